// SPDX-License-Identifier: GPL-2.0
/* meridian io: every read and write on a regular file, per thread, with its latency
 * and whether the page cache served it.
 *
 * Four strategies for the syscall side, picked at run time by autoload:
 *   fentry_* / fexit_*: the kernel functions below the syscalls that still take the fd;
 *   ks_* / kr_*:        kprobes on the syscalls (libbpf's ksyscall);
 *   raw_*:              tp_btf raw syscalls sys_enter/sys_exit with a syscall-id filter;
 *   tp_*:               the syscalls:sys_enter_* / sys_exit_* tracepoints.
 * Each is one thin pair of programs per syscall around the same two bodies, enter_sys()
 * and finish_op() (see "the syscalls" below).
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
#include "io.h"

#define S_IFMT 0170000
#define S_IFREG 0100000
#define PAGE_SIZE_BYTES 4096

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

MAP_DEF(stats, BPF_MAP_TYPE_PERCPU_HASH, struct fileio_key, struct fileio_stats, 8192);

/* A block request in flight, by its struct request pointer: who submitted it
 * (block_io_start runs in the submitting thread) and when the device got it. */
struct rq_owner {
	__u64 op_start;		/* start_ns of the submitter's operation then, 0: none */
	__u64 issue_ns;
	__u32 pid;
	__u32 tid;
	__u32 start;		/* process start (proc_start) */
	__u32 pad;
	char comm[IO_COMM_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);	/* merged-away requests never complete */
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct rq_owner);
} rqs SEC(".maps");

MAP_DEF(disk_io, BPF_MAP_TYPE_PERCPU_HASH, struct fileio_disk_key, struct fileio_disk_stats, 8192);

MAP_DEF(pids, BPF_MAP_TYPE_HASH, __u32, __u8, 1024);

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
	if (filter_pid && !bpf_map_lookup_elem(&pids, &pid))
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

/* The inode of a regular file, or NULL. */
static __always_inline struct inode *regular_inode(struct file *f)
{
	struct inode *inode = f ? f->f_inode : NULL;

	if (!inode || (inode->i_mode & S_IFMT) != S_IFREG)
		return NULL;
	return inode;
}

static __always_inline struct fileio_inflight *start_op(__u32 tid, struct file *f, int fd,
							enum io_op op, __u64 bytes_requested,
							__s64 pos)
{
	struct inode *inode = regular_inode(f);
	struct fileio_inflight *st;

	if (!inode)
		return NULL;
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
		pos = f->f_pos;
	st->bytes_requested = bytes_requested;
	st->pos = pos;
	st->ino = inode->i_ino;
	st->dev = inode->i_sb->s_dev;
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
		st->ino2 = target->i_ino;
		st->dev2 = target->i_sb->s_dev;
		st->fd2 = out_fd;
		st->pair = 1;
	} else if (!st && target) {
		start_op(task->pid, fout, out_fd, IO_OP_WRITE, count, out_pos);
	}
}

