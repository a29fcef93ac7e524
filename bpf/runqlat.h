/* Key and value layouts of `meridian runqlat`: the one definition that both the
 * kernel program and the Python decoder (through BTF) read. */
#ifndef MERIDIAN_RUNQLAT_H
#define MERIDIAN_RUNQLAT_H

/* Log-linear buckets (bits.bpf.h) of values below 2^32 units (log2 slots 0-31, as
 * before): 3.7 KB a value per CPU, in a map not preallocated (HIST_MAP_DEF): a 64-CPU
 * host pays 238 KB per process in use with -P, not 10240 x 64 x 3.7 KB = 2.4 GB up front
 * (the log2 slots took 178 MB). */
#define RUNQLAT_BUCKETS ((1 + 32 - 4) * 16)
#define RUNQLAT_COMM_LEN 16

/* Histogram key: pid 0 and no comm unless -P. */
struct runqlat_key {
	__u32 pid;	/* thread group id with -P */
	char comm[RUNQLAT_COMM_LEN];
};

/* Per-CPU value: user space sums the CPUs (and takes the largest max). */
struct runqlat_hist {
	__u64 sum_ns;
	__u64 min_ns;	/* 0: none yet */
	__u64 max_ns;
	__u64 buckets[RUNQLAT_BUCKETS];	/* run-queue latency in usecs or msecs, log-linear */
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
	__u64 pids_full;	/* tracepoints with -p: new threads not followed, set full */
};

#endif
