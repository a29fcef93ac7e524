/* meridian io, part of io.bpf.c (included there, after the state and the accounting):
 * the disk signals every strategy shares and the block-layer programs. */
#ifndef MERIDIAN_IO_BLOCK_BPF_H
#define MERIDIAN_IO_BLOCK_BPF_H

/* ---- disk signals (every strategy) ------------------------------------------------- */

#define REQ_OP_BITS_MASK 0xff

/* The operation a disk signal of thread tid belongs to: its syscall in flight, else
 * the io_uring request it issues (io_uring.bpf.h); NULL: none. */
static __always_inline struct fileio_inflight *signal_slot(__u32 tid)
{
	struct fileio_inflight *st = busy_slot(tid);

	return st ? st : uring_slot(tid);
}

/* Pages [index, index + 2^order) of inode `ino` on `dev` entered the page cache: read
 * from the disk for the operation `st` in flight on this thread (or for the readahead
 * past it). The tracepoint and the tp_btf program below call it with the same values,
 * each only for a thread with an operation in flight (the folio is read only then). */
static __always_inline void page_added(struct fileio_inflight *st, __u64 ino, __u32 dev,
				       __u64 index, __u32 order)
{
	struct ahead_key k = {};
	struct ahead_range *r, nr;
	__u64 n, a, b, s, e, own;

	n = 1ULL << (order & 31);
	if (st->pair && ino == st->ino2 && dev == st->dev2)
		return;		/* the copy's target: pages it dirties, no disk I/O */
	if (st->op != IO_OP_READ || ino != st->ino || dev != st->dev) {
		st->pages += n;		/* metadata, or another file: this operation's disk I/O */
		return;
	}
	/* The part of [a, b) inside the operation's own range is its own; the rest is
	 * readahead for the reads that follow. */
	a = index;
	b = a + n;
	s = st->pos / PAGE_SIZE_BYTES;
	e = (st->pos + st->bytes_requested + PAGE_SIZE_BYTES - 1) / PAGE_SIZE_BYTES;
	own = 0;
	if ((a > s ? a : s) < (b < e ? b : e))
		own = (b < e ? b : e) - (a > s ? a : s);
	st->pages += own;
	if (own == n)
		return;
	if (a < e)
		a = e;		/* only what lies past the read's range is credited */
	if (a >= b)
		return;
	k.ino = st->ino;
	k.dev = st->dev;
	r = bpf_map_lookup_elem(&ahead, &k);
	if (r && a <= r->hi && b >= r->lo) {
		if (a < r->lo)
			r->lo = a;
		if (b > r->hi)
			r->hi = b;
		return;
	}
	nr.lo = a;
	nr.hi = b;
	if (!r)
		__sync_fetch_and_add(&ahead_live, 1);
	bpf_map_update_elem(&ahead, &k, &nr, BPF_ANY);
}

/* A bio of `bytes` from `sector` was queued by the operation in flight on this thread.
 * The first of each direction with data gives the event its sector: block_bio_queue
 * fires after the partition remap, so it is the whole disk's sector as the block
 * tracepoints show it (the request built from that bio starts there), on every kernel
 * (6.1 has no block_io_start) and under both kinds of disk signal. */
static __always_inline void bio_queued(__u64 bytes, bool write, __u64 sector)
{
	struct fileio_inflight *st = signal_slot((__u32)bpf_get_current_pid_tgid());

	if (!st)
		return;
	st->bio_bytes += bytes;
	if (write)
		st->wbio_bytes += bytes;
	if (!bytes)
		return;		/* an empty preflush: no sector of the data */
	if (write && st->wsector < 0)
		st->wsector = sector;
	else if (!write && st->rsector < 0)
		st->rsector = sector;
}

/* The tracepoints: what the tracepoint and kprobe strategies load (tracefs). */
SEC("tracepoint/filemap/mm_filemap_add_to_page_cache")
int tp_page_added(struct trace_event_raw_mm_filemap_op_page_cache *ctx)
{
	struct fileio_inflight *st = signal_slot((__u32)bpf_get_current_pid_tgid());

	if (st)
		page_added(st, ctx->i_ino, ctx->s_dev, ctx->index, ctx->order);
	return 0;
}