/* An offset behind a pointer, a user's or the kernel's, -1 (the file's own) for NULL. */
static __always_inline __s64 read_pos(const loff_t *p, bool user)
{
	loff_t pos = -1;

	if (p && (user ? bpf_probe_read_user(&pos, sizeof(pos), p)
		       : bpf_probe_read_kernel(&pos, sizeof(pos), p)))
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

/* One completed operation into the aggregates and, if asked, the event stream. */
static __always_inline void account(struct fileio_inflight *st, __u32 op, __u64 ino,
				    __u32 dev, __s32 fd, long ret, __u64 disk, bool cached,
				    __u64 io_wait, __u64 lat, __u64 now, struct task_struct *task,
				    bool disk_time)
{
	struct fileio_key key = {
		.pid = task->tgid, .op = op, .cached = cached, .start = proc_start(task),
	};
	struct fileio_stats *s;
	struct fileio_event *ev;

	s = bpf_map_lookup_elem(&stats, &key);
	if (!s) {
		bpf_map_update_elem(&stats, &key, &zero_stats, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&stats, &key);
		if (s)
			__builtin_memcpy(s->comm, task->comm, sizeof(s->comm));
	}
	if (s) {
		s->ops++;
		s->bytes += ret;
		s->bytes_requested += st->bytes_requested;
		s->disk_bytes += disk;
		s->io_wait_ns += io_wait;
		s->latency_sum_ns += lat;
		if (lat > s->latency_max_ns)
			s->latency_max_ns = lat;
		if (!s->first_ns)
			s->first_ns = now;
		s->last_ns = now;
		s->slots[hist_slot(lat, IO_MAX_SLOTS)]++;
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
	ev->dev = dev;
	ev->pid = key.pid;
	ev->tid = task->pid;
	ev->fd = fd;
	ev->op = op;
	ev->cached = cached;
	__builtin_memcpy(ev->comm, task->comm, sizeof(ev->comm));
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
			task, true);
	} else {
		/* A copy: the read of the source takes the pages inserted (or else the bios
		 * that read), the write of the target the bios that write. I/O wait goes to
		 * the write when it submitted write bios, else to the read. */
		wdisk = st->wbio_bytes;
		disk = st->pages ? st->pages * PAGE_SIZE_BYTES : st->bio_bytes - wdisk;
		account(st, IO_OP_READ, st->ino, st->dev, st->fd, ret, disk,
			!disk && !(st->io_wait_ns && !wdisk), wdisk ? 0 : st->io_wait_ns, lat,
			now, task, !wdisk);
		account(st, IO_OP_WRITE, st->ino2, st->dev2, st->fd2, ret, wdisk, !wdisk,
			wdisk ? st->io_wait_ns : 0, lat, now, task, wdisk);
	}
	st->start_ns = 0;	/* idle: the entry stays for the thread's next operation */
}

/* ---- disk signals (every strategy) ------------------------------------------------- */

SEC("tracepoint/filemap/mm_filemap_add_to_page_cache")
int tp_page_added(struct trace_event_raw_mm_filemap_op_page_cache *ctx)
{
	struct fileio_inflight *st = busy_slot((__u32)bpf_get_current_pid_tgid());
	struct ahead_key k = {};
	struct ahead_range *r, nr;
	__u64 n, a, b, s, e, own;

	if (!st)
		return 0;
	n = 1ULL << (ctx->order & 31);
	if (st->pair && ctx->i_ino == st->ino2 && ctx->s_dev == st->dev2)
		return 0;	/* the copy's target: pages it dirties, no disk I/O */
	if (st->op != IO_OP_READ || ctx->i_ino != st->ino || ctx->s_dev != st->dev) {
		st->pages += n;		/* metadata, or another file: this operation's disk I/O */
		return 0;
	}
	/* The part of [a, b) inside the operation's own range is its own; the rest is
	 * readahead for the reads that follow. */
	a = ctx->index;
	b = a + n;
	s = st->pos / PAGE_SIZE_BYTES;
	e = (st->pos + st->bytes_requested + PAGE_SIZE_BYTES - 1) / PAGE_SIZE_BYTES;
	own = 0;
	if ((a > s ? a : s) < (b < e ? b : e))
		own = (b < e ? b : e) - (a > s ? a : s);
	st->pages += own;
	if (own == n)
		return 0;
	if (a < e)
		a = e;		/* only what lies past the read's range is credited */
	if (a >= b)
		return 0;
	k.ino = st->ino;
	k.dev = st->dev;
	r = bpf_map_lookup_elem(&ahead, &k);
	if (r && a <= r->hi && b >= r->lo) {
		if (a < r->lo)
			r->lo = a;
		if (b > r->hi)
			r->hi = b;
		return 0;
	}
	nr.lo = a;
	nr.hi = b;
	if (!r)
		__sync_fetch_and_add(&ahead_live, 1);
	bpf_map_update_elem(&ahead, &k, &nr, BPF_ANY);
	return 0;
}

SEC("tracepoint/block/block_bio_queue")
int tp_bio_queue(struct trace_event_raw_block_bio *ctx)
{
	struct fileio_inflight *st = busy_slot((__u32)bpf_get_current_pid_tgid());

	if (st) {
		__u64 n = (__u64)ctx->nr_sector << 9;

		st->bio_bytes += n;
		if (ctx->rwbs[0] == 'W' || ctx->rwbs[1] == 'W')	/* "W..", "FW.." */
			st->wbio_bytes += n;
	}
	return 0;
}

