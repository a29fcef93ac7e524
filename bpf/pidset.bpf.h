/* A tool's PID set (-p) behind a per-CPU memo of the last answer. Most syscalls on a
 * CPU come from the process before, so the set (a hash lookup, a helper call) is asked
 * once per switch instead of at every hook, and "not traced" is kept too: with -p,
 * every other process on the host pays at each of its calls the tool hooks.
 *
 * A memo is the answer for a tgid under the set's change counts: `gen`, bumped by the
 * kernel when it changes the set (syscalls following children and their exits), and
 * `epoch`, bumped by user space after it adds a PID (one writer: a map of its own).
 * A memo of other counts is asked again. The caller reads both counts before the
 * lookup, so an answer from a lookup that raced a change keeps the old counts. A set
 * written only before attach (io's) passes 0 for both. */
#ifndef MERIDIAN_PIDSET_BPF_H
#define MERIDIAN_PIDSET_BPF_H

#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"

struct pid_memo {
	__u64 gen;
	__u64 epoch;
	__u32 tgid;
	__u32 traced;
};

#define PID_MEMO_DEF(name) MAP_DEF(name, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct pid_memo, 1)

/* Is tgid in `set` (a hash keyed by tgid)? `memo`: a PID_MEMO_DEF map. */
static __always_inline bool pid_in_set(void *memo, void *set, __u32 tgid, __u64 gen,
				       __u64 epoch)
{
	__u32 zero = 0;
	struct pid_memo *m = bpf_map_lookup_elem(memo, &zero);
	bool in;

	if (m && m->tgid == tgid && m->gen == gen && m->epoch == epoch)
		return m->traced;
	in = bpf_map_lookup_elem(set, &tgid) != NULL;
	if (m) {
		m->tgid = tgid;
		m->gen = gen;
		m->epoch = epoch;
		m->traced = in;
	}
	return in;
}

#endif
