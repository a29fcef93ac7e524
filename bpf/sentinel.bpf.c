// SPDX-License-Identifier: GPL-2.0
/* meridian sentinel: PMU samples attributed to network flows (MicroSentinel,
 * docs/requirements/sentinel.md).
 *
 * Packet hooks write the CPU's current packet context (time, flow id, direction,
 * ifindex, gso_segs) to `ms_curr_ctx` and to the history ring `ms_hist`; the first
 * sight of a flow id puts its 5-tuple into the LRU map `ms_flows` for user space to
 * name it. `ms_pmu_handler`, a perf_event program on every sampled event and CPU,
 * takes a token from the CPU's bucket, finds the flow of the CPU's latest packet within
 * MS_FLOW_SKID_NS (else of the newest in its history within MS_HISTORY_LEN times
 * that), takes stacks (and optionally a branch snapshot) and emits one
 * `struct ms_sample` into the ring buffer `ms_events`.
 *
 * Packet hook strategies, picked at run time by autoload, best first:
 *   fentry: ms_btf_rx (below) with ms_fentry_tx, fentry on __dev_queue_xmit
 *          (dev_queue_xmit is an inline wrapper of it): in the sending task, before
 *          the qdisc, so a sample right after it finds the packet in its slot. RX
 *          stays on the tracepoint: fentry on netif_receive_skb, the drivers'
 *          non-GRO entry, misses packets through GRO lists and the backlog (veth);
 *   ms_btf_rx / ms_btf_tx: tp_btf/netif_receive_skb (in __netif_receive_skb_core:
 *          every received packet, skb->data at the network header, VLAN tags not
 *          yet removed when not offloaded) and tp_btf/net_dev_start_xmit (the
 *          driver's transmit: network header set by the stack);
 *   ms_xdp_rx: optional XDP on named interfaces (RX fast path, before the skb).
 * A packet is keyed by its IPv4/IPv6 TCP/UDP 5-tuple (IPv6 extension headers walked),
 * a VXLAN or Geneve packet by its inner frame's (sentinel_flow.bpf.h).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "maps.bpf.h"
#include "sentinel.h"

#define ETH_P_IP_ 0x0800
#define ETH_P_IPV6_ 0x86DD
#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88A8
#define AF_INET_ 2
#define AF_INET6_ 10
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
#define ENOENT_ 2

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

const volatile __u64 wakeup_bytes = 1;	/* wake the reader past this fill level */
const volatile __u64 flow_skid_ns = MS_FLOW_SKID_NS;
const volatile bool collect_stacks = true;
/* The agent itself: its samples carry no user stack. An interpreter's frames, walked
 * without frame pointers, make a new stack id at nearly every sample, which fills the
 * stack maps and costs the agent a delete each; its samples keep their ip (the
 * function) and kernel stack. */
const volatile __u32 self_tgid = 0;
/* 0: no branch records; 1: bpf_get_branch_snapshot (needs an LBR-enabled perf event
 * on the CPU); 2: bpf_read_branch_records (the sample's own branch stack: the event
 * opened with branch_sample_type). */
const volatile __u32 lbr_mode = 0;

/* ---- maps ---------------------------------------------------------------------- */

MAP_DEF(ms_curr_ctx, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct ms_flow_ctx, 1);

MAP_DEF(ms_hist, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct ms_history, 1);

MAP_DEF(ms_flows, BPF_MAP_TYPE_LRU_HASH, __u64, struct ms_flow_key, 65536);

RINGBUF_DEF(ms_events, 1 << 22);

RINGBUF_DEF(ms_lbr_events, 1 << 20);

/* Two stack maps used in turn: a STACK_TRACE map is never emptied by the kernel, so
 * once full every new stack would fail. User space switches the programs to the other
 * side (ms_stack_side) when the current one passes a fill mark, and empties the old
 * one once every sample that may name it has been read: no id is ever reused while a
 * sample in the ring still points at it. An id from ms_stacks_b has MS_STACK_SIDE_B
 * set. */
#define MS_STACK_SIDE_B (1 << 30)
#define MS_STACKS_DEF(name)						\
	struct {							\
		__uint(type, BPF_MAP_TYPE_STACK_TRACE);			\
		__uint(max_entries, 16384);				\
		__uint(key_size, sizeof(__u32));			\
		__uint(value_size, 127 * sizeof(__u64)); /* PERF_MAX_STACK_DEPTH */ \
	} name SEC(".maps")

MS_STACKS_DEF(ms_stacks);
MS_STACKS_DEF(ms_stacks_b);

/* 0: new stacks go to ms_stacks, 1: to ms_stacks_b (written by user space). */
MAP_DEF(ms_stack_side, BPF_MAP_TYPE_ARRAY, __u32, __u32, 1);

/* Attach cookie (a slot) -> MS_COOKIE_VALUE(event, raw_code). */
MAP_DEF(ms_event_cookie, BPF_MAP_TYPE_ARRAY, __u32, __u64, MS_MAX_EVENTS);

