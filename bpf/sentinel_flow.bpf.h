/* meridian sentinel, part of sentinel.bpf.c (included there, after the maps): the flow
 * context of every packet and the programs that record it (fentry, tp_btf, XDP). */
#ifndef MERIDIAN_SENTINEL_FLOW_BPF_H
#define MERIDIAN_SENTINEL_FLOW_BPF_H

#include "kread.bpf.h"

/* ---- flow context ---------------------------------------------------------------- */

/* FNV-1a 64 over the 40 bytes of the key, byte by byte (user space recomputes it). */
static __always_inline __u64 flow_hash(const struct ms_flow_key *key)
{
	const __u8 *b = (const __u8 *)key;
	__u64 h = FNV_OFFSET;

#pragma unroll
	for (int i = 0; i < (int)sizeof(*key); i++) {
		h ^= b[i];
		h *= FNV_PRIME;
	}
	return h;
}

/* A flow key on the stack, aligned for word compares. */
union flow_key {
	struct ms_flow_key k;
	__u64 w[5];
};

/* The CPU's last two flows (a stream's data and its ACKs alternate on a CPU): a
 * packet of one of them skips the hash and the LRU map. Every 1024th hit looks the
 * flow up in ms_flows anyway, so that a busy flow stays recent there (and comes
 * back after an eviction). */
struct key_cache {
	union flow_key key[2];
	__u64 id[2];
	__u32 next;
	__u32 hits;
};

MAP_DEF(ms_key_cache, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct key_cache, 1);

static __always_inline bool same_key(const union flow_key *a, const union flow_key *b)
{
	return a->w[0] == b->w[0] && a->w[1] == b->w[1] && a->w[2] == b->w[2] &&
	       a->w[3] == b->w[3] && a->w[4] == b->w[4];
}

/* The flow id of `key`, its 5-tuple put into ms_flows on first sight. */
static __always_inline __u64 flow_id_of(union flow_key *key)
{
	__u32 zero = 0;
	struct key_cache *kc = bpf_map_lookup_elem(&ms_key_cache, &zero);
	__u64 id;

	if (kc) {
		int hit = same_key(&kc->key[0], key) ? 0 : same_key(&kc->key[1], key) ? 1 : -1;

		if (hit >= 0 && (++kc->hits & 1023))
			return kc->id[hit & 1];
	}
	id = flow_hash(&key->k);
	if (!bpf_map_lookup_elem(&ms_flows, &id))
		bpf_map_update_elem(&ms_flows, &id, &key->k, BPF_NOEXIST);
	if (kc) {
		__u32 i = kc->next++ & 1;

		kc->key[i] = *key;
		kc->id[i] = id;
	}
	return id;
}

/* A packet with a flow: the CPU's current context and the next history slot. */
static __always_inline void record_packet(union flow_key *key, __u8 dir, __u32 ifindex,
					  __u16 segs)
{
	__u32 zero = 0;
	struct ms_flow_ctx *cur = bpf_map_lookup_elem(&ms_curr_ctx, &zero);
	struct ms_history *h = bpf_map_lookup_elem(&ms_hist, &zero);
	struct ms_counters *c = counters();
	struct ms_flow_ctx *slot;
	__u64 id;

	if (!cur || !h)
		return;
	id = flow_id_of(key);
	slot = &h->ctx[h->head & (MS_HISTORY_LEN - 1)];
	slot->flow_id = id;
	slot->ifindex = ifindex;
	slot->gso_segs = segs ? segs : 1;
	slot->direction = dir;
	slot->pad = 0;
	slot->time_ns = bpf_ktime_get_ns();
	h->head++;
	*cur = *slot;
	if (c)
		__sync_fetch_and_add(&c->flows_seen, 1);
}

/* A packet without a flow (ARP, ICMP, a fragment...): the CPU's current context says
 * "no flow" from now on; the history keeps the last packets that had one. */
