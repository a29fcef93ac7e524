/* meridian syscalls, part of syscalls.bpf.c (included there): the path of an fd, as
 * /proc/PID/fd names it, written into the start record being built (bufs[0]) behind
 * its strings, by the shared walk in fdpath.bpf.h. */
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

/* The path of an fd into the start record b at data[base]: its length with the NUL,
 * 0 if none. */
static __always_inline long fd_path(struct task_struct *task, int fd, struct syscalls_buf *b,
				    __u32 base)
{
	return fdpath_write(fd_file(task, fd), b->data, base);
}

#endif /* MERIDIAN_SYSCALLS_PATH_BPF_H */
