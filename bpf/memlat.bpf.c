// SPDX-License-Identifier: GPL-2.0
/* meridian memlat: page-fault handling latency, as log2 histograms per minor/major fault
 * (and per process with -P), matched per thread (the thread half of the pid_tgid key of
 * docs/requirements/memlat-runqlat.md, "Key: pid_tgid", as an array slot). Two start
 * points (--from), one set of ends.
 *
 * --from exception (the default): a fault is a page-fault exception taken by a traced
 * thread (exceptions:page_fault_user/kernel), timed from the trap to the end of
 * handle_mm_fault(). It finishes when mm_account_fault() counts it as minor or major
 * (as getrusage's ru_minflt/ru_majflt and the perf events page-faults-min/maj do),
 * after any VM_FAULT_RETRY. Every other end is `failed`: no VMA or no access (SIGSEGV,
 * or EFAULT through the exception fixup), VM_FAULT_ERROR from handle_mm_fault (SIGBUS,
 * SIGSEGV, OOM), a kernel-address fault, a retry given up on a signal. A failed fault
 * is counted once: where fexit/kretprobe see VM_FAULT_ERROR, else when the thread's
 * next fault starts or the thread exits with it open. handle_mm_fault() calls without
 * an exception (get_user_pages(): no pt_regs, no perf event; the kernel still adds
 * them to the caller's ru_minflt) are no faults here. An end with no fault open is
 * `unmatched` (a fault in flight at attach). So one workload gives the same counts
 * under every strategy.
 *
 * Strategies for the same logic, picked at run time by autoload, best first; the entry
 * is always the exception tracepoint, the end:
 *   fentry:     fexit of handle_mm_fault: its return value and flags decide, as
 *               mm_account_fault() does (tp_btf entries);
 *   kprobe:     kretprobe of handle_mm_fault, its flags kept by a kprobe at its entry
 *               (tracepoint entries);
 *   tp_btf/tp + perf: perf_event programs on the software events page-faults-min and
 *               page-faults-maj, which mm_account_fault() emits in the faulting thread
 *               once per accounted fault.
 *
 * --from handle_mm_fault (docs/requirements/memlat-runqlat.md, "Delta t"): a fault is a
 * call of handle_mm_fault() by a traced thread, whoever the caller (the exception,
 * get_user_pages() for read(),
 * process_vm_readv(), ptrace...: every call mm_account_fault() counts in the caller's
 * ru_minflt/ru_majflt), timed from its entry to its return, which ends it as the fexit
 * path above does (ret and flags: minor, major, failed). A VM_FAULT_RETRY return is
 * no end: the caller calls again for the same address (FAULT_FLAG_TRIED, or after a
 * per-VMA-lock attempt), and the fault ends at that call's return, timed from the
 * first entry; a next call for another address means the retry was given up: failed.
 * A call that starts while the thread is inside handle_mm_fault already (a fault taken
 * within a fault handler; no kernel path does it on purpose, as the mmap lock is held)
 * is `nested`: not timed on its own, its time is part of the outer fault's, whose
 * return alone ends a fault. Strategies: hmf_fentry (fentry/fexit) and hmf_kprobe
 * (kprobe/kretprobe). A kretprobe can be missed (more threads inside handle_mm_fault
 * than its instances): a kprobe entry whose stack pointer is not below the open call's
 * is no nested call but the next call after a missed return, whose fault is counted
 * failed (as the kprobe strategy above counts it at the thread's next fault).
 *
 * The slots are global, not per CPU: a major fault sleeps on I/O and may finish on
 * another CPU.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "bits.bpf.h"
#include "maps.bpf.h"
#include "pidset.bpf.h"
#include "memlat.h"

#define VM_FAULT_MAJOR_BIT 0x0004
#define VM_FAULT_RETRY_BIT 0x0400
#define VM_FAULT_ERROR_BITS 0x0873	/* OOM SIGBUS HWPOISON HWPOISON_LARGE SIGSEGV FALLBACK */
#define FAULT_FLAG_TRIED_BIT 0x20

const volatile __u64 latency_unit_ns = 1000;	/* slots of usecs (1 with --ns) */
const volatile __u64 tail_ns = 8000;		/* the tail threshold */
const volatile bool per_process = false;	/* -P */
const volatile bool filter_pid = false;		/* -p: only the processes in `pids` */

/* Each thread's fault in progress, in its slot (THREAD_SLOTS). The slot keeps the tid
 * it belongs to; a thread whose fault starts where another's tid is takes the slot over
 * (counted). */
THREAD_SLOTS(starts, struct memlat_start);
HIST_MAP_DEF(hists, BPF_MAP_TYPE_PERCPU_HASH, struct memlat_key, struct memlat_hist, 10240);
/* Without -P: one histogram per kind, indexed by enum memlat_kind (no hashing). */
MAP_DEF(totals, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct memlat_hist, 2);
MAP_DEF(counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct memlat_counters, 1);
/* -p: the thread group ids traced, written before attach (sized by user space); its
 * change count is 0 (pidset.bpf.h). */
