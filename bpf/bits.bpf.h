/* Log2 and log-linear histogram helpers shared by every program (kernel side only). */
#ifndef MERIDIAN_BITS_BPF_H
#define MERIDIAN_BITS_BPF_H

/* floor(log2(v)), with log2(0) == 0: slot i holds [2^i, 2^(i+1)), slot 0 holds 0 and 1. */
static __always_inline __u64 log2_u32(__u32 v)
{
	__u32 shift, r;

	r = (v > 0xFFFF) << 4; v >>= r;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r;
}

static __always_inline __u64 log2_u64(__u64 v)
{
	__u32 hi = v >> 32;

	return hi ? log2_u32(hi) + 32 : log2_u32(v);
}

/* The slot for v, clamped to the last slot of a histogram with `nslots` slots. */
static __always_inline __u32 hist_slot(__u64 v, __u32 nslots)
{
	__u64 s = log2_u64(v);

	return s >= nslots ? nslots - 1 : (__u32)s;
}

/* Log-linear histograms (src/meridian/hist.py reads them, HIST_SUB_BITS there too):
 * values below 2^HIST_SUB_BITS have a bucket each; above, each power of two [2^e,
 * 2^(e+1)) is split into 2^HIST_SUB_BITS buckets of width 2^(e-HIST_SUB_BITS), so a
 * bucket is at most 1/16 of its lower bound wide (the quantiles' relative error, 6.25%).
 * A power of two's buckets sum to exactly its log2 slot, so bcc's text histogram is
 * unchanged. The last bucket also holds everything above. */
#define HIST_SUB_BITS 4
#define HIST_SUB (1U << HIST_SUB_BITS)
/* Buckets of a histogram of values below 2^log2_top (log2 slots 0 .. log2_top - 1). */
#define HIST_BUCKETS(log2_top) ((1 + (log2_top) - HIST_SUB_BITS) * HIST_SUB)

/* A hash map of histogram values, not preallocated: a per-CPU value of a few KB times
 * every possible CPU times max_entries would be taken up front (GBs on a large host);
 * this way memory follows the keys in use (bpf_mem_alloc, any context). */
#define HIST_MAP_DEF(_name, _type, _key, _value, _max_entries)	\
	struct {						\
		__uint(type, _type);				\
		__uint(map_flags, BPF_F_NO_PREALLOC);		\
		__uint(max_entries, _max_entries);		\
		__type(key, _key);				\
		__type(value, _value);				\
	} _name SEC(".maps")

static __always_inline __u32 hist_bucket(__u64 v, __u32 nbuckets)
{
	__u64 e, b;

	if (v < HIST_SUB) {
		b = v;
	} else {
		e = log2_u64(v);
		b = ((e - HIST_SUB_BITS + 1) << HIST_SUB_BITS) |
		    ((v >> (e - HIST_SUB_BITS)) & (HIST_SUB - 1));
	}
	return b >= nbuckets ? nbuckets - 1 : (__u32)b;
}

/* A latency in the histogram's unit of `unit_ns` (a read-only global): nsecs as they
 * are; usecs by a multiply and a shift instead of a division: 274877907 =
 * ceil(2^38 / 1000) is exact for every ns < 2^38 / 56 (56 = 274877907 * 1000 - 2^38),
 * so for all below 2^32 ns (4.3 s). */
static __always_inline __u64 in_units(__u64 ns, __u64 unit_ns)
{
	if (unit_ns == 1)
		return ns;
	if (unit_ns == 1000 && ns < (1ULL << 32))
		return (ns * 274877907ULL) >> 38;
	return ns / unit_ns;
}

/* The smallest (largest) non-zero value into *p, shared between CPUs: a few
 * compare-and-swap tries (another CPU that wins moved *p the same way). 0 = none yet. */
static __always_inline void atomic_min(__u64 *p, __u64 v)
{
	__u64 old;

	for (int i = 0; i < 4; i++) {
		old = *p;
		if ((old && old <= v) || __sync_val_compare_and_swap(p, old, v) == old)
			return;
	}
}

static __always_inline void atomic_max(__u64 *p, __u64 v)
{
	__u64 old;

	for (int i = 0; i < 4; i++) {
		old = *p;
		if (old >= v || __sync_val_compare_and_swap(p, old, v) == old)
			return;
	}
}

/* Add a value to a histogram `h` with fields buckets[nbuckets], and `sum`, `min` and
 * `max` (the names given: the sum, smallest and largest sample, min 0 = none yet) of
 * the sample `s`; `bv` is the value in the buckets' unit. Plain adds: for per-CPU
 * values of programs that do not nest on a CPU. */
#define HIST_ADD(h, bv, s, nbuckets, sum, min, max)				\
	do {									\
		(h)->buckets[hist_bucket(bv, nbuckets)]++;			\
		(h)->sum += (s);						\
		if (!(h)->min || (s) < (h)->min)				\
			(h)->min = (s);						\
		if ((s) > (h)->max)						\
			(h)->max = (s);						\
	} while (0)

/* A latency of `ns` into a histogram value `h` (fields buckets[nbuckets], sum_ns,
 * min_ns, max_ns), its bucket in units of `unit_ns`. */
#define LATENCY_ADD(h, ns, unit_ns, nbuckets)					\
	HIST_ADD(h, in_units(ns, unit_ns), ns, nbuckets, sum_ns, min_ns, max_ns)

#endif