static __always_inline void record_unparsed(void)
{
	__u32 zero = 0;
	struct ms_flow_ctx *cur = bpf_map_lookup_elem(&ms_curr_ctx, &zero);
	struct ms_counters *c = counters();

	if (cur) {
		cur->flow_id = 0;
		cur->time_ns = bpf_ktime_get_ns();
	}
	if (c)
		__sync_fetch_and_add(&c->flows_unparsed, 1);
}

/* The packet header of type T at kernel address `addr`, to read fields from. Where the
 * kernel has bpf_rdonly_cast (6.2+), the header itself: direct loads (a fault reads as
 * zero), no helper call, for this runs for every packet. Older kernels: `copy` (a T on
 * the stack), filled by one bpf_probe_read_kernel (all zero if it faults). Only for the
 * fixed layouts of the UAPI headers. */
#define PKT_HDR(T, addr, copy)                                                  \
	(have_bpf_rdonly_cast ?                                                 \
		 KCAST(T, addr) :                                               \
		 (bpf_probe_read_kernel((copy), sizeof(T), (addr)), (T *)(copy)))

/* Fill `key` from the network header at `nh` (kernel memory, the family from the IP
 * version nibble). Returns false when there is no IPv4/IPv6 TCP/UDP flow. */
static __always_inline bool parse_l3(const void *nh, struct ms_flow_key *key)
{
	struct iphdr ip_copy;	/* the copies of kernels without bpf_rdonly_cast */
	struct ipv6hdr ip6_copy;
	struct udphdr l4_copy;
	struct iphdr *ip = PKT_HDR(struct iphdr, nh, &ip_copy);
	struct udphdr *l4;
	__u8 first = *(__u8 *)ip, proto;

	if (first >> 4 == 4) {
		__u8 ihl = first & 0xf;

		proto = ip->protocol;
		/* A fragment after the first has no ports: no flow. */
		if (ihl < 5 || (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_) ||
		    (bpf_ntohs(ip->frag_off) & 0x1fff))
			return false;
		*(__u32 *)key->saddr = ip->saddr;
		*(__u32 *)key->daddr = ip->daddr;
		key->family = AF_INET_;
		l4 = PKT_HDR(struct udphdr, nh + ihl * 4, &l4_copy);
	} else if (first >> 4 == 6) {
		struct ipv6hdr *ip6 = PKT_HDR(struct ipv6hdr, nh, &ip6_copy);

		proto = ip6->nexthdr;
		/* Extension headers are not walked: such packets have no flow. */
		if (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_)
			return false;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			((__u32 *)key->saddr)[i] = ip6->saddr.in6_u.u6_addr32[i];
			((__u32 *)key->daddr)[i] = ip6->daddr.in6_u.u6_addr32[i];
		}
		key->family = AF_INET6_;
		l4 = PKT_HDR(struct udphdr, nh + sizeof(*ip6), &l4_copy);
	} else {
		return false;
	}
	key->proto = proto;
	/* Ports stay in network byte order (TCP and UDP both start with them). */
	key->sport = l4->source;
	key->dport = l4->dest;
	return true;
}

/* gso_segs of an skb: skb_shinfo(skb) is at head + end. */
static __always_inline __u16 skb_segs(const struct sk_buff *skb)
{
	return KREAD(struct skb_shared_info, skb->head + skb->end, gso_segs);
}

/* Received: skb->data is at the network header, skb->protocol its ethertype; up to two
 * VLAN tags (not offloaded) still in front. */
static __always_inline void on_rx(const struct sk_buff *skb)
{
	union flow_key key = {};
	const void *nh = skb->data;
	__u16 proto = bpf_ntohs(skb->protocol);
	struct net_device *dev = skb->dev;

#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (proto != ETH_P_8021Q_ && proto != ETH_P_8021AD_)
			break;
		proto = bpf_ntohs(KREAD(struct vlan_hdr, nh, h_vlan_encapsulated_proto));
		nh += sizeof(struct vlan_hdr);
	}
	if ((proto != ETH_P_IP_ && proto != ETH_P_IPV6_) || !parse_l3(nh, &key.k)) {
		record_unparsed();
		return;
	}
	record_packet(&key, MS_DIR_RX, dev ? dev->ifindex : 0, skb_segs(skb));
}

