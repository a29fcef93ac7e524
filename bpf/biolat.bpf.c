// SPDX-License-Identifier: GPL-2.0
/* meridian biolat: block request latency, sizes, queue depth and slow requests.
 *
 * Two strategies for the same logic, picked at run time by autoload:
 *   btf_*: tp_btf programs that get the struct request pointer, the exact key
 *          for a request in flight (merges and requeues make dev+sector collide);
 *   tp_*:  plain block tracepoints keyed by dev+sector, for kernels without tp_btf.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "bits.bpf.h"
#include "maps.bpf.h"
#include "biolat.h"

const volatile bool targ_queued = false;	/* -Q: latency starts at insert */
const volatile __u64 latency_unit_ns = 1000;	/* histogram buckets of usecs (or msecs) */
const volatile bool filter_dev_on = false;
const volatile __u32 filter_dev = 0;
const volatile bool track_depth = false;	/* --depth: requests in flight per device */
const volatile bool slow_on = false;
/* No block_io_start (before 6.5): the submitter is the task at insert, or at issue when
 * the request skipped the queue (issued directly, in the submitter's context). */
const volatile bool submitter_at_issue = false;
const volatile __u64 slow_ns = 0;
const volatile __u64 wakeup_bytes = 1;

/* A request in flight: the pointer (tp_btf) or dev+sector (tracepoints). */
struct req_key {
	__u64 id;
	__u32 dev;
	__u32 pad;
};

struct req_state {
	__u64 insert_ns;
	__u64 issue_ns;
	__u32 pid;
	__u32 depth;		/* --depth: requests in flight at its issue, itself included */
	char comm[BIOLAT_COMM_LEN];
};

MAP_DEF(reqs, BPF_MAP_TYPE_HASH, struct req_key, struct req_state, 65536);
HIST_MAP_DEF(hists, BPF_MAP_TYPE_HASH, struct biolat_key, struct biolat_hist, 16384);
MAP_DEF(sizes, BPF_MAP_TYPE_HASH, struct biolat_size_key, __u64, BIOLAT_SIZES);
MAP_DEF(depth, BPF_MAP_TYPE_HASH, __u32, struct biolat_depth, 1024);
MAP_DEF(counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct biolat_counters, 1);

RINGBUF_DEF(events, 1 << 22);

EXPORT_RECORD(biolat_event);

static const struct biolat_hist zero_hist;
static const struct biolat_depth zero_depth;

/* Completions run in interrupts too, and may nest in another program on a CPU. */
#define COUNT(field) COUNT_ATOMIC(&counters, struct biolat_counters, field)

static __always_inline bool dev_filtered(__u32 dev)
{
	return filter_dev_on && dev != filter_dev;
}

static __always_inline void hist_add(__u32 dev, enum biolat_op op, enum biolat_kind kind,
				     __u32 slot, __u32 bytes, __u64 slot_value, __u64 sample)
{
	struct biolat_key key = { .dev = dev, .op = op, .kind = kind, .slot = slot };
	struct biolat_hist *h = lookup_or_init(&hists, &key, &zero_hist);

	if (!h) {
		COUNT(hists_full);
		return;
	}
	__sync_fetch_and_add(&h->buckets[hist_bucket(slot_value, BIOLAT_BUCKETS)], 1);
	__sync_fetch_and_add(&h->sum, sample);
	__sync_fetch_and_add(&h->bytes, bytes);
	atomic_min(&h->min, sample);
	atomic_max(&h->max, sample);
}

static __always_inline __u32 size_slot(__u32 bytes)
{
	return bytes ? (__u32)log2_u64(bytes) : 0;
}

/* A request leaves the device (completed or requeued): one fewer in flight, and the
 * busy period ends with the last. Its start is read before the decrement, so an issue
 * on another CPU that starts the next period right after the decrement cannot be
 * taken for this period's start. The race left: an issue whose 0 -> 1 came before its
 * busy_since_ns store, completing within those few instructions: its period is lost
 * (`now > since` keeps the sum from going back). */
static __always_inline void leave_device(__u32 dev, __u64 now)
{
	struct biolat_depth *d = bpf_map_lookup_elem(&depth, &dev);
	__u64 since;

	if (!d)
		return;
	since = *(volatile __u64 *)&d->busy_since_ns;
	if (__sync_fetch_and_add(&d->inflight, -1) == 1 && now > since)
		__sync_fetch_and_add(&d->busy_ns, now - since);
}

