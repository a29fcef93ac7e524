// SPDX-License-Identifier: GPL-2.0
/* meridian io: every read and write on a regular file, per thread, with its latency
 * and whether the page cache served it.
 *
 * Four strategies for the syscall side, picked at run time by autoload:
 *   fentry_* / fexit_*: trampolines on the syscalls' own functions (__x64_sys_*);
 *   ks_* / kr_*:        kprobes on the syscalls (libbpf's ksyscall);
 *   raw_*:              tp_btf raw syscalls sys_enter/sys_exit with a syscall-id filter;
 *   tp_*:               the syscalls:sys_enter_* / sys_exit_* tracepoints.
 * Each is one thin pair of programs per syscall around the same two bodies, enter_sys()
 * and finish_op() (io_syscalls.bpf.h; the disk signals and block layer: io_block.bpf.h).
 * The disk signals are shared by all of them: a page inserted into the page cache by the
 * thread (filemap:mm_filemap_add_to_page_cache), a bio it submits (block:block_bio_queue)
 * and the time it sleeps in I/O wait (sched_switch with in_iowait), each only while
 * the thread has a read or write in flight. An operation with none of them is cached.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "bits.bpf.h"
#include "maps.bpf.h"
#include "task.bpf.h"
#include "pidset.bpf.h"
#include "io.h"

#define S_IFMT 0170000
#define S_IFREG 0100000
#define PAGE_SIZE_BYTES 4096
#define MAX_RW_COUNT (0x7fffffff & ~(PAGE_SIZE_BYTES - 1))	/* include/linux/fs.h */

const volatile bool filter_pid = false;		/* only PIDs in `pids` */
const volatile bool filter_comm = false;	/* only comms in `comms` */
const volatile __u64 filter_cgroup = 0;		/* cgroup v2 id (its directory's inode), 0: all */
const volatile __u32 cgroup_level = 0;		/* its depth below the cgroup2 root */
const volatile __u32 self_pid = 0;		/* the agent: never traced */
const volatile bool events_on = true;
const volatile bool disk_only = false;
const volatile __u64 min_latency_ns = 0;
const volatile __u64 wakeup_bytes = 1;
const volatile __u64 tick_ns = 10000000;	/* 1 s / CLK_TCK: /proc/PID/stat's time unit */

/* An operation in flight on a thread, and the disk signals seen meanwhile. */
struct fileio_inflight {
	__u64 start_ns;
	__u64 bytes_requested;
	__u64 pos;		/* file offset at the start */
	__u64 ino;
	__u64 pages;		/* pages inserted for this operation (its range, or metadata) */
	__u64 bio_bytes;	/* bytes of bios this thread submitted */
	__u64 io_wait_ns;	/* time asleep in I/O wait */
	__u64 wait_start_ns;	/* non-zero while asleep in I/O wait */
	__u64 wbio_bytes;	/* the part of bio_bytes that writes */
	__u64 ino2;		/* copies (sendfile, copy_file_range) between two regular */
	__u32 dev2;		/* files: the target, written; the source is ino/dev, read */
	__s32 fd2;
	__u32 dev;
	__s32 fd;
	__u32 op;
	__u32 pair;		/* 1: a copy, a read of ino and a write of ino2 */
	__u32 tid;		/* the thread the slot belongs to */
	__u32 disk_requests;	/* block requests it submitted that completed, */
	__u64 disk_latency_ns;	/* and their device time (issue to completion) */
	__s64 rsector;		/* start sector of the first read bio it submitted, */
	__s64 wsector;		/* of the first write bio; -1: none yet */
};

/* Each thread's operation in flight, in the slot tid % the array's size (user space
 * sizes it to pid_max when it can, so live threads never share a slot). An array
 * lookup is a few inlined instructions; task-local storage and hash maps are helper
 * calls, and on a host with return-thunk mitigations (this VM: Safe RET) every call
 * costs tens of ns. A thread that finds another's tid in its slot takes the slot over;
 * the other thread's operation, if one was in flight, is counted as evicted. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 32768);	/* a power of two: resized before load */
	__type(key, __u32);
	__type(value, struct fileio_inflight);
} inflight SEC(".maps");

