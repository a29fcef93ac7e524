/* Record and key layouts of `meridian io`: the one definition that both the kernel
 * program and the Python decoder (through BTF) read. */
#ifndef MERIDIAN_IO_H
#define MERIDIAN_IO_H

#define IO_MAX_SLOTS 40		/* log2(latency in ns): up to 2^40 ns, about 18 minutes */
#define IO_COMM_LEN 16
#define IO_MAX_IOV 16		/* iovecs summed for bytes_requested of readv/writev */

enum io_op {
	IO_OP_READ,
	IO_OP_WRITE,
};

/* Exact aggregate key: one per process, operation and cached/disk. */
struct fileio_key {
	__u32 pid;
	__u32 op;		/* enum io_op */
	__u32 cached;		/* 1: no page-cache insertion, no block I/O, no I/O wait */
	__u32 start;		/* process start, clock ticks since boot (/proc/PID/stat
				 * field 22): a reused PID is another process */
};

/* Per-CPU values of the aggregate map; user space sums over CPUs. */
struct fileio_stats {
	__u64 ops;
	__u64 bytes;		/* returned by the syscalls */
	__u64 bytes_requested;
	__u64 disk_bytes;	/* pages inserted (reads) or bio bytes submitted in flight */
	__u64 io_wait_ns;
	__u64 latency_sum_ns;
	__u64 latency_max_ns;
	__u64 first_ns;		/* CLOCK_MONOTONIC of the first and last completion */
	__u64 last_ns;
	__u64 slots[IO_MAX_SLOTS];	/* log2(latency_ns) */
	char comm[IO_COMM_LEN];
};

/* Block requests per submitting process and op: what reached the device, with the
 * device-level latency (issue to completion). */
struct fileio_disk_key {
	__u32 pid;
	__u32 op;		/* enum io_op */
	__u32 start;		/* as in fileio_key */
	__u32 pad;
};

struct fileio_disk_stats {
	__u64 requests;
	__u64 bytes;
	__u64 latency_sum_ns;
	__u64 latency_max_ns;
	__u64 slots[IO_MAX_SLOTS];	/* log2(device latency in ns) */
	char comm[IO_COMM_LEN];
};

/* Everything the tool drops or cannot match, counted per CPU, never silently. */
struct fileio_counters {
	__u64 events_lost;	/* ring buffer reservations that failed */
	__u64 evicted;		/* operations not tracked: a thread whose tid shares the
				 * slot (tid % slots) took it over while they were in flight */
	__u64 stats_full;	/* operations not aggregated: aggregate map full */
	__u64 failed;		/* syscalls that returned an error (not aggregated) */
	__u64 disk_full;	/* block requests not aggregated: per-PID disk map full */
};

/* One read or write on a regular file, streamed through the ring buffer. */
struct fileio_event {
	__u64 ts_ns;		/* CLOCK_MONOTONIC at completion */
	__u64 latency_ns;
	__u64 bytes;
	__u64 bytes_requested;
	__u64 disk_bytes;
	__u64 io_wait_ns;
	__u64 ino;
	__u64 disk_latency_ns;	/* device time (issue to completion) of the block requests
				 * the operation submitted and saw complete, summed */
	__u32 dev;		/* kernel dev_t of the file's super block */
	__u32 pid;
	__u32 tid;
	__s32 fd;		/* -1 where the hook does not know it (vfs_read/vfs_write) */
	__u32 op;		/* enum io_op */
	__u32 cached;
	__u32 disk_requests;	/* those block requests */
	char comm[IO_COMM_LEN];
};

#endif