MAP_DEF(ms_tb, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct ms_token_bucket, 1);

MAP_DEF(ms_tb_cfg, BPF_MAP_TYPE_ARRAY, __u32, struct ms_tb_cfg, 1);

MAP_DEF(ms_ctrl, BPF_MAP_TYPE_ARRAY, __u32, struct ms_ctrl, 1);

/* Thread group ids sampled when ms_ctrl.pid_filter is on. */
MAP_DEF(ms_target_pids, BPF_MAP_TYPE_HASH, __u32, __u8, 1024);

MAP_DEF(ms_counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct ms_counters, 1);

struct ms_lbr_scratch {
	struct perf_branch_entry e[MS_LBR_MAX];
};

MAP_DEF(ms_lbr_scratch, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct ms_lbr_scratch, 1);

EXPORT_RECORD(ms_sample);
EXPORT_RECORD(ms_lbr);

static __always_inline struct ms_counters *counters(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&ms_counters, &zero);
}

#include "sentinel_flow.bpf.h"	/* the flow context of every packet */

/* ---- sample handler -------------------------------------------------------------- */

/* One token from the CPU's bucket, refilled from the time since the last sample at
 * the configured rate and capped at the headroom. False: drop (counted). */
static __always_inline bool take_token(__u64 now, struct ms_counters *c)
{
	__u32 zero = 0;
	struct ms_tb_cfg *cfg = bpf_map_lookup_elem(&ms_tb_cfg, &zero);
	struct ms_token_bucket *tb = bpf_map_lookup_elem(&ms_tb, &zero);
	__u64 cap, elapsed, tokens, add;

	if (!cfg || !tb || !cfg->samples_per_sec)
		return true;	/* no limit */
	cap = (cfg->headroom ? cfg->headroom : 1) * 1000;
	if (tb->cfg_seq != cfg->seq) {
		/* A new budget: start full (at most the headroom) from now. */
		tb->cfg_seq = cfg->seq;
		tb->tokens_milli = cap;
		tb->last_ns = now;
		tb->hard_drop_until_ns = 0;
	}
	elapsed = now - tb->last_ns;
	if (elapsed > 10000000000ULL)	/* 10 s: the cap is reached long before */
		elapsed = 10000000000ULL;
	/* milli-tokens earned: elapsed ns x samples_per_sec x 1000 / 1e9. The clock moves
	 * on only by the time those paid for, so that frequent samples (a fraction of a
	 * milli-token each) still add up to the exact rate. */
	add = elapsed * cfg->samples_per_sec / 1000000;
	tokens = tb->tokens_milli + add;
	if (tokens >= cap) {
		tokens = cap;
		tb->last_ns = now;
	} else if (add) {
		tb->last_ns += add * 1000000 / cfg->samples_per_sec;
	}
	if (now < tb->hard_drop_until_ns) {
		tb->tokens_milli = tokens;
		c->hard_drop++;
		return false;
	}
	if (tokens < 1000) {
		tb->tokens_milli = tokens;
		if (cfg->hard_drop_ns)
			tb->hard_drop_until_ns = now + cfg->hard_drop_ns;
		c->token_bucket++;
		return false;
	}
	tb->tokens_milli = tokens - 1000;
	return true;
}

/* The flow of the CPU's latest packet if it is within the skid window, else
 * (docs/requirements/sentinel.md §5.1, find_flow_in_history) of the newest packet of its
 * history within MS_HISTORY_LEN skid windows, else none. */
static __always_inline void attach_flow(struct ms_sample *s, __u64 now)
{
	__u32 zero = 0;
	struct ms_flow_ctx *cur = bpf_map_lookup_elem(&ms_curr_ctx, &zero);
	struct ms_history *h = bpf_map_lookup_elem(&ms_hist, &zero);
	struct ms_flow_ctx *src = NULL;

	s->flow_source = MS_FLOW_FALLBACK;
	if (cur && cur->flow_id && now - cur->time_ns <= flow_skid_ns) {
		src = cur;
		s->flow_source = MS_FLOW_CURRENT;
	} else if (h) {
		/* Newest first, each entry once: the first within the window is the newest
		 * there. The ring is in time order, but where a hook interrupted another's
		 * write (RX in a softirq during fentry's TX): then the newest slot may hold
		 * a packet 16 old and the one before it the latest. */
		__u64 window = MS_HISTORY_LEN * flow_skid_ns;
		__u32 head = h->head;

#pragma unroll
		for (int i = 1; i <= MS_HISTORY_LEN; i++) {
			struct ms_flow_ctx *e = &h->ctx[(head - i) & (MS_HISTORY_LEN - 1)];

			if (e->flow_id && now - e->time_ns <= window) {
				src = e;
				s->flow_source = MS_FLOW_HISTORY;
				break;
			}
		}
	}
	if (src) {
		s->flow_id = src->flow_id;
		s->ifindex = src->ifindex;
		s->gso_segs = src->gso_segs ? src->gso_segs : 1;
		s->direction = src->direction;
	} else {
		s->flow_id = 0;
		s->ifindex = 0;
		s->gso_segs = 1;
		s->direction = 0;
	}
}