const volatile __u32 inflight_mask = 32768 - 1;	/* max_entries of inflight - 1 */

/* Pages a read inserted ahead of its own range (readahead): data that came from the
 * disk for the reads that follow. A later read of those pages is served by the disk,
 * even when the readahead I/O finished before it started, and takes them as its
 * disk_bytes, so the disk_bytes of a sequential pass add up to the file's size. */
struct ahead_key {
	__u64 ino;
	__u32 dev;
	__u32 pad;
};

struct ahead_range {
	__u64 lo;		/* page indices [lo, hi) */
	__u64 hi;
};

MAP_DEF(ahead, BPF_MAP_TYPE_LRU_HASH, struct ahead_key, struct ahead_range, 4096);

HIST_MAP_DEF(stats, BPF_MAP_TYPE_PERCPU_HASH, struct fileio_key, struct fileio_stats, 8192);

/* In front of `stats`, a cache of aggregates per CPU: `cache_ways` entries per CPU and
 * (op, cached); a process may use two of them (by a hash of it, and the neighbour). An
 * operation whose process owns an entry updates it in place: an array lookup (a few
 * inlined instructions) and the CPU's id (inlined on x86 since 6.10), not the hash
 * lookup (a helper call and a hash: most of what io costs a pread above two clock
 * reads). Entries never move into the hash, so user space adds each live entry to its
 * key's per-CPU values and never counts one twice. A free entry is claimed with a
 * compare-and-swap (through a "being claimed" tag, so a preempted claimer and the owner
 * never write one entry at once); one owned by another live process sends the operation
 * to the hash, as before; one whose owner user space has let go (its tag in
 * `stats_retired`: the process gone, its numbers read and kept in user space) is
 * claimed again. User space never writes an entry. */
#define STATS_CLAIMING (~0ULL)

/* Both resized by user space: possible CPUs x cache_ways x 4 entries. */
MAP_DEF(stats_cache, BPF_MAP_TYPE_ARRAY, __u32, struct fileio_cached, 1);
MAP_DEF(stats_retired, BPF_MAP_TYPE_ARRAY, __u32, __u64, 1);

const volatile __u32 cache_ways = 0;	/* a power of two; 0: no cache */

/* A block request in flight, by its struct request pointer: who submitted it
 * (block_io_start runs in the submitting thread) and when the device got it. */
struct rq_owner {
	__u64 op_start;		/* start_ns of the submitter's operation then, 0: none */
	__u64 issue_ns;
	__u32 pid;
	__u32 tid;
	__u32 start;		/* process start (proc_start) */
	__u32 dev;		/* non-zero: written back on behalf of pid, on this device
				 * (io_writeback.bpf.h) */
	char comm[IO_COMM_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);	/* merged-away requests never complete */
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct rq_owner);
} rqs SEC(".maps");

HIST_MAP_DEF(disk_io, BPF_MAP_TYPE_PERCPU_HASH, struct fileio_disk_key, struct fileio_disk_stats, 8192);

MAP_DEF(pids, BPF_MAP_TYPE_HASH, __u32, __u8, 1024);
/* Written before attach only: its change count is 0 (pidset.bpf.h). */
PID_MEMO_DEF(pid_memo);

MAP_DEF(comms, BPF_MAP_TYPE_HASH, char[IO_COMM_LEN], __u8, 64);

MAP_DEF(counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct fileio_counters, 1);

RINGBUF_DEF(events, 1 << 24);

EXPORT_RECORD(fileio_event);

/* Threads asleep in I/O wait with an operation in flight: while zero, sched_switch
 * skips the lookup of the next task. */
