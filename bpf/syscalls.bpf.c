// SPDX-License-Identifier: GPL-2.0
/* meridian syscalls: file-system syscalls as start and end events (seed 002, Mortadelo).
 *
 * The start carries the raw arguments, up to two user strings (paths) and the path of
 * an fd argument, resolved here from the task's fd table; the end carries the result.
 * A record is built in a per-CPU buffer and copied to the ring at its real length
 * (strings packed behind the header), so the ring and a recording carry no padding.
 * A string that cannot be read at entry (its page not faulted in yet) is read again
 * at exit and sent with the end. Syscall set, PID set (with children followed) and
 * our own process, cgroup and process name (--comm) are filtered here.
 *
 * Two strategies, picked at run time by autoload:
 *   btf_*: tp_btf raw syscall tracepoints (pt_regs and the id/result);
 *   tp_*:  the raw_syscalls tracepoints, for kernels without tp_btf.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "maps.bpf.h"
#include "syscalls.h"

const volatile bool filter_pids = false;	/* only PIDs in `pids` (and their children) */
const volatile bool follow_children = true;
const volatile bool trace_all = false;		/* --all: every syscall number */
const volatile __u32 self_tgid = 0;		/* never trace the tracer */
const volatile bool filter_cgroup = false;	/* only tasks in this cgroup (v2 id) */
const volatile __u64 cgroup_id = 0;
const volatile __u64 wakeup_bytes = 1;
/* --comm: the process name contains comm_pat (ASCII case folded when comm_fold). */
const volatile bool filter_comm = false;
const volatile bool comm_fold = false;
const volatile __u32 comm_pat_len = 0;
const volatile char comm_pat[SYSCALLS_COMM_LEN] = {};

__u64 next_index = 0;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SYSCALLS_MAX_NR);
	__type(key, __u32);
	__type(value, struct syscalls_meta);
} sc_meta SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);	/* tgid */
	__type(value, __u8);
} pids SEC(".maps");

/* Threads whose string arguments could not be read at entry: bit i for str[i]. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);	/* tid */
	__type(value, __u8);
} retry SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct syscalls_counters);
} counters SEC(".maps");

/* Scratch space to build an fd's path: twice the size so that every bounded write fits. */
struct path_buf {
	char buf[2 * SYSCALLS_PATH_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct path_buf);
} scratch SEC(".maps");

/* The record being built: entry 0 for starts, 1 for ends. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct syscalls_buf);
} bufs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24);
} events SEC(".maps");

EXPORT_RECORD(syscalls_event);

#define COUNT(field)                                                        \
	do {                                                                \
		__u32 zero = 0;                                             \
		struct syscalls_counters *c = bpf_map_lookup_elem(&counters, &zero); \
		if (c)                                                      \
			__sync_fetch_and_add(&c->field, 1);                 \
	} while (0)

static __always_inline char fold(char c)
{
	return comm_fold && c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}

/* Does the current task's name contain comm_pat? */
static __always_inline bool comm_matches(void)
{
	char comm[SYSCALLS_COMM_LEN] = {};
	__u32 i, j, n = comm_pat_len;

	if (n == 0 || n >= SYSCALLS_COMM_LEN)
		return true;
	bpf_get_current_comm(comm, sizeof(comm));
	for (i = 0; i + n < SYSCALLS_COMM_LEN; i++) {
		for (j = 0; j < n; j++) {
			if (fold(comm[(i + j) & (SYSCALLS_COMM_LEN - 1)]) != comm_pat[j & (SYSCALLS_COMM_LEN - 1)])
				break;
		}
		if (j == n)
			return true;
		if (!comm[i & (SYSCALLS_COMM_LEN - 1)])
			break;
	}
	return false;
}

/* The calling task's syscall, if it is traced: its meta, else NULL. */
static __always_inline struct syscalls_meta *traced(long id, __u32 tgid)
{
	struct syscalls_meta *meta;
	__u32 nr = id;

	if (tgid == self_tgid || id < 0 || id >= SYSCALLS_MAX_NR)
		return NULL;
	meta = bpf_map_lookup_elem(&sc_meta, &nr);
	if (!meta || (!trace_all && !meta->traced))
		return NULL;
	if (filter_pids && !bpf_map_lookup_elem(&pids, &tgid))
		return NULL;
	if (filter_cgroup && bpf_get_current_cgroup_id() != cgroup_id)
		return NULL;
	if (filter_comm && !comm_matches())
		return NULL;
	return meta;
}