/* ---- block layer: requests by submitting process, device latency ---------------- */

/* In the submitting thread: the request is allocated for its bio. */
SEC("tp_btf/block_io_start")
int BPF_PROG(tp_io_start, struct request *rq)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct fileio_inflight *st;
	struct rq_owner o = {};
	__u64 key = (__u64)rq;

	if (!traced(task->tgid))
		return 0;
	o.pid = task->tgid;
	o.tid = task->pid;
	o.start = proc_start(task);
	st = busy_slot(o.tid);
	if (st)
		o.op_start = st->start_ns;
	__builtin_memcpy(o.comm, task->comm, sizeof(o.comm));
	bpf_map_update_elem(&rqs, &key, &o, BPF_ANY);
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(tp_rq_issue, struct request *rq)
{
	__u64 key = (__u64)rq;
	struct rq_owner *o = bpf_map_lookup_elem(&rqs, &key);

	if (o)
		o->issue_ns = bpf_ktime_get_ns();	/* again after a requeue */
	return 0;
}

#define REQ_OP_BITS_MASK 0xff

/* A request (or part of it: nr_bytes) completed. The request counts once, when its
 * last bytes complete; its latency is from the (last) issue to that completion. */
SEC("tp_btf/block_rq_complete")
int BPF_PROG(tp_rq_complete, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	__u64 key = (__u64)rq;
	struct rq_owner *o = bpf_map_lookup_elem(&rqs, &key);
	struct fileio_disk_key dk = {};
	struct fileio_disk_stats *s;
	struct fileio_inflight *st;
	bool last;
	__u32 op;
	__u64 lat;

	if (!o)
		return 0;
	op = rq->cmd_flags & REQ_OP_BITS_MASK;	/* REQ_OP_READ 0, REQ_OP_WRITE 1 */
	last = nr_bytes >= rq->__data_len;
	if (op > 1 || !o->issue_ns) {
		if (last)
			bpf_map_delete_elem(&rqs, &key);
		return 0;
	}
	lat = bpf_ktime_get_ns() - o->issue_ns;
	dk.pid = o->pid;
	dk.op = op;
	dk.start = o->start;
	s = bpf_map_lookup_elem(&disk_io, &dk);
	if (!s) {
		bpf_map_update_elem(&disk_io, &dk, &zero_disk, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&disk_io, &dk);
		if (s)
			__builtin_memcpy(s->comm, o->comm, sizeof(s->comm));
	}
	if (!s) {
		COUNT(disk_full);
	} else {
		s->bytes += nr_bytes;
		if (last) {
			s->requests++;
			s->latency_sum_ns += lat;
			if (lat > s->latency_max_ns)
				s->latency_max_ns = lat;
			s->slots[hist_slot(lat, IO_MAX_SLOTS)]++;
		}
	}
	if (last && o->op_start) {
		/* Into the submitter's operation, if it is still the one in flight (its
		 * requests may complete on several CPUs at once). */
		st = slot_of(o->tid);
		if (st && st->tid == o->tid && st->start_ns == o->op_start) {
			__sync_fetch_and_add(&st->disk_latency_ns, lat);
			__sync_fetch_and_add(&st->disk_requests, 1);
		}
	}
	if (last)
		bpf_map_delete_elem(&rqs, &key);
	return 0;
}

/* A thread with an operation in flight going to sleep in I/O wait, and coming back. */
SEC("tp_btf/sched_switch")
int BPF_PROG(tp_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	struct fileio_inflight *st;

	if (BPF_CORE_READ_BITFIELD(prev, in_iowait)) {
		st = busy_slot(prev->pid);
		if (st && !st->wait_start_ns) {
			st->wait_start_ns = bpf_ktime_get_ns();
			__sync_fetch_and_add(&iowaiters, 1);
		}
	}
	if (iowaiters) {
		st = slot_of(next->pid);
		if (st && st->tid == next->pid && st->wait_start_ns) {
			st->io_wait_ns += bpf_ktime_get_ns() - st->wait_start_ns;
			st->wait_start_ns = 0;
			__sync_fetch_and_add(&iowaiters, -1);
		}
	}
	return 0;
}

