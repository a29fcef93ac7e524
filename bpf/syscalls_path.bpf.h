/* meridian syscalls, part of syscalls.bpf.c (included there): the path of an fd, as
 * /proc/PID/fd names it, written into the start record being built (bufs[0]) behind
 * its strings, by the shared walk in fdpath.bpf.h, or from a per-CPU cache of the
 * paths walked last.
 *
 * The cache. A walk costs more than the rest of a start (bpf_stats: about 130 ns of a
 * 3-level path on this VM, a callback return at each level; on 6.1, a helper call per
 * field), and most fds a program uses it walks again and again (read, fstat, close).
 * A path stays what it was while no rename and no mount change happened anywhere: the
 * kernel's rename_lock and mount_lock sequence counts, which d_path() itself checks,
 * are the entry's validity. Their addresses come from /proc/kallsyms (user space sets
 * them), which lists data symbols only with CONFIG_KALLSYMS_ALL (Debian's kernels);
 * without them there is no cache. An entry also keeps what a dentry freed and reused
 * at the same address would change (its parent, name hash and length, inode), and is
 * taken only while its file is not unlinked (" (deleted)" is decided at each use).
 * Pseudo files (pipe:[ino], ...) are named without a walk and not cached. */
#ifndef MERIDIAN_SYSCALLS_PATH_BPF_H
#define MERIDIAN_SYSCALLS_PATH_BPF_H

#define FDPATH_LEN SYSCALLS_PATH_LEN
#define FDPATH_DEPTH SYSCALLS_PATH_DEPTH
#define FDPATH_MAX_BASE (2 * SYSCALLS_STR_LEN)	/* behind both strings */

/* The start record's data[] (bufs[0]): SYSCALLS_DATA_LEN is 2 * (STR_LEN + PATH_LEN). */
static __always_inline char *fdpath_dest(void)
{
	__u32 zero = 0;
	struct syscalls_buf *b = bpf_map_lookup_elem(&bufs, &zero);

	return b ? b->data : NULL;
}

#include "fdpath.bpf.h"

/* The addresses of the kernel's rename_lock and mount_lock (seqlock_t: the first word
 * is the count, odd while written), [0] and [1], set by user space before attach; 0
 * where kallsyms does not list them. In a map, not read-only data: the cache's code
 * is then never dead code for the verifier to cut out, and is checked on every kernel
 * as it runs (6.18 failed to load a program whose function, static or global, had its
 * dead code removed: "verifier bug: No program to jit at insn"). */
MAP_DEF(path_locks, BPF_MAP_TYPE_ARRAY, __u32, __u64, 2);

#define PATH_CACHE_WAYS 16	/* entries a CPU, picked by the name's hash */

struct path_entry {
	__u64 gen;		/* odd while a program writes the entry (it may be preempted) */
	__u64 dentry;		/* the file's f_path: the key (0: empty) */
	__u64 mnt;
	__u64 parent;		/* the dentry's d_parent, d_name.hash_len and d_inode */
	__u64 hash_len;
	__u64 inode;
	__u32 renames;		/* rename_lock's and mount_lock's counts when walked */
	__u32 mounts;
	__u32 len;		/* bytes of path, NUL included */
	__u32 pad;
	char path[SYSCALLS_PATH_LEN];
};

MAP_DEF(path_cache, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct path_entry, PATH_CACHE_WAYS);

/* What an entry must hold to be a file's path now, and the file: in a map, as
 * file_path() takes it. */
struct path_key {
	__u64 file;		/* struct file *, as a number */
	__u64 dentry, mnt, parent, hash_len, inode;
	__u64 rename_lock, mount_lock;	/* their addresses */
	__u32 renames, mounts;
	__u32 ok;		/* the fields hold the file's key (path_key_of() said so) */
};

MAP_DEF(path_now, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct path_key, 1);

/* A sequence count at addr (odd: being written, so never a hit). */
static __always_inline __u32 seq_at(__u64 addr)
{
	__u32 seq = 1;

	if (have_bpf_rdonly_cast)
		return KCAST(struct seqcount, addr)->sequence;
	bpf_probe_read_kernel(&seq, sizeof(seq), (const void *)addr);
	return seq;
}

/* f's key into k; false when its path is not cached: no counts to check it by, a
 * pseudo file, an unlinked file, or a rename or mount change under way. f: from KOBJ. */
static __always_inline bool path_key_of(struct file *f, struct path_key *k)
{
	__u32 first = 0, second = 1;
	__u64 *rename_lock = bpf_map_lookup_elem(&path_locks, &first);
	__u64 *mount_lock = bpf_map_lookup_elem(&path_locks, &second);
	struct dentry *d = KFIELD(f, f_path.dentry);
	const struct dentry_operations *op;

	if (!rename_lock || !mount_lock || !*rename_lock || !*mount_lock || !d)
		return false;
	k->rename_lock = *rename_lock;
	k->mount_lock = *mount_lock;
	op = KFIELD(d, d_op);
	if (op && KFIELD(op, d_dname))
		return false;
	if (!KFIELD(d, d_hash.pprev))	/* unlinked (or a root: not worth an entry) */
		return false;
	k->renames = seq_at(k->rename_lock);
	k->mounts = seq_at(k->mount_lock);
	if ((k->renames | k->mounts) & 1)
		return false;
	k->dentry = (__u64)d;
	k->mnt = (__u64)KFIELD(f, f_path.mnt);
	k->parent = (__u64)KFIELD(d, d_parent);
	k->hash_len = KFIELD(d, d_name.hash_len);
	k->inode = (__u64)KFIELD(d, d_inode);
	return true;
}

