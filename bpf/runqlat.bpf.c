// SPDX-License-Identifier: GPL-2.0
/* meridian runqlat: run-queue latency, the time a runnable task waits for a CPU:
 * from wake-up (sched_wakeup, sched_wakeup_new) or preemption (sched_switch with the
 * previous task still runnable) until sched_switch puts it on a CPU. Keyed by TID.
 *
 * Strategies, picked at run time by autoload:
 *   btf_*: tp_btf programs that get the task_struct pointers (tgid for -P and -p);
 *   tp_*:  plain sched tracepoints, for kernels without tp_btf; they carry TIDs only.
 *          Without -p, -P keys by thread. With -p the set holds the listed processes'
 *          threads, each with its process (the -P key), and tp_fork/tp_free keep it
 *          so: a new thread of a listed process joins, a freed one leaves.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "bits.bpf.h"
#include "maps.bpf.h"
#include "pidset.bpf.h"
#include "runqlat.h"

#define TASK_RUNNING 0
#define TASK_REPORT_MAX 0x100	/* the sched_switch tracepoint's state for a preemption */

const volatile __u64 latency_unit_ns = 1000;	/* slots of usecs (or msecs with -m) */
const volatile bool per_process = false;	/* -P */
const volatile bool filter_pid = false;		/* -p: only the ids in `pids` */
const volatile bool pids_are_tids = false;	/* tracepoints with -p: `pids` holds threads */

/* When each thread became runnable (0: not waiting), in its slot (THREAD_SLOTS). A
 * thread keeps its slot; the slot keeps the tid it belongs to, and a thread that finds
 * another's tid there takes it over (that one's wait is then not matched). */
THREAD_SLOTS(starts, struct runqlat_start);
/* Without -P: the one histogram, in a per-CPU array (no hashing). */
MAP_DEF(totals, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct runqlat_hist, 1);
HIST_MAP_DEF(hists, BPF_MAP_TYPE_PERCPU_HASH, struct runqlat_key, struct runqlat_hist, 10240);
MAP_DEF(counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct runqlat_counters, 1);

/* -p: the traced ids, each with its process (tgid): tgids for tp_btf; for the
 * tracepoints the threads of the listed processes (user space reads /proc/PID/task),
 * then tp_fork adds their new threads and tp_free drops freed ones. Sized by user
 * space, which writes it before the programs that ask it are attached. */
MAP_DEF(pids, BPF_MAP_TYPE_HASH, __u32, __u32, 1024);
PID_MEMO_DEF(pid_memo);
/* The set's change count (pidset.bpf.h): 0 but for tp_fork's and tp_free's changes. */
__u64 pids_gen = 0;

static const struct runqlat_hist zero_hist;

/* sched_switch and the wake-ups do not nest on a CPU (all run with interrupts off). */
#define COUNT(field) COUNT_PLAIN(&counters, struct runqlat_counters, field)

static __always_inline struct runqlat_start *slot_of(__u32 tid)
{
	return thread_slot(&starts, starts_mask, tid);
}

/* -p: is `id` in the set (tgid for tp_btf, tid for the tracepoints)? */
static __always_inline bool traced(__u32 id)
{
	return !filter_pid || pid_in_set(&pid_memo, &pids, id, *(volatile __u64 *)&pids_gen);
}

static __always_inline void enqueue(__u32 tid, __u32 tgid, __u64 now)
{
	struct runqlat_start *st;

	if (!tid || !traced(tgid))
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
	__u64 delta;

	if (!traced(tgid))
		return;
	st = slot_of(tid);
	if (!st || st->tid != tid || !st->ts_ns)
		return;
	delta = now - st->ts_ns;
	st->ts_ns = 0;
	COUNT(matched);
	if (per_process) {
		key.pid = tgid;
		if (pids_are_tids) {	/* the tracepoints' "tgid" is the tid: the set knows */
			__u32 *owner = bpf_map_lookup_elem(&pids, &tid);

			if (owner)
				key.pid = *owner;
		}
		bpf_probe_read_kernel_str(key.comm, sizeof(key.comm), comm);
		h = lookup_or_init(&hists, &key, &zero_hist);
	} else {
		h = first_value(&totals);
	}
	if (!h) {
		COUNT(hists_full);
		return;
	}
	/* Per-CPU value, and sched_switch cannot nest on a CPU: plain adds are exact. */
	LATENCY_ADD(h, delta, latency_unit_ns, RUNQLAT_BUCKETS);
}

