/* Map helpers shared by the programs (kernel side only). */
#ifndef MERIDIAN_MAPS_BPF_H
#define MERIDIAN_MAPS_BPF_H

#include <bpf/bpf_helpers.h>

/* Keep a record type in the object's BTF (user space decodes records through it)
 * when no map or global mentions it, as with ring buffer records. */
#define EXPORT_RECORD(name) struct name *__meridian_record_##name __attribute__((unused))

/* A map with a key and a value, in one line (libbpf's BTF-defined form):
 * MAP_DEF(hists, BPF_MAP_TYPE_HASH, struct key, struct hist, 10240); */
#define MAP_DEF(_name, _type, _key, _value, _max_entries)	\
	struct {						\
		__uint(type, _type);				\
		__uint(max_entries, _max_entries);		\
		__type(key, _key);				\
		__type(value, _value);				\
	} _name SEC(".maps")

/* A ring buffer of `_bytes` (a power of two, a multiple of the page size). */
#define RINGBUF_DEF(_name, _bytes)			\
	struct {					\
		__uint(type, BPF_MAP_TYPE_RINGBUF);	\
		__uint(max_entries, _bytes);		\
	} _name SEC(".maps")

/* One slot per thread: an array indexed by tid & `name`_mask, both resized and set by
 * user space before load to the power of two that covers pid_max (so live threads
 * never share a slot). An array lookup is a few inlined instructions, no hashing. */
#define THREAD_SLOTS(name, value)						\
	MAP_DEF(name, BPF_MAP_TYPE_ARRAY, __u32, value, 32768);		\
	const volatile __u32 name##_mask = 32768 - 1

/* Thread tid's slot in a THREAD_SLOTS array (never NULL: the index is masked in). */
static __always_inline void *thread_slot(void *map, __u32 mask, __u32 tid)
{
	__u32 idx = tid & mask;

	return bpf_map_lookup_elem(map, &idx);
}

/* The value at index 0 of an array: the one entry of counters or of a total. */
static __always_inline void *first_value(void *map)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(map, &zero);
}

/* Count one in `field` of a one-entry per-CPU array of counters (a struct `type`):
 * COUNT_ATOMIC where the programs that count may nest on a CPU (an interrupt that
 * completes I/O, a perf event), COUNT_PLAIN where they cannot. */
#define COUNT_ATOMIC(map, type, field)					\
	do {								\
		type *__c = first_value(map);				\
		if (__c)						\
			__sync_fetch_and_add(&__c->field, 1);		\
	} while (0)
#define COUNT_PLAIN(map, type, field)					\
	do {								\
		type *__c = first_value(map);				\
		if (__c)						\
			__c->field++;					\
	} while (0)

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
