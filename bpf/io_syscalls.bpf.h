/* meridian io, part of io.bpf.c (included there, last): the syscall programs of every
 * strategy, thin wrappers instantiated per attach type around enter_sys() and
 * finish_op(). */
#ifndef MERIDIAN_IO_SYSCALLS_BPF_H
#define MERIDIAN_IO_SYSCALLS_BPF_H

/* ---- the syscalls: one body, instantiated per attach type ----------------------------
 * Every strategy hooks the same syscalls (the fentry one, the kernel functions that take
 * their arguments) with a thin entry program that calls enter_sys() with the syscall's
 * kind and where its arguments are, and an exit program that calls finish_op() with its
 * return value. The kind is a constant in every program but raw_enter's, so each
 * program keeps only its own path and reads only the arguments that path uses. */

#define K_READ 1		/* enum io_op + 1 */
#define K_WRITE 2
#define K_VEC 4			/* arguments: fd, iovec array, count */
#define K_POS 8			/* the 4th argument is the offset */
#define K_SENDFILE 16		/* sendfile64(out_fd, in_fd, loff_t *offset, count) */
#define K_COPY 32		/* copy_file_range(fd_in, loff_t *off_in, fd_out, loff_t *off_out,
				 * len, flags) */

/* The traced syscalls and their kinds: read, write and their pread/readv/preadv/preadv2
 * forms (preadv's pos_l holds all of the offset on 64-bit; -1 in preadv2's is the file's
 * own offset), and the copies. */
#define IO_SYSCALLS(X)                                                      \
	X(read, K_READ)                                                     \
	X(pread64, K_READ | K_POS)                                          \
	X(readv, K_READ | K_VEC)                                            \
	X(preadv, K_READ | K_VEC | K_POS)                                   \
	X(preadv2, K_READ | K_VEC | K_POS)                                  \
	X(write, K_WRITE)                                                   \
	X(pwrite64, K_WRITE | K_POS)                                        \
	X(writev, K_WRITE | K_VEC)                                          \
	X(pwritev, K_WRITE | K_VEC | K_POS)                                 \
	X(pwritev2, K_WRITE | K_VEC | K_POS)                                \
	X(sendfile64, K_SENDFILE)                                           \
	X(copy_file_range, K_COPY)

#define KIND_ENUM(name, kind) KIND_##name = kind,
enum { IO_SYSCALLS(KIND_ENUM) };

#if defined(__TARGET_ARCH_x86)
enum { NR_read = 0, NR_write = 1, NR_pread64 = 17, NR_pwrite64 = 18, NR_readv = 19,
       NR_writev = 20, NR_preadv = 295, NR_pwritev = 296, NR_preadv2 = 327,
       NR_pwritev2 = 328, NR_sendfile64 = 40, NR_copy_file_range = 326 };
#define SYSCALL_NR(regs) ((regs)->orig_ax)
#define SYSCALL_ARGS(regs) { (regs)->di, (regs)->si, (regs)->dx, (regs)->r10, (regs)->r8 }
#define SYS_PREFIX "__x64_sys_"
#elif defined(__TARGET_ARCH_arm64)
enum { NR_read = 63, NR_write = 64, NR_readv = 65, NR_writev = 66, NR_pread64 = 67,
       NR_pwrite64 = 68, NR_preadv = 69, NR_pwritev = 70, NR_preadv2 = 286,
       NR_pwritev2 = 287, NR_sendfile64 = 71, NR_copy_file_range = 285 };
#define SYSCALL_NR(regs) ((regs)->syscallno)
#define SYSCALL_ARGS(regs) { (regs)->orig_x0, (regs)->regs[1], (regs)->regs[2],     \
			     (regs)->regs[3], (regs)->regs[4] }
#define SYS_PREFIX "__arm64_sys_"
#endif

extern _Bool LINUX_HAS_SYSCALL_WRAPPER __kconfig;

/* Where an entry program finds the syscall's arguments. */
enum args_at {
	AT_TRACEPOINT,	/* syscalls:sys_enter_*: ctx->args[] */
	AT_REGS,	/* the user registers, a BTF pointer: direct loads */
	AT_KSYSCALL,	/* a kprobe on the syscall: its own registers */
	AT_WRAPPED,	/* a kprobe on the syscall's wrapper: the user registers behind
			 * its argument, read with helpers (as libbpf's BPF_KSYSCALL) */
};

/* ctx->args[n] with a literal index: args is a CO-RE access (vmlinux.h), and an index
 * computed from its relocated offset would move the context pointer, which the verifier
 * refuses. */
static __always_inline unsigned long tp_arg(struct trace_event_raw_sys_enter *ctx, int n)
{
	switch (n) {
	case 0: return ctx->args[0];
	case 1: return ctx->args[1];
	case 2: return ctx->args[2];
	case 3: return ctx->args[3];
	default: return ctx->args[4];
	}
}

/* Argument n (0: the first) of the syscall. */
static __always_inline unsigned long sys_arg(enum args_at at, void *ctx, int n)
{
	struct pt_regs *regs = ctx;

	switch (at) {
	case AT_TRACEPOINT:
		return tp_arg(ctx, n);
	case AT_REGS: {
#ifdef SYSCALL_NR
		unsigned long args[5] = SYSCALL_ARGS(regs);

		return args[n];
#else
		return 0;
#endif
	}
	case AT_KSYSCALL:
		switch (n) {
		case 0: return PT_REGS_PARM1_SYSCALL(regs);
		case 1: return PT_REGS_PARM2_SYSCALL(regs);
		case 2: return PT_REGS_PARM3_SYSCALL(regs);
		case 3: return PT_REGS_PARM4_SYSCALL(regs);
		default: return PT_REGS_PARM5_SYSCALL(regs);
		}
	case AT_WRAPPED:
		switch (n) {
		case 0: return PT_REGS_PARM1_CORE_SYSCALL(regs);
		case 1: return PT_REGS_PARM2_CORE_SYSCALL(regs);
		case 2: return PT_REGS_PARM3_CORE_SYSCALL(regs);
		case 3: return PT_REGS_PARM4_CORE_SYSCALL(regs);
		default: return PT_REGS_PARM5_CORE_SYSCALL(regs);
		}
	}
	return 0;
}