/* ---- tp_btf ------------------------------------------------------------------------ */

/* A wake-up, of a task or a new one: the task starts waiting. Every wake-up program
 * is this body; `proto` is its signature, `tid` and `tgid` read from it. */
#define WAKEUP(sec, proto, tid, tgid)						\
	SEC(sec)								\
	int proto								\
	{									\
		enqueue(tid, tgid, bpf_ktime_get_ns());				\
		return 0;							\
	}

WAKEUP("tp_btf/sched_wakeup", BPF_PROG(btf_wakeup, struct task_struct *p), p->pid, p->tgid)
WAKEUP("tp_btf/sched_wakeup_new", BPF_PROG(btf_wakeup_new, struct task_struct *p), p->pid,
       p->tgid)

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

WAKEUP("tracepoint/sched/sched_wakeup",
       tp_wakeup(struct trace_event_raw_sched_wakeup_template *ctx), ctx->pid, ctx->pid)
WAKEUP("tracepoint/sched/sched_wakeup_new",
       tp_wakeup_new(struct trace_event_raw_sched_wakeup_template *ctx), ctx->pid, ctx->pid)

SEC("tracepoint/sched/sched_switch")
int tp_switch(struct trace_event_raw_sched_switch *ctx)
{
	__u64 now = bpf_ktime_get_ns();

	if ((ctx->prev_state & (TASK_REPORT_MAX - 1)) == TASK_RUNNING)
		enqueue(ctx->prev_pid, ctx->prev_pid, now);
	switched_in(ctx->next_pid, ctx->next_pid, ctx->next_comm, now);
	return 0;
}

/* With -p, the set follows threads (attached first, with the set written: the threads
 * started meanwhile user space adds from /proc before it attaches the programs above).
 *
 * Is `tid` a thread of the current task's process? A new thread goes at the end of its
 * process's thread list (copy_process()); a few more may have joined since. */
static __always_inline bool own_thread(__u32 tid)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct signal_struct *sig = BPF_CORE_READ(task, signal);
	struct list_head *head = &sig->thread_head;
	struct list_head *pos = BPF_CORE_READ(sig, thread_head.prev);
	struct task_struct *t;
	int i;

	for (i = 0; i < 4; i++) {
		if (!pos || pos == head)
			return false;
		t = container_of(pos, struct task_struct, thread_node);
		if ((__u32)BPF_CORE_READ(t, pid) == tid)
			return true;
		pos = BPF_CORE_READ(pos, prev);
	}
	return false;
}

/* Runs in the forking thread (parent_pid): its new thread joins the set, with the
 * process it is in; a new process does not (as with tp_btf's tgids). */
SEC("tracepoint/sched/sched_process_fork")
int tp_fork(struct trace_event_raw_sched_process_fork *ctx)
{
	__u32 parent = ctx->parent_pid, child = ctx->child_pid, tgid, *owner;
	long ret;

	if (!filter_pid)
		return 0;
	owner = bpf_map_lookup_elem(&pids, &parent);
	if (!owner || !own_thread(child))
		return 0;
	tgid = *owner;
	ret = bpf_map_update_elem(&pids, &child, &tgid, BPF_NOEXIST);
	if (!ret)
		__sync_fetch_and_add(&pids_gen, 1);	/* a memo may say "not traced" */
	else if (ret != -17)	/* EEXIST: there already */
		COUNT(pids_full);	/* only here: no two forks nest on a CPU */
	return 0;
}

/* A task freed (its waits are over): its tid leaves the set, as it may be reused. */
SEC("tracepoint/sched/sched_process_free")
int tp_free(struct trace_event_raw_sched_process_template *ctx)
{
	__u32 tid = ctx->pid;

	if (filter_pid && !bpf_map_delete_elem(&pids, &tid))
		__sync_fetch_and_add(&pids_gen, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
