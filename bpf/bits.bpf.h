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

#endif