/* Transmitted: the stack has set the network header (VLAN tags, if any, are in front
 * of it or offloaded). */
static __always_inline void on_tx(const struct sk_buff *skb, const struct net_device *dev)
{
	union flow_key key = {};
	__u16 proto = bpf_ntohs(skb->protocol);

	if (proto == ETH_P_8021Q_ || proto == ETH_P_8021AD_ || proto == ETH_P_IP_ ||
	    proto == ETH_P_IPV6_) {
		if (parse_l3(skb->head + skb->network_header, &key.k)) {
			record_packet(&key, MS_DIR_TX, dev ? dev->ifindex : 0, skb_segs(skb));
			return;
		}
	}
	record_unparsed();
}

SEC("fentry/__dev_queue_xmit")
int BPF_PROG(ms_fentry_tx, struct sk_buff *skb)
{
	on_tx(skb, skb->dev);
	return 0;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(ms_btf_rx, struct sk_buff *skb)
{
	on_rx(skb);
	return 0;
}

SEC("tp_btf/net_dev_start_xmit")
int BPF_PROG(ms_btf_tx, const struct sk_buff *skb, const struct net_device *dev)
{
	on_tx(skb, dev);
	return 0;
}

/* XDP: direct packet access from the Ethernet header. Always passes the packet. */
SEC("xdp")
int ms_xdp_rx(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	union flow_key key = {};
	struct ethhdr *eth = data;
	__u16 proto;
	void *l4;
	__u8 ip_proto;

	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	proto = bpf_ntohs(eth->h_proto);
	data = eth + 1;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		struct vlan_hdr *vh = data;

		if (proto != ETH_P_8021Q_ && proto != ETH_P_8021AD_)
			break;
		if ((void *)(vh + 1) > end)
			return XDP_PASS;
		proto = bpf_ntohs(vh->h_vlan_encapsulated_proto);
		data = vh + 1;
	}
	if (proto == ETH_P_IP_) {
		struct iphdr *ip = data;
		__u8 ihl;

		if ((void *)(ip + 1) > end)
			goto unparsed;
		ihl = ((__u8 *)ip)[0] & 0xf;
		if (ihl < 5 || (bpf_ntohs(ip->frag_off) & 0x1fff))
			goto unparsed;
		__builtin_memcpy(key.k.saddr, &ip->saddr, 4);
		__builtin_memcpy(key.k.daddr, &ip->daddr, 4);
		key.k.family = AF_INET_;
		ip_proto = ip->protocol;
		l4 = data + ihl * 4;
	} else if (proto == ETH_P_IPV6_) {
		struct ipv6hdr *ip6 = data;

		if ((void *)(ip6 + 1) > end)
			goto unparsed;
		__builtin_memcpy(key.k.saddr, &ip6->saddr, 16);
		__builtin_memcpy(key.k.daddr, &ip6->daddr, 16);
		key.k.family = AF_INET6_;
		ip_proto = ip6->nexthdr;
		l4 = ip6 + 1;
	} else {
		goto unparsed;
	}
	if (ip_proto != IPPROTO_TCP_ && ip_proto != IPPROTO_UDP_)
		goto unparsed;
	if (l4 + 4 > end)
		goto unparsed;
	key.k.proto = ip_proto;
	key.k.sport = ((__u16 *)l4)[0];
	key.k.dport = ((__u16 *)l4)[1];
	record_packet(&key, MS_DIR_RX, ctx->ingress_ifindex, 1);
	return XDP_PASS;
unparsed:
	record_unparsed();
	return XDP_PASS;
}

#endif /* MERIDIAN_SENTINEL_FLOW_BPF_H */
