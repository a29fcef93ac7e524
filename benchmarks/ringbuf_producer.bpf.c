// SPDX-License-Identifier: GPL-2.0
/* Benchmark producer: one 32-byte record per getppid() of one process, submitted the
 * way every Meridian tool submits (no wake-up until the ring passes a fill mark). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "maps.bpf.h"

struct bench_rec {
	__u64 seq;
	__u64 ts_ns;
	__u32 pid;
	__u32 tid;
	__u64 arg;
};

EXPORT_RECORD(bench_rec);

const volatile __u32 target_tgid = 0;
const volatile __u64 wakeup_bytes = 1;
__u64 seq = 0;
__u64 lost = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24);
} events SEC(".maps");

SEC("tp_btf/sys_enter")
int BPF_PROG(on_enter, struct pt_regs *regs, long id)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct bench_rec *r;

	if (id != 110 || (pid_tgid >> 32) != target_tgid) /* __NR_getppid on x86_64 */
		return 0;
	r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		__sync_fetch_and_add(&lost, 1);
		return 0;
	}
	r->seq = __sync_fetch_and_add(&seq, 1);
	r->ts_ns = bpf_ktime_get_ns();
	r->pid = pid_tgid >> 32;
	r->tid = (__u32)pid_tgid;
	r->arg = id;
	ringbuf_submit_lazy(&events, r, wakeup_bytes, r->seq);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