/* One completed request of `bytes` into the exact size counts. */
static __always_inline void size_add(__u32 dev, enum biolat_op op, __u32 bytes)
{
	struct biolat_size_key key = { .dev = dev, .op = op, .bytes = bytes };
	static const __u64 zero;
	__u64 *n = lookup_or_init(&sizes, &key, &zero);

	if (!n) {
		COUNT(sizes_full);
		return;
	}
	__sync_fetch_and_add(n, 1);
}

static __always_inline void note_submitter(struct req_state *st)
{
	st->pid = bpf_get_current_pid_tgid() >> 32;
	bpf_get_current_comm(&st->comm, sizeof(st->comm));
}

/* The submitting thread allocates the request: remember who it was. */
static __always_inline void start_req(const struct req_key *k)
{
	struct req_state st = {};

	note_submitter(&st);
	if (bpf_map_update_elem(&reqs, k, &st, BPF_ANY))
		COUNT(reqs_full);
}

static __always_inline struct req_state *find_or_add(const struct req_key *k)
{
	struct req_state *st = bpf_map_lookup_elem(&reqs, k);
	struct req_state init = {};

	if (st)
		return st;
	if (bpf_map_update_elem(&reqs, k, &init, BPF_ANY)) {
		COUNT(reqs_full);
		return NULL;
	}
	return bpf_map_lookup_elem(&reqs, k);
}

static __always_inline void insert_req(const struct req_key *k)
{
	struct req_state *st = find_or_add(k);

	if (!st)
		return;
	st->insert_ns = bpf_ktime_get_ns();
	if (submitter_at_issue && !st->pid)
		note_submitter(st);
}

static __always_inline void issue_req(const struct req_key *k, __u32 dev, enum biolat_op op,
				      __u32 bytes)
{
	__u64 now = bpf_ktime_get_ns();
	struct req_state *st, fresh = { .issue_ns = now };
	struct biolat_depth *d;
	__s64 inflight;

	if (!targ_queued && !slow_on && !track_depth) {
		/* Nothing recorded before issue to keep: one map operation. */
		if (bpf_map_update_elem(&reqs, k, &fresh, BPF_ANY))
			COUNT(reqs_full);
		return;
	}
	st = find_or_add(k);
	if (!st)
		return;
	if (submitter_at_issue && !st->pid && !st->issue_ns)
		note_submitter(st);
	if (targ_queued && st->insert_ns && !st->issue_ns)
		hist_add(dev, op, BIOLAT_KIND_QUEUE, size_slot(bytes), bytes,
			 in_units(now - st->insert_ns, latency_unit_ns), now - st->insert_ns);
	if (st->issue_ns) {
		/* Issued again without a completion or requeue we saw: already in flight. */
		st->issue_ns = now;
		return;
	}
	st->issue_ns = now;
	if (!track_depth)
		return;
	d = lookup_or_init(&depth, &dev, &zero_depth);
	if (!d)
		return;
	inflight = __sync_fetch_and_add(&d->inflight, 1) + 1;
	if (inflight == 1)
		*(volatile __u64 *)&d->busy_since_ns = now;	/* was idle: busy from now */
	__sync_fetch_and_add(&d->issued, 1);
	st->depth = inflight;
	hist_add(dev, op, BIOLAT_KIND_DEPTH, 0, 0, inflight, inflight);
}

/* Back to the queue after issue: it leaves the device and will be issued again. */
static __always_inline void requeue_req(const struct req_key *k, __u32 dev)
{
	struct req_state *st = bpf_map_lookup_elem(&reqs, k);

	if (!st || !st->issue_ns)
		return;
	st->issue_ns = 0;
	COUNT(requeued);
	if (track_depth)
		leave_device(dev, bpf_ktime_get_ns());
}

