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
	/* The current slot, its flow id last: a sample that interrupts the copy (the
	 * perf handler runs in an interrupt) finds no flow there and takes this packet,
	 * whole, from the history, not one flow's id with another packet's direction. */
	cur->flow_id = 0;
	barrier();
	cur->time_ns = slot->time_ns;
	cur->ifindex = slot->ifindex;
	cur->gso_segs = slot->gso_segs;
	cur->direction = dir;
	cur->pad = 0;
	barrier();
	cur->flow_id = id;
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

/* The header of type T at byte `off` of the packet at `pkt`, or NULL when it does not
 * end by `end`: one parser for XDP and the skb hooks, `xdp` a constant at every call
 * (the compiler keeps one of the two). XDP reads the packet in place, `end` its
 * data_end (the bounds check the verifier wants before each access); the skb hooks
 * read kernel memory with PKT_HDR, `end` the end of the skb's linear data (what is
 * past it is not the packet's). The parser keeps offsets, not pointers: the verifier
 * then sees the walks that took different paths (VLAN tags, extension headers) reach
 * the same place with a scalar in a range, and verifies what follows once. */
#define HDR_AT(xdp, T, pkt, off, end, copy)                                     \
	((const void *)(pkt) + (off) + sizeof(T) > (const void *)(end) ? NULL : \
	 (xdp) ? (T *)((pkt) + (off)) : PKT_HDR(T, (pkt) + (off), copy))

#define IPPROTO_HOPOPTS_ 0
#define IPPROTO_ROUTING_ 43
#define IPPROTO_FRAGMENT_ 44
#define IPPROTO_DSTOPTS_ 60
#define MS_IPV6_EXT_MAX 4	/* IPv6 extension headers walked to reach TCP/UDP */
#define VXLAN_PORT 4789
#define GENEVE_PORT 6081
#define ETH_P_TEB_ 0x6558	/* Geneve's protocol type of an Ethernet frame */

/* Fill `key` from the IPv4/IPv6 header at byte `off` of `pkt` (the family from the IP
 * version nibble), reading nothing past `end`. IPv6 hop-by-hop, routing, destination
 * options and fragment headers are walked, up to MS_IPV6_EXT_MAX of them. Returns the
 * offset of the TCP/UDP header, or 0 when there is no IPv4/IPv6 TCP/UDP flow. */
static __always_inline __u32 parse_ip(const void *pkt, __u32 off, const void *end,
				      struct ms_flow_key *key, const bool xdp)
{
	struct iphdr ip_copy;	/* the copies of kernels without bpf_rdonly_cast */
	struct ipv6hdr ip6_copy;
	struct frag_hdr ext_copy;
	struct udphdr l4_copy;
	struct iphdr *ip = HDR_AT(xdp, struct iphdr, pkt, off, end, &ip_copy);
	struct udphdr *ports;
	__u8 first, proto;

	if (!ip)
		return 0;
	first = *(__u8 *)ip;
	if (first >> 4 == 4) {
		__u8 ihl = first & 0xf;

		/* A fragment after the first has no ports: no flow. */
		if (ihl < 5 || (bpf_ntohs(ip->frag_off) & 0x1fff))
			return 0;
		proto = ip->protocol;
		*(__u32 *)key->saddr = ip->saddr;
		*(__u32 *)key->daddr = ip->daddr;
		key->family = AF_INET_;
		off += ihl * 4;
	} else if (first >> 4 == 6) {
		struct ipv6hdr *ip6 = HDR_AT(xdp, struct ipv6hdr, pkt, off, end, &ip6_copy);

		if (!ip6)
			return 0;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			((__u32 *)key->saddr)[i] = ip6->saddr.in6_u.u6_addr32[i];
			((__u32 *)key->daddr)[i] = ip6->daddr.in6_u.u6_addr32[i];
		}
		key->family = AF_INET6_;
		proto = ip6->nexthdr;
		off += sizeof(*ip6);
#pragma unroll
		for (int i = 0; i < MS_IPV6_EXT_MAX; i++) {
			struct frag_hdr *ext;

			if (proto != IPPROTO_HOPOPTS_ && proto != IPPROTO_ROUTING_ &&
			    proto != IPPROTO_DSTOPTS_ && proto != IPPROTO_FRAGMENT_)
				break;
			/* Every extension header has 8 bytes at least, the next header's
			 * type first. Read as a fragment header: for the others, its
			 * `reserved` byte is their length in 8 bytes past the first 8. */
			ext = HDR_AT(xdp, struct frag_hdr, pkt, off, end, &ext_copy);
			if (!ext)
				return 0;
			if (proto == IPPROTO_FRAGMENT_) {
				/* A fragment after the first has no ports: no flow (as IPv4). */
				if (bpf_ntohs(ext->frag_off) & 0xfff8)
					return 0;
				off += sizeof(*ext);
			} else {
				off += (ext->reserved + 1) * 8;
			}
			proto = ext->nexthdr;
		}
	} else {
		return 0;
	}
	if (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_)
		return 0;
	/* Ports stay in network byte order (TCP and UDP both start with them). */
	ports = HDR_AT(xdp, struct udphdr, pkt, off, end, &l4_copy);
	if (!ports)
		return 0;
	key->proto = proto;
	key->sport = ports->source;
	key->dport = ports->dest;
	return off;
}

