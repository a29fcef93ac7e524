// SPDX-License-Identifier: GPL-2.0
/* Feature probes: each program is loaded and attached alone, so `meridian doctor`
 * and the strategy choice report what this kernel really accepts. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} probe_hash SEC(".maps");

SEC("fentry/vfs_read")
int BPF_PROG(probe_fentry)
{
	return 0;
}

SEC("kprobe/vfs_read")
int BPF_KPROBE(probe_kprobe)
{
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(probe_tp_btf)
{
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_getppid")
int probe_tracepoint(void *ctx)
{
	__u32 key = 0;
	__u64 one = 1;

	bpf_map_update_elem(&probe_hash, &key, &one, BPF_ANY);
	return 0;
}

SEC("perf_event")
int probe_perf_event(void *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