__u64 iowaiters = 0;
/* Entries of `ahead` (an upper bound: LRU evictions are not subtracted): while zero,
 * a read skips the lookup. */
__u64 ahead_live = 0;

static const struct fileio_stats zero_stats;
static const struct fileio_disk_stats zero_disk;

#define COUNT(field)                                                        \
	do {                                                                \
		__u32 zero = 0;                                             \
		struct fileio_counters *c = bpf_map_lookup_elem(&counters, &zero); \
		if (c)                                                      \
			c->field++;                                         \
	} while (0)

/* The slot of thread tid (never NULL: the index is masked into the array). */
static __always_inline struct fileio_inflight *slot_of(__u32 tid)
{
	__u32 idx = tid & inflight_mask;

	return bpf_map_lookup_elem(&inflight, &idx);
}

/* Thread tid's operation in flight, or NULL. */
static __always_inline struct fileio_inflight *busy_slot(__u32 tid)
{
	struct fileio_inflight *st = slot_of(tid);

	if (!st || st->tid != tid || !st->start_ns)
		return NULL;
	return st;
}

static __always_inline bool traced(__u32 pid)
{
	if (pid == self_pid)
		return false;
	if (filter_pid && !pid_in_set(&pid_memo, &pids, pid, 0))
		return false;
	/* The cgroup or any cgroup below it: its ancestor at the cgroup's own depth. */
	if (filter_cgroup && bpf_get_current_ancestor_cgroup_id(cgroup_level) != filter_cgroup)
		return false;
	if (filter_comm) {
		char comm[IO_COMM_LEN] = {};

		bpf_get_current_comm(comm, sizeof(comm));
		if (!bpf_map_lookup_elem(&comms, comm))
			return false;
	}
	return true;
}

/* The inode of a regular file, or NULL. f (from fd_file()) and the inode: read with
 * KFIELD (kread.bpf.h). */
static __always_inline struct inode *regular_inode(struct file *f)
{
	struct inode *inode = f ? KFIELD(f, f_inode) : NULL;

	if (!inode || (KFIELD(inode, i_mode) & S_IFMT) != S_IFREG)
		return NULL;
	return inode;
}

#include "io_names.bpf.h"	/* note_name(): each file's path, once per inode */

static __always_inline struct fileio_inflight *start_op(__u32 tid, struct file *f, int fd,
							enum io_op op, __u64 bytes_requested,
							__s64 pos)
{
	struct inode *inode = regular_inode(f);
	struct fileio_inflight *st;

	if (!inode)
		return NULL;
	note_name(f, inode);
	/* A thread keeps its slot from one operation to the next (start_ns 0: idle). */
	st = slot_of(tid);
	if (!st)
		return NULL;
	if (st->tid != tid) {
		if (st->start_ns)
			COUNT(evicted);
		st->tid = tid;
	}
	if (pos < 0)
		pos = KFIELD(f, f_pos);
	/* What the kernel will move at most (rw_verify_area and sendfile, copy_file_range
	 * clamp to it): cat asks copy_file_range for 0x7fffffffc0000000 bytes, and two of
	 * those summed wrapped the process's total around 2^64. */
	if (bytes_requested > MAX_RW_COUNT)
		bytes_requested = MAX_RW_COUNT;
	st->bytes_requested = bytes_requested;
	st->pos = pos;
	st->ino = KFIELD(inode, i_ino);
	st->dev = KFIELD(inode, i_sb, s_dev);
	st->fd = fd;
	st->op = op;
	st->pair = 0;
	st->pages = 0;
	st->bio_bytes = 0;
	st->wbio_bytes = 0;
	st->io_wait_ns = 0;
	st->wait_start_ns = 0;
	st->disk_requests = 0;
	st->disk_latency_ns = 0;
	st->rsector = -1;
	st->wsector = -1;
	st->start_ns = bpf_ktime_get_ns();
	return st;
}