/* The offset of the inner Ethernet frame of a VXLAN or Geneve packet (UDP to port 4789
 * or 6081; `key` its outer flow, its UDP header at `udp`), else 0. VXLAN: an 8-byte
 * header, then the frame. Geneve: an 8-byte header and opt_len 4-byte words of
 * options, then the frame when its protocol type says Ethernet. */
static __always_inline __u32 tunnel_inner(const struct ms_flow_key *key, const void *pkt,
					  __u32 udp, const void *end, const bool xdp)
{
	__u32 hdr = udp + sizeof(struct udphdr);
	struct vlan_hdr gnv_copy;
	struct vlan_hdr *gnv;
	__u16 word;

	if (key->proto != IPPROTO_UDP_)
		return 0;
	if (key->dport == bpf_htons(VXLAN_PORT))
		return hdr + 8;
	if (key->dport != bpf_htons(GENEVE_PORT))
		return 0;
	/* Geneve's first 32 bits (version:2 opt_len:6, flags:8, protocol type:16) have a
	 * VLAN tag's layout, a type in every kernel's BTF (geneve's own is a module's). */
	gnv = HDR_AT(xdp, struct vlan_hdr, pkt, hdr, end, &gnv_copy);
	if (!gnv || bpf_ntohs(gnv->h_vlan_encapsulated_proto) != ETH_P_TEB_)
		return 0;
	word = bpf_ntohs(gnv->h_vlan_TCI);
	if (word >> 14)	/* version 0 only */
		return 0;
	return hdr + 8 + ((word >> 8) & 0x3f) * 4;
}

/* Key the packet whose IPv4/IPv6 header is at byte `off` of `pkt`, reading nothing past
 * `end`: by its 5-tuple, or for VXLAN and Geneve by the 5-tuple of the inner frame
 * (IPv4/IPv6, TCP/UDP), the outer one's kept when the inner frame has none. False: no
 * flow. */
static __always_inline bool key_packet(const void *pkt, __u32 off, const void *end,
				       union flow_key *key, const bool xdp)
{
	union flow_key inner = {};
	struct ethhdr eth_copy;
	struct ethhdr *eth;
	__u32 l4 = parse_ip(pkt, off, end, &key->k, xdp), frame;
	__u16 proto;

	if (!l4)
		return false;
	frame = tunnel_inner(&key->k, pkt, l4, end, xdp);
	eth = frame ? HDR_AT(xdp, struct ethhdr, pkt, frame, end, &eth_copy) : NULL;
	if (!eth)
		return true;
	proto = bpf_ntohs(eth->h_proto);
	if ((proto == ETH_P_IP_ || proto == ETH_P_IPV6_) &&
	    parse_ip(pkt, frame + sizeof(*eth), end, &inner.k, xdp))
		*key = inner;
	return true;
}

/* gso_segs of an skb: skb_shinfo(skb) is at head + end. */
static __always_inline __u16 skb_segs(const struct sk_buff *skb)
{
	return KREAD(struct skb_shared_info, skb->head + skb->end, gso_segs);
}

/* The end of an skb's linear data, where the stack has put (or pulled) the headers
 * (tail: an offset from head on 64-bit kernels). */
static __always_inline const void *skb_tail(const struct sk_buff *skb)
{
	return skb->head + skb->tail;
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
	if ((proto != ETH_P_IP_ && proto != ETH_P_IPV6_) ||
	    !key_packet(nh, 0, skb_tail(skb), &key, false)) {
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
		if (key_packet(skb->head + skb->network_header, 0, skb_tail(skb), &key, false)) {
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
	__u32 off = sizeof(*eth);
	__u16 proto;

	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	proto = bpf_ntohs(eth->h_proto);
#pragma unroll
	for (int i = 0; i < 2; i++) {
		struct vlan_hdr *vh = data + off;

		if (proto != ETH_P_8021Q_ && proto != ETH_P_8021AD_)
			break;
		if ((void *)(vh + 1) > end)
			return XDP_PASS;
		proto = bpf_ntohs(vh->h_vlan_encapsulated_proto);
		off += sizeof(*vh);
	}
	if ((proto == ETH_P_IP_ || proto == ETH_P_IPV6_) && key_packet(data, off, end, &key, true))
		record_packet(&key, MS_DIR_RX, ctx->ingress_ifindex, 1);
	else
		record_unparsed();
	return XDP_PASS;
}

#endif /* MERIDIAN_SENTINEL_FLOW_BPF_H */