SEC("tracepoint/block/block_bio_queue")
int tp_bio_queue(struct trace_event_raw_block_bio *ctx)
{
	/* rwbs "W..", "FW..": a write, with a preflush or not */
	bio_queued((__u64)ctx->nr_sector << 9, ctx->rwbs[0] == 'W' || ctx->rwbs[1] == 'W',
		   ctx->sector);
	return 0;
}

/* The same hooks as raw tracepoints with BTF (tp_btf and fentry strategies): no
 * tracefs, so they run in a pod without it. They compute what the tracepoints record
 * (include/trace/events/filemap.h, block.h) from the folio and the bio. */

/* 6.1-6.7 keep a large folio's order in _folio_order; 6.8+ in _flags_1's low byte. */
struct folio___61 {
	unsigned char _folio_order;
} __attribute__((preserve_access_index));

static __always_inline __u32 folio_order_of(struct folio *folio)
{
	unsigned long flags = 0;

	/* folio->flags: an unsigned long before 6.18, memdesc_flags_t since; first either way */
	bpf_probe_read_kernel(&flags, sizeof(flags), folio);
	if (!(flags & (1UL << bpf_core_enum_value(enum pageflags, PG_head))))
		return 0;
	if (bpf_core_field_exists(((struct folio___61 *)folio)->_folio_order))
		return BPF_CORE_READ((struct folio___61 *)folio, _folio_order);
	return BPF_CORE_READ(folio, _flags_1) & 0xff;
}

SEC("tp_btf/mm_filemap_add_to_page_cache")
int BPF_PROG(btf_page_added, struct folio *folio)
{
	struct fileio_inflight *st = signal_slot((__u32)bpf_get_current_pid_tgid());
	struct inode *host;
	struct super_block *sb;
	__u32 dev;

	if (!st)
		return 0;
	host = BPF_CORE_READ(folio, mapping, host);
	sb = BPF_CORE_READ(host, i_sb);
	dev = sb ? BPF_CORE_READ(sb, s_dev) : BPF_CORE_READ(host, i_rdev);
	page_added(st, BPF_CORE_READ(host, i_ino), dev, BPF_CORE_READ(folio, index),
		   folio_order_of(folio));
	return 0;
}

#define REQ_OP_WRITE_VALUE 1	/* REQ_OP_WRITE: rwbs 'W' (blk_fill_rwbs) */

SEC("tp_btf/block_bio_queue")
int BPF_PROG(btf_bio_queue, struct bio *bio)
{
	__u32 opf = BPF_CORE_READ(bio, bi_opf);

	bio_queued(BPF_CORE_READ(bio, bi_iter.bi_size),
		   (opf & REQ_OP_BITS_MASK) == REQ_OP_WRITE_VALUE,
		   BPF_CORE_READ(bio, bi_iter.bi_sector));
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
	int wb = writeback_owner(rq, task, &o);	/* another process's pages? */

	if (wb > 0)
		bpf_map_update_elem(&rqs, &key, &o, BPF_ANY);
	if (wb || !traced(task->tgid))
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
	void *map;
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
	dk.dev = o->dev;	/* non-zero: on behalf of o->pid, into `writeback` */
	map = o->dev ? (void *)&writeback : (void *)&disk_io;
	s = bpf_map_lookup_elem(map, &dk);
	if (!s) {
		bpf_map_update_elem(map, &dk, &zero_disk, BPF_NOEXIST);
		s = bpf_map_lookup_elem(map, &dk);
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
			if (!s->latency_min_ns || lat < s->latency_min_ns)
				s->latency_min_ns = lat;
			if (lat > s->latency_max_ns)
				s->latency_max_ns = lat;
			s->buckets[hist_bucket(lat, IO_HIST_BUCKETS)]++;
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

#endif /* MERIDIAN_IO_BLOCK_BPF_H */
