/* Reading a task's kernel objects with direct loads (kernel side only). */
#ifndef MERIDIAN_TASK_BPF_H
#define MERIDIAN_TASK_BPF_H

#include <bpf/bpf_core_read.h>
#include "kread.bpf.h"

/* task->files->fdt->fd[fd]: the struct file, or NULL; its fields are read with KFIELD
 * (kread.bpf.h). The fd array slot is read as a struct kiocb, whose first field is a
 * struct file pointer. */
static __always_inline struct file *fd_file(struct task_struct *task, int fd)
{
	struct fdtable *fdt = task->files->fdt;

	if (fd < 0 || (unsigned int)fd >= fdt->max_fds)
		return NULL;
	return KREAD(struct kiocb, (unsigned long)fdt->fd + (unsigned long)fd * sizeof(void *),
		     ki_filp);
}

#endif