static __always_inline bool skip_for_fd(const struct syscalls_meta *meta, const __u64 *args)
{
	int pos = meta->fd_pos;

	return meta->need_fd && pos >= 0 && pos < 6 && (int)args[pos & 7] < 0;
}

/* task->files->fdt->fd[fd]: the struct file, or NULL. */
static __always_inline struct file *fd_file(int fd)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	struct file **arr;
	struct file *f = NULL;

	if (!fdt || fd < 0 || (unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return NULL;
	arr = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&f, sizeof(f), &arr[fd]))
		return NULL;
	return f;
}

/* Walking an fd's dentries up to the root, then writing their names down from it:
 * two bpf_loop() callbacks, each verified once. */
struct walk_ctx {
	struct dentry *d;
	struct mount *mnt;
	__u32 n;	/* dentries in chain, leaf first */
	__u32 off;	/* bytes written to the scratch buffer */
	struct dentry *chain[SYSCALLS_PATH_DEPTH];
};

static long walk_up(__u64 i, struct walk_ctx *c)
{
	struct dentry *d = c->d, *parent;
	struct mount *mnt = c->mnt, *mnt_parent;

	if (d == BPF_CORE_READ(mnt, mnt.mnt_root)) {
		mnt_parent = BPF_CORE_READ(mnt, mnt_parent);
		if (mnt_parent == mnt)
			return 1;	/* the root of everything */
		c->d = BPF_CORE_READ(mnt, mnt_mountpoint);
		c->mnt = mnt_parent;
		return 0;
	}
	parent = BPF_CORE_READ(d, d_parent);
	if (parent == d || c->n >= SYSCALLS_PATH_DEPTH)
		return 1;	/* root of an internal file system (pipe, socket), or too deep */
	c->chain[c->n & (SYSCALLS_PATH_DEPTH - 1)] = d;
	c->n++;
	c->d = parent;
	return 0;
}

static long write_down(__u64 k, struct walk_ctx *c)
{
	__u32 zero = 0, i;
	struct path_buf *pb = bpf_map_lookup_elem(&scratch, &zero);
	const unsigned char *name;
	struct dentry *d;
	long len;

	if (!pb || k >= c->n || c->off >= SYSCALLS_PATH_LEN - 1)
		return 1;
	i = c->n - 1 - k;
	pb->buf[c->off & (SYSCALLS_PATH_LEN - 1)] = '/';
	c->off++;
	d = c->chain[i & (SYSCALLS_PATH_DEPTH - 1)];
	name = BPF_CORE_READ(d, d_name.name);
	len = bpf_probe_read_kernel_str(&pb->buf[c->off & (SYSCALLS_PATH_LEN - 1)],
					SYSCALLS_PATH_LEN, name);
	if (len > 1)
		c->off += len - 1;
	return 0;
}

/* The path of an fd (crossing mounts, at most SYSCALLS_PATH_DEPTH names) into `out`
 * (room for SYSCALLS_PATH_LEN bytes): its length with the NUL, 0 if none. */
static __always_inline long fd_path(int fd, char *out)
{
	struct file *f = fd_file(fd);
	struct walk_ctx c = {};
	struct path_buf *pb;
	__u32 zero = 0;

	if (!f)
		return 0;
	pb = bpf_map_lookup_elem(&scratch, &zero);
	if (!pb)
		return 0;
	c.d = BPF_CORE_READ(f, f_path.dentry);
	c.mnt = container_of(BPF_CORE_READ(f, f_path.mnt), struct mount, mnt);
	bpf_loop(SYSCALLS_PATH_DEPTH + 16, walk_up, &c, 0);
	if (c.n == 0) {
		pb->buf[0] = '/';
		c.off = 1;
	} else {
		bpf_loop(SYSCALLS_PATH_DEPTH, write_down, &c, 0);
	}
	if (c.off > SYSCALLS_PATH_LEN - 1)
		c.off = SYSCALLS_PATH_LEN - 1;
	pb->buf[c.off & (SYSCALLS_PATH_LEN - 1)] = 0;
	return bpf_probe_read_kernel_str(out, SYSCALLS_PATH_LEN, pb->buf);
}

/* Bytes of b->data in use: bounded for the verifier (each string takes at most 256). */
static __always_inline __u32 bound(__u32 off)
{
	return off > 2 * SYSCALLS_STR_LEN ? 2 * SYSCALLS_STR_LEN : off;
}

