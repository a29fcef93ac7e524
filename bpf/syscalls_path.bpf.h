/* meridian syscalls, part of syscalls.bpf.c (included there): the path of an fd, from
 * its dentries up to the root across mounts, written into the record. */
#ifndef MERIDIAN_SYSCALLS_PATH_BPF_H
#define MERIDIAN_SYSCALLS_PATH_BPF_H

static __always_inline struct dentry *as_dentry(__u64 p)
{
	return bpf_rdonly_cast((void *)p, bpf_core_type_id_kernel(struct dentry));
}

static __always_inline struct mount *as_mount(__u64 p)
{
	return bpf_rdonly_cast((void *)p, bpf_core_type_id_kernel(struct mount));
}

/* A name kept inside its dentry (d_shortname, under 40 bytes: most names) copied as
 * five word loads and stores, with no helper call; the bytes past it are overwritten by
 * what follows. Returns its length, or -1 when the name lives elsewhere (a long name,
 * or a kernel before 6.14, which calls the field d_iname). */
static __always_inline long copy_short_name(__u64 p, char *to)
{
	struct dentry *d = as_dentry(p);
	__u32 len = d->d_name.len;
	__u64 *out = (__u64 *)to;

	if (!bpf_core_field_exists(struct dentry, d_shortname) ||
	    (__u64)d->d_name.name != p + bpf_core_field_offset(struct dentry, d_shortname) ||
	    len >= sizeof(d->d_shortname))
		return -1;
	out[0] = d->d_shortname.words[0];
	out[1] = d->d_shortname.words[1];
	out[2] = d->d_shortname.words[2];
	out[3] = d->d_shortname.words[3];
	out[4] = d->d_shortname.words[4];
	return len;
}

/* Walking an fd's dentries up to the root, then writing their names down from it,
 * straight into the record being built (bufs[0]) at data[base]: two bpf_loop()
 * callbacks, each verified once (bounded loops in place of them exceed the verifier's
 * budget). Kernel pointers are kept as numbers and retyped with bpf_rdonly_cast where
 * they are read. */
struct walk_ctx {
	__u64 d;	/* struct dentry * */
	__u64 mnt;	/* struct mount * */
	__u32 n;	/* dentries in chain, leaf first */
	__u32 off;	/* bytes of the path written */
	__u32 base;	/* where the path starts in data[] (at most 2 * SYSCALLS_STR_LEN) */
	__u64 chain[SYSCALLS_PATH_DEPTH];
};

static long walk_up(__u64 i, struct walk_ctx *c)
{
	struct mount *mnt = as_mount(c->mnt);
	__u64 parent, mnt_parent;

	if (c->d == (__u64)mnt->mnt.mnt_root) {
		mnt_parent = (__u64)mnt->mnt_parent;
		if (mnt_parent == c->mnt)
			return 1;	/* the root of everything */
		c->d = (__u64)mnt->mnt_mountpoint;
		c->mnt = mnt_parent;
		return 0;
	}
	parent = (__u64)as_dentry(c->d)->d_parent;
	if (parent == c->d || c->n >= SYSCALLS_PATH_DEPTH)
		return 1;	/* root of an internal file system (pipe, socket), or too deep */
	c->chain[c->n & (SYSCALLS_PATH_DEPTH - 1)] = c->d;
	c->n++;
	c->d = parent;
	return 0;
}

static long write_down(__u64 k, struct walk_ctx *c)
{
	__u32 zero = 0, at, base = c->base;
	struct syscalls_buf *b = bpf_map_lookup_elem(&bufs, &zero);
	__u64 d;
	long len;

	if (!b || k >= c->n || c->off >= SYSCALLS_PATH_LEN - 1 || base > 2 * SYSCALLS_STR_LEN)
		return 1;
	d = c->chain[(c->n - 1 - k) & (SYSCALLS_PATH_DEPTH - 1)];
	at = base + (c->off & (SYSCALLS_PATH_LEN - 1));
	b->data[at] = '/';
	c->off++;
	at = base + (c->off & (SYSCALLS_PATH_LEN - 1));
	len = copy_short_name(d, &b->data[at]);
	if (len < 0)
		len = bpf_probe_read_kernel_str(&b->data[at], SYSCALLS_PATH_LEN,
						as_dentry(d)->d_name.name) - 1;
	if (len > 0)
		c->off += len;
	return 0;
}

/* The path of an fd (crossing mounts, at most SYSCALLS_PATH_DEPTH names) into the
 * start record b at data[base]: its length with the NUL, 0 if none. */
static __always_inline long fd_path(struct task_struct *task, int fd, struct syscalls_buf *b,
				    __u32 base)
{
	struct file *f = fd_file(task, fd);
	struct walk_ctx c = {};

	if (!f || base > 2 * SYSCALLS_STR_LEN)
		return 0;
	c.d = (__u64)f->f_path.dentry;
	c.mnt = (__u64)container_of(f->f_path.mnt, struct mount, mnt);
	c.base = base;
	bpf_loop(SYSCALLS_PATH_DEPTH + 16, walk_up, &c, 0);
	if (c.n == 0) {
		b->data[base] = '/';
		c.off = 1;
	} else {
		bpf_loop(SYSCALLS_PATH_DEPTH, write_down, &c, 0);
	}
	if (c.off > SYSCALLS_PATH_LEN - 1)
		c.off = SYSCALLS_PATH_LEN - 1;
	b->data[base + (c.off & (SYSCALLS_PATH_LEN - 1))] = 0;
	return c.off + 1;
}

#endif /* MERIDIAN_SYSCALLS_PATH_BPF_H */