/* Account a completion; returns a reserved slow-I/O record for the caller to finish. */
static __always_inline struct biolat_event *complete_req(const struct req_key *k, __u32 dev,
							 enum biolat_op op, __u32 bytes,
							 __u64 sector, int error)
{
	__u64 now = bpf_ktime_get_ns();
	struct req_state *st = bpf_map_lookup_elem(&reqs, k);
	struct biolat_event *ev = NULL;
	__u64 start, lat;

	if (!st || !st->issue_ns) {
		COUNT(unmatched);
		if (st)
			bpf_map_delete_elem(&reqs, k);
		return NULL;
	}
	start = targ_queued && st->insert_ns ? st->insert_ns : st->issue_ns;
	lat = now - start;
	hist_add(dev, op, BIOLAT_KIND_LATENCY, size_slot(bytes), bytes,
		 in_units(lat, latency_unit_ns), lat);
	size_add(dev, op, bytes);
	if (track_depth && st->depth) {
		hist_add(dev, op, BIOLAT_KIND_LATENCY_AT_DEPTH, (__u32)log2_u64(st->depth), bytes,
			 in_units(lat, latency_unit_ns), lat);
		leave_device(dev, now);
	}

	if (slow_on && lat >= slow_ns) {
		ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
		if (!ev) {
			COUNT(events_lost);
		} else {
			ev->ts_ns = now;
			ev->sector = sector;
			ev->latency_ns = lat;
			ev->queue_ns = st->insert_ns ? st->issue_ns - st->insert_ns : 0;
			ev->dev = dev;
			ev->bytes = bytes;
			ev->pid = st->pid;
			ev->error = error;
			ev->op = op;
			__builtin_memcpy(ev->comm, st->comm, sizeof(ev->comm));
		}
	}
	bpf_map_delete_elem(&reqs, k);
	return ev;
}

/* ---- tp_btf strategy: the request pointer ------------------------------------------ */