/* ---- the syscalls: one body, instantiated per attach type ----------------------------
 * Every strategy hooks the same syscalls (the fentry one, the kernel functions that take
 * their arguments) with a thin entry program that calls enter_sys() with the syscall's
 * kind and where its arguments are, and an exit program that calls finish_op() with its
 * return value. The kind is a constant in every program but raw_enter's, so each
 * program keeps only its own path and reads only the arguments that path uses. */

#define K_READ 1		/* enum io_op + 1 */
#define K_WRITE 2
#define K_VEC 4			/* arguments: fd, iovec array, count */
#define K_POS 8			/* the 4th argument is the offset */
#define K_SENDFILE 16		/* sendfile64(out_fd, in_fd, loff_t *offset, count) */
#define K_COPY 32		/* copy_file_range(fd_in, loff_t *off_in, fd_out, loff_t *off_out,
				 * len, flags) */

/* The traced syscalls and their kinds: read, write and their pread/readv/preadv/preadv2
 * forms (preadv's pos_l holds all of the offset on 64-bit; -1 in preadv2's is the file's
 * own offset), and the copies. */
#define IO_SYSCALLS(X)                                                      \
	X(read, K_READ)                                                     \
	X(pread64, K_READ | K_POS)                                          \
	X(readv, K_READ | K_VEC)                                            \
	X(preadv, K_READ | K_VEC | K_POS)                                   \
	X(preadv2, K_READ | K_VEC | K_POS)                                  \
	X(write, K_WRITE)                                                   \
	X(pwrite64, K_WRITE | K_POS)                                        \
	X(writev, K_WRITE | K_VEC)                                          \
	X(pwritev, K_WRITE | K_VEC | K_POS)                                 \
	X(pwritev2, K_WRITE | K_VEC | K_POS)                                \
	X(sendfile64, K_SENDFILE)                                           \
	X(copy_file_range, K_COPY)

#define KIND_ENUM(name, kind) KIND_##name = kind,
enum { IO_SYSCALLS(KIND_ENUM) };

#if defined(__TARGET_ARCH_x86)
enum { NR_read = 0, NR_write = 1, NR_pread64 = 17, NR_pwrite64 = 18, NR_readv = 19,
       NR_writev = 20, NR_preadv = 295, NR_pwritev = 296, NR_preadv2 = 327,
       NR_pwritev2 = 328, NR_sendfile64 = 40, NR_copy_file_range = 326 };
#define SYSCALL_NR(regs) ((regs)->orig_ax)
#define SYSCALL_ARGS(regs) { (regs)->di, (regs)->si, (regs)->dx, (regs)->r10, (regs)->r8 }
#define SYS_COPY_FILE_RANGE "__x64_sys_copy_file_range"
#elif defined(__TARGET_ARCH_arm64)
enum { NR_read = 63, NR_write = 64, NR_readv = 65, NR_writev = 66, NR_pread64 = 67,
       NR_pwrite64 = 68, NR_preadv = 69, NR_pwritev = 70, NR_preadv2 = 286,
       NR_pwritev2 = 287, NR_sendfile64 = 71, NR_copy_file_range = 285 };
#define SYSCALL_NR(regs) ((regs)->syscallno)
#define SYSCALL_ARGS(regs) { (regs)->orig_x0, (regs)->regs[1], (regs)->regs[2],     \
			     (regs)->regs[3], (regs)->regs[4] }
#define SYS_COPY_FILE_RANGE "__arm64_sys_copy_file_range"
#endif

extern _Bool LINUX_HAS_SYSCALL_WRAPPER __kconfig;

/* Where an entry program finds the syscall's arguments. */
enum args_at {
	AT_TRACEPOINT,	/* syscalls:sys_enter_*: ctx->args[] */
	AT_REGS,	/* the user registers, a BTF pointer: direct loads */
	AT_KSYSCALL,	/* a kprobe on the syscall: its own registers */
	AT_WRAPPED,	/* a kprobe on the syscall's wrapper: the user registers behind
			 * its argument, read with helpers (as libbpf's BPF_KSYSCALL) */
	AT_FENTRY,	/* a kernel function that takes the syscall's arguments in order
			 * (do_sendfile's offset pointer is the kernel's copy) */
};

