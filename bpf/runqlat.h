/* Key and value layouts of `meridian runqlat`: the one definition that both the
 * kernel program and the Python decoder (through BTF) read. */
#ifndef MERIDIAN_RUNQLAT_H
#define MERIDIAN_RUNQLAT_H

#define RUNQLAT_MAX_SLOTS 32
#define RUNQLAT_COMM_LEN 16

/* Histogram key: pid 0 and no comm unless -P. */
struct runqlat_key {
	__u32 pid;	/* thread group id with -P */
	char comm[RUNQLAT_COMM_LEN];
};

/* Per-CPU value: user space sums the CPUs (and takes the largest max). */
struct runqlat_hist {
	__u64 slots[RUNQLAT_MAX_SLOTS];	/* log2(run-queue latency in usecs or msecs) */
	__u64 sum_ns;
	__u64 max_ns;
};

/* A thread's wait in progress (ts_ns 0 when not waiting), in the slot tid % size. */
struct runqlat_start {
	__u64 ts_ns;
	__u32 tid;	/* the thread the slot belongs to */
	__u32 pad;
};

struct runqlat_counters {
	__u64 enqueued;		/* wake-ups and preemptions recorded */
	__u64 matched;		/* of those, switched in: the histogram total */
	__u64 hists_full;	/* samples not counted: histogram map full */
};

#endif
