/* Record and key layouts of `meridian io`: the one definition that both the kernel
 * program and the Python decoder (through BTF) read. */
#ifndef MERIDIAN_IO_H
#define MERIDIAN_IO_H

/* Latency histograms: log-linear buckets of ns (bits.bpf.h), HIST_BUCKETS(34): values
 * below 2^34 ns (17 s), above in the last bucket (the exact max says how far). A value
 * is then 4.1 KB (496 __u64: a __u32 would wrap after 2^32 samples of one key on one
 * CPU, an hour at this VM's 1.2 M/s, and which bucket wrapped cannot be told), of every
 * possible CPU: the maps that hold it are not preallocated (HIST_MAP_DEF), so a 64-CPU
 * host pays 64 x 4.1 KB = 262 KB per (process, op, cached) key in use, rather than
 * 8192 x 64 x 4.1 KB = 2.1 GB per map up front (the log2 slots took 214 MB). */
#define IO_HIST_BUCKETS ((1 + 34 - 4) * 16)
#define IO_COMM_LEN 16
#define IO_MAX_IOV 16		/* iovecs summed for bytes_requested of readv/writev */

/* Bit 0: the direction; bit 1: submitted through io_uring, not a syscall of its own. */
enum io_op {
	IO_OP_READ,
	IO_OP_WRITE,
	IO_OP_URING_READ,
	IO_OP_URING_WRITE,
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
	__u64 latency_min_ns;	/* 0: none yet */
	__u64 latency_max_ns;
	__u64 first_ns;		/* CLOCK_MONOTONIC of the first and last completion */
	__u64 last_ns;
	__u64 buckets[IO_HIST_BUCKETS];	/* latency_ns, log-linear (bits.bpf.h) */
	char comm[IO_COMM_LEN];
	__u64 cgroup_id;	/* the process's cgroup v2 id when the entry was made: its
				 * container (containers.py) */
};

/* An entry of `stats_cache`: one key's aggregates on one CPU, kept outside the
 * `stats` hash so that its operations skip the hash lookup (io.bpf.c). */
struct fileio_cached {
	__u64 tag;		/* the owner, pid << 32 | start; 0: free; ~0: being claimed */
	struct fileio_stats s;
};

/* Block requests per submitting process and op: what reached the device, with the
 * device-level latency (issue to completion). */
struct fileio_disk_key {
	__u32 pid;
	__u32 op;		/* enum io_op */
	__u32 start;		/* as in fileio_key */
	__u32 dev;		/* `writeback` map: the device (kernel dev_t); 0 in disk_io */
};

struct fileio_disk_stats {
	__u64 requests;
	__u64 bytes;
	__u64 latency_sum_ns;
	__u64 latency_min_ns;	/* 0: none yet */
	__u64 latency_max_ns;
	__u64 buckets[IO_HIST_BUCKETS];	/* device latency in ns, log-linear (bits.bpf.h) */
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
	__u64 wb_unattributed;	/* write requests a kernel thread issued for pages whose
				 * dirtier is unknown (dirtied before tracing started, by a
				 * kernel thread, or forgotten by the `dirtiers` LRU) */
	__u64 wb_dirtiers;	/* entries put into `dirtiers` (user space: minus the live
				 * ones, the evicted) */
	__u64 names_lost;	/* name records the `names` ring had no room for */
	__u64 uring_untracked;	/* io_uring reads and writes not counted: the map of those
				 * in flight was full (io_uring.bpf.h) */
};

#define IO_PATH_LEN 256		/* a file's path, resolved in the kernel */

/* A file's path, sent once per inode (again when it is renamed or unlinked) through the
 * `names` ring before any event that names the inode (io_names.bpf.h). */
struct fileio_name {
	__u64 ts_ns;		/* CLOCK_MONOTONIC when sent: before the operation's start */
	__u64 ino;
	__u32 dev;		/* kernel dev_t of the file's super block */
	__u32 len;		/* bytes of path, NUL excluded; 0: not resolved */
	__u32 deleted;		/* unlinked while open */
	__u32 pad;
	char path[IO_PATH_LEN];
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
	__s64 sector;		/* start sector (512 B, of the whole disk, as the block
				 * tracepoints give it) of the first bio with data of the
				 * operation's direction that it submitted; -1: none. Last,
				 * so the fields before keep their offsets. */
};

#endif