/* ctx->args[n] with a literal index: args is a CO-RE access (vmlinux.h), and an index
 * computed from its relocated offset would move the context pointer, which the verifier
 * refuses. */
static __always_inline unsigned long tp_arg(struct trace_event_raw_sys_enter *ctx, int n)
{
	switch (n) {
	case 0: return ctx->args[0];
	case 1: return ctx->args[1];
	case 2: return ctx->args[2];
	case 3: return ctx->args[3];
	default: return ctx->args[4];
	}
}

/* Argument n (0: the first) of the syscall. */
static __always_inline unsigned long sys_arg(enum args_at at, void *ctx, int n)
{
	struct pt_regs *regs = ctx;

	switch (at) {
	case AT_TRACEPOINT:
		return tp_arg(ctx, n);
	case AT_FENTRY:
		return ((unsigned long long *)ctx)[n];
	case AT_REGS: {
#ifdef SYSCALL_NR
		unsigned long args[5] = SYSCALL_ARGS(regs);

		return args[n];
#else
		return 0;
#endif
	}
	case AT_KSYSCALL:
		switch (n) {
		case 0: return PT_REGS_PARM1_SYSCALL(regs);
		case 1: return PT_REGS_PARM2_SYSCALL(regs);
		case 2: return PT_REGS_PARM3_SYSCALL(regs);
		case 3: return PT_REGS_PARM4_SYSCALL(regs);
		default: return PT_REGS_PARM5_SYSCALL(regs);
		}
	case AT_WRAPPED:
		switch (n) {
		case 0: return PT_REGS_PARM1_CORE_SYSCALL(regs);
		case 1: return PT_REGS_PARM2_CORE_SYSCALL(regs);
		case 2: return PT_REGS_PARM3_CORE_SYSCALL(regs);
		case 3: return PT_REGS_PARM4_CORE_SYSCALL(regs);
		default: return PT_REGS_PARM5_CORE_SYSCALL(regs);
		}
	}
	return 0;
}

/* The start of a syscall of this kind (0: not one of ours). */
static __always_inline void enter_sys(__u8 kind, enum args_at at, void *ctx)
{
	unsigned long count;
	__s64 pos = -1;

	if (!kind)
		return;
#define ARG(n) sys_arg(at, ctx, n)
	if (kind & K_SENDFILE) {
		enter_copy((int)ARG(1), read_pos((const loff_t *)ARG(2), at != AT_FENTRY),
			   (int)ARG(0), -1, ARG(3));
		return;
	}
	if (kind & K_COPY) {
		enter_copy((int)ARG(0), read_pos((const loff_t *)ARG(1), true), (int)ARG(2),
			   read_pos((const loff_t *)ARG(3), true), ARG(4));
		return;
	}
	count = ARG(2);
	if (kind & K_POS)
		pos = (__s64)ARG(3);
	enter_fd((int)ARG(0), (kind & K_WRITE) ? IO_OP_WRITE : IO_OP_READ,
		 (kind & K_VEC) ? iov_bytes((const struct iovec *)ARG(1), count) : count, pos);
#undef ARG
}

/* ---- tracepoint strategy: syscalls:sys_enter_* / sys_exit_* ------------------------ */

