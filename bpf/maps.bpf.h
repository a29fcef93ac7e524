/* Map helpers shared by the programs (kernel side only). */
#ifndef MERIDIAN_MAPS_BPF_H
#define MERIDIAN_MAPS_BPF_H

#include <bpf/bpf_helpers.h>

/* Keep a record type in the object's BTF (user space decodes records through it)
 * when no map or global mentions it, as with ring buffer records. */
#define EXPORT_RECORD(name) struct name *__meridian_record_##name __attribute__((unused))

/* Look `key` up, inserting `init` first when absent. NULL when the map is full. */
static __always_inline void *lookup_or_init(void *map, const void *key, const void *init)
{
	void *val = bpf_map_lookup_elem(map, key);

	if (val)
		return val;
	/* BPF_NOEXIST: another CPU may have inserted it meanwhile, then we take theirs. */
	bpf_map_update_elem(map, key, init, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

/* Submit a ring buffer record, waking the reader only when the ring is filling up:
 * the reader drains on a short timer instead. The fill level is read (a helper call)
 * only when the low 6 bits of `tick` are zero: pass a value that changes from record
 * to record (a counter, a timestamp in ns), so about one record in 64 pays for it.
 * That also bounds the wake-ups while the ring stays past its mark: each is an
 * irq_work (a self-interrupt), and one per record cost more than the programs' own
 * work (syscalls: 400 -> 200 ns per exit program). */
static __always_inline void ringbuf_submit_lazy(void *ringbuf, void *rec, __u64 wakeup_bytes,
						__u64 tick)
{
	__u64 flags = BPF_RB_NO_WAKEUP;

	if (!(tick & 63) && bpf_ringbuf_query(ringbuf, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	bpf_ringbuf_submit(rec, flags);
}

#endif
