/* A tool's PID set (-p) behind a per-CPU memo of the last answer. Most syscalls on a
 * CPU come from the process before, so the set (a hash lookup, a helper call) is asked
 * once per switch instead of at every hook, and "not traced" is kept too: with -p,
 * every other process on the host pays at each of its calls the tool hooks.
 *
 * A memo is one word, written and read whole, so that a program preempted on the CPU
 * (fentry, faultable syscall tracepoints) cannot leave one process's answer under
 * another's tgid: the tgid, the answer, and a stamp of the set's change count. The
 * count is the caller's: bumped whenever the set changes (syscalls: by the kernel when
 * it follows a child or removes a PID, by user space after it adds one); a memo of
 * another stamp is asked again. The caller reads the count before the lookup, so an
 * answer from a lookup that raced a change keeps the old stamp. A set written only
 * before attach (io's) passes 0. The stamp keeps 31 bits: a memo is wrong only if
 * exactly a multiple of 2^31 changes fell between two calls of one process on a CPU.
 * Stack: the memo's key is read-only data, not a stack slot (io's raw_enter, the walk
 * of send_name() and its bpf_loop() callback share 512 bytes, counted in 32-byte
 * frames by 6.1's verifier, and were at 512 exactly). */
#ifndef MERIDIAN_PIDSET_BPF_H
#define MERIDIAN_PIDSET_BPF_H

#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"

#define PID_MEMO_DEF(name) MAP_DEF(name, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, __u64, 1)

const volatile __u32 pid_memo_key = 0;

#define PID_MEMO_IN (1ULL << 31)

/* Is tgid in `set` (a hash keyed by tgid)? `memo`: a PID_MEMO_DEF map; `count`: the
 * set's change count, read before this call. */
static __always_inline bool pid_in_set(void *memo, void *set, __u32 tgid, __u64 count)
{
	__u64 *m = bpf_map_lookup_elem(memo, (const void *)&pid_memo_key);
	__u64 want = (__u64)tgid << 32 | (count & (PID_MEMO_IN - 1)), v;
	bool in;

	if (m) {
		v = *(volatile __u64 *)m;
		if ((v & ~PID_MEMO_IN) == want)
			return v & PID_MEMO_IN;
	}
	in = bpf_map_lookup_elem(set, &tgid) != NULL;
	if (m)
		*(volatile __u64 *)m = want | (in ? PID_MEMO_IN : 0);
	return in;
}

#endif