MAP_DEF(pids, BPF_MAP_TYPE_HASH, __u32, __u8, 1);
PID_MEMO_DEF(pid_memo);

static const struct memlat_hist zero_hist;

#define COUNT(field) COUNT_ATOMIC(&counters, struct memlat_counters, field)

/* Is the thread `id` (pid_tgid) traced (-p)? */
static __always_inline bool traced(__u64 id)
{
	return !filter_pid || pid_in_set(&pid_memo, &pids, id >> 32, 0);
}

/* The slot of thread `tid`, whichever thread holds it. */
static __always_inline struct memlat_start *slot_of(__u32 tid)
{
	return thread_slot(&starts, starts_mask, tid);
}

/* The slot of thread `id` (pid_tgid) as a fault starts in it, NULL if the thread is not
 * traced. A thread keeps its slot between faults (ts_ns 0 when closed); it takes over
 * another thread's (tids equal modulo the array size), whose open fault is `evicted`. */
static __always_inline struct memlat_start *claim_slot(__u64 id)
{
	struct memlat_start *st;

	if (!traced(id))
		return NULL;
	st = slot_of(id);
	if (st && st->tid != (__u32)id) {
		if (st->ts_ns)
			COUNT(evicted);
		st->tid = id;
		st->ts_ns = 0;
		st->in_call = 0;
	}
	return st;
}

