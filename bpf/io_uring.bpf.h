/* meridian io, part of io.bpf.c (included there before the disk signals): reads and
 * writes on regular files submitted through io_uring, which make no read or write
 * syscall of their own.
 *
 * A request is followed from its submission (io_uring_submit_req; io_uring_submit_sqe
 * before 6.4) to its completion (io_uring_complete: the CQE, with the result), by its
 * `struct io_kiocb` pointer, in `uring_ops`. Its latency is submission to completion.
 * Both tracepoints give the request as an argument on every kernel with them (6.1,
 * 6.12 and 6.18 differ in the arguments after it), so one body reads everything else
 * from the request.
 *
 * Cached or disk: the disk signals (page-cache insertions, bios) of a request happen
 * where it is issued: inline in the submitting thread, right after the submission
 * tracepoint (a buffered read that misses starts its readahead there before it waits
 * for the pages); or in an io-wq worker of the process, after io_uring_queue_async_work.
 * So each thread remembers the last request it submitted, and the process the last one
 * it handed to a worker (`uring_current`), and a disk signal in a thread with no
 * syscall in flight goes to that request while it is in flight. This is exact when a
 * thread has one request in flight at a time (queue depth 1); with more, a request's
 * signals may be counted to the one submitted after it in the same thread, so a
 * process's disk bytes stay right while the split of its operations into cached and
 * disk may not. I/O wait is not counted for io_uring: the submitter waits for
 * completions in io_uring_enter, not for one request. A request that posts no CQE
 * (IOSQE_CQE_SKIP_SUCCESS) is not counted either: it has no io_uring_complete. */
#ifndef MERIDIAN_IO_URING_BPF_H
#define MERIDIAN_IO_URING_BPF_H

/* UAPI opcodes (include/uapi/linux/io_uring.h), fixed since 5.1/5.6. */
#define IORING_OP_READV 1
#define IORING_OP_WRITEV 2
#define IORING_OP_READ_FIXED 4
#define IORING_OP_WRITE_FIXED 5
#define IORING_OP_READ 22
#define IORING_OP_WRITE 23

#define REQ_F_FIXED_FILE_FLAG 1		/* REQ_F_FIXED_FILE: cqe.fd indexes the ring's files */
#define URING_WORKER_KEY (1U << 31)	/* uring_current: a process's request for its workers */
#define PF_IO_WORKER_FLAG 0x00000010	/* PF_IO_WORKER: an io-wq worker thread */

struct uring_op {
	struct fileio_inflight st;	/* as a syscall's; st.op: IO_OP_READ or IO_OP_WRITE */
	__u64 cgroup_id;		/* the submitter's */
	__u32 pid;
	__u32 start;			/* proc_start() of the submitter */
	__u32 fixed;			/* the file is a registered one: resolved when issued */
	__u32 pad;
	char comm[IO_COMM_LEN];
};

MAP_DEF(uring_ops, BPF_MAP_TYPE_HASH, __u64, struct uring_op, 8192);

static const struct uring_op zero_uring;

/* The request each thread submitted last (key: tid), and the one each process handed to
 * its io-wq workers last (key: URING_WORKER_KEY | pid). Stale entries are harmless: a
 * request that completed is no longer in uring_ops. */
MAP_DEF(uring_current, BPF_MAP_TYPE_LRU_HASH, __u32, __u64, 8192);

/* Requests in uring_ops: while zero, the disk signals skip the lookups. */
__u64 uring_live = 0;

/* The io_rw inside a request (req->cmd): its kiocb (file, position), address, length. */
static __always_inline __u64 uring_rw(__u64 req)
{
	return req + bpf_core_field_offset(struct io_kiocb, cmd);
}

/* The request's file, if it is a regular one: its inode into u->st, and the file's own
 * position where the request reads or writes at it (offset -1). */
static __always_inline bool uring_file(struct uring_op *u, struct file *f)
{
	struct inode *inode = regular_inode(f);

	if (!inode)
		return false;
	note_name(f, inode);
	u->st.ino = KFIELD(inode, i_ino);
	u->st.dev = KFIELD(inode, i_sb, s_dev);
	if ((__s64)u->st.pos < 0)
		u->st.pos = KFIELD(f, f_pos);
	return true;
}

