/* Reading kernel memory that no program argument typed: a field of the object at a
 * kernel address (kept as a number, or reached through a pointer the verifier does not
 * type).
 *
 * Where the kernel has the bpf_rdonly_cast kfunc (6.2+), the address is retyped as its
 * BTF type and the field is a direct load (a fault reads as zero): no helper call, which
 * on hosts with return-thunk mitigations costs tens of ns (the verifier turns the kfunc
 * call itself into a register move). Older kernels (Debian 12's 6.1) read the same
 * field with bpf_probe_read_kernel. The loader sets have_bpf_rdonly_cast from the
 * kernel's BTF before load (meridian.bpf.object: every `have_<kfunc>` global), so the
 * verifier drops the other branch, and the weak extern lets the object load where the
 * kfunc is missing.
 *
 * One mechanism, in two forms:
 *   KREAD(T, addr, a, ...)   ((T *)addr)->a->...: a read from an address (a number, or
 *                            a pointer of any kind); one flag test.
 *   KOBJ(T, addr), then      the same, for several reads from one object, or for a walk
 *   KFIELD(p, a, ...)        that goes on from a pointer read on the way: KOBJ retypes
 *                            the address once; KFIELD reads p->a->... with p from KOBJ,
 *                            from a pointer KREAD or KFIELD returned, or from a typed
 *                            program argument, as many times as wanted.
 * Fields are named as in BPF_CORE_READ: a.b for embedded members, one name per pointer
 * followed (KFIELD(inode, i_sb, s_dev) is inode->i_sb->s_dev). KREAD_BY, KOBJ_BY and
 * KFIELD_BY take the choice as their first argument, a constant where the flag was
 * tested outside: in bpf_loop() callbacks (below).
 *
 * The rule: a pointer that KREAD, KOBJ or KFIELD returned is, on 6.1, a number to the
 * verifier; its fields are read with KFIELD only, never with `->` (which 6.2+ would
 * accept and 6.1 refuse). Direct `->` loads stay for pointers every kernel types: the
 * arguments of fentry and tp_btf programs, bpf_get_current_task_btf() and the pointers
 * walked from them. KCAST is the raw retype, only where have_bpf_rdonly_cast. */
#ifndef MERIDIAN_KREAD_BPF_H
#define MERIDIAN_KREAD_BPF_H

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;

const volatile bool have_bpf_rdonly_cast = false;

/* The object of type T at addr, for direct loads (only where have_bpf_rdonly_cast). */
#define KCAST(T, addr)                                                          \
	((T *)bpf_rdonly_cast((void *)(unsigned long)(addr), bpf_core_type_id_kernel(T)))

/* The object of type T at addr, to read with KFIELD: retyped where the kernel has
 * bpf_rdonly_cast, else the address itself. */
#define KOBJ(T, addr) KOBJ_BY(have_bpf_rdonly_cast, T, addr)

/* p->a->...: a direct load (as C reads it) where have_bpf_rdonly_cast, else
 * BPF_CORE_READ (a bpf_probe_read_kernel per pointer followed). A scalar or a pointer,
 * of the field's type without const (fields such as dentry's d_name are const). */
#define KFIELD(p, a, ...) KFIELD_BY(have_bpf_rdonly_cast, p, a, ##__VA_ARGS__)

/* ((T *)addr)->a->...: KFIELD(KOBJ(T, addr), a, ...) with one test of the flag. */
#define KREAD(T, addr, a, ...) KREAD_BY(have_bpf_rdonly_cast, T, addr, a, ##__VA_ARGS__)

/* The same with the choice given: `direct` is have_bpf_rdonly_cast tested once outside,
 * a constant here. For bpf_loop() callbacks: a test of the flag inside one multiplies
 * the states the verifier explores (6.7+ verifies a callback as a loop, to convergence:
 * io's tp_enter_read went from 232,000 instructions processed to 995,000 of its
 * 1,000,000), so the caller tests it and passes one of two callbacks, each built with a
 * constant (fdpath.bpf.h).
 *
 * The probe read goes through its own copy of the address (barrier_var) into its own
 * variable, so that clang shares nothing with the direct load: it keeps the field's
 * offset in the load instruction and stores nothing on the stack for it, and 6.2+ runs
 * the same instructions as with `->` (and a test of the flag, which the verifier turns
 * into no jump at all). */
#define KOBJ_BY(direct, T, addr)                                                \
	((direct) ? KCAST(T, addr) : (T *)(unsigned long)(addr))

#define KFIELD_BY(direct, p, a, ...)                                            \
	({                                                                      \
		__auto_type __kf_p = (p);                                       \
		__auto_type __kf_v = (___type(__kf_p, a, ##__VA_ARGS__))0;      \
		if (direct) {                                                   \
			__kf_v = ___arrow(__kf_p, a, ##__VA_ARGS__);            \
		} else {                                                        \
			typeof(__kf_v) __kf_t;                                  \
			barrier_var(__kf_p);                                    \
			BPF_CORE_READ_INTO(&__kf_t, __kf_p, a, ##__VA_ARGS__);  \
			__kf_v = __kf_t;                                        \
		}                                                               \
		__kf_v;                                                         \
	})

#define KREAD_BY(direct, T, addr, a, ...)                                       \
	({                                                                      \
		unsigned long __kr_a = (unsigned long)(addr);                   \
		__auto_type __kr_v = (___type(((T *)0), a, ##__VA_ARGS__))0;    \
		if (direct) {                                                   \
			__kr_v = ___arrow(KCAST(T, __kr_a), a, ##__VA_ARGS__);  \
		} else {                                                        \
			typeof(__kr_v) __kr_t;                                  \
			barrier_var(__kr_a);                                    \
			BPF_CORE_READ_INTO(&__kr_t, ((T *)__kr_a), a, ##__VA_ARGS__); \
			__kr_v = __kr_t;                                        \
		}                                                               \
		__kr_v;                                                         \
	})

#endif /* MERIDIAN_KREAD_BPF_H */
