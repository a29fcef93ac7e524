/* meridian syscalls, part of syscalls.bpf.c (included there): output arguments (a
 * user pointer the call fills in) read at a successful exit and sent with the end,
 * so user space shows pipe2([3, 4], ...) and fstat's st_mode and st_size, as strace. */
#ifndef MERIDIAN_SYSCALLS_OUT_BPF_H
#define MERIDIAN_SYSCALLS_OUT_BPF_H

/* One piece of an output argument: `len` bytes at user address `at` into the end
 * record at data[*off]; false when it cannot be read. */
static __always_inline bool read_piece(struct syscalls_buf *b, __u64 at, __u32 len, __u32 *off)
{
	__u32 o = bound(*off);

	if (len == 0 || len > 8 || bpf_probe_read_user(&b->data[o], len, (const void *)at))
		return false;
	*off = o + len;
	return true;
}

/* Two fields of a user struct in one read (one helper call, not two): `len1` bytes at
 * `at`, then `len2` bytes at `at + gap`, into the end record at data[*off]. */
static __always_inline bool read_two(struct syscalls_buf *b, __u64 at, __u32 len1, __u32 gap,
				     __u32 len2, __u32 *off)
{
	__u8 raw[32];
	__u32 o = bound(*off);

	if (len1 > 8 || len2 > 8 || gap > 24 || bpf_probe_read_user(raw, gap + 8, (const void *)at))
		return false;
	__builtin_memcpy(&b->data[o], raw, 8);	/* the first field (and what follows it) */
	__builtin_memcpy(&b->data[o + len1], &raw[gap & 31], 8);
	*off = o + len1 + len2;
	return true;
}

/* The output argument of a call that succeeded (pipe2's fds, a stat buffer) behind
 * the end's strings, as enum syscalls_out says; its length in e->out_len. */
static __always_inline void read_output(struct syscalls_buf *b, const struct syscalls_meta *meta,
					long ret, __u32 *off)
{
	int pos = meta->out_pos;
	__u32 start = *off;
	bool ok = false;
	__u64 p;

	if (ret < 0 || pos < 0 || pos >= 6)
		return;
	p = b->ev.args[pos & 7];
	switch (meta->out_kind) {
	case SYSCALLS_OUT_FDS:
		ok = read_piece(b, p, 8, off);
		break;
	case SYSCALLS_OUT_STAT:	/* st_mode (+24, 4 bytes) and st_size (+48, 8) */
		ok = read_two(b, p + 24, 4, 24, 8, off);
		break;
	case SYSCALLS_OUT_STATX:	/* stx_mode (+28, 2 bytes) and stx_size (+40, 8) */
		ok = read_two(b, p + 28, 2, 12, 8, off);
		break;
	}
	if (!ok) {
		*off = start;	/* nothing sent, not half of it */
		return;
	}
	b->ev.out_len = *off - start;
}

#endif /* MERIDIAN_SYSCALLS_OUT_BPF_H */
