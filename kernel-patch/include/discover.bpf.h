/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Path discovery: every device crossing of a tagged, matching packet in the
 * namespaces this agent owns, as struct hoptrace_crossing records. Read-only
 * tracing programs: they never change, drop or redirect a packet. The
 * packets are tagged by the ordinary taggers (hop_tc with hop_tag_udp,
 * tag_tcp) in the sender's namespace.
 *
 * Egress is net:net_dev_queue, not net_dev_xmit: it fires in
 * __dev_queue_xmit after tc egress (so a packet tagged there already carries
 * its ID) and before the driver, so a tunnel's own crossing comes before the
 * underlay's (net_dev_xmit of vxlan0 fires after wire0's, nested inside it).
 * Ingress is net:netif_receive_skb (__netif_receive_skb_core), once per
 * device the packet is received on: a bridge port, then the bridge when the
 * frame goes up, a tunnel after decapsulation.
 *
 * Following through address translation: a packet the filter refuses (a
 * Service's DNAT rewrote its destination, a masquerade its source) may still
 * be the flow's. It is taken by its ID when the ID is of the discovery's
 * origin (hop_parse's follow_origin), or of a trace's origin in
 * discover_origins: a trace applied to a flow that overlaps the discovery's
 * may have tagged the packet first, and a tagger never overwrites an ID.
 * Such crossings are flagged HOPTRACE_F_FOLLOWED (the flow's addresses
 * changed before them); a trace's packet followed that no crossing on any
 * node saw matching the filter is another flow of that trace, and the
 * dispatcher leaves it out.
 *
 * Include hop.bpf.h before this file (maps, filter, flow hash, parser).
 */
#ifndef __HOPTRACE_DISCOVER_BPF_H
#define __HOPTRACE_DISCOVER_BPF_H

#include "discover.h"

/* The netns inodes this agent owns (its host's): on one kernel shared by
 * emulated hosts every agent's tracepoints see every namespace, so each
 * crossing must be attributed to exactly one node. Filled before attach. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u8);
} discover_netns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} crossings SEC(".maps");

/* The ID origins of the traces whose packets to follow besides the
 * discovery's own (index: the origin, value 1), filled before attach. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u8);
} discover_origins SEC(".maps");

const struct hoptrace_crossing *unused_crossing_type __attribute__((unused));
const enum hoptrace_direction *unused_direction_type __attribute__((unused));

static __always_inline void emit_crossing(const struct pkt_info *p, __u32 ifindex, __u32 ino,
					  __u32 wire_len, __u8 direction)
{
	struct hoptrace_crossing *c;

	c = bpf_ringbuf_reserve(&crossings, sizeof(*c), 0);
	if (!c) {
		count(HOPTRACE_C_RINGBUF_FULL, 1);
		return;
	}
	c->ts_ns = bpf_ktime_get_ns();
	c->packet_id = p->id;
	c->flow_hash = flow_hash(p);
	c->ifindex = ifindex;
	c->netns_ino = ino;
	c->wire_len = wire_len;
	c->direction = direction;
	c->pad = 0;
	c->flags = p->flags;
	/* Discovery runs for seconds and the agent polls: no wakeup per record. */
	bpf_ringbuf_submit(c, BPF_RB_NO_WAKEUP);
	count(HOPTRACE_C_RECORDED, 1);
}

/* A packet the filter refused and hop_parse did not follow (not of the
 * discovery's origin): followed when its ID is of an origin in
 * discover_origins. Only in a discovery that follows (follow_origin set) and
 * for the filter's protocol, as hop_may_follow. */
static __always_inline bool discover_follow(struct pkt_reader *r, struct pkt_info *p)
{
	__u32 origin;
	__u8 *follow;

	if (!hop_may_follow(p->proto) || parse_id(PKT_KERNEL, r, p) || !p->id)
		goto refused;
	origin = p->id >> HOPTRACE_ID_SEQ_BITS;
	follow = bpf_map_lookup_elem(&discover_origins, &origin);
	if (!follow || !*follow)
		goto refused;
	p->flags |= HOPTRACE_F_FOLLOWED;
	return true;
refused:
	p->id = 0;
	return false;
}

/* The device of skb (skb->dev at both events), checked against the owned
 * namespaces first: that is what keeps the program cheap for everything
 * else on the machine. Packet location as in hop_kernel_skb. */
static __always_inline int discover_skb(struct sk_buff *skb, __u8 direction, bool floor)
{
	struct pkt_reader r = {.floor = floor};
	struct pkt_info p = {};
	struct net_device *dev;
	__u16 ethertype;
	__u32 ifindex, ino;
	int status;

	count(HOPTRACE_C_SEEN, 1);
	dev = skb->dev; /* tp_btf: BTF-typed (KERNEL_FIELD) */
	if (!dev) {
		count(HOPTRACE_C_NOT_MATCHED, 1);
		return 0;
	}
	ino = dev_netns_ino(dev, true);
	if (!bpf_map_lookup_elem(&discover_netns, &ino)) {
		count(HOPTRACE_C_NOT_MATCHED, 1);
		return 0;
	}
	ifindex = dev->ifindex;

	if (pkt_reader_from_skb(skb, &r, &ethertype, true)) {
		count(HOPTRACE_C_PARSE_TRUNCATED, 1);
		return 0;
	}
	pkt_copy_head(&r);
	status = hop_parse(PKT_KERNEL, &r, ethertype, &p);
	if (status == HOP_NOT_MATCHED && !discover_follow(&r, &p)) {
		count(HOPTRACE_C_NOT_MATCHED, 1);
		return 0;
	}
	if (status && status != HOP_NOT_MATCHED) {
		count_parse_error(status);
		return 0;
	}
	count(HOPTRACE_C_MATCHED, 1);
	if (!p.id) {
		count(HOPTRACE_C_UNTAGGED, 1);
		return 0;
	}
	emit_crossing(&p, ifindex, ino, r.total, direction);
	return 0;
}

/* Program definitions, each with its _floor twin (hop.bpf.h). */
#define HOPTRACE_PROG_DISCOVER                                                                     \
	SEC("tp_btf/netif_receive_skb") int BPF_PROG(discover_recv, struct sk_buff *skb)           \
	{                                                                                          \
		return discover_skb(skb, HOPTRACE_DIR_INGRESS, false);                             \
	}                                                                                          \
	SEC("tp_btf/netif_receive_skb") int BPF_PROG(discover_recv_floor, struct sk_buff *skb)     \
	{                                                                                          \
		return discover_skb(skb, HOPTRACE_DIR_INGRESS, true);                              \
	}                                                                                          \
	SEC("tp_btf/net_dev_queue") int BPF_PROG(discover_queue, struct sk_buff *skb)              \
	{                                                                                          \
		return discover_skb(skb, HOPTRACE_DIR_EGRESS, false);                              \
	}                                                                                          \
	SEC("tp_btf/net_dev_queue") int BPF_PROG(discover_queue_floor, struct sk_buff *skb)        \
	{                                                                                          \
		return discover_skb(skb, HOPTRACE_DIR_EGRESS, true);                               \
	}

#endif /* __HOPTRACE_DISCOVER_BPF_H */
