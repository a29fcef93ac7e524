/* The path of an open file as the kernel names it (/proc/PID/fd), shared by the tools
 * that resolve file names in the kernel (syscalls, io). Needs task.bpf.h.
 *
 * The includer defines, before including it:
 *   FDPATH_LEN       bytes of a path with its NUL (a power of 2)
 *   FDPATH_DEPTH     names walked up from the file (a power of 2)
 *   FDPATH_MAX_BASE  the largest `base` passed to fdpath_write()
 *   static __always_inline char *fdpath_dest(void)
 *                    the destination area, looked up again in the bpf_loop()
 *                    callbacks (a map value: a pointer cannot be passed to them); it has
 *                    room for FDPATH_MAX_BASE + 2 * FDPATH_LEN bytes, as the writes are
 *                    bounded by masks, not by the room left.
 * and calls fdpath_write(f, dest, base) with dest == fdpath_dest().
 *
 * A file on a mounted file system: its dentries walked up to the root, across mounts,
 * " (deleted)" appended when it is unlinked (d_path()). A file whose dentry names
 * itself (d_op->d_dname, the pseudo files of internal file systems): the name composed
 * here as the kernel's d_dname would, by the super block's magic (fdpath_dname.bpf.h). */
#ifndef MERIDIAN_FDPATH_BPF_H
#define MERIDIAN_FDPATH_BPF_H

/* The index base + off (off masked to the path's room) into the destination, bounded
 * again just before the write that uses it: base and off come from a map or a caller,
 * and 6.1's verifier loses a bound that the compiler put on another copy of the value
 * (a spill, a 32-bit move), while the compiler drops a clamp or mask it proves
 * redundant. The barriers keep both, on the register the write uses. */
static __always_inline __u64 fdpath_at(__u64 base, __u64 off)
{
	barrier_var(base);
	if (base > FDPATH_MAX_BASE)
		base = FDPATH_MAX_BASE;
	barrier_var(off);
	return base + (off & (FDPATH_LEN - 1));
}

/* A name kept inside its dentry (d_shortname, under 40 bytes: most names) copied as
 * five word loads and stores, with no helper call; the bytes past it are overwritten by
 * what follows. Returns its length, or -1 when the name lives elsewhere (a long name,
 * or a kernel before 6.14, which calls the field d_iname). direct: as in KFIELD_BY. */
static __always_inline long copy_short_name(__u64 p, char *to, const bool direct)
{
	struct dentry *d;
	__u64 *out = (__u64 *)to;
	__u32 len;

	if (!bpf_core_field_exists(struct dentry, d_shortname))
		return -1;
	d = KOBJ_BY(direct, struct dentry, p);
	len = KFIELD_BY(direct, d, d_name.len);
	if ((__u64)KFIELD_BY(direct, d, d_name.name) !=
		    p + bpf_core_field_offset(struct dentry, d_shortname) ||
	    len >= sizeof(d->d_shortname))
		return -1;
	out[0] = KFIELD_BY(direct, d, d_shortname.words[0]);
	out[1] = KFIELD_BY(direct, d, d_shortname.words[1]);
	out[2] = KFIELD_BY(direct, d, d_shortname.words[2]);
	out[3] = KFIELD_BY(direct, d, d_shortname.words[3]);
	out[4] = KFIELD_BY(direct, d, d_shortname.words[4]);
	return len;
}

/* Walking a file's dentries up to the root, then writing their names down from it,
 * straight into fdpath_dest() at [base]: two bpf_loop() callbacks, each verified once
 * (bounded loops in place of them exceed the verifier's budget). Kernel pointers are
 * kept as numbers. Each callback comes in two builds, reading with direct loads or
 * with bpf_probe_read_kernel (KREAD_BY, KFIELD_BY: kread.bpf.h), and the caller picks
 * one by have_bpf_rdonly_cast: no test of the flag inside a callback. */
struct fdpath_walk {
	__u64 d;	/* struct dentry * */
	__u64 mnt;	/* struct mount * */
	__u32 n;	/* dentries in chain, leaf first */
	__u32 off;	/* bytes of the path written */
	__u32 base;	/* where the path starts in the destination (at most FDPATH_MAX_BASE) */
	__u64 chain[FDPATH_DEPTH];
};

/* The walk's state lives in a map value, not on the stack. Since 6.7 the verifier
 * checks a bpf_loop() callback iteration after iteration until its state repeats; a
 * stack value is tracked exactly, so with `n` and `off` there every iteration was new
 * (286,000 instructions processed for each program that resolves a name, 0.4 s of
 * load time each on this VM's 6.18, minutes under QEMU). The fields of a map value are
 * unknown numbers to the verifier: the second iteration matches the first. Per-CPU, as
 * the destination is: programs that name files do not nest on a CPU. */
MAP_DEF(fdpath_state, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct fdpath_walk, 1);

static __always_inline struct fdpath_walk *fdpath_state_of_cpu(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&fdpath_state, &zero);
}

