// SPDX-License-Identifier: GPL-2.0
/* meridian syscalls: file-system syscalls as start and end events (Mortadelo,
 * docs/requirements/syscalls.md).
 *
 * The start carries the raw arguments, up to two user strings (paths) and the path of
 * an fd argument, resolved here from the task's fd table as /proc/PID/fd names it
 * (fdpath.bpf.h: pipe:[ino], anon_inode:[eventfd], ...); the end carries the result
 * and, for a call that fills in a user array or struct, its bytes (pipe2's fds).
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
#include "task.bpf.h"
#include "pidset.bpf.h"
#include "syscalls.h"

const volatile bool filter_pids = false;	/* only PIDs in `pids` (and their children) */
const volatile bool follow_children = true;
const volatile bool trace_all = false;		/* --all: every syscall number */
const volatile __u32 self_tgid = 0;		/* never trace the tracer */
const volatile bool filter_cgroup = false;	/* only tasks in this cgroup (v2 id) or below */
const volatile __u64 cgroup_id = 0;
const volatile __u32 cgroup_level = 0;		/* its depth below the cgroup2 root */
const volatile __u64 wakeup_bytes = 1;
const volatile __u64 ring_bytes = 1 << 24;	/* max_entries of events */
/* --comm: the process name contains comm_pat (ASCII case folded when comm_fold). */
const volatile bool filter_comm = false;
const volatile bool comm_fold = false;
const volatile __u32 comm_pat_len = 0;
const volatile char comm_pat[SYSCALLS_COMM_LEN] = {};

__u64 next_index = 0;

MAP_DEF(sc_meta, BPF_MAP_TYPE_ARRAY, __u32, struct syscalls_meta, SYSCALLS_MAX_NR);

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

/* Entries in `retry` (while zero, an end skips the lookup). */
__u64 retry_live = 0;

static __always_inline void retry_done(__u32 tid)
{
	if (!bpf_map_delete_elem(&retry, &tid))
		__sync_fetch_and_add(&retry_live, -1);
}

/* The PID set's change count (pidset.bpf.h) is pids_gen + pids_epoch: the kernel bumps
 * pids_gen when it follows a child or removes a PID, user space bumps pids_epoch (its
 * own map: one writer) after it adds one. */
__u64 pids_gen = 0;

MAP_DEF(pids_epoch, BPF_MAP_TYPE_ARRAY, __u32, __u64, 1);

PID_MEMO_DEF(pid_memo);

MAP_DEF(counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct syscalls_counters, 1);

/* The record being built: entry 0 for starts, 1 for ends. */
MAP_DEF(bufs, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct syscalls_buf, 2);