/* k's entry, picked by its name's hash (salted by the parent dentry's address). */
static __always_inline struct path_entry *path_slot(const struct path_key *k)
{
	__u32 way = (__u32)k->hash_len & (PATH_CACHE_WAYS - 1);

	return bpf_map_lookup_elem(&path_cache, &way);
}

/* Copy a whole path's room, SYSCALLS_PATH_LEN bytes, as unrolled word loads and
 * stores: no helper call, and no branch on the length for the verifier to follow.
 * Bytes past the path are junk that the record's fd_len leaves out. */
static __always_inline void copy_path(char *to, const char *from)
{
	int i;

#pragma unroll
	for (i = 0; i < SYSCALLS_PATH_LEN / 8; i++)
		((__u64 *)to)[i] = ((const __u64 *)from)[i];
}

/* The cached path of k into b->data at base: its length with the NUL, 0 on a miss. */
static __always_inline long path_from_cache(const struct path_key *k, struct syscalls_buf *b,
					    __u32 base)
{
	struct path_entry *e = path_slot(k);
	__u64 gen;
	__u32 len;

	if (!e)
		return 0;
	gen = e->gen;
	barrier();
	len = e->len;
	if (gen & 1 || e->dentry != k->dentry || e->mnt != k->mnt || e->parent != k->parent ||
	    e->hash_len != k->hash_len || e->inode != k->inode || e->renames != k->renames ||
	    e->mounts != k->mounts || len == 0 || len > SYSCALLS_PATH_LEN)
		return 0;
	copy_path(&b->data[bound(base)], e->path);	/* bound again: see bound() */
	barrier();
	return e->gen == gen ? len : 0;	/* rewritten meanwhile: walk instead */
}

/* Keep the path just walked (`len` bytes at b->data[base]) for k, unless a rename or
 * a mount change happened during the walk. */
static __always_inline void path_to_cache(const struct path_key *k, const struct syscalls_buf *b,
					  __u32 base, long len)
{
	struct path_entry *e;

	if (len <= 0 || len > SYSCALLS_PATH_LEN || seq_at(k->rename_lock) != k->renames ||
	    seq_at(k->mount_lock) != k->mounts)
		return;
	e = path_slot(k);
	if (!e)
		return;
	e->gen++;
	barrier();
	e->dentry = k->dentry;
	e->mnt = k->mnt;
	e->parent = k->parent;
	e->hash_len = k->hash_len;
	e->inode = k->inode;
	e->renames = k->renames;
	e->mounts = k->mounts;
	e->len = len;
	copy_path(e->path, &b->data[bound(base)]);
	barrier();
	e->gen++;
}

/* The path of k->file into b->data at base (b: the start being built, bufs[0]), from
 * the cache or walked: its length with the NUL, 0 if none. A global function, which
 * the verifier checks once, on its own, not again for each way a start reaches it:
 * btf_sys_enter went from 493,000 instructions of its million on 6.18 to 246,000
 * (with the cache inlined: 925,000). Where the cache is off, the call is all it costs
 * a walked fd (7-20 ns on this VM, where each return is a Safe RET: the SRSO
 * mitigation). The file comes as a number in k (a map): a global function's arguments
 * cannot be kernel pointers on 6.1. */
__noinline long file_path(struct path_key *k, struct syscalls_buf *b, __u32 base)
{
	struct file *f;
	long n;

	if (!k || !b || !k->file)
		return 0;
	base = bound(base);
	f = KOBJ(struct file, k->file);
	k->ok = path_key_of(f, k);
	if (k->ok) {
		n = path_from_cache(k, b, base);
		if (n > 0) {
			COUNT(paths_cached);
			return n;
		}
	}
	n = fdpath_write(f, b->data, base);
	if (k->ok)
		path_to_cache(k, b, base, n);
	return n;
}

/* The path of an fd into the start record b at data[base]: its length with the NUL,
 * 0 if none. */
static __always_inline long fd_path(struct task_struct *task, int fd, struct syscalls_buf *b,
				    __u32 base)
{
	__u32 zero = 0;
	struct path_key *k = bpf_map_lookup_elem(&path_now, &zero);

	if (!k)		/* never (an array's entry 0) */
		return 0;
	k->file = (__u64)fd_file(task, fd);
	return file_path(k, b, base);
}

#endif /* MERIDIAN_SYSCALLS_PATH_BPF_H */
