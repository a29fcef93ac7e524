// SPDX-License-Identifier: GPL-2.0
/* meridian runqlat: run-queue latency, the time a runnable task waits for a CPU:
 * from wake-up (sched_wakeup, sched_wakeup_new) or preemption (sched_switch with the
 * previous task still runnable) until sched_switch puts it on a CPU. Keyed by TID.
 *
 * Strategies, picked at run time by autoload:
 *   btf_*: tp_btf programs that get the task_struct pointers (tgid for -P and -p);
 *   tp_*:  plain sched tracepoints, for kernels without tp_btf; they carry TIDs only,
 *          so this path knows no thread groups: totals and -p of a single thread.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "bits.bpf.h"
#include "maps.bpf.h"
#include "runqlat.h"

#define TASK_RUNNING 0
#define TASK_REPORT_MAX 0x100	/* the sched_switch tracepoint's state for a preemption */

const volatile __u64 latency_unit_ns = 1000;	/* slots of usecs (or msecs with -m) */
const volatile bool per_process = false;	/* -P */
const volatile __u32 filter_pid = 0;		/* -p: tgid (tp_btf) or tid (tracepoint) */

/* When each thread became runnable (0: not waiting), in the slot tid % the array's
 * size (user space sizes it to pid_max when it can, so live threads never share a
 * slot): an array lookup is a few inlined instructions, no hashing. A thread keeps
 * its slot; the slot keeps the tid it belongs to, and a thread that finds another's
 * tid there takes it over (that one's wait is then not matched). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 32768);	/* a power of two: resized before load */
	__type(key, __u32);
	__type(value, struct runqlat_start);
} start SEC(".maps");

const volatile __u32 starts_mask = 32768 - 1;	/* max_entries of start - 1 */

/* Without -P: the one histogram, in a per-CPU array (no hashing). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct runqlat_hist);
} totals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 10240);
	__type(key, struct runqlat_key);
	__type(value, struct runqlat_hist);
} hists SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct runqlat_counters);
} counters SEC(".maps");

static const struct runqlat_hist zero_hist;

#define COUNT(field)                                                        \
	do {                                                                \
		__u32 zero = 0;                                             \
		struct runqlat_counters *c = bpf_map_lookup_elem(&counters, &zero); \
		if (c)                                                      \
			c->field++;                                         \
	} while (0)

static __always_inline struct runqlat_start *slot_of(__u32 tid)
{
	__u32 idx = tid & starts_mask;

	return bpf_map_lookup_elem(&start, &idx);
}

static __always_inline void enqueue(__u32 tid, __u32 tgid, __u64 now)
{
	struct runqlat_start *st;

	if (!tid || (filter_pid && tgid != filter_pid))
		return;
	st = slot_of(tid);
	if (!st)
		return;
	st->tid = tid;
	st->ts_ns = now;
	COUNT(enqueued);
}

static __always_inline void switched_in(__u32 tid, __u32 tgid, const char *comm, __u64 now)
{
	struct runqlat_start *st;
	struct runqlat_key key = {};
	struct runqlat_hist *h;
	__u32 zero = 0;
	__u64 delta;

	if (filter_pid && tgid != filter_pid)
		return;
	st = slot_of(tid);
	if (!st || st->tid != tid || !st->ts_ns)
		return;
	delta = now - st->ts_ns;
	st->ts_ns = 0;
	COUNT(matched);
	if (per_process) {
		key.pid = tgid;
		bpf_probe_read_kernel_str(key.comm, sizeof(key.comm), comm);
		h = lookup_or_init(&hists, &key, &zero_hist);
	} else {
		h = bpf_map_lookup_elem(&totals, &zero);
	}
	if (!h) {
		COUNT(hists_full);
		return;
	}
	/* Per-CPU value, and sched_switch cannot nest on a CPU: plain adds are exact. */
	h->slots[hist_slot(delta / latency_unit_ns, RUNQLAT_MAX_SLOTS)]++;
	h->sum_ns += delta;
	if (delta > h->max_ns)
		h->max_ns = delta;
}

/* ---- tp_btf ------------------------------------------------------------------------ */

SEC("tp_btf/sched_wakeup")
int BPF_PROG(btf_wakeup, struct task_struct *p)
{
	enqueue(p->pid, p->tgid, bpf_ktime_get_ns());
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(btf_wakeup_new, struct task_struct *p)
{
	enqueue(p->pid, p->tgid, bpf_ktime_get_ns());
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(btf_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 now = bpf_ktime_get_ns();	/* one clock read for both tasks */

	/* Still on the run queue: preempted, or it never went to sleep. */
	if (preempt || prev_state == TASK_RUNNING)
		enqueue(prev->pid, prev->tgid, now);
	switched_in(next->pid, next->tgid, next->comm, now);
	return 0;
}

/* ---- plain tracepoints: TIDs only ---------------------------------------------------- */

SEC("tracepoint/sched/sched_wakeup")
int tp_wakeup(struct trace_event_raw_sched_wakeup_template *ctx)
{
	enqueue(ctx->pid, ctx->pid, bpf_ktime_get_ns());
	return 0;
}

SEC("tracepoint/sched/sched_wakeup_new")
int tp_wakeup_new(struct trace_event_raw_sched_wakeup_template *ctx)
{
	enqueue(ctx->pid, ctx->pid, bpf_ktime_get_ns());
	return 0;
}

SEC("tracepoint/sched/sched_switch")
int tp_switch(struct trace_event_raw_sched_switch *ctx)
{
	__u64 now = bpf_ktime_get_ns();

	if ((ctx->prev_state & (TASK_REPORT_MAX - 1)) == TASK_RUNNING)
		enqueue(ctx->prev_pid, ctx->prev_pid, now);
	switched_in(ctx->next_pid, ctx->next_pid, ctx->next_comm, now);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