static __always_inline void uring_submit(__u64 req)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct uring_op *u;
	__u64 rw = uring_rw(req), len;
	__u32 tid = task->pid;
	__u8 opcode;
	bool write;
	int fd;

	if (!traced(task->tgid))
		return;
	opcode = KREAD(struct io_kiocb, req, opcode);
	switch (opcode) {
	case IORING_OP_READ: case IORING_OP_READV: case IORING_OP_READ_FIXED:
		write = false;
		break;
	case IORING_OP_WRITE: case IORING_OP_WRITEV: case IORING_OP_WRITE_FIXED:
		write = true;
		break;
	default:
		return;
	}
	/* Built in the map's own value. A request already there never completed where
	 * io could see it (IOSQE_CQE_SKIP_SUCCESS posts no CQE, so no io_uring_complete):
	 * its io_kiocb was freed and is reused now, and the entry is taken over. */
	u = bpf_map_lookup_elem(&uring_ops, &req);
	if (u) {
		__builtin_memcpy(u, &zero_uring, sizeof(*u));
	} else if (bpf_map_update_elem(&uring_ops, &req, &zero_uring, BPF_NOEXIST)) {
		COUNT(uring_untracked);
		return;
	} else {
		u = bpf_map_lookup_elem(&uring_ops, &req);
		if (!u)
			return;
		__sync_fetch_and_add(&uring_live, 1);
	}
	len = KREAD(struct io_rw, rw, len);
	if (opcode == IORING_OP_READV || opcode == IORING_OP_WRITEV)
		len = iov_bytes((const struct iovec *)KREAD(struct io_rw, rw, addr), len);
	u->st.bytes_requested = len;
	u->st.pos = KREAD(struct kiocb, rw, ki_pos);	/* the SQE's offset */
	u->st.op = write ? IO_OP_WRITE : IO_OP_READ;
	u->st.tid = tid;
	u->st.rsector = -1;
	u->st.wsector = -1;
	u->pid = task->tgid;
	u->start = proc_start(task);
	u->cgroup_id = bpf_get_current_cgroup_id();
	__builtin_memcpy(u->comm, task->comm, sizeof(u->comm));
	fd = KREAD(struct io_kiocb, req, cqe.fd);
	u->fixed = KREAD(struct io_kiocb, req, flags) & REQ_F_FIXED_FILE_FLAG;
	u->st.fd = u->fixed ? -1 : fd;
	/* A file by its fd is looked up as the request is issued, after this tracepoint: it
	 * is the fd's file now. Not a regular file: not followed. */
	if (!u->fixed && !uring_file(u, fd_file(task, fd))) {
		bpf_map_delete_elem(&uring_ops, &req);
		__sync_fetch_and_add(&uring_live, -1);
		return;
	}
	bpf_map_update_elem(&uring_current, &tid, &req, BPF_ANY);
	u->st.start_ns = bpf_ktime_get_ns();
}

/* The request the disk signals of the current thread belong to (no syscall of its own
 * in flight), or NULL. */
static __always_inline struct fileio_inflight *uring_slot(__u32 tid)
{
	struct task_struct *task;
	struct uring_op *u;
	__u32 key = tid;
	__u64 *req;

	if (!uring_live)
		return NULL;
	req = bpf_map_lookup_elem(&uring_current, &key);
	if (!req) {
		task = bpf_get_current_task_btf();
		if (!(task->flags & PF_IO_WORKER_FLAG))
			return NULL;
		key = URING_WORKER_KEY | task->tgid;
		req = bpf_map_lookup_elem(&uring_current, &key);
		if (!req)
			return NULL;
	}
	u = bpf_map_lookup_elem(&uring_ops, req);
	if (!u || !u->st.start_ns)
		return NULL;
	/* A registered file: known once the request is issued, which it is now. */
	if (!u->st.ino && !uring_file(u, KREAD(struct io_kiocb, *req, file)))
		return NULL;
	return &u->st;
}