struct request___old {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

static __always_inline __u32 rq_dev(struct request *rq)
{
	struct gendisk *disk;

	if (bpf_core_field_exists(((struct request___old *)rq)->rq_disk))
		disk = BPF_CORE_READ((struct request___old *)rq, rq_disk);
	else
		disk = BPF_CORE_READ(rq, q, disk);
	if (!disk)
		return 0;
	return (BPF_CORE_READ(disk, major) << 20) | BPF_CORE_READ(disk, first_minor);
}

static __always_inline enum biolat_op op_of_flags(__u32 flags)
{
	switch (flags & 0xff) {
	case 0: return BIOLAT_OP_READ;		/* REQ_OP_READ */
	case 1: return BIOLAT_OP_WRITE;		/* REQ_OP_WRITE */
	case 7: return BIOLAT_OP_WRITE;		/* REQ_OP_ZONE_APPEND */
	case 2: return BIOLAT_OP_FLUSH;		/* REQ_OP_FLUSH */
	case 3: return BIOLAT_OP_DISCARD;	/* REQ_OP_DISCARD */
	case 5: return BIOLAT_OP_DISCARD;	/* REQ_OP_SECURE_ERASE */
	default: return BIOLAT_OP_OTHER;
	}
}

/* The rwbs string that the block tracepoints print, built from cmd_flags. */
static __always_inline void fill_rwbs(char *rwbs, __u32 flags)
{
	__u32 sync = 1U << bpf_core_enum_value(enum req_flag_bits, __REQ_SYNC);
	__u32 meta = 1U << bpf_core_enum_value(enum req_flag_bits, __REQ_META);
	__u32 fua = 1U << bpf_core_enum_value(enum req_flag_bits, __REQ_FUA);
	__u32 preflush = 1U << bpf_core_enum_value(enum req_flag_bits, __REQ_PREFLUSH);
	__u32 rahead = 1U << bpf_core_enum_value(enum req_flag_bits, __REQ_RAHEAD);
	int i = 0;

	if (flags & preflush)
		rwbs[i++] = 'F';
	switch (flags & 0xff) {
	case 1: case 7: rwbs[i++] = 'W'; break;
	case 3: rwbs[i++] = 'D'; break;
	case 5: rwbs[i++] = 'D'; rwbs[i++] = 'E'; break;
	case 2: rwbs[i++] = 'F'; break;
	case 0: rwbs[i++] = 'R'; break;
	default: rwbs[i++] = 'N';
	}
	if (flags & fua)
		rwbs[i++] = 'F';
	if (flags & rahead)
		rwbs[i++] = 'A';
	if (flags & sync)
		rwbs[i++] = 'S';
	if (flags & meta)
		rwbs[i++] = 'M';
}

/* A program of the request's life before completion: its key is the request pointer,
 * `body` runs unless the device is filtered out (`k` the key, `dev` the device). */
#define BTF_REQ_PROG(hook, name, body)						\
	SEC("tp_btf/" hook)							\
	int BPF_PROG(name, struct request *rq)					\
	{									\
		struct req_key k = { .id = (__u64)rq };				\
		__u32 dev = rq_dev(rq);						\
										\
		if (!dev_filtered(dev))						\
			body;							\
		return 0;							\
	}

BTF_REQ_PROG("block_io_start", btf_io_start, start_req(&k))
BTF_REQ_PROG("block_rq_insert", btf_rq_insert, insert_req(&k))
BTF_REQ_PROG("block_rq_issue", btf_rq_issue,
	     issue_req(&k, dev, op_of_flags(BPF_CORE_READ(rq, cmd_flags)),
		       BPF_CORE_READ(rq, __data_len)))
BTF_REQ_PROG("block_rq_requeue", btf_rq_requeue, requeue_req(&k, dev))

SEC("tp_btf/block_rq_complete")
int BPF_PROG(btf_rq_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	struct req_key k = { .id = (__u64)rq };
	__u32 dev = rq_dev(rq);
	__u32 flags = BPF_CORE_READ(rq, cmd_flags);
	struct biolat_event *ev;

	if (dev_filtered(dev))
		return 0;
	ev = complete_req(&k, dev, op_of_flags(flags), nr_bytes, BPF_CORE_READ(rq, __sector), error);
	if (ev) {
		__builtin_memset(ev->rwbs, 0, sizeof(ev->rwbs));
		fill_rwbs(ev->rwbs, flags);
		ringbuf_submit_lazy(&events, ev, wakeup_bytes, ev->ts_ns);
	}
	return 0;
}

/* ---- tracepoint strategy: dev+sector ----------------------------------------------- */

static __always_inline enum biolat_op op_of_rwbs(const char *rwbs)
{
	char c = rwbs[0];

	/* A leading F is a preflush when an operation letter follows it. */
	if (c == 'F' && (rwbs[1] == 'W' || rwbs[1] == 'R' || rwbs[1] == 'D' || rwbs[1] == 'N'))
		c = rwbs[1];
	switch (c) {
	case 'R': return BIOLAT_OP_READ;
	case 'W': return BIOLAT_OP_WRITE;
	case 'D': return BIOLAT_OP_DISCARD;
	case 'F': return BIOLAT_OP_FLUSH;
	default: return BIOLAT_OP_OTHER;
	}
}

/* The op of a tracepoint record's rwbs field. */
static __always_inline enum biolat_op tp_op(const char *field)
{
	char rwbs[BIOLAT_RWBS_LEN];

	bpf_probe_read_kernel(rwbs, sizeof(rwbs), field);
	return op_of_rwbs(rwbs);
}

/* The same through the plain tracepoints: the key is dev+sector, `ctx` the
 * tracepoint's record of `type`. */
#define TP_REQ_PROG(hook, name, type, body)					\
	SEC("tracepoint/block/" hook)						\
	int name(struct type *ctx)						\
	{									\
		struct req_key k = { .id = ctx->sector, .dev = ctx->dev };	\
										\
		if (!dev_filtered(ctx->dev))					\
			body;							\
		return 0;							\
	}

TP_REQ_PROG("block_io_start", tp_io_start, trace_event_raw_block_rq, start_req(&k))
TP_REQ_PROG("block_rq_insert", tp_rq_insert, trace_event_raw_block_rq, insert_req(&k))
TP_REQ_PROG("block_rq_issue", tp_rq_issue, trace_event_raw_block_rq,
	    issue_req(&k, ctx->dev, tp_op(ctx->rwbs), ctx->bytes))
TP_REQ_PROG("block_rq_requeue", tp_rq_requeue, trace_event_raw_block_rq_requeue,
	    requeue_req(&k, ctx->dev))

SEC("tracepoint/block/block_rq_complete")
int tp_rq_complete(struct trace_event_raw_block_rq_completion *ctx)
{
	struct req_key k = { .id = ctx->sector, .dev = ctx->dev };
	char rwbs[BIOLAT_RWBS_LEN];
	struct biolat_event *ev;

	if (dev_filtered(ctx->dev))
		return 0;
	bpf_probe_read_kernel(rwbs, sizeof(rwbs), ctx->rwbs);
	ev = complete_req(&k, ctx->dev, op_of_rwbs(rwbs), ctx->nr_sector << 9, ctx->sector,
			  ctx->error);
	if (ev) {
		__builtin_memcpy(ev->rwbs, rwbs, sizeof(rwbs));
		ringbuf_submit_lazy(&events, ev, wakeup_bytes, ev->ts_ns);
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
