/* Record and key layouts of `meridian biolat`: the one definition that both the
 * kernel program and the Python decoder (through BTF) read. */
#ifndef MERIDIAN_BIOLAT_H
#define MERIDIAN_BIOLAT_H

/* Log-linear buckets (bits.bpf.h) of values below 2^32 units (log2 slots 0-31, as
 * before): 3.7 KB a value, in a map not preallocated (HIST_MAP_DEF): memory for the keys
 * in use, not 16384 x 3.7 KB = 61 MB up front. */
#define BIOLAT_BUCKETS ((1 + 32 - 4) * 16)
#define BIOLAT_SIZES 4096	/* distinct (device, op, request size) counted exactly */
#define BIOLAT_COMM_LEN 16
#define BIOLAT_RWBS_LEN 8

enum biolat_op {
	BIOLAT_OP_READ,
	BIOLAT_OP_WRITE,
	BIOLAT_OP_DISCARD,
	BIOLAT_OP_FLUSH,
	BIOLAT_OP_OTHER,
};

enum biolat_kind {
	BIOLAT_KIND_LATENCY,	/* issue (or insert, with -Q) to completion */
	BIOLAT_KIND_QUEUE,	/* insert to issue: time spent queued in the block layer */
	BIOLAT_KIND_DEPTH,	/* requests in flight on the device, sampled at each issue */
	BIOLAT_KIND_LATENCY_AT_DEPTH,	/* the latency again, by the depth at its issue */
};

/* Histogram key: one histogram per device, operation, kind and slot. Every view (per
 * device, per op, size histogram, latency by size or by depth) is a sum over it. */
struct biolat_key {
	__u32 dev;		/* kernel dev_t: major << 20 | minor */
	enum biolat_op op;
	enum biolat_kind kind;
	__u32 slot;		/* log2(bytes); for BIOLAT_KIND_LATENCY_AT_DEPTH log2(depth) */
};

struct biolat_hist {
	__u64 sum;	/* of latencies in ns, or of depths for BIOLAT_KIND_DEPTH */
	__u64 min;	/* smallest latency in ns, or smallest depth; 0: none yet */
	__u64 max;	/* largest latency in ns, or largest depth */
	__u64 bytes;	/* bytes completed */
	__u64 buckets[BIOLAT_BUCKETS];	/* latency in usecs or msecs, or depth; log-linear */
};

/* Requests completed per device, op and exact size in bytes (request sizes take few
 * distinct values: counted exactly, not in buckets). */
struct biolat_size_key {
	__u32 dev;
	enum biolat_op op;
	__u32 bytes;
};

/* Per-device requests in flight (issued, not completed), as seen since attach, and the
 * time with at least one in flight (iostat's %util, /proc/diskstats io_ticks): busy_ns
 * of the busy periods ended, and the start of the one going on, if inflight > 0. */
struct biolat_depth {
	__s64 inflight;
	__u64 issued;
	__u64 busy_ns;
	__u64 busy_since_ns;
};

/* Everything the tool drops or cannot match, counted per CPU, never silently. */
struct biolat_counters {
	__u64 unmatched;	/* completions whose issue was not seen */
	__u64 events_lost;	/* slow-I/O records the ring buffer had no room for */
	__u64 reqs_full;	/* in-flight requests not tracked: map full */
	__u64 hists_full;	/* samples not counted: histogram map full */
	__u64 requeued;		/* requests requeued after issue */
	__u64 sizes_full;	/* completions whose size was not counted: `sizes` map full */
};

/* One slow request, streamed through the ring buffer (exercise 3). */
struct biolat_event {
	__u64 ts_ns;		/* CLOCK_MONOTONIC at completion */
	__u64 sector;
	__u64 latency_ns;
	__u64 queue_ns;		/* insert to issue, when -Q */
	__u32 dev;
	__u32 bytes;
	__u32 pid;		/* thread group that queued the request; 0 if not seen */
	__s32 error;
	enum biolat_op op;
	char rwbs[BIOLAT_RWBS_LEN];
	char comm[BIOLAT_COMM_LEN];
};

#endif
