/* meridian io, part of io.bpf.c (included there before start_op): the path of each file
 * an operation touches, resolved in the kernel while the fd is open, so short-lived
 * processes (cat, dd, cp, a compiler) are named too.
 *
 * The first time an inode is seen (an LRU hash, `named`), its path goes out as one
 * `fileio_name` record through the `names` ring, before the operation's own event.
 * The value kept per inode is a signature of the file's last name: its dentry's name
 * hash and length, its directory's inode and whether it is unlinked. A rename of the
 * file or an unlink changes it, and the name is sent again as the kernel then sees it
 * (with " (deleted)", as /proc/PID/fd shows it). A rename of a directory above is not
 * seen. User space keeps a bounded (dev, ino) -> path cache (names.py); when it has
 * forgotten one the kernel still remembers, it deletes the inode from `named` to have
 * it sent again. The walk itself (dentries to the mount root and across mounts, bounded
 * depth) is the one `meridian syscalls` uses for fds: the shared fdpath.bpf.h. */
#ifndef MERIDIAN_IO_NAMES_BPF_H
#define MERIDIAN_IO_NAMES_BPF_H

struct inode_key {
	__u64 ino;
	__u32 dev;		/* kernel dev_t of the super block */
	__u32 pad;
};

MAP_DEF(named, BPF_MAP_TYPE_LRU_HASH, struct inode_key, __u64, 16384);

/* The record is built here, then copied into the ring (the walk writes into a map
 * value; ring memory cannot be handed to its callbacks). The walk's writes are bounded
 * by masks, not by the room left: `spill` takes what may run past the path. */
struct fileio_name_buf {
	struct fileio_name n;
	char spill[IO_PATH_LEN];
};

MAP_DEF(name_buf, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct fileio_name_buf, 1);

/* The shared walk (fdpath.bpf.h, as `meridian syscalls` resolves fds), into name_buf. */
#define FDPATH_LEN IO_PATH_LEN
#define FDPATH_DEPTH 32
#define FDPATH_MAX_BASE 0

static __always_inline char *fdpath_dest(void)
{
	__u32 zero = 0;
	struct fileio_name_buf *b = bpf_map_lookup_elem(&name_buf, &zero);

	return b ? b->n.path : NULL;
}

#include "fdpath.bpf.h"

RINGBUF_DEF(names, 1 << 22);

EXPORT_RECORD(fileio_name);

/* Unlinked: the dentry is unhashed and not a root (d_unlinked()). d: read with KFIELD. */
static __always_inline bool unlinked(struct dentry *d)
{
	return !KFIELD(d, d_hash.pprev) && KFIELD(d, d_parent) != d;
}

/* The walk and the record, as a global function: verified once, not inlined into each
 * syscall's program (raw_enter would exceed the verifier's budget). Its arguments are
 * numbers; the file pointer is retyped here (KOBJ). Returns 0 when sent. */
__noinline int send_name(__u64 file, __u64 ino, __u32 dev, __u32 gone, __u64 sig)
{
	struct file *f = KOBJ(struct file, file);
	struct fileio_name_buf *b;
	struct inode_key k;
	__u32 zero = 0;
	long n;

	b = bpf_map_lookup_elem(&name_buf, &zero);
	if (!b)
		return 1;
	b->n.ts_ns = bpf_ktime_get_ns();
	b->n.ino = ino;
	b->n.dev = dev;
	b->n.deleted = gone;
	n = fdpath_write(f, b->n.path, 0);	/* " (deleted)" included, as /proc shows it */
	b->n.len = n > 0 ? n - 1 : 0;
	/* No wake-up: the reader drains the names whenever the events ring wakes it. */
	if (bpf_ringbuf_output(&names, &b->n, sizeof(b->n), BPF_RB_NO_WAKEUP)) {
		COUNT(names_lost);
		return 1;	/* not remembered: the next operation tries again */
	}
	/* The key built only now, from the record: its stack is the walk's (the frames of
	 * a program, this function and a bpf_loop() callback share 512 bytes). */
	k.ino = b->n.ino;
	k.dev = b->n.dev;
	k.pad = 0;
	bpf_map_update_elem(&named, &k, &sig, BPF_ANY);
	return 0;
}

/* Sends f's path if this inode's name was not sent yet, or has changed since: inline,
 * the common case is one lookup that finds the same signature. f and inode: read with
 * KFIELD (kread.bpf.h). */
static __always_inline void note_name(struct file *f, struct inode *inode)
{
	struct inode_key k = { .ino = KFIELD(inode, i_ino), .dev = KFIELD(inode, i_sb, s_dev) };
	struct dentry *d = KFIELD(f, f_path.dentry);
	struct inode *dir;
	__u64 sig, *old, file = 0;
	bool gone;

	if (!events_on || !d)
		return;
	gone = unlinked(d);
	dir = KFIELD(d, d_parent, d_inode);
	sig = dir ? KFIELD(dir, i_ino) : 0;
	sig = KFIELD(d, d_name.hash_len) ^ (sig * 0x9E3779B97F4A7C15ULL) ^ gone;
	old = bpf_map_lookup_elem(&named, &k);
	if (old && *old == sig)
		return;
	/* The pointer as a number (a global function takes scalars): copied off the stack. */
	bpf_probe_read_kernel(&file, sizeof(file), &f);
	send_name(file, k.ino, k.dev, gone, sig);
}

#endif /* MERIDIAN_IO_NAMES_BPF_H */
