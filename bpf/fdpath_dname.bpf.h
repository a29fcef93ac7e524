/* Part of fdpath.bpf.h (included there): the names of files whose dentry names itself
 * (d_op->d_dname), composed here as the kernel does (fs/d_path.c d_path()), picked by
 * the super block's magic, since the d_dname functions are not addressable here:
 *   pipefs   pipe:[ino]                  fs/pipe.c pipefs_dname()
 *   sockfs   socket:[ino]                net/socket.c sockfs_dname()
 *   anon     anon_inode:NAME             fs/anon_inodes.c (eventfd, eventpoll, timerfd,
 *                                        signalfd, io_uring, inotify, bpf-map, ...)
 *   pidfs    anon_inode:[pidfd]          fs/pidfs.c pidfs_dname()
 *   nsfs     TYPE:[ino]                  fs/nsfs.c ns_dname() (net:[4026531833])
 *   dmabuf   /NAME:BUFNAME               drivers/dma-buf dmabuffs_dname()
 *   others   /NAME (deleted)             simple_dname(): alloc_file_pseudo() files on a
 *                                        super block without dentry operations (memfd,
 *                                        SysV shm, shared /dev/zero maps, secretmem)
 * These are the only d_dname functions in the kernel (6.18). */
#ifndef MERIDIAN_FDPATH_DNAME_BPF_H
#define MERIDIAN_FDPATH_DNAME_BPF_H

#define FDPATH_PIPEFS_MAGIC 0x50495045
#define FDPATH_SOCKFS_MAGIC 0x534F434B
#define FDPATH_ANON_INODE_FS_MAGIC 0x09041934
#define FDPATH_PID_FS_MAGIC 0x50494446
#define FDPATH_NSFS_MAGIC 0x6e736673
#define FDPATH_DMA_BUF_MAGIC 0x444d4142

static const char fdpath_fmt_pipe[] = "pipe:[%lu]";
static const char fdpath_fmt_socket[] = "socket:[%lu]";
static const char fdpath_fmt_anon[] = "anon_inode:%s";
static const char fdpath_fmt_pidfd[] = "anon_inode:[pidfd]";
static const char fdpath_fmt_ns[] = "%s:[%lu]";
static const char fdpath_fmt_dmabuf[] = "/%s:%s";
static const char fdpath_fmt_dmabuf_anon[] = "/%s:";
static const char fdpath_fmt_simple[] = "/%s (deleted)";

/* d's name at dest[base] when d names itself: its length with the NUL, else 0. f and
 * d: read with KFIELD (kread.bpf.h). */
static __always_inline long fdpath_dname(struct file *f, struct dentry *d, char *dest,
					 __u32 base)
{
	const struct dentry_operations *op = KFIELD(d, d_op);
	struct inode *inode;
	__u64 data[2] = {};
	const char *fmt = fdpath_fmt_simple;
	long n;

	if (!op || !KFIELD(op, d_dname) || base > FDPATH_MAX_BASE)
		return 0;
	if (d == KFIELD(d, d_parent) && d == KFIELD(f, f_path.mnt, mnt_root))
		return 0;	/* the root of a mount: walked as a path */
	inode = KFIELD(d, d_inode);
	data[0] = (__u64)KFIELD(d, d_name.name);
	switch (KFIELD(d, d_sb, s_magic)) {
	case FDPATH_PIPEFS_MAGIC:
		data[0] = inode ? KFIELD(inode, i_ino) : 0;
		fmt = fdpath_fmt_pipe;
		break;
	case FDPATH_SOCKFS_MAGIC:
		data[0] = inode ? KFIELD(inode, i_ino) : 0;
		fmt = fdpath_fmt_socket;
		break;
	case FDPATH_ANON_INODE_FS_MAGIC:
		fmt = fdpath_fmt_anon;
		break;
	case FDPATH_PID_FS_MAGIC:
		fmt = fdpath_fmt_pidfd;
		break;
	case FDPATH_NSFS_MAGIC:
		if (!inode)
			return 0;
		data[0] = (__u64)KREAD(struct ns_common, KFIELD(inode, i_private), ops, name);
		data[1] = KFIELD(inode, i_ino);
		fmt = fdpath_fmt_ns;
		break;
	case FDPATH_DMA_BUF_MAGIC:
		data[1] = (__u64)KREAD(struct dma_buf, KFIELD(d, d_fsdata), name);
		fmt = data[1] ? fdpath_fmt_dmabuf : fdpath_fmt_dmabuf_anon;
		break;
	}
	n = bpf_snprintf(&dest[fdpath_at(base, 0)], FDPATH_LEN, fmt, data, sizeof(data));
	if (n <= 0)
		return 0;
	return n > FDPATH_LEN ? FDPATH_LEN : n;
}

/* A walked path of `off` bytes at dest[base] gets " (deleted)" when its file was
 * unlinked (d_unlinked(): unhashed and not a root), as /proc shows it; the new length.
 * d: read with KFIELD. */
static __always_inline __u32 fdpath_deleted(struct dentry *d, char *dest, __u32 base,
					    __u32 off)
{
	const char tail[] = " (deleted)";
	__u32 i;

	if (KFIELD(d, d_hash.pprev) || KFIELD(d, d_parent) == d || base > FDPATH_MAX_BASE)
		return off;
	if (off > FDPATH_LEN - sizeof(tail))
		off = FDPATH_LEN - sizeof(tail);
	for (i = 0; i < sizeof(tail) - 1; i++)
		dest[fdpath_at(base, off + i)] = tail[i];
	return off + sizeof(tail) - 1;
}

#endif /* MERIDIAN_FDPATH_DNAME_BPF_H */
