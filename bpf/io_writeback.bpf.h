/* meridian io, part of io.bpf.c (included there before io_block.bpf.h): writeback
 * charged to the process that dirtied the pages, not to the flusher that writes them.
 *
 * The dirtying side: tp_btf/writeback_dirty_folio fires in the dirtying task each time a
 * page-cache folio goes from clean to dirty, with its address_space; its host inode
 * keys an LRU hash (dev, ino) -> the last user process that dirtied it. The kernel's
 * own ownership (inode->i_wb) is per cgroup, not per process, so this map is ours.
 *
 * The writing side: at block_io_start (in the submitting thread) a write request's
 * first page is followed to its inode: bio->bi_io_vec[bi_idx].bv_page (its head page for
 * a large folio) ->mapping->host. If a process other than the submitter dirtied it,
 * the request is charged to that process in the `writeback` map, by device.
 *
 * Why this and not the flusher's writeback_single_inode_start (which inode a worker
 * writes now): the page names its inode wherever the request comes from (the flusher,
 * `sync`, an fsync of another process, the bdev mapping's metadata), with no per-thread
 * state to keep in step, and one map lookup per request. Its limits: a request is
 * charged whole to its first page's inode (requests merge only contiguous sectors, so
 * in practice one file), and to the inode's last dirtier. */
#ifndef MERIDIAN_IO_WRITEBACK_BPF_H
#define MERIDIAN_IO_WRITEBACK_BPF_H

#define PF_KTHREAD_FLAG 0x00200000
#define REQ_OP_WRITE_CODE 1
#define PAGE_MAPPING_FLAGS 3UL	/* anon, movable, KSM: not a file's mapping */

const volatile bool writeback_on = false;	/* tp_dirty_folio is attached */

/* The last user process that dirtied an inode's pages. */
struct dirtier {
	__u32 pid;
	__u32 start;		/* proc_start */
	__u32 traced;		/* it passed the filters when it dirtied the pages */
	__u32 pad;
	char comm[IO_COMM_LEN];
};

/* LRU: an inode nobody writes back any more ages out; the entries put in are counted
 * (wb_dirtiers) and user space subtracts the live ones to show the evicted. */
MAP_DEF(dirtiers, BPF_MAP_TYPE_LRU_HASH, struct inode_key, struct dirtier, 16384);

/* Block requests written back on behalf of a process: key (dirtier, op write, start,
 * device), the same values as disk_io. */
HIST_MAP_DEF(writeback, BPF_MAP_TYPE_PERCPU_HASH, struct fileio_disk_key,
	     struct fileio_disk_stats, 8192);

SEC("tp_btf/writeback_dirty_folio")
int BPF_PROG(tp_dirty_folio, struct folio *folio, struct address_space *mapping)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct inode_key k = {};
	struct dirtier d = {}, *cur;
	struct inode *host;

	if (task->flags & PF_KTHREAD_FLAG)
		return 0;	/* the kernel's own (loop workers, jbd2): the flusher's share */
	host = mapping ? mapping->host : NULL;
	if (!host)
		return 0;
	k.ino = host->i_ino;
	k.dev = host->i_sb->s_dev;
	d.pid = task->tgid;
	d.start = proc_start(task);
	cur = bpf_map_lookup_elem(&dirtiers, &k);
	if (cur && cur->pid == d.pid && cur->start == d.start)
		return 0;	/* the common case: the same writer, one lookup per folio */
	d.traced = traced(d.pid);
	__builtin_memcpy(d.comm, task->comm, sizeof(d.comm));
	bpf_map_update_elem(&dirtiers, &k, &d, BPF_ANY);
	if (!cur)
		COUNT(wb_dirtiers);
	return 0;
}

/* The dirtier of the request's first page, or NULL; *file: the page is a file's. */
static __always_inline struct dirtier *rq_dirtier(struct request *rq, bool *file)
{
	struct inode_key k = {};
	struct bio_vec *bv;
	struct page *page;
	unsigned long head, mapping;
	struct inode *host;
	struct bio *bio = rq->bio;

	if (!bio)
		return NULL;
	bv = BPF_CORE_READ(bio, bi_io_vec);
	if (!bv)
		return NULL;
	bv += BPF_CORE_READ(bio, bi_iter.bi_idx);
	page = BPF_CORE_READ(bv, bv_page);
	if (!page)
		return NULL;
	head = BPF_CORE_READ(page, compound_head);
	if (head & 1)
		page = (struct page *)(head - 1);	/* a tail page of a large folio */
	mapping = (unsigned long)BPF_CORE_READ(page, mapping);
	if (!mapping || (mapping & PAGE_MAPPING_FLAGS))
		return NULL;
	host = BPF_CORE_READ((struct address_space *)mapping, host);
	if (!host)
		return NULL;
	*file = true;
	k.ino = BPF_CORE_READ(host, i_ino);
	k.dev = BPF_CORE_READ(host, i_sb, s_dev);
	return bpf_map_lookup_elem(&dirtiers, &k);
}

/* At block_io_start: whose request this is when it writes back another process's
 * pages. 1: `o` names the dirtier (charged in `writeback`); -1: the dirtier is one the
 * filters exclude (filters select the writer, not the flusher: not counted at all);
 * 0: the submitter's own (disk_io, as before). */
static __always_inline int writeback_owner(struct request *rq, struct task_struct *task,
					   struct rq_owner *o)
{
	struct dirtier *d;
	bool file = false;

	if (!writeback_on || (rq->cmd_flags & 0xff) != REQ_OP_WRITE_CODE)
		return 0;
	d = rq_dirtier(rq, &file);
	if (!d) {
		if (file && (task->flags & PF_KTHREAD_FLAG))
			COUNT(wb_unattributed);
		return 0;
	}
	if (d->pid == task->tgid && d->start == proc_start(task))
		return 0;
	if (!d->traced)
		return -1;
	o->pid = d->pid;
	o->tid = 0;
	o->start = d->start;
	o->dev = BPF_CORE_READ(rq, q, disk, part0, bd_dev);
	if (!o->dev)
		o->dev = ~0U;	/* never 0: 0 means the submitter's own */
	__builtin_memcpy(o->comm, d->comm, sizeof(o->comm));
	return 1;
}

#endif /* MERIDIAN_IO_WRITEBACK_BPF_H */