RINGBUF_DEF(events, 1 << 24);

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
static __always_inline bool comm_matches(struct task_struct *task)
{
	char comm[SYSCALLS_COMM_LEN] = {};
	__u32 i, j, n = comm_pat_len;

	if (n == 0 || n >= SYSCALLS_COMM_LEN)
		return true;
	__builtin_memcpy(comm, task->comm, sizeof(comm));
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

/* Is tgid in the PID set? */
static __always_inline bool pid_traced(__u32 tgid)
{
	__u32 zero = 0;
	__u64 *epoch = bpf_map_lookup_elem(&pids_epoch, &zero);

	return pid_in_set(&pid_memo, &pids, tgid, pids_gen + (epoch ? *epoch : 0));
}

/* The calling task's syscall, if it is traced: its meta, else NULL. */
static __always_inline struct syscalls_meta *traced(long id, struct task_struct *task)
{
	struct syscalls_meta *meta;
	__u32 nr = id, tgid = task->tgid;

	if (tgid == self_tgid || id < 0 || id >= SYSCALLS_MAX_NR)
		return NULL;
	meta = bpf_map_lookup_elem(&sc_meta, &nr);
	if (!meta || (!trace_all && !meta->traced))
		return NULL;
	if (filter_pids && !pid_traced(tgid))
		return NULL;
	/* The cgroup or any below it: the task's ancestor at the cgroup's own depth. */
	if (filter_cgroup && bpf_get_current_ancestor_cgroup_id(cgroup_level) != cgroup_id)
		return NULL;
	if (filter_comm && !comm_matches(task))
		return NULL;
	return meta;
}

static __always_inline bool skip_for_fd(const struct syscalls_meta *meta, const __u64 *args)
{
	int pos = meta->fd_pos;

	return meta->need_fd && pos >= 0 && pos < 6 && (int)args[pos & 7] < 0;
}

/* Bytes of b->data in use: bounded for the verifier (each string takes at most 256).
 * The test stays in the code (barrier_var) even where clang proves it true: clang checks
 * a string's length n as n - 1 <= 255, on a copy, and drops the clamp of the offset
 * that follows. 6.18's verifier carries that bound back to n (registers linked by a
 * negative delta), 6.12's does not, and refused the unclamped data[] index ("R1
 * unbounded memory access" in btf_sys_enter). */
static __always_inline __u32 bound(__u32 off)
{
	barrier_var(off);
	return off > 2 * SYSCALLS_STR_LEN ? 2 * SYSCALLS_STR_LEN : off;
}

#include "syscalls_path.bpf.h"	/* fd_path(): an fd's path into the record */

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

/* Bytes in the ring not consumed yet, as bpf_ringbuf_query() says them: where the
 * kernel has bpf_rdonly_cast, its producer and consumer positions read directly, without
 * the helper call (tens of ns on hosts with return thunks, such as this VM, at every
 * event); else the helper. */
static __always_inline __u64 ring_avail(void)
{
	if (have_bpf_rdonly_cast) {
		struct bpf_ringbuf *rb = KCAST(struct bpf_ringbuf_map, &events)->rb;

		return rb->producer_pos - rb->consumer_pos;
	}
	return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
}

/* The ring's fill level (bytes not yet consumed), or -1 when a record of any size may
 * not fit: then the event is dropped (and counted) before any work is spent on its
 * strings and fd path, so an overloaded ring stays cheap (ring_avail: no helper call
 * where bpf_rdonly_cast exists). Also what send() decides a wake-up by. */
static __always_inline __s64 ring_fill(void)
{
	__u64 avail = ring_avail();

	if (avail + sizeof(struct syscalls_buf) + 8 <= ring_bytes)
		return avail;
	__sync_fetch_and_add(&next_index, 1);
	COUNT(lost);
	return -1;
}

/* Whether the record of this index wakes the reader. While the ring is past its mark
 * only one record in 64 does: a wake-up is an irq_work (a self-interrupt), and one per
 * record while the reader is busy draining cost more than everything else the programs
 * do. */
static __always_inline __u64 wake_flags(__u64 index, __s64 fill)
{
	return fill >= wakeup_bytes && !(index & 63) ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

/* Copy the record to the ring at its length (header + `off` bytes of strings). */
static __always_inline void send(struct syscalls_buf *b, __u32 off, __s64 fill)
{
	__u32 len = off;

	barrier_var(len);	/* the test stays: 6.1 does not know the bound clang knows */
	if (len > SYSCALLS_DATA_LEN)
		len = SYSCALLS_DATA_LEN;
	b->ev.index = __sync_fetch_and_add(&next_index, 1);
	if (bpf_ringbuf_output(&events, b, sizeof(b->ev) + len, wake_flags(b->ev.index, fill))) {
		COUNT(lost);
		return;
	}
	COUNT(events);
}

/* The record's header; no strings and no fd path yet. */
static __always_inline void fill_header(struct syscalls_event *e, struct task_struct *task,
					long id, __u8 kind, long ret, const __u64 *args)
{
	e->ts_ns = bpf_ktime_get_ns();
	e->pid = task->tgid;
	e->tid = task->pid;
	e->nr = id;
	e->kind = kind;
	e->ret = ret;
	e->str_ok = 0;
	e->fd_ok = 0;
	e->pad = 0;
	e->out_len = 0;
	e->str_len[0] = e->str_len[1] = 0;
	e->fd_len = 0;
	__builtin_memcpy(e->args, args, sizeof(e->args));
	__builtin_memcpy(e->comm, task->comm, sizeof(e->comm));
}

static __always_inline void on_enter(long id, const __u64 *args)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct syscalls_meta *meta = traced(id, task);
	__u32 tid = task->pid, key = 0, off = 0;
	struct syscalls_event *e;
	struct syscalls_buf *b;
	__u8 want = 0, failed;
	__s64 fill;
	long n;
	int pos;

	if (!meta || skip_for_fd(meta, args))
		return;
	fill = ring_fill();
	if (fill < 0)
		return;
	b = bpf_map_lookup_elem(&bufs, &key);
	if (!b)
		return;
	e = &b->ev;
	fill_header(e, task, id, SYSCALLS_START, 0, args);
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
		else
			__sync_fetch_and_add(&retry_live, 1);	/* an upper bound (overwrites) */
	}
	e->fd_ok = 0;
	e->fd_len = 0;
	pos = meta->fd_pos;
	if (pos >= 0 && pos < 6) {
		off = bound(off);
		n = fd_path(task, (int)args[pos & 7], b, off);
		if (n > 0 && n <= SYSCALLS_PATH_LEN) {
			e->fd_ok = 1;
			e->fd_len = n;
			off += n;
		}
	}
	send(b, off, fill);
}