/* pos < 0: the file's own offset (read, readv, preadv2 with -1). */
static __always_inline void enter_fd(int fd, enum io_op op, __u64 bytes_requested, __s64 pos)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct file *f;

	if (!traced(task->tgid))
		return;
	f = fd_file(task, fd);
	if (f)
		start_op(task->pid, f, fd, op, bytes_requested, pos);
}

/* sendfile and copy_file_range: a copy from in_fd to out_fd. Whichever side is a
 * regular file is traced: the source as a read, the target as a write, both of the
 * bytes the syscall returns (one operation each, same latency, when both are).
 * in_pos / out_pos: the offsets, -1 for the file's own. */
static __always_inline void enter_copy(int in_fd, __s64 in_pos, int out_fd, __s64 out_pos,
				       __u64 count)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct fileio_inflight *st;
	struct inode *target;
	struct file *fout;

	if (!traced(task->tgid))
		return;
	fout = fd_file(task, out_fd);
	target = regular_inode(fout);
	st = start_op(task->pid, fd_file(task, in_fd), in_fd, IO_OP_READ, count, in_pos);
	if (st && target) {
		note_name(fout, target);
		st->ino2 = KFIELD(target, i_ino);
		st->dev2 = KFIELD(target, i_sb, s_dev);
		st->fd2 = out_fd;
		st->pair = 1;
	} else if (!st && target) {
		start_op(task->pid, fout, out_fd, IO_OP_WRITE, count, out_pos);
	}
}

/* An offset behind a user's pointer, -1 (the file's own) for NULL. */
static __always_inline __s64 read_pos(const loff_t *p)
{
	loff_t pos = -1;

	if (p && bpf_probe_read_user(&pos, sizeof(pos), p))
		pos = -1;
	return pos;
}

/* Sum of the iov_len of a user iovec array (the first IO_MAX_IOV of them). */
static __always_inline __u64 iov_bytes(const struct iovec *iov, unsigned long vlen)
{
	__u64 total = 0;

	for (int i = 0; i < IO_MAX_IOV; i++) {
		__u64 len = 0;

		if (i >= vlen)
			break;
		if (bpf_probe_read_user(&len, sizeof(len), &iov[i].iov_len))
			break;
		total += len;
	}
	return total;
}

/* Pages of [pos, pos + ret) that an earlier read inserted ahead: taken, so no other
 * read counts them again. */
static __always_inline __u64 take_ahead(struct fileio_inflight *st, long ret)
{
	struct ahead_key k = { .ino = st->ino, .dev = st->dev };
	struct ahead_range *r;
	__u64 s, e, lo, hi;

	if (!ahead_live)
		return 0;
	r = bpf_map_lookup_elem(&ahead, &k);
	if (!r)
		return 0;
	s = st->pos / PAGE_SIZE_BYTES;
	e = (st->pos + ret + PAGE_SIZE_BYTES - 1) / PAGE_SIZE_BYTES;
	lo = r->lo > s ? r->lo : s;
	hi = r->hi < e ? r->hi : e;
	if (lo >= hi)
		return 0;
	if (hi >= r->hi) {
		bpf_map_delete_elem(&ahead, &k);
		__sync_fetch_and_add(&ahead_live, -1);
	} else {
		r->lo = hi;	/* pages skipped below lo are left behind */
	}
	return hi - lo;
}

/* The process's start time in clock ticks since boot, as /proc/PID/stat (field 22)
 * shows it: with the PID it names one process, also once the PID is reused. */
static __always_inline __u32 proc_start(struct task_struct *task)
{
	return task->group_leader->start_boottime / tick_ns;
}

/* Claims entry e (index idx) for `tag` if it is free or its owner was retired: NULL
 * when it is another live process's, or another claim got there first. */
