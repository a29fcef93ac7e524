// SPDX-License-Identifier: GPL-2.0
/* meridian memlat: page-fault handling latency, t_exit - t_entry matched per thread
 * (the thread half of the seed's pid_tgid key, as an array slot), as log2 histograms
 * per minor/major fault (and per process with -P).
 *
 * Strategies for the same logic, picked at run time by autoload, best first:
 *   fentry_* / fexit_*: handle_mm_fault itself (needs BPF trampolines); these also
 *          see faults taken for get_user_pages() (no pt_regs), which emit no perf
 *          event and so are not in the histograms of the perf strategies;
 *   kprobe_* / kretprobe_*: the same on kprobes;
 *   btf_* + perf_*: the exceptions:page_fault_user/kernel tracepoints (tp_btf) as
 *          entry, and perf_event programs on the software events page-faults-min and
 *          page-faults-maj as exit: mm_account_fault() emits them at the end of
 *          handle_mm_fault(), in the faulting thread, once per finished fault;
 *   tp_*  + perf_*: the same entry through the plain tracepoints.
 * A fault that fails (SIGSEGV, exception fixup) never reaches the exit: its entry is
 * overwritten by the thread's next fault (counted as stale), or the thread exits with
 * it (counted as exited). The entries are global, not per CPU: a major fault sleeps
 * on I/O and may finish on another CPU.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "bits.bpf.h"
#include "maps.bpf.h"
#include "memlat.h"

#define VM_FAULT_MAJOR_BIT 0x0004
#define VM_FAULT_RETRY_BIT 0x0400
#define VM_FAULT_ERROR_BITS 0x0873	/* OOM SIGBUS HWPOISON HWPOISON_LARGE SIGSEGV FALLBACK */
#define FAULT_FLAG_TRIED_BIT 0x20

const volatile __u64 latency_unit_ns = 1000;	/* slots of usecs (1 with --ns) */
const volatile __u64 tail_ns = 8000;		/* the tail threshold */
const volatile bool per_process = false;	/* -P */
const volatile __u32 filter_pid = 0;		/* -p: thread group id, 0 = all */

/* Each thread's fault in progress, in its slot (THREAD_SLOTS). The slot keeps the tid
 * it belongs to; a thread that finds another's tid there takes the slot over
 * (counted). */
THREAD_SLOTS(starts, struct memlat_start);
HIST_MAP_DEF(hists, BPF_MAP_TYPE_PERCPU_HASH, struct memlat_key, struct memlat_hist, 10240);
/* Without -P: one histogram per kind, indexed by enum memlat_kind (no hashing). */
MAP_DEF(totals, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct memlat_hist, 2);
MAP_DEF(counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct memlat_counters, 1);

static const struct memlat_hist zero_hist;

#define COUNT(field) COUNT_ATOMIC(&counters, struct memlat_counters, field)

static __always_inline struct memlat_start *slot_of(__u32 tid)
{
	return thread_slot(&starts, starts_mask, tid);
}

/* A fault starts in this thread. A thread keeps its slot between faults (ts_ns 0 when
 * closed). */
static __always_inline void fault_start(__u32 flags)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct memlat_start *st;
	__u32 tid = id;

	if (filter_pid && (__u32)(id >> 32) != filter_pid)
		return;
	st = slot_of(tid);
	if (!st)
		return;
	if (st->tid != tid) {
		/* Another thread's slot (tids equal modulo the array size): take it. */
		if (st->ts_ns)
			COUNT(evicted);
		st->tid = tid;
		st->retrying = 0;
	} else if (st->retrying) {
		/* handle_mm_fault called again after VM_FAULT_RETRY: the same fault, started
		 * at the first call; the last call's flags decide major/minor
		 * (FAULT_FLAG_TRIED is set there when the kernel retried it). */
		st->retrying = 0;
		st->flags = flags;
		return;
	} else if (st->ts_ns) {
		COUNT(stale);
	}
	st->ts_ns = bpf_ktime_get_ns();
	st->flags = flags;
}

/* This thread's open fault, or NULL (counted unmatched). */
static __always_inline struct memlat_start *open_fault(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct memlat_start *st;

	if (filter_pid && (__u32)(id >> 32) != filter_pid)
		return NULL;
	st = slot_of(id);
	if (!st || st->tid != (__u32)id || !st->ts_ns) {
		COUNT(unmatched);
		return NULL;
	}
	return st;
}

