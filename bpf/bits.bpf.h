/* log2 slot helpers shared by every histogram (kernel side only). */
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

/* Add a latency of `ns` to a histogram value `h` (fields slots[nslots], sum_ns and
 * max_ns), its slot in units of `unit_ns`. Plain adds: for per-CPU values of programs
 * that do not nest on a CPU. */
#define LATENCY_ADD(h, ns, unit_ns, nslots)					\
	do {									\
		(h)->slots[hist_slot(in_units(ns, unit_ns), nslots)]++;		\
		(h)->sum_ns += (ns);						\
		if ((ns) > (h)->max_ns)						\
			(h)->max_ns = (ns);					\
	} while (0)

#endif