#define TRACEPOINT(name, kind)                                              \
	SEC("tracepoint/syscalls/sys_enter_" #name)                         \
	int tp_enter_##name(struct trace_event_raw_sys_enter *ctx)          \
	{                                                                   \
		enter_sys(kind, AT_TRACEPOINT, ctx);                        \
		return 0;                                                   \
	}                                                                   \
	SEC("tracepoint/syscalls/sys_exit_" #name)                          \
	int tp_exit_##name(struct trace_event_raw_sys_exit *ctx)            \
	{                                                                   \
		finish_op(ctx->ret);                                        \
		return 0;                                                   \
	}

IO_SYSCALLS(TRACEPOINT)

/* ---- kprobe strategy: the syscalls through their wrappers (ksyscall) -----------------
 * Where kprobes work but trampolines do not: libbpf's ksyscall finds the architecture's
 * wrapper; the user's arguments, and the real fd, come with it. */

#define KSYSCALL(name, kind)                                                \
	SEC("ksyscall/" #name)                                              \
	int ks_##name(struct pt_regs *ctx)                                  \
	{                                                                   \
		if (LINUX_HAS_SYSCALL_WRAPPER)                              \
			enter_sys(kind, AT_WRAPPED, (void *)PT_REGS_PARM1(ctx)); \
		else                                                        \
			enter_sys(kind, AT_KSYSCALL, ctx);                  \
		return 0;                                                   \
	}                                                                   \
	SEC("kretsyscall/" #name)                                           \
	int BPF_KRETPROBE(kr_##name, long ret)                              \
	{                                                                   \
		finish_op(ret);                                             \
		return 0;                                                   \
	}

IO_SYSCALLS(KSYSCALL)

#ifdef SYSCALL_NR
/* ---- raw syscall strategy: tp_btf sys_enter / sys_exit with an id filter -----------
 * The filter: one load from a small table indexed by syscall id. */
#define NR_TABLE 512
#define KIND_AT_NR(name, kind) [NR_##name] = kind,

static const __u8 sys_kind[NR_TABLE] = { IO_SYSCALLS(KIND_AT_NR) };

static __always_inline __u8 kind_of(unsigned long id)
{
	return id < NR_TABLE ? sys_kind[id] : 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(raw_enter, struct pt_regs *regs, long id)
{
	enter_sys(kind_of(id), AT_REGS, regs);
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(raw_exit, struct pt_regs *regs, long ret)
{
	if (kind_of(SYSCALL_NR(regs)))
		finish_op(ret);
	return 0;
}
#endif

/* ---- fentry strategy: the syscall bodies that take the fd ----------------------------
 * ksys_read/ksys_write, ksys_pread64/ksys_pwrite64, do_readv/do_writev (readv, writev),
 * do_preadv/do_pwritev (preadv, preadv2, pwritev, pwritev2), do_sendfile, and the
 * copy_file_range syscall itself. They sit right above vfs_read/vfs_write/vfs_readv/
 * vfs_writev and, unlike those, still have the fd, so events carry the real fd as on the
 * tracepoint path. vfs_iter_read/vfs_iter_write are not hooked: only kernel users call
 * them (the loop device's worker, overlayfs, nfsd), and under overlayfs they would count
 * a user's read twice. A trampoline costs less than a syscall tracepoint.
 *
 * FENTRY_AT(name, hook, syscall, at, nargs): fentry_NAME and fexit_NAME on the kernel
 * function HOOK, a SYSCALL's body, with its arguments AT; fexit reads the return value
 * after the function's NARGS arguments. FENTRY: a function taking the syscall's. */

#define FENTRY_AT(name, hook, syscall, at, nargs)                           \
	SEC("fentry/" hook)                                                 \
	int fentry_##name(unsigned long long *ctx)                          \
	{                                                                   \
		enter_sys(KIND_##syscall, at, at == AT_REGS ? (void *)ctx[0] : ctx); \
		return 0;                                                   \
	}                                                                   \
	SEC("fexit/" hook)                                                  \
	int fexit_##name(unsigned long long *ctx)                           \
	{                                                                   \
		finish_op((long)ctx[nargs]);                                \
		return 0;                                                   \
	}
#define FENTRY(fn, syscall, nargs) FENTRY_AT(fn, #fn, syscall, AT_FENTRY, nargs)

FENTRY(ksys_read, read, 3)
FENTRY(ksys_write, write, 3)
FENTRY(ksys_pread64, pread64, 4)
FENTRY(ksys_pwrite64, pwrite64, 4)
FENTRY(do_readv, readv, 4)		/* fd, vec, vlen, flags */
FENTRY(do_writev, writev, 4)
FENTRY(do_preadv, preadv, 5)		/* fd, vec, vlen, pos, flags */
FENTRY(do_pwritev, pwritev, 5)
FENTRY(do_sendfile, sendfile64, 5)	/* out_fd, in_fd, ppos, count, max */
#ifdef SYSCALL_NR
/* copy_file_range has no fd-taking helper below the syscall: hook the syscall itself,
 * whose one argument is the user registers. */
FENTRY_AT(copy_file_range, SYS_COPY_FILE_RANGE, copy_file_range, AT_REGS, 1)
#endif

char LICENSE[] SEC("license") = "GPL";