/* The fault of this thread finished: account it as `kind`. */
static __always_inline void fault_end(struct memlat_start *st, enum memlat_kind kind)
{
	__u64 delta = bpf_ktime_get_ns() - st->ts_ns;
	struct memlat_key key = { .kind = kind };
	struct memlat_hist *h;
	__u32 idx = kind;

	st->ts_ns = 0;
	if (per_process) {
		key.pid = bpf_get_current_pid_tgid() >> 32;
		bpf_get_current_comm(&key.comm, sizeof(key.comm));
		h = lookup_or_init(&hists, &key, &zero_hist);
	} else {
		h = bpf_map_lookup_elem(&totals, &idx);
	}
	if (!h) {
		COUNT(hists_full);
		return;
	}
	/* A per-CPU value, and exits do not nest on a CPU (perf_event programs are kept
	 * from nesting by the kernel; faults do not run handle_mm_fault in interrupts):
	 * plain adds are exact and cheaper than atomics. The faults matched are the sum
	 * of the counts (plus hists_full): no counter of their own. */
	LATENCY_ADD(h, delta, latency_unit_ns, MEMLAT_BUCKETS);
	if (delta >= tail_ns)
		h->tail++;
}

/* Exit seen as a perf software event: the kind is the event's. */
static __always_inline int perf_exit(enum memlat_kind kind)
{
	struct memlat_start *st = open_fault();

	if (st)
		fault_end(st, kind);
	return 0;	/* 0: the kernel writes no perf sample */
}

/* Exit seen at the return of handle_mm_fault: decide as mm_account_fault() does. */
static __always_inline void ret_exit(__u32 ret)
{
	struct memlat_start *st = open_fault();

	if (!st)
		return;
	if (ret & VM_FAULT_RETRY_BIT) {
		st->retrying = 1;	/* not finished: mm_account_fault() waits too */
		return;
	}
	if (ret & VM_FAULT_ERROR_BITS) {
		st->ts_ns = 0;
		COUNT(failed);
		return;
	}
	fault_end(st, (ret & VM_FAULT_MAJOR_BIT) || (st->flags & FAULT_FLAG_TRIED_BIT)
			      ? MEMLAT_MAJOR
			      : MEMLAT_MINOR);
}

/* A thread exits: a fault it left open never finishes. Close the slot, so that a
 * later thread with the same tid starts afresh (not stale, not retrying). */
static __always_inline void thread_exit(__u32 tid)
{
	struct memlat_start *st = slot_of(tid);

	if (!st || st->tid != tid)
		return;
	if (st->ts_ns)
		COUNT(exited);
	st->ts_ns = 0;
	st->retrying = 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(btf_thread_exit, struct task_struct *task)
{
	thread_exit(task->pid);
	return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int tp_thread_exit(void *ctx)
{
	thread_exit(bpf_get_current_pid_tgid());
	return 0;
}

/* ---- entries: fentry, kprobe, and the page-fault tracepoints ---------------------- */

/* Every entry program is this body: a fault starts, with handle_mm_fault's flags
 * where the hook has them. `proto` is the program's signature. */
#define FAULT_ENTRY(sec, proto, flags)						\
	SEC(sec)								\
	int proto								\
	{									\
		fault_start(flags);						\
		return 0;							\
	}

FAULT_ENTRY("fentry/handle_mm_fault",
	    BPF_PROG(fentry_fault, struct vm_area_struct *vma, unsigned long address,
		     unsigned int flags), flags)
FAULT_ENTRY("kprobe/handle_mm_fault",
	    BPF_KPROBE(kprobe_fault, struct vm_area_struct *vma, unsigned long address,
		       unsigned int flags), flags)
FAULT_ENTRY("tp_btf/page_fault_user", BPF_PROG(btf_fault_user), 0)
FAULT_ENTRY("tp_btf/page_fault_kernel", BPF_PROG(btf_fault_kernel), 0)
FAULT_ENTRY("tracepoint/exceptions/page_fault_user", tp_fault_user(void *ctx), 0)
FAULT_ENTRY("tracepoint/exceptions/page_fault_kernel", tp_fault_kernel(void *ctx), 0)

/* ---- exits: fexit, kretprobe (the return value), perf events (the kind) ---------- */

SEC("fexit/handle_mm_fault")
int BPF_PROG(fexit_fault, struct vm_area_struct *vma, unsigned long address, unsigned int flags,
	     struct pt_regs *regs, vm_fault_t ret)
{
	ret_exit(ret);
	return 0;
}

SEC("kretprobe/handle_mm_fault")
int BPF_KRETPROBE(kretprobe_fault, vm_fault_t ret)
{
	ret_exit(ret);
	return 0;
}

SEC("perf_event")
int perf_fault_min(struct bpf_perf_event_data *ctx)
{
	return perf_exit(MEMLAT_MINOR);
}

SEC("perf_event")
int perf_fault_maj(struct bpf_perf_event_data *ctx)
{
	return perf_exit(MEMLAT_MAJOR);
}

char LICENSE[] SEC("license") = "GPL";