static __always_inline struct fileio_stats *claim(struct fileio_cached *e, __u32 idx, __u64 tag,
						  const char *comm)
{
	__u64 old = e->tag, *retired;

	if (old) {
		retired = bpf_map_lookup_elem(&stats_retired, &idx);
		if (!retired || *retired != old)
			return NULL;	/* another live process's, or being claimed */
	}
	if (__sync_val_compare_and_swap(&e->tag, old, STATS_CLAIMING) != old)
		return NULL;
	/* Zeroed once a claim (a 4 KiB copy, which clang leaves to a helper). */
	bpf_probe_read_kernel(&e->s, sizeof(e->s), &zero_stats);
	__builtin_memcpy(e->s.comm, comm, sizeof(e->s.comm));
	e->s.cgroup_id = bpf_get_current_cgroup_id();
	e->tag = tag;
	return &e->s;
}

/* The CPU's cache entry for `key`: one of two ways (by a hash of the process, and its
 * neighbour), the one its process owns, else one it can claim; NULL: the hash. */
static __always_inline struct fileio_stats *cached_stats(const struct fileio_key *key,
							 const char *comm)
{
	__u64 tag = (__u64)key->pid << 32 | key->start;
	struct fileio_cached *e0, *e1;
	struct fileio_stats *s;
	__u32 way, idx0, idx1;

	if (!cache_ways)
		return NULL;
	way = ((key->pid ^ key->start) * 2654435761u) >> 16;
	idx0 = (bpf_get_smp_processor_id() * cache_ways + (way & (cache_ways - 1))) << 2 |
	       key->op << 1 | key->cached;
	idx1 = idx0 ^ (cache_ways > 1 ? 4 : 0);	/* the neighbouring way */
	e0 = bpf_map_lookup_elem(&stats_cache, &idx0);
	if (!e0)
		return NULL;
	if (e0->tag == tag)
		return &e0->s;
	e1 = bpf_map_lookup_elem(&stats_cache, &idx1);
	if (!e1)
		return NULL;
	if (e1->tag == tag)
		return &e1->s;
	s = claim(e0, idx0, tag, comm);
	return s ? s : claim(e1, idx1, tag, comm);
}

/* Who did an operation: its process (PID and start), thread, command and cgroup (0:
 * the current task's, read only when an aggregate is made). */
struct io_doer {
	__u32 pid;
	__u32 start;		/* proc_start() */
	__u32 tid;
	const char *comm;
	__u64 cgroup_id;
};

static __always_inline struct io_doer doer_of(struct task_struct *task)
{
	struct io_doer d = {
		.pid = task->tgid, .start = proc_start(task), .tid = task->pid, .comm = task->comm,
	};

	return d;
}

/* One completed operation into the aggregates and, if asked, the event stream. Only
 * the syscalls' reads and writes (op 0 and 1) go through the per-CPU cache, whose index
 * holds the op in one bit. */
