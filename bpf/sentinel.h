/* Record, key and map-value layouts of `meridian sentinel`: the one definition that the
 * kernel program and the Python decoders (through BTF) both read. */
#ifndef MERIDIAN_SENTINEL_H
#define MERIDIAN_SENTINEL_H

#define MS_HISTORY_LEN 16		/* per-CPU ring of recent packet contexts */
#define MS_FLOW_SKID_NS 200000ULL	/* a sample may land this long after its packet */
#define MS_LBR_MAX 32			/* branch entries kept per LBR snapshot */
#define MS_MAX_EVENTS 16		/* logical event slots (cookie values) */

/* Logical events. A perf event's cookie (ms_event_cookie) names one of these. */
enum ms_event {
	MS_EVT_CYCLES = 0,
	MS_EVT_INSTRUCTIONS = 1,
	MS_EVT_LLC_MISS = 2,
	MS_EVT_BRANCH_MISS = 3,
	MS_EVT_REMOTE_DRAM = 4,
	MS_EVT_XSNP_HITM = 5,
	MS_EVT_CPU_CLOCK = 6,	/* software fallback where the CPU has no PMU */
	MS_EVT_RAW = 7,		/* a raw event code given by the user */
};

enum ms_direction {
	MS_DIR_RX = 0,
	MS_DIR_TX = 1,
};

/* Where a sample's flow came from. */
enum ms_flow_source {
	MS_FLOW_CURRENT = 0,	/* the CPU's current packet context, within the skid window */
	MS_FLOW_HISTORY = 1,	/* the newest packet of the CPU's history within
				 * MS_HISTORY_LEN x the skid window */
	MS_FLOW_FALLBACK = 2,	/* none within the window: fallback id (0) */
};

/* A flow's 5-tuple, as hashed: the flow id is FNV-1a 64 over these 40 bytes exactly.
 * IPv4 addresses fill the first 4 bytes of saddr/daddr, the rest zero. Ports in
 * network byte order. RX packets are keyed as they arrive (remote -> local), TX as
 * they leave (local -> remote): a TCP connection is two flows, one per direction. */
struct ms_flow_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 sport;	/* network byte order */
	__u16 dport;	/* network byte order */
	__u8 proto;	/* IPPROTO_TCP, IPPROTO_UDP, ... */
	__u8 family;	/* AF_INET (2) or AF_INET6 (10) */
	__u8 pad[2];
};

/* One packet context: the current slot and each history entry. */
struct ms_flow_ctx {
	__u64 time_ns;		/* bpf_ktime_get_ns() when the packet was seen */
	__u64 flow_id;
	__u32 ifindex;
	__u16 gso_segs;		/* >= 1 */
	__u8 direction;		/* enum ms_direction */
	__u8 pad;
};

struct ms_history {
	__u32 head;		/* next slot to write */
	__u32 pad;
	struct ms_flow_ctx ctx[MS_HISTORY_LEN];
};

/* One sample, through the ring buffer `ms_events`. */
struct ms_sample {
	__u64 time_ns;		/* bpf_ktime_get_ns() (CLOCK_MONOTONIC) */
	__u64 ip;		/* instruction pointer (user or kernel) */
	__u64 data_addr;	/* PEBS data address where the event has one, else 0 */
	__u64 flow_id;		/* 0: no flow */
	__u64 cgroup_id;	/* bpf_get_current_cgroup_id() */
	__u32 pid;		/* thread group id */
	__u32 tid;
	__u32 cpu;
	__u32 ifindex;		/* the packet's interface, 0 without a flow */
	__s32 user_stack_id;	/* in ms_stacks, < 0: none (negative errno) */
	__s32 kernel_stack_id;
	__u16 event;		/* enum ms_event */
	__u16 gso_segs;		/* >= 1 */
	__u8 direction;		/* enum ms_direction */
	__u8 flow_source;	/* enum ms_flow_source */
	__u8 lbr_nr;		/* entries in the ms_lbr record that follows, 0: none */
	__u8 pad;
	__u32 numa_node;	/* bpf_get_numa_node_id() */
	__u32 raw_code;		/* the raw event code for MS_EVT_RAW, else 0 */
};

/* The branch stack of one sample, through the ring buffer `ms_lbr_events` (only on
 * CPUs with LBR); joined to its sample by (cpu, time_ns). */
struct ms_lbr_entry {
	__u64 from;
	__u64 to;
};

struct ms_lbr {
	__u64 time_ns;
	__u32 cpu;
	__u32 nr;
	struct ms_lbr_entry entries[MS_LBR_MAX];
};

/* Per-CPU token bucket state. */
struct ms_token_bucket {
	__u64 tokens_milli;	/* tokens x 1000 (sub-token refills from elapsed ns) */
	__u64 last_ns;		/* last refill */
	__u64 hard_drop_until_ns;	/* drop everything until then (overload) */
	__u64 cfg_seq;		/* ms_tb_cfg.seq seen last: a new one resets the bucket */
};

/* Token bucket configuration, one entry, changed by user space while running. */
struct ms_tb_cfg {
	__u64 samples_per_sec;	/* per CPU; 0: no limit */
	__u64 headroom;		/* most tokens kept (idle cannot release a burst) */
	__u64 hard_drop_ns;	/* after an empty bucket, drop for this long; 0: never */
	__u64 seq;		/* bumped on every change */
};

/* Everything dropped in the kernel, per CPU, by reason. */
struct ms_counters {
	__u64 token_bucket;	/* no token */
	__u64 hard_drop;	/* in a hard-drop window */
	__u64 ring_full;	/* ms_events full */
	__u64 lbr_ring_full;	/* ms_lbr_events full (the sample went out without it) */
	__u64 target_filtered;	/* not a configured target (kernel-side pid filter) */
	__u64 emitted;		/* samples written to ms_events */
	__u64 flows_seen;	/* packets parsed into a flow */
	__u64 flows_unparsed;	/* packets with no IPv4/IPv6 TCP/UDP flow */
	__u64 samples;		/* handler runs: emitted + token_bucket + hard_drop + ring_full
				 * + target_filtered, exactly */
};

/* Control words user space changes while running, one entry (`ms_ctrl`). */
struct ms_ctrl {
	__u32 pid_filter;	/* 1: sample only the thread groups in ms_target_pids */
	__u32 pad;
};

/* A perf event's attach cookie is its slot in `ms_event_cookie`, whose value packs
 * the logical event, flags and the raw code: (raw_code << 32) | (flags << 16) | event.
 * MS_SLOT_DATA_ADDR: the event samples a data address (PERF_SAMPLE_ADDR, PEBS); for
 * the others the kernel leaves perf_sample_data.addr unset, so it is not read. */
#define MS_SLOT_DATA_ADDR 1
#define MS_COOKIE_VALUE(event, flags, raw_code) \
	(((__u64)(raw_code) << 32) | ((__u64)(flags) << 16) | (__u64)(event))

#endif