/* Read the string arguments selected by `want` (bits) behind the header; returns the
 * bits read and sets *off past them. */
static __always_inline __u8 read_strings(struct syscalls_buf *b,
					 const struct syscalls_meta *meta, __u8 want, __u32 *off)
{
	struct syscalls_event *e = &b->ev;
	__u8 ok = 0;
	long n;
	int s;

	for (s = 0; s < 2; s++) {
		int pos = meta->str_pos[s];

		e->str_len[s & 1] = 0;
		if (pos < 0 || pos >= 6 || !(want & (1 << s)))
			continue;
		n = bpf_probe_read_user_str(&b->data[bound(*off)], SYSCALLS_STR_LEN,
					    (const void *)e->args[pos & 7]);
		if (n > 0 && n <= SYSCALLS_STR_LEN) {
			ok |= 1 << s;
			e->str_len[s & 1] = n;
			*off = bound(*off) + n;
		}
	}
	return ok;
}

/* No room for a record of any size: the event is dropped (and counted) before any
 * work is spent on its strings and fd path, so an overloaded ring stays cheap. */
static __always_inline bool ring_full(void)
{
	__u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	__u64 size = bpf_ringbuf_query(&events, BPF_RB_RING_SIZE);

	if (avail + sizeof(struct syscalls_buf) + 8 <= size)
		return false;
	__sync_fetch_and_add(&next_index, 1);
	COUNT(lost);
	return true;
}

/* Copy the record to the ring at its length (header + `off` bytes of strings). */
static __always_inline void send(struct syscalls_buf *b, __u32 off)
{
	__u64 flags = BPF_RB_NO_WAKEUP;
	__u32 len = off;

	if (len > SYSCALLS_DATA_LEN)
		len = SYSCALLS_DATA_LEN;
	b->ev.index = __sync_fetch_and_add(&next_index, 1);
	/* The fill level (a helper call) is read for one record in 64, as in maps.bpf.h. */
	if (!(b->ev.index & 63) && bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&events, b, sizeof(b->ev) + len, flags)) {
		COUNT(lost);
		return;
	}
	COUNT(events);
}

static __always_inline void on_enter(long id, const __u64 *args)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	struct syscalls_meta *meta = traced(id, tgid);
	struct syscalls_event *e;
	struct syscalls_buf *b;
	__u32 key = 0, off = 0;
	__u8 want = 0, failed;
	long n;
	int pos;

	if (!meta || skip_for_fd(meta, args) || ring_full())
		return;
	b = bpf_map_lookup_elem(&bufs, &key);
	if (!b)
		return;
	e = &b->ev;
	e->ts_ns = bpf_ktime_get_ns();
	e->pid = tgid;
	e->tid = tid;
	e->nr = id;
	e->kind = SYSCALLS_START;
	e->ret = 0;
	e->pad = 0;
	e->pad2 = 0;
	__builtin_memcpy(e->args, args, sizeof(e->args));
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	if (meta->str_pos[0] >= 0)
		want |= 1;
	if (meta->str_pos[1] >= 0)
		want |= 2;
	e->str_ok = read_strings(b, meta, want, &off);
	failed = want & ~e->str_ok;
	if (failed) {
		COUNT(str_failed);
		if (bpf_map_update_elem(&retry, &tid, &failed, BPF_ANY))
			COUNT(retry_full);
	}
	e->fd_ok = 0;
	e->fd_len = 0;
	pos = meta->fd_pos;
	if (pos >= 0 && pos < 6) {
		off = bound(off);
		n = fd_path((int)args[pos & 7], &b->data[off]);
		if (n > 0 && n <= SYSCALLS_PATH_LEN) {
			e->fd_ok = 1;
			e->fd_len = n;
			off += n;
		}
	}
	send(b, off);
}

static __always_inline void regs_args(struct pt_regs *regs, __u64 *args)
{
	args[0] = BPF_CORE_READ(regs, di);
	args[1] = BPF_CORE_READ(regs, si);
	args[2] = BPF_CORE_READ(regs, dx);
	args[3] = BPF_CORE_READ(regs, r10);
	args[4] = BPF_CORE_READ(regs, r8);
	args[5] = BPF_CORE_READ(regs, r9);
}