/* The branch records of this sample into ms_lbr_events; their number (0: none). */
static __always_inline __u8 take_lbr(struct bpf_perf_event_data *ctx, __u64 now, __u32 cpu,
				     struct ms_counters *c)
{
	__u32 zero = 0;
	struct ms_lbr_scratch *sc = bpf_map_lookup_elem(&ms_lbr_scratch, &zero);
	struct ms_lbr *rec;
	long bytes;
	__u32 nr;

	if (!sc)
		return 0;
	if (lbr_mode == 1)
		bytes = bpf_get_branch_snapshot(sc->e, sizeof(sc->e), 0);
	else
		bytes = bpf_read_branch_records(ctx, sc->e, sizeof(sc->e), 0);
	if (bytes <= 0)
		return 0;
	nr = bytes / sizeof(struct perf_branch_entry);
	if (nr > MS_LBR_MAX)
		nr = MS_LBR_MAX;
	rec = bpf_ringbuf_reserve(&ms_lbr_events, sizeof(*rec), 0);
	if (!rec) {
		c->lbr_ring_full++;
		return 0;
	}
	rec->time_ns = now;
	rec->cpu = cpu;
	rec->nr = nr;
#pragma unroll
	for (int i = 0; i < MS_LBR_MAX; i++) {
		rec->entries[i].from = i < nr ? sc->e[i].from : 0;
		rec->entries[i].to = i < nr ? sc->e[i].to : 0;
	}
	ringbuf_submit_lazy(&ms_lbr_events, rec, wakeup_bytes >> 2, now);
	return nr;
}

/* A stack id of ms_stacks_b, marked as such (errors stay negative). */
static __always_inline __s32 side_b(long id)
{
	return id < 0 ? (__s32)id : (__s32)(id | MS_STACK_SIDE_B);
}

SEC("perf_event")
int ms_pmu_handler(struct bpf_perf_event_data *ctx)
{
	struct ms_counters *c = counters();
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, zero = 0, slot, cpu;
	struct ms_ctrl *ctrl;
	struct ms_sample *s;
	__u64 now, *ev;
	__u32 *side;

	if (!c)
		return 0;
	/* perf_event programs do not nest on a CPU: plain adds are exact. */
	c->samples++;
	ctrl = bpf_map_lookup_elem(&ms_ctrl, &zero);
	if (ctrl && ctrl->pid_filter && !bpf_map_lookup_elem(&ms_target_pids, &tgid)) {
		c->target_filtered++;
		return 0;
	}
	now = bpf_ktime_get_ns();
	if (!take_token(now, c))
		return 0;
	s = bpf_ringbuf_reserve(&ms_events, sizeof(*s), 0);
	if (!s) {
		c->ring_full++;
		return 0;
	}
	cpu = bpf_get_smp_processor_id();
	s->time_ns = now;
	s->ip = PT_REGS_IP(&ctx->regs);
	s->cgroup_id = bpf_get_current_cgroup_id();
	s->pid = tgid;
	s->tid = (__u32)id;
	s->cpu = cpu;
	s->numa_node = bpf_get_numa_node_id();
	attach_flow(s, now);
	slot = bpf_get_attach_cookie(ctx) & (MS_MAX_EVENTS - 1);
	ev = bpf_map_lookup_elem(&ms_event_cookie, &slot);
	s->event = ev ? (__u16)*ev : MS_EVT_CPU_CLOCK;
	s->raw_code = ev ? *ev >> 32 : 0;
	s->data_addr = ev && ((*ev >> 16) & MS_SLOT_DATA_ADDR) ? ctx->addr : 0;
	if (collect_stacks) {
		/* A sample in user mode has no kernel stack (kernel addresses have the top
		 * bit set on x86_64 and arm64). */
		bool user = tgid != self_tgid;

		side = bpf_map_lookup_elem(&ms_stack_side, &zero);
		if (side && *side) {
			s->user_stack_id = user ? side_b(bpf_get_stackid(ctx, &ms_stacks_b,
									 BPF_F_USER_STACK)) : -ENOENT_;
			s->kernel_stack_id = (long)s->ip < 0 ?
				side_b(bpf_get_stackid(ctx, &ms_stacks_b, 0)) : -ENOENT_;
		} else {
			s->user_stack_id = user ?
				bpf_get_stackid(ctx, &ms_stacks, BPF_F_USER_STACK) : -ENOENT_;
			s->kernel_stack_id = (long)s->ip < 0 ?
				bpf_get_stackid(ctx, &ms_stacks, 0) : -ENOENT_;
		}
	} else {
		s->user_stack_id = -ENOENT_;
		s->kernel_stack_id = -ENOENT_;
	}
	s->lbr_nr = lbr_mode ? take_lbr(ctx, now, cpu, c) : 0;
	s->pad = 0;
	c->emitted++;
	ringbuf_submit_lazy(&ms_events, s, wakeup_bytes, c->emitted);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