static __always_inline long walk_up(struct fdpath_walk *c, const bool direct)
{
	struct mount *mnt = KOBJ_BY(direct, struct mount, c->mnt);
	__u64 parent, mnt_parent;

	if (c->d == (__u64)KFIELD_BY(direct, mnt, mnt.mnt_root)) {
		mnt_parent = (__u64)KFIELD_BY(direct, mnt, mnt_parent);
		if (mnt_parent == c->mnt)
			return 1;	/* the root of everything */
		c->d = (__u64)KFIELD_BY(direct, mnt, mnt_mountpoint);
		c->mnt = mnt_parent;
		return 0;
	}
	parent = (__u64)KREAD_BY(direct, struct dentry, c->d, d_parent);
	if (parent == c->d || c->n >= FDPATH_DEPTH)
		return 1;	/* a disconnected root, or too deep */
	c->chain[c->n & (FDPATH_DEPTH - 1)] = c->d;
	c->n++;
	c->d = parent;
	return 0;
}

static __always_inline long write_down(__u64 k, struct fdpath_walk *c, const bool direct)
{
	__u64 at, off = c->off, base = c->base;
	char *dest = fdpath_dest();
	__u64 d;
	long len;

	if (!dest || k >= c->n || off >= FDPATH_LEN - 1 || base > FDPATH_MAX_BASE)
		return 1;
	d = c->chain[(c->n - 1 - k) & (FDPATH_DEPTH - 1)];
	dest[fdpath_at(base, off)] = '/';
	off++;
	at = fdpath_at(base, off);
	len = copy_short_name(d, &dest[at], direct);
	if (len < 0)
		len = bpf_probe_read_kernel_str(&dest[at], FDPATH_LEN,
						KREAD_BY(direct, struct dentry, d, d_name.name)) - 1;
	c->off = len > 0 ? off + len : off;
	return 0;
}

static long fdpath_walk_up(__u64 i, void *unused)
{
	struct fdpath_walk *c = fdpath_state_of_cpu();

	return c ? walk_up(c, true) : 1;
}

static long fdpath_walk_up_probed(__u64 i, void *unused)
{
	struct fdpath_walk *c = fdpath_state_of_cpu();

	return c ? walk_up(c, false) : 1;
}

static long fdpath_write_down(__u64 k, void *unused)
{
	struct fdpath_walk *c = fdpath_state_of_cpu();

	return c ? write_down(k, c, true) : 1;
}

static long fdpath_write_down_probed(__u64 k, void *unused)
{
	struct fdpath_walk *c = fdpath_state_of_cpu();

	return c ? write_down(k, c, false) : 1;
}

#include "fdpath_dname.bpf.h"	/* fdpath_dname(): the names of pseudo files */

/* The walk of f's dentries (d: its dentry) for fdpath_write(). A function of its own, so
 * that the walk's temporaries and fdpath_dname()'s share their stack: the frames of a
 * program, send_name() and a bpf_loop() callback together fit in the verifier's 512
 * bytes, also with the temporaries of kernels without bpf_rdonly_cast. */
static __always_inline long fdpath_walk(struct file *f, struct dentry *d, char *dest,
					__u32 base)
{
	struct fdpath_walk *c = fdpath_state_of_cpu();
	__u32 off;

	if (!c)
		return 0;
	c->d = (__u64)d;
	c->mnt = (__u64)KFIELD(f, f_path.mnt) - bpf_core_field_offset(struct mount, mnt);
	c->n = 0;
	c->off = 0;
	c->base = base;
	if (have_bpf_rdonly_cast)
		bpf_loop(FDPATH_DEPTH + 16, fdpath_walk_up, NULL, 0);
	else
		bpf_loop(FDPATH_DEPTH + 16, fdpath_walk_up_probed, NULL, 0);
	if (c->n == 0) {
		dest[fdpath_at(base, 0)] = '/';
		c->off = 1;
	} else if (have_bpf_rdonly_cast) {
		bpf_loop(FDPATH_DEPTH, fdpath_write_down, NULL, 0);
	} else {
		bpf_loop(FDPATH_DEPTH, fdpath_write_down_probed, NULL, 0);
	}
	off = c->off;
	if (off > FDPATH_LEN - 1)
		off = FDPATH_LEN - 1;
	off = fdpath_deleted(d, dest, base, off);
	dest[fdpath_at(base, off)] = 0;
	return off + 1;
}

/* f's path at dest[base] (dest: fdpath_dest(), base at most FDPATH_MAX_BASE),
 * NUL-terminated: its length with the NUL, 0 when f is NULL. f: from fd_file() or KOBJ
 * (its fields read with KFIELD). */
static __always_inline long fdpath_write(struct file *f, char *dest, __u32 base)
{
	struct dentry *d;
	long n;

	if (!f || base > FDPATH_MAX_BASE)
		return 0;
	d = KFIELD(f, f_path.dentry);
	n = fdpath_dname(f, d, dest, base);
	if (n > 0)
		return n;
	return fdpath_walk(f, d, dest, base);
}

#endif /* MERIDIAN_FDPATH_BPF_H */