/* Handed to an io-wq worker: its disk signals go to this request. */
static __always_inline void uring_async(__u64 req)
{
	__u32 key = URING_WORKER_KEY | (__u32)(bpf_get_current_pid_tgid() >> 32);

	if (uring_live && bpf_map_lookup_elem(&uring_ops, &req))
		bpf_map_update_elem(&uring_current, &key, &req, BPF_ANY);
}

static __always_inline void uring_complete(__u64 req)
{
	struct uring_op *u = bpf_map_lookup_elem(&uring_ops, &req);
	struct io_doer who;
	__u64 now, disk;
	__s32 res;

	if (!u)
		return;
	res = KREAD(struct io_kiocb, req, cqe.res);
	if (res < 0) {
		COUNT(failed);
		goto out;
	}
	if (!u->st.ino && !uring_file(u, KREAD(struct io_kiocb, req, file)))
		goto out;	/* a registered file that is not a regular one */
	now = bpf_ktime_get_ns();
	if (u->st.op == IO_OP_READ && res > 0)
		u->st.pages += take_ahead(&u->st, res);
	/* As finish_op(): a read's disk bytes are the pages of its range it inserted or an
	 * earlier read inserted ahead for it, else the bios it submitted. */
	disk = u->st.bio_bytes;
	if (u->st.op == IO_OP_READ && u->st.pages)
		disk = u->st.pages * PAGE_SIZE_BYTES;
	who.pid = u->pid;
	who.start = u->start;
	who.tid = u->st.tid;
	who.comm = u->comm;
	who.cgroup_id = u->cgroup_id;
	account(&u->st, u->st.op | IO_OP_URING_READ, u->st.ino, u->st.dev, u->st.fd, res, disk,
		!disk && !u->st.bio_bytes, 0, now - u->st.start_ns, now, who, false, false);
out:
	bpf_map_delete_elem(&uring_ops, &req);
	__sync_fetch_and_add(&uring_live, -1);
}

/* The programs: raw tracepoints with BTF (no tracefs), and the tracepoints for io's
 * tracepoint strategy. The submission's tracepoint was io_uring_submit_sqe before 6.4. */
SEC("tp_btf/io_uring_submit_req")
int BPF_PROG(btf_uring_submit, struct io_kiocb *req)
{
	uring_submit((__u64)req);
	return 0;
}

SEC("tp_btf/io_uring_submit_sqe")
int BPF_PROG(btf_uring_submit_sqe, struct io_kiocb *req)
{
	uring_submit((__u64)req);
	return 0;
}

SEC("tp_btf/io_uring_queue_async_work")
int BPF_PROG(btf_uring_async, struct io_kiocb *req)
{
	uring_async((__u64)req);
	return 0;
}

/* (ctx, req, ...) on every kernel; what follows req differs (6.18: the CQE). */
SEC("tp_btf/io_uring_complete")
int BPF_PROG(btf_uring_complete, void *ring, void *req)
{
	uring_complete((__u64)req);
	return 0;
}

struct trace_event_raw_io_uring_submit_sqe {
	void *req;
} __attribute__((preserve_access_index));

SEC("tracepoint/io_uring/io_uring_submit_req")
int tp_uring_submit(struct trace_event_raw_io_uring_submit_req *ctx)
{
	uring_submit((__u64)ctx->req);
	return 0;
}

SEC("tracepoint/io_uring/io_uring_submit_sqe")
int tp_uring_submit_sqe(struct trace_event_raw_io_uring_submit_sqe *ctx)
{
	uring_submit((__u64)ctx->req);
	return 0;
}

SEC("tracepoint/io_uring/io_uring_queue_async_work")
int tp_uring_async(struct trace_event_raw_io_uring_queue_async_work *ctx)
{
	uring_async((__u64)ctx->req);
	return 0;
}

SEC("tracepoint/io_uring/io_uring_complete")
int tp_uring_complete(struct trace_event_raw_io_uring_complete *ctx)
{
	uring_complete((__u64)ctx->req);
	return 0;
}

#endif /* MERIDIAN_IO_URING_BPF_H */