/* The start of a syscall of this kind (0: not one of ours). */
static __always_inline void enter_sys(__u8 kind, enum args_at at, void *ctx)
{
	unsigned long count;
	__s64 pos = -1;

	if (!kind)
		return;
#define ARG(n) sys_arg(at, ctx, n)
	if (kind & K_SENDFILE) {
		enter_copy((int)ARG(1), read_pos((const loff_t *)ARG(2)),
			   (int)ARG(0), -1, ARG(3));
		return;
	}
	if (kind & K_COPY) {
		enter_copy((int)ARG(0), read_pos((const loff_t *)ARG(1)), (int)ARG(2),
			   read_pos((const loff_t *)ARG(3)), ARG(4));
		return;
	}
	count = ARG(2);
	if (kind & K_POS)
		pos = (__s64)ARG(3);
	enter_fd((int)ARG(0), (kind & K_WRITE) ? IO_OP_WRITE : IO_OP_READ,
		 (kind & K_VEC) ? iov_bytes((const struct iovec *)ARG(1), count) : count, pos);
#undef ARG
}

/* ---- tracepoint strategy: syscalls:sys_enter_* / sys_exit_* ------------------------ */

#define TRACEPOINT(name, kind)                                              \
	SEC("tracepoint/syscalls/sys_enter_" #name)                         \
	int tp_enter_##name(struct trace_event_raw_sys_enter *ctx)          \
	{                                                                   \
		enter_sys(kind, AT_TRACEPOINT, ctx);                        \
		return 0;                                                   \
	}                                                                   \
	SEC("tracepoint/syscalls/sys_exit_" #name)                          \
	int tp_exit_##name(struct trace_event_raw_sys_exit *ctx)            \
	{                                                                   \
		finish_op(ctx->ret);                                        \
		return 0;                                                   \
	}

IO_SYSCALLS(TRACEPOINT)

/* ---- kprobe strategy: the syscalls through their wrappers (ksyscall) -----------------
 * Where kprobes work but trampolines do not: libbpf's ksyscall finds the architecture's
 * wrapper; the user's arguments, and the real fd, come with it. */

#define KSYSCALL(name, kind)                                                \
	SEC("ksyscall/" #name)                                              \
	int ks_##name(struct pt_regs *ctx)                                  \
	{                                                                   \
		if (LINUX_HAS_SYSCALL_WRAPPER)                              \
			enter_sys(kind, AT_WRAPPED, (void *)PT_REGS_PARM1(ctx)); \
		else                                                        \
			enter_sys(kind, AT_KSYSCALL, ctx);                  \
		return 0;                                                   \
	}                                                                   \
	SEC("kretsyscall/" #name)                                           \
	int BPF_KRETPROBE(kr_##name, long ret)                              \
	{                                                                   \
		finish_op(ret);                                             \
		return 0;                                                   \
	}

IO_SYSCALLS(KSYSCALL)

#ifdef SYSCALL_NR
/* ---- raw syscall strategy: tp_btf sys_enter / sys_exit with an id filter -----------
 * The filter: one load from a small table indexed by syscall id. */
#define NR_TABLE 512
#define KIND_AT_NR(name, kind) [NR_##name] = kind,

static const __u8 sys_kind[NR_TABLE] = { IO_SYSCALLS(KIND_AT_NR) };

static __always_inline __u8 kind_of(unsigned long id)
{
	return id < NR_TABLE ? sys_kind[id] : 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(raw_enter, struct pt_regs *regs, long id)
{
	enter_sys(kind_of(id), AT_REGS, regs);
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(raw_exit, struct pt_regs *regs, long ret)
{
	if (kind_of(SYSCALL_NR(regs)))
		finish_op(ret);
	return 0;
}
#endif

#ifdef SYSCALL_NR
/* ---- fentry strategy: each syscall's own function ------------------------------------
 * __x64_sys_NAME (__arm64_sys_NAME), which the syscall table calls, so no compiler
 * inlines it; its one argument is the user registers, read as the raw strategy reads
 * them. Not the bodies below it that take the fd (ksys_pread64, do_readv...): Debian's
 * 6.1 and 6.12 inline ksys_pread64 and ksys_pwrite64 into their syscalls, keeping a copy
 * only for the 32-bit compat calls, so a trampoline there attached and never ran (every
 * pread went uncounted), and another build may inline others. A trampoline still costs
 * less than a syscall tracepoint. fexit reads the return value after the argument. */
#define FENTRY_SYS(name, kind)                                              \
	SEC("fentry/" SYS_PREFIX #name)                                     \
	int fentry_##name(unsigned long long *ctx)                          \
	{                                                                   \
		enter_sys(kind, AT_REGS, (void *)ctx[0]);                   \
		return 0;                                                   \
	}                                                                   \
	SEC("fexit/" SYS_PREFIX #name)                                      \
	int fexit_##name(unsigned long long *ctx)                           \
	{                                                                   \
		finish_op((long)ctx[1]);                                    \
		return 0;                                                   \
	}

IO_SYSCALLS(FENTRY_SYS)
#endif

#endif /* MERIDIAN_IO_SYSCALLS_BPF_H */