static __always_inline void account(struct fileio_inflight *st, __u32 op, __u64 ino,
				    __u32 dev, __s32 fd, long ret, __u64 disk, bool cached,
				    __u64 io_wait, __u64 lat, __u64 now, struct io_doer who,
				    bool disk_time, bool via_cache)
{
	struct fileio_key key = {
		.pid = who.pid, .op = op, .cached = cached, .start = who.start,
	};
	struct fileio_stats *s = NULL;
	struct fileio_event *ev;

	if (via_cache)
		s = cached_stats(&key, who.comm);
	if (!s)
		s = bpf_map_lookup_elem(&stats, &key);
	if (!s) {
		bpf_map_update_elem(&stats, &key, &zero_stats, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&stats, &key);
		if (s) {
			__builtin_memcpy(s->comm, who.comm, sizeof(s->comm));
			s->cgroup_id = who.cgroup_id ? who.cgroup_id : bpf_get_current_cgroup_id();
		}
	}
	if (s) {
		s->ops++;
		s->bytes += ret;
		s->bytes_requested += st->bytes_requested;
		s->disk_bytes += disk;
		s->io_wait_ns += io_wait;
		s->latency_sum_ns += lat;
		if (!s->latency_min_ns || lat < s->latency_min_ns)
			s->latency_min_ns = lat;
		if (lat > s->latency_max_ns)
			s->latency_max_ns = lat;
		if (!s->first_ns)
			s->first_ns = now;
		s->last_ns = now;
		s->buckets[hist_bucket(lat, IO_HIST_BUCKETS)]++;
	} else {
		COUNT(stats_full);
	}

	if (!events_on || lat < min_latency_ns || (disk_only && cached))
		return;
	ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	if (!ev) {
		COUNT(events_lost);
		return;
	}
	ev->ts_ns = now;
	ev->latency_ns = lat;
	ev->bytes = ret;
	ev->bytes_requested = st->bytes_requested;
	ev->disk_bytes = disk;
	ev->io_wait_ns = io_wait;
	ev->ino = ino;
	ev->disk_latency_ns = disk_time ? st->disk_latency_ns : 0;
	ev->disk_requests = disk_time ? st->disk_requests : 0;
	ev->sector = (op & 1) ? st->wsector : st->rsector;	/* op & 1: a write */
	ev->dev = dev;
	ev->pid = key.pid;
	ev->tid = who.tid;
	ev->fd = fd;
	ev->op = op;
	ev->cached = cached;
	__builtin_memcpy(ev->comm, who.comm, sizeof(ev->comm));
	ringbuf_submit_lazy(&events, ev, wakeup_bytes, now);
}

static __always_inline void finish_op(long ret)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 tid = task->pid;
	struct fileio_inflight *st = busy_slot(tid);
	__u64 now, lat, disk, wdisk;

	if (!st)
		return;
	if (ret < 0) {
		COUNT(failed);
		st->start_ns = 0;
		return;
	}
	now = bpf_ktime_get_ns();
	lat = now - st->start_ns;
	if (st->op == IO_OP_READ && ret > 0)
		st->pages += take_ahead(st, ret);
	if (!st->pair) {
		/* disk_bytes of a buffered read: the pages of its range it inserted or an
		 * earlier read inserted ahead for it (the bios it submits for readahead belong
		 * to the reads that follow); otherwise, as for O_DIRECT reads and every write
		 * (a buffered write inserts the pages it dirties, which is no disk I/O), the
		 * bios it submitted. Cached: no disk bytes, no bio, no time in I/O wait. */
		disk = st->bio_bytes;
		if (st->op == IO_OP_READ && st->pages)
			disk = st->pages * PAGE_SIZE_BYTES;
		account(st, st->op, st->ino, st->dev, st->fd, ret, disk,
			!disk && !st->bio_bytes && !st->io_wait_ns, st->io_wait_ns, lat, now,
			doer_of(task), true, true);
	} else {
		/* A copy: the read of the source takes the pages inserted (or else the bios
		 * that read), the write of the target the bios that write. I/O wait goes to
		 * the write when it submitted write bios, else to the read. */
		wdisk = st->wbio_bytes;
		disk = st->pages ? st->pages * PAGE_SIZE_BYTES : st->bio_bytes - wdisk;
		account(st, IO_OP_READ, st->ino, st->dev, st->fd, ret, disk,
			!disk && !(st->io_wait_ns && !wdisk), wdisk ? 0 : st->io_wait_ns, lat,
			now, doer_of(task), !wdisk, true);
		account(st, IO_OP_WRITE, st->ino2, st->dev2, st->fd2, ret, wdisk, !wdisk,
			wdisk ? st->io_wait_ns : 0, lat, now, doer_of(task), wdisk, true);
	}
	st->start_ns = 0;	/* idle: the entry stays for the thread's next operation */
}

/* The programs, in four parts: writeback owners, io_uring, the disk signals and block
 * layer, then the syscalls. */
#include "io_writeback.bpf.h"
#include "io_uring.bpf.h"
#include "io_block.bpf.h"
#include "io_syscalls.bpf.h"

char LICENSE[] SEC("license") = "GPL";
