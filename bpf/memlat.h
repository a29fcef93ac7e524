/* Key and value layouts of `meridian memlat`: the one definition that both the
 * kernel program and the Python decoder (through BTF) read. */
#ifndef MERIDIAN_MEMLAT_H
#define MERIDIAN_MEMLAT_H

/* Log-linear buckets (bits.bpf.h) of values below 2^32 units (log2 slots 0-31, as
 * before): 3.7 KB a value per CPU, in a map not preallocated (HIST_MAP_DEF): a 64-CPU
 * host pays 238 KB per process in use with -P, not 10240 x 64 x 3.7 KB = 2.4 GB up front
 * (the log2 slots took 184 MB). */
#define MEMLAT_BUCKETS ((1 + 32 - 4) * 16)
#define MEMLAT_COMM_LEN 16

enum memlat_kind {
	MEMLAT_MINOR,	/* served without I/O */
	MEMLAT_MAJOR,	/* needed I/O (or was retried), as mm_account_fault() decides */
};

/* Histogram key: one histogram per kind, and per process with -P (else pid 0). */
struct memlat_key {
	__u32 pid;	/* thread group id, 0 unless -P */
	enum memlat_kind kind;
	char comm[MEMLAT_COMM_LEN];	/* empty unless -P */
};

/* Per-CPU value: user space sums the CPUs (and takes the largest max). */
struct memlat_hist {
	__u64 sum_ns;
	__u64 min_ns;	/* 0: none yet */
	__u64 max_ns;
	__u64 tail;	/* faults at or above the tail threshold, counted exactly */
	__u64 buckets[MEMLAT_BUCKETS];	/* latency in usecs (nsecs with --ns), log-linear */
};

/* A thread's fault in progress (ts_ns 0 between faults), in the slot tid % size. */
struct memlat_start {
	__u64 ts_ns;	/* the fault's start: the page-fault exception, or (--from
			 * handle_mm_fault) the entry of its first handle_mm_fault call */
	__u64 address;	/* --from handle_mm_fault: the page number (address >> 12) of
			 * the fault, to tell its retry from a new fault */
	__u64 sp;	/* --from handle_mm_fault, kprobe: the stack pointer at the entry
			 * of the open call (a nested call's is below it) */
	__u32 tid;	/* the thread the slot belongs to */
	__u16 flags;	/* kprobe paths: handle_mm_fault's flags at its last (outermost)
			 * call, low 16 bits (only FAULT_FLAG_TRIED, 0x20, is read) */
	__u16 in_call;	/* kprobe path: in handle_mm_fault called for an exception;
			 * --from handle_mm_fault: the calls open (1, more when nested) */
};

/* Every fault the histograms do not hold, counted per CPU, never silently. Faults
 * started and matched are not counted here (one atomic add fewer per fault each): the
 * matched ones are the histograms' total plus hists_full, the open ones are the slots
 * with a start time, and every other start ended as failed or evicted. The same
 * workload gives the same counts under every strategy (memlat.bpf.c). */
struct memlat_counters {
	__u64 failed;		/* faults the kernel did not account as minor or major (no
				 * VMA or access: SIGSEGV/EFAULT; VM_FAULT_ERROR: SIGBUS...):
				 * seen in handle_mm_fault's return value, or open when the
				 * thread's next fault started or the thread exited */
	__u64 unmatched;	/* faults accounted without a start (in flight at attach) */
	__u64 evicted;		/* open faults whose slot another thread took (tids equal
				 * modulo the slot array's size; never when it is pid_max) */
	__u64 hists_full;	/* samples not counted: histogram map full */
	__u64 nested;		/* --from handle_mm_fault: calls entered while the thread was
				 * inside handle_mm_fault already (part of the outer call's
				 * time, not timed on their own) */
};

#endif