/* A page-fault exception: a fault starts in this thread. */
static __always_inline void fault_start(void)
{
	struct memlat_start *st = claim_slot(bpf_get_current_pid_tgid());

	if (!st)
		return;
	if (st->ts_ns)
		COUNT(failed);	/* the thread's previous fault never got accounted */
	st->ts_ns = bpf_ktime_get_ns();
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

/* The kernel accounted this thread's fault as `kind`: close it, or count an end
 * without a start (unmatched). */
static __always_inline void fault_accounted(struct memlat_start *st, __u32 tid,
					    enum memlat_kind kind)
{
	if (st && st->tid == tid && st->ts_ns)
		fault_end(st, kind);
	else
		COUNT(unmatched);
}

/* Exit seen as a perf software event: the kind is the event's. */
static __always_inline int perf_exit(enum memlat_kind kind)
{
	__u64 id = bpf_get_current_pid_tgid();

	if (traced(id))
		fault_accounted(slot_of(id), id, kind);
	return 0;	/* 0: the kernel writes no perf sample */
}

/* handle_mm_fault(), called for an exception (regs given), returned `ret` to this
 * thread (whose slot is `st`, possibly another's): end the fault as mm_account_fault()
 * does with the same ret and flags, so exactly when the perf events fire. */
static __always_inline void fault_return(struct memlat_start *st, __u32 tid, __u32 ret,
					 __u32 flags)
{
	if (ret & VM_FAULT_RETRY_BIT)
		return;	/* not finished: the exception calls handle_mm_fault again */
	if (ret & VM_FAULT_ERROR_BITS) {
		/* Failed: counted now, not at the thread's next fault or exit. */
		if (st && st->tid == tid && st->ts_ns) {
			st->ts_ns = 0;
			COUNT(failed);
		}
		return;
	}
	fault_accounted(st, tid, (ret & VM_FAULT_MAJOR_BIT) || (flags & FAULT_FLAG_TRIED_BIT)
					 ? MEMLAT_MAJOR
					 : MEMLAT_MINOR);
}

/* A thread exits: a fault it left open never finishes (failed). Close the slot, so that
 * a later thread with the same tid starts afresh. */
static __always_inline void thread_exit(__u32 tid)
{
	struct memlat_start *st = slot_of(tid);

	if (!st || st->tid != tid)
		return;
	if (st->ts_ns)
		COUNT(failed);
	st->ts_ns = 0;
	st->in_call = 0;
	st->sp = 0;
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

/* ---- entries: the page-fault exception, under every strategy ---------------------- */

SEC("tp_btf/page_fault_user")
int BPF_PROG(btf_fault_user)
{
	fault_start();
	return 0;
}

SEC("tp_btf/page_fault_kernel")
int BPF_PROG(btf_fault_kernel)
{
	fault_start();
	return 0;
}

SEC("tracepoint/exceptions/page_fault_user")
int tp_fault_user(void *ctx)
{
	fault_start();
	return 0;
}

SEC("tracepoint/exceptions/page_fault_kernel")
int tp_fault_kernel(void *ctx)
{
	fault_start();
	return 0;
}

/* ---- ends: fexit, kretprobe (the return value), perf events (the kind) ------------ */

SEC("fexit/handle_mm_fault")
int BPF_PROG(fexit_fault, struct vm_area_struct *vma, unsigned long address, unsigned int flags,
	     struct pt_regs *regs, vm_fault_t ret)
{
	__u64 id = bpf_get_current_pid_tgid();

	/* regs NULL: get_user_pages(), no exception, no fault here (nor a perf event) */
	if (regs && traced(id))
		fault_return(slot_of(id), id, ret, flags);
	return 0;
}

/* A kretprobe sees neither the arguments nor whether the call had regs: the kprobe at
 * the entry marks the slot of a call for an exception (in_call) and keeps its flags.
 * One case differs from the other strategies: a call whose slot holds another thread's
 * open fault (tids equal modulo the array size) is not marked, so its end is not
 * counted unmatched. */
SEC("kprobe/handle_mm_fault")
int BPF_KPROBE(kprobe_fault, struct vm_area_struct *vma, unsigned long address,
	       unsigned int flags, struct pt_regs *regs)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct memlat_start *st;

	if (!traced(id))
		return 0;
	st = slot_of(id);
	if (!st)
		return 0;
	if (!regs) {
		/* get_user_pages(): its return is no fault's end (even after a missed
		 * kretprobe left in_call set) */
		if (st->tid == (__u32)id)
			st->in_call = 0;
		return 0;
	}
	if (st->tid != (__u32)id) {
		if (st->ts_ns)
			return 0;
		st->tid = id;	/* a closed slot: taking it loses nothing */
	}
	st->in_call = 1;
	st->flags = flags;
	return 0;
}

SEC("kretprobe/handle_mm_fault")
int BPF_KRETPROBE(kretprobe_fault, vm_fault_t ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct memlat_start *st = slot_of(id);

	if (!st || st->tid != (__u32)id || !st->in_call)
		return 0;	/* get_user_pages(), or not traced */
	st->in_call = 0;
	fault_return(st, id, ret, st->flags);
	return 0;
}

/* ---- --from handle_mm_fault: entry and return of every call ---------------------- */

#define NESTED_MAX 8	/* in_call's bound (a deeper nesting than 2 is not seen) */

/* handle_mm_fault(address, flags) entered by this thread. `sp`: the stack pointer at
 * the entry (kprobe), 0 where entries and returns always pair (fentry/fexit). */
static __always_inline void hmf_entry(__u64 address, __u32 flags, __u64 sp)
{
	struct memlat_start *st = claim_slot(bpf_get_current_pid_tgid());
	__u64 page = address >> 12;

	if (!st)
		return;
	if (st->in_call) {
		if (!sp || sp < st->sp) {
			/* Within the open call: part of its time, no fault of its own. */
			COUNT(nested);
			if (st->in_call < NESTED_MAX)
				st->in_call++;
			return;
		}
		/* Not below the open call on the stack: that call's kretprobe was missed. */
		if (st->ts_ns)
			COUNT(failed);
		st->ts_ns = 0;
		st->in_call = 0;
	}
	if (st->ts_ns && st->address != page) {
		/* A retried fault whose caller gave up (another address now): failed. */
		COUNT(failed);
		st->ts_ns = 0;
	}
	if (!st->ts_ns)
		st->ts_ns = bpf_ktime_get_ns();	/* else the retry: timed from the first */
	st->address = page;
	st->sp = sp;
	st->flags = flags;
	st->in_call = 1;
}

/* handle_mm_fault() returned `ret` to this thread: the end of the outermost call ends
 * its fault (or not, on VM_FAULT_RETRY) as the exception path's fexit does. */
static __always_inline void hmf_return(__u32 ret, __u32 flags, bool have_flags)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct memlat_start *st;

	if (!traced(id))
		return;
	st = slot_of(id);
	if (!st || st->tid != (__u32)id || !st->in_call) {
		COUNT(unmatched);	/* a call in flight at attach */
		return;
	}
	st->in_call--;
	if (st->in_call)
		return;	/* a nested call's return (counted at its entry) */
	fault_return(st, id, ret, have_flags ? flags : st->flags);
}

SEC("fentry/handle_mm_fault")
int BPF_PROG(fentry_hmf, struct vm_area_struct *vma, unsigned long address, unsigned int flags)
{
	hmf_entry(address, flags, 0);
	return 0;
}

SEC("fexit/handle_mm_fault")
int BPF_PROG(fexit_hmf, struct vm_area_struct *vma, unsigned long address, unsigned int flags,
	     struct pt_regs *regs, vm_fault_t ret)
{
	hmf_return(ret, flags, true);
	return 0;
}

SEC("kprobe/handle_mm_fault")
int BPF_KPROBE(kprobe_hmf, struct vm_area_struct *vma, unsigned long address,
	       unsigned int flags)
{
	__u64 sp = PT_REGS_SP(ctx);

	hmf_entry(address, flags, sp ? sp : 1);
	return 0;
}

SEC("kretprobe/handle_mm_fault")
int BPF_KRETPROBE(kretprobe_hmf, vm_fault_t ret)
{
	hmf_return(ret, 0, false);
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