static __always_inline void regs_args(struct pt_regs *regs, __u64 *args)
{
	args[0] = regs->di;
	args[1] = regs->si;
	args[2] = regs->dx;
	args[3] = regs->r10;
	args[4] = regs->r8;
	args[5] = regs->r9;
}

#include "syscalls_out.bpf.h"	/* read_output(): pipe2's fds, stat buffers */

/* An end without strings (all but those that read one again): written straight into
 * a ring record of fixed length, the header and `out` bytes for an output argument
 * (out_len of them used, the rest zeroed), with no per-CPU buffer and no copy: 19-28
 * ns less an end on this VM (bpf_stats, benchmarks/RESULTS.md). `out`: a constant. */
static __always_inline void send_end(struct task_struct *task, long id, long ret,
				     const __u64 *args, const struct syscalls_meta *meta,
				     __s64 fill, const __u32 out)
{
	struct syscalls_buf *r = bpf_ringbuf_reserve(&events, sizeof(r->ev) + out, 0);
	__u32 off = 0;

	if (!r) {
		__sync_fetch_and_add(&next_index, 1);
		COUNT(lost);
		return;
	}
	fill_header(&r->ev, task, id, SYSCALLS_END, ret, args);
	if (out) {
		__builtin_memset(r->data, 0, SYSCALLS_OUT_LEN);
		read_output(r, meta, ret, &off);
	}
	r->ev.index = __sync_fetch_and_add(&next_index, 1);
	bpf_ringbuf_submit(r, wake_flags(r->ev.index, fill));
	COUNT(events);
}

/* `regs`: the syscall's saved user registers, which still hold its arguments. */
static __always_inline void on_exit(long id, long ret, struct pt_regs *regs)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct syscalls_meta *meta = traced(id, task);
	__u32 tid = task->pid, key = 1, off = 0;
	struct syscalls_event *e;
	struct syscalls_buf *b;
	__u64 args[6] = {};
	__u8 *again = NULL;
	__s64 fill;

	if (!meta)
		return;
	if (meta->need_fd || meta->str_pos[0] >= 0 || meta->out_pos >= 0)
		regs_args(regs, args);
	if (skip_for_fd(meta, args))
		return;
	if (meta->str_pos[0] >= 0)
		again = retry_live ? bpf_map_lookup_elem(&retry, &tid) : NULL;
	fill = ring_fill();
	if (fill < 0) {
		if (again)
			retry_done(tid);
		return;
	}
	if (again) {
		b = bpf_map_lookup_elem(&bufs, &key);
		if (!b)
			return;
		e = &b->ev;
		fill_header(e, task, id, SYSCALLS_END, ret, args);
		/* After a successful exec the old image (and its strings) is gone. */
		if (!(ret == 0 && (id == 59 || id == 322)))
			e->str_ok = read_strings(b, meta, *again, &off);
		retry_done(tid);
		if (e->str_ok) {
			COUNT(str_retried);
			read_output(b, meta, ret, &off);
			send(b, off, fill);
			return;
		}
	}
	/* An end without strings: one layout, however it came. */
	if (meta->out_pos >= 0)
		send_end(task, id, ret, args, meta, fill, SYSCALLS_OUT_LEN);
	else
		send_end(task, id, ret, args, meta, fill, 0);
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
	if (!ret) {
		__sync_fetch_and_add(&pids_gen, 1);	/* a memo may say "not traced" */
		COUNT(forks_followed);
	} else if (ret != -17)	/* EEXIST: followed already */
		COUNT(pids_full);
}

/* The last thread of a traced process exits (do_exit() has counted it out of
 * signal->live): its PID leaves the set, as it may be reused. */
static __always_inline void on_exit_process(void)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (filter_pids && follow_children && BPF_CORE_READ(task, signal, live.counter) == 0)
		if (!bpf_map_delete_elem(&pids, &tgid))
			__sync_fetch_and_add(&pids_gen, 1);
}

/* ---- tp_btf strategy ------------------------------------------------------------ */

SEC("tp_btf/sys_enter")
int BPF_PROG(btf_sys_enter, struct pt_regs *regs, long id)
{
	__u64 args[6];

	regs_args(regs, args);
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