/* `regs`: the syscall's saved user registers, which still hold its arguments. */
static __always_inline void on_exit(long id, long ret, struct pt_regs *regs)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	struct syscalls_meta *meta = traced(id, tgid);
	struct syscalls_event *e;
	struct syscalls_buf *b;
	__u64 args[6] = {};
	__u8 *again = NULL;
	__u32 key = 1, off = 0;

	if (!meta)
		return;
	if (meta->need_fd || meta->str_pos[0] >= 0)
		regs_args(regs, args);
	if (skip_for_fd(meta, args))
		return;
	if (meta->str_pos[0] >= 0)
		again = bpf_map_lookup_elem(&retry, &tid);
	if (ring_full()) {
		if (again)
			bpf_map_delete_elem(&retry, &tid);
		return;
	}
	b = bpf_map_lookup_elem(&bufs, &key);
	if (!b)
		return;
	e = &b->ev;
	e->ts_ns = bpf_ktime_get_ns();
	e->pid = tgid;
	e->tid = tid;
	e->nr = id;
	e->kind = SYSCALLS_END;
	e->ret = ret;
	e->str_ok = 0;
	e->fd_ok = 0;
	e->pad = 0;
	e->pad2 = 0;
	e->str_len[0] = e->str_len[1] = 0;
	e->fd_len = 0;
	__builtin_memcpy(e->args, args, sizeof(e->args));
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	if (again) {
		/* After a successful exec the old image (and its strings) is gone. */
		if (!(ret == 0 && (id == 59 || id == 322))) {
			e->str_ok = read_strings(b, meta, *again, &off);
			if (e->str_ok)
				COUNT(str_retried);
		}
		bpf_map_delete_elem(&retry, &tid);
	}
	send(b, off);
}

/* Runs in the forking task: its tgid is the parent process. */
static __always_inline void on_fork(__u32 child_tgid)
{
	__u32 parent_tgid = bpf_get_current_pid_tgid() >> 32;
	__u8 one = 1;
	long ret;

	if (!filter_pids || !follow_children || parent_tgid == child_tgid)
		return;
	if (!bpf_map_lookup_elem(&pids, &parent_tgid))
		return;
	ret = bpf_map_update_elem(&pids, &child_tgid, &one, BPF_NOEXIST);
	if (!ret)
		COUNT(forks_followed);
	else if (ret != -17)	/* EEXIST: followed already */
		COUNT(pids_full);
}

/* The last thread of a traced process exits (do_exit() has counted it out of
 * signal->live): its PID leaves the set, as it may be reused. */
static __always_inline void on_exit_process(void)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (filter_pids && follow_children && BPF_CORE_READ(task, signal, live.counter) == 0)
		bpf_map_delete_elem(&pids, &tgid);
}

/* ---- tp_btf strategy ------------------------------------------------------------ */

SEC("tp_btf/sys_enter")
int BPF_PROG(btf_sys_enter, struct pt_regs *regs, long id)
{
	__u64 args[6];

	args[0] = regs->di;
	args[1] = regs->si;
	args[2] = regs->dx;
	args[3] = regs->r10;
	args[4] = regs->r8;
	args[5] = regs->r9;
	on_enter(id, args);
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(btf_sys_exit, struct pt_regs *regs, long ret)
{
	on_exit(regs->orig_ax, ret, regs);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(btf_fork, struct task_struct *parent, struct task_struct *child)
{
	on_fork(child->tgid);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(btf_exit, struct task_struct *p)
{
	on_exit_process();
	return 0;
}

/* ---- tracepoint strategy -------------------------------------------------------- */

SEC("tracepoint/raw_syscalls/sys_enter")
int tp_sys_enter(struct trace_event_raw_sys_enter *ctx)
{
	__u64 args[6];

	args[0] = ctx->args[0];
	args[1] = ctx->args[1];
	args[2] = ctx->args[2];
	args[3] = ctx->args[3];
	args[4] = ctx->args[4];
	args[5] = ctx->args[5];
	on_enter(ctx->id, args);
	return 0;
}

SEC("tracepoint/raw_syscalls/sys_exit")
int tp_sys_exit(struct trace_event_raw_sys_exit *ctx)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());

	on_exit(ctx->id, ctx->ret, regs);
	return 0;
}

SEC("tracepoint/sched/sched_process_fork")
int tp_fork(struct trace_event_raw_sched_process_fork *ctx)
{
	/* A new process: its pid is its tgid. A new thread's id added here is never
	 * looked up (its tgid is its parent's, in the set already). */
	on_fork(ctx->child_pid);
	return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int tp_exit(void *ctx)
{
	on_exit_process();
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
