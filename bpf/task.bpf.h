/* Reading a task's kernel objects with direct loads (kernel side only). */
#ifndef MERIDIAN_TASK_BPF_H
#define MERIDIAN_TASK_BPF_H

#include <bpf/bpf_core_read.h>

/* A no-op at run time: the verifier retypes a kernel address as a BTF type, so its
 * fields are direct loads (a fault reads as zero) instead of bpf_probe_read_kernel
 * calls; on hosts with return-thunk mitigations every helper call costs tens of ns. */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

/* task->files->fdt->fd[fd]: the struct file, or NULL. The fd array slot is read as a
 * struct kiocb, whose first field is a struct file pointer. */
static __always_inline struct file *fd_file(struct task_struct *task, int fd)
{
	struct fdtable *fdt = task->files->fdt;
	struct kiocb *slot;

	if (fd < 0 || (unsigned int)fd >= fdt->max_fds)
		return NULL;
	slot = bpf_rdonly_cast((void *)((unsigned long)fdt->fd + (unsigned long)fd * sizeof(void *)),
			       bpf_core_type_id_kernel(struct kiocb));
	return slot->ki_filp;
}

#endif
