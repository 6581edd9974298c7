/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The hook programs: one per device and direction at tc, one per device and event at the
 * tracepoints of packets (net:netif_receive_skb, net:net_dev_xmit, ...), the traces that
 * cross it in its maps (docs/design.md, "Many traces on a device"). It parses a packet once, finds
 * the traces that take it by sets of trace slots (protocol, source port, destination port; the
 * traces that take any port; an ID's origin for the traces that follow it), checks each candidate's
 * whole filter from its slot's entry in filters, and runs the hop body of each trace that takes it
 * (at most HOPTRACE_HOOK_MATCHED, the rest counted) with the settings of its slot's entry in
 * settings: the body of hop.bpf.h (hop_finish and the UDP tagger), HS(name) reading the entry.
 *
 * The body is a global function: the verifier checks it once, with every setting unknown, not once
 * per call. Global functions take scalars and the context before 5.12, so the parsed packet travels
 * to it in a per-CPU map (hook_pkt): tc and tcx programs, and those two events, run with bottom
 * halves off, and none of the body's helpers runs another hook on the same CPU in the middle of it.
 *
 * Define HOPTRACE_HOOK before including hop.bpf.h, then this file.
 */
#ifndef __HOPTRACE_HOOK_BPF_H
#define __HOPTRACE_HOOK_BPF_H

#include "hook.h"

/* The traces that take a protocol (IPPROTO_*; a trace without one is in every entry). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct hoptrace_trace_set);
} by_proto SEC(".maps");

/* The traces that take a source port, and a destination port (those that take any are in
 * wildcards instead). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct hoptrace_trace_set);
} by_sport SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct hoptrace_trace_set);
} by_dport SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hoptrace_hook_wildcards);
} wildcards SEC(".maps");

/* The traces that follow IDs of an origin (follow_origin) through address translations. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HOPTRACE_HOOK_ORIGINS);
	__type(key, __u32);
	__type(value, struct hoptrace_trace_set);
} origin_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HOPTRACE_HOOK_SLOTS);
	__type(key, __u32);
	__type(value, struct hoptrace_hook_filter);
} filters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HOPTRACE_HOOK_SLOTS);
	__type(key, __u32);
	__type(value, struct hoptrace_hook_settings);
} settings SEC(".maps");

/* The hook's own counters, once a packet: SEEN, NOT_MATCHED (no trace took it), PARSE_*, and
 * HOPTRACE_HOOK_C_OVERFLOW. A trace's own (MATCHED and on) are in counters, at its slot. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HOPTRACE_HOOK_C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} hook_counters SEC(".maps");

/* The packet the hook parsed, for the bodies it calls (see the top of this file). flags: the
 * parser's, which each body starts from (a body that tagged the packet adds TAGGED_HERE to its own
 * record only). acc and follow: its candidate traces, by filter and by ID, here rather than on the
 * stack, which the hook and the body it calls share (512 bytes). */
struct hook_packet {
	struct pkt_info p;
	__u16 flags;
	struct hoptrace_trace_set acc;
	struct hoptrace_trace_set follow;
	/* The candidates left to check, and the bodies run: in memory, not in registers, so that
	 * the paths through one candidate (taken, followed, refused) end in the same verifier
	 * state. Before 6.3 a state after a BPF-to-BPF call has every scalar precise (see loader's
	 * TestFloorVariantsHaveNoCalls), and a count in a register would keep them apart: 2^32
	 * paths. */
	struct hoptrace_trace_set left;
	__u32 ran;
	struct hop_meta m; /* the body's, for the stack's sake */
	/* The tracepoint hook's packet for its parse and its bodies, global functions that take
	 * scalars alone: a reader of the struct sk_buff with its address (read through probes
	 * there) and no copy, and the device. */
	struct pkt_reader r;
	__u64 shinfo; /* its struct skb_shared_info's address */
	__u32 ifindex;
	__u32 netns;
	__u16 ethertype;
	__u16 gso_segs;
	__u16 gso_size;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hook_packet);
} hook_pkt SEC(".maps");

const struct hoptrace_hook_settings *unused_hook_settings_type __attribute__((unused));
const struct hoptrace_hook_filter *unused_hook_filter_type __attribute__((unused));
const struct hoptrace_hook_wildcards *unused_hook_wildcards_type __attribute__((unused));
const struct hoptrace_hook_count_key *unused_hook_count_key_type __attribute__((unused));

/* A load from the per-CPU packet that clang may not keep in a register across the loop's paths. */
#define READ_ONCE_(x) (*(volatile typeof(x) *)&(x))

static __always_inline void hook_count(__u32 c)
{
	__u64 *v = bpf_map_lookup_elem(&hook_counters, &c);

	if (v)
		*v += 1;
}

/* A candidate trace's whole filter, as hop.bpf.h's flow_match with its constants. */
static __always_inline bool hook_filter_takes_flow(const struct hoptrace_hook_filter *f, __u8 proto,
						   __u8 family, const __u32 *saddr,
						   const __u32 *daddr, __u16 sport, __u16 dport)
{
	if (f->proto && proto != f->proto)
		return false;
	if (f->family && (family != f->family || !addr_match(saddr, f->src, f->src_mask, family) ||
			  !addr_match(daddr, f->dst, f->dst_mask, family)))
		return false;
	if (f->sport && sport != f->sport)
		return false;
	return !f->dport || dport == f->dport;
}

static __always_inline bool hook_filter_takes(const struct hoptrace_hook_filter *f,
					      const struct pkt_info *p)
{
	return hook_filter_takes_flow(f, p->proto, p->family, p->saddr, p->daddr, p->sport,
				      p->dport);
}

/* acc = proto & (sport | any sport) & (dport | any dport); whether any trace is left. */
static __always_inline bool hook_candidates(struct hoptrace_trace_set *acc,
					    const struct hoptrace_trace_set *proto,
					    const struct hoptrace_trace_set *sport,
					    const struct hoptrace_trace_set *dport,
					    const struct hoptrace_hook_wildcards *wild)
{
	__u64 left = 0;

#pragma unroll
	for (int i = 0; i < HOPTRACE_HOOK_WORDS; i++) {
		acc->w[i] = proto->w[i] & (sport->w[i] | wild->sport.w[i]) &
			    (dport->w[i] | wild->dport.w[i]);
		left |= acc->w[i];
	}
	return left;
}

/*
 * Whether a frame the fast path (parse.bpf.h's fast_flow_*) decided may be a trace's: a candidate
 * by its protocol and ports, or an ID some trace of its protocol may follow. false: refused without
 * the general parser, as a hop program's fast path refuses another flow.
 */
static __always_inline bool hook_fast_may_take(const struct fast_flow *f,
					       const struct hoptrace_hook_wildcards *wild)
{
	__u32 kp = f->proto, ks = f->sport, kd = f->dport;
	const struct hoptrace_trace_set *proto = bpf_map_lookup_elem(&by_proto, &kp);
	const struct hoptrace_trace_set *sport = bpf_map_lookup_elem(&by_sport, &ks);
	const struct hoptrace_trace_set *dport = bpf_map_lookup_elem(&by_dport, &kd);
	__u64 left = 0;

	if (!proto || !sport || !dport)
		return true;
#pragma unroll
	for (int i = 0; i < HOPTRACE_HOOK_WORDS; i++) {
		left |= proto->w[i] & (sport->w[i] | wild->sport.w[i]) &
			(dport->w[i] | wild->dport.w[i]);
		if (!f->no_id)
			left |= proto->w[i] & wild->follow.w[i];
	}
	return left != 0;
}

/* The lowest set bit's index of w != 0: the population count of the bits below it, in ALU
 * instructions alone (no table, whose variable offset the verifier would want precise, no branch).
 */
static __always_inline __u32 lowest_bit(__u64 w)
{
	__u64 v = (w & -w) - 1;

	v -= (v >> 1) & 0x5555555555555555ULL;
	v = (v & 0x3333333333333333ULL) + ((v >> 2) & 0x3333333333333333ULL);
	v = (v + (v >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
	return (v * 0x0101010101010101ULL) >> 56;
}

/*
 * One matched trace's hop at tc: hop_skb_l2's part after the parse, with the trace's settings hs,
 * on the packet the hook parsed (hp). extra: HOPTRACE_F_FOLLOWED when the trace took it by its ID.
 */
static __always_inline int hook_body_skb_l2(struct __sk_buff *skb, __u32 slot, __u32 extra,
					    bool floor)
{
	__u32 ifindex = skb->ifindex, len = skb->len, zero = 0;
	const struct hoptrace_hook_settings *hs = bpf_map_lookup_elem(&settings, &slot);
	struct hook_packet *hp = bpf_map_lookup_elem(&hook_pkt, &zero);
	struct hop_meta *m;
	struct pkt_info *p;

	barrier_var(ifindex);
	barrier_var(len);
	if (!hs || !hp)
		return 0;
	struct pkt_reader r = {.ctx = skb, .len = len, .total = len, .floor = floor};

	p = &hp->p;
	p->flags = hp->flags | extra;
	m = &hp->m;
	__builtin_memset(m, 0, sizeof(*m));
	skb_meta(hs, skb, m, false, floor);
	pkt_set_direct(&r, (const __u8 *)(long)skb->data, (const __u8 *)(long)skb->data_end,
		       !floor);
	if (!p->id && !p->fragment && HS(hop_tag_udp) && p->proto == IPPROTO_UDP_) {
		int outcome = tag_udp_packet(hs, skb, p, floor);

		if (outcome == HOPTRACE_C_TAGGED) {
			hop_count(hs, HOPTRACE_C_TAGGED, 1);
			len += HOPTRACE_UDP_ID_LEN;
		} else if (outcome != HOPTRACE_C_UNTAGGED) {
			hop_count(hs, outcome, 1);
		}
	}
	hop_finish(hs, PARSE_OK, p, ifindex, len, m, PKT_SKB, &r);
	return 0;
}

/*
 * A parsed packet's candidates at any hook: the traces whose sets take its protocol and ports, then
 * its ID for those (and for the traces that follow its origin). Whether any is left: then hp->left
 * holds them, for hook_run_bodies.
 */
static __always_inline bool hook_take_candidates(enum pkt_source src, struct pkt_reader *r,
						 struct hook_packet *hp,
						 const struct hoptrace_hook_wildcards *wild)
{
	const struct hoptrace_trace_set *proto, *sport, *dport, *origin;
	struct pkt_info *p = &hp->p;
	bool any, following = false;
	__u32 key;
	int status;

	key = p->proto;
	proto = bpf_map_lookup_elem(&by_proto, &key);
	key = p->sport;
	sport = bpf_map_lookup_elem(&by_sport, &key);
	key = p->dport;
	dport = bpf_map_lookup_elem(&by_dport, &key);
	if (!proto || !sport || !dport)
		return false;
	any = hook_candidates(&hp->acc, proto, sport, dport, wild);
	/* The ID only for a packet some trace may take: its filter's, or followed by its ID (a
	 * translation keeps the protocol, so only the protocol's traces may follow it). */
	if (!any && !(p->proto == IPPROTO_TCP_ || p->proto == IPPROTO_UDP_)) {
		hook_count(HOPTRACE_C_NOT_MATCHED);
		return false;
	}
	status = parse_id(src, r, p);
	if (status) {
		if (any)
			hook_count(status == PARSE_TRUNCATED ? HOPTRACE_C_PARSE_TRUNCATED
							     : HOPTRACE_C_PARSE_MALFORMED);
		else
			hook_count(HOPTRACE_C_NOT_MATCHED);
		return false;
	}
	__builtin_memset(&hp->follow, 0, sizeof(hp->follow));
	if (p->id) {
		key = p->id >> HOPTRACE_ID_SEQ_BITS;
		origin = bpf_map_lookup_elem(&origin_slots, &key);
		if (origin) {
#pragma unroll
			for (int i = 0; i < HOPTRACE_HOOK_WORDS; i++) {
				hp->follow.w[i] = origin->w[i] & proto->w[i];
				following |= hp->follow.w[i] != 0;
			}
		}
	}
	if (!any && !following) {
		hook_count(HOPTRACE_C_NOT_MATCHED);
		return false;
	}
	hp->flags = p->flags;
#pragma unroll
	for (int i = 0; i < HOPTRACE_HOOK_WORDS; i++)
		hp->left.w[i] = hp->acc.w[i] | hp->follow.w[i];
	return true;
}

/*
 * The bodies of the candidates in hp->left whose whole filter takes the packet (or that follow its
 * ID), at most HOPTRACE_HOOK_MATCHED, the rest counted. The tc hook's (skb_body) take its skb; the
 * tracepoint hook's (kernel_body) read hp.
 */
static __always_inline void hook_run_bodies(struct hook_packet *hp, struct __sk_buff *ctx,
					    int (*skb_body)(struct __sk_buff *, __u32, __u32),
					    int (*kernel_body)(__u32, __u32))
{
	hp->ran = 0;
#pragma unroll
	for (int i = 0; i < HOPTRACE_HOOK_WORDS; i++) {
		for (int j = 0; j < HOPTRACE_HOOK_MATCHED; j++) {
			__u64 w = READ_ONCE_(hp->left.w[i]);
			__u32 bit, slot, extra;
			const struct hoptrace_hook_filter *f;

			if (!w)
				break;
			hp->left.w[i] = w & (w - 1);
			bit = lowest_bit(w);
			slot = i * 64 + bit;
			f = bpf_map_lookup_elem(&filters, &slot);
			if (f && hook_filter_takes(f, &hp->p))
				extra = 0;
			else if (READ_ONCE_(hp->follow.w[i]) & (1ULL << bit))
				extra = HOPTRACE_F_FOLLOWED;
			else
				continue;
			if (READ_ONCE_(hp->ran) >= HOPTRACE_HOOK_MATCHED) {
				hook_count(HOPTRACE_HOOK_C_OVERFLOW);
				continue;
			}
			hp->ran = READ_ONCE_(hp->ran) + 1;
			if (skb_body)
				skb_body(ctx, slot, extra);
			else
				kernel_body(slot, extra);
		}
		/* candidates past the ones a word's loop checks: not run, counted once */
		if (READ_ONCE_(hp->left.w[i]))
			hook_count(HOPTRACE_HOOK_C_OVERFLOW);
	}
	if (!READ_ONCE_(hp->ran))
		hook_count(HOPTRACE_C_NOT_MATCHED);
}

static __always_inline void hook_count_parse_error(int status)
{
	hook_count(status == PARSE_TRUNCATED   ? HOPTRACE_C_PARSE_TRUNCATED
		   : status == PARSE_MALFORMED ? HOPTRACE_C_PARSE_MALFORMED
					       : HOPTRACE_C_PARSE_NON_IP);
}

/*
 * The hook at tc: the fast path's refusal, the parse, the candidates, their bodies. body: the
 * global function of this variant (HOPTRACE_HOOK_TC below).
 */
static __always_inline int hook_skb_l2(struct __sk_buff *skb, bool floor,
				       int (*body)(struct __sk_buff *, __u32, __u32))
{
	__u32 len = skb->len, zero = 0;
	const struct hoptrace_hook_wildcards *wild;
	struct hook_packet *hp;
	int status;

	barrier_var(len);
	hook_count(HOPTRACE_C_SEEN);
	hp = bpf_map_lookup_elem(&hook_pkt, &zero);
	wild = bpf_map_lookup_elem(&wildcards, &zero);
	if (!hp || !wild)
		return TCX_NEXT_;
	if (!hop_general_only) {
		struct fast_flow f = {}; /* 6.1 refuses reads of a stack slot no path wrote */

		if (fast_flow_l2((const __u8 *)(long)skb->data, (const __u8 *)(long)skb->data_end,
				 len, &f) &&
		    !hook_fast_may_take(&f, wild)) {
			hook_count(HOPTRACE_C_NOT_MATCHED);
			return TCX_NEXT_;
		}
	}
	struct pkt_reader r = {.ctx = skb, .len = len, .total = len, .floor = floor};

	__builtin_memset(&hp->p, 0, sizeof(hp->p));
	pkt_set_direct(&r, (const __u8 *)(long)skb->data, (const __u8 *)(long)skb->data_end,
		       !floor);
	status = parse_headers(PKT_SKB, &r, 0, 0, &hp->p);
	if (status) {
		hook_count_parse_error(status);
		return TCX_NEXT_;
	}
	if (hook_take_candidates(PKT_SKB, &r, hp, wild))
		hook_run_bodies(hp, skb, body, NULL);
	return TCX_NEXT_;
}

/*
 * The tracepoint hook's parse and candidates, a global function of its own (hook_tp_parse): its
 * frame and a body's are not on the stack together. The packet is the reader hook_kernel_skb left
 * in hp, copied from its start as a hop program's (hop_kernel_skb). Whether any body is to run.
 */
static __always_inline int hook_parse_kernel_skb(bool floor)
{
	const struct hoptrace_hook_wildcards *wild;
	struct hook_packet *hp;
	__u32 zero = 0;
	int status;

	hp = bpf_map_lookup_elem(&hook_pkt, &zero);
	wild = bpf_map_lookup_elem(&wildcards, &zero);
	if (!hp || !wild)
		return 0;
	struct pkt_reader r = {.ctx = hp->r.ctx,
			       .kbase = hp->r.kbase,
			       .len = hp->r.len,
			       .total = hp->r.total,
			       .floor = floor};

	pkt_copy_head(&r);
	__builtin_memset(&hp->p, 0, sizeof(hp->p));
	status = parse_headers(PKT_KERNEL, &r, 0, hp->ethertype, &hp->p);
	if (status) {
		hook_count_parse_error(status);
		return 0;
	}
	if (!hook_take_candidates(PKT_KERNEL, &r, hp, wild))
		return 0;
	/* the skb's TCP segment count, once for every body (pkt_reader's segs), as hop.bpf.h's
	 * kernel_segments reads it */
	hp->r.segs = 0;
	if (!floor && hp->p.id && hp->p.proto == IPPROTO_TCP_) {
		struct skb_shared_info *shinfo = (void *)hp->shinfo;

		BPF_CORE_READ_INTO(&hp->gso_segs, shinfo, gso_segs);
		BPF_CORE_READ_INTO(&hp->gso_size, shinfo, gso_size);
		hp->r.segs = tcp_segments(hp->gso_segs, hp->gso_size, &hp->p);
	}
	return 1;
}

/*
 * One matched trace's hop at a tracepoint: hop_kernel_skb's part after the parse, with the trace's
 * settings, on the packet the hook parsed (hp). The skb is an address here (global functions take
 * scalars), its fields read through probes.
 */
static __always_inline int hook_body_kernel_skb(__u32 slot, __u32 extra)
{
	__u32 zero = 0;
	const struct hoptrace_hook_settings *hs = bpf_map_lookup_elem(&settings, &slot);
	struct hook_packet *hp = bpf_map_lookup_elem(&hook_pkt, &zero);
	struct sk_buff *skb;
	struct hop_meta *m;
	struct pkt_info *p;

	if (!hs || !hp)
		return 0;
	skb = hp->r.ctx;
	p = &hp->p;
	p->flags = hp->flags | extra;
	m = &hp->m;
	__builtin_memset(m, 0, sizeof(*m));
	if (act_reads_any(hs)) {
		if (act_reads(hs, HOPTRACE_FIELD_NETNS))
			m->netns = hp->netns;
		if (act_reads(hs, HOPTRACE_FIELD_MARK))
			m->mark = BPF_CORE_READ(skb, mark);
		if (act_reads(hs, HOPTRACE_FIELD_PRIORITY))
			m->priority = BPF_CORE_READ(skb, priority);
		if (act_reads(hs, HOPTRACE_FIELD_QUEUE_MAPPING))
			m->queue_mapping = BPF_CORE_READ(skb, queue_mapping);
		if (act_reads(hs, HOPTRACE_FIELD_GSO_SEGS) ||
		    act_reads(hs, HOPTRACE_FIELD_GSO_SIZE)) {
			struct skb_shared_info *shinfo = (void *)hp->shinfo;

			m->gso_segs = BPF_CORE_READ(shinfo, gso_segs);
			m->gso_size = BPF_CORE_READ(shinfo, gso_size);
		}
	}
	if (HS(act_capture))
		m->capture_l3 = hp->ethertype;
	hop_finish(hs, PARSE_OK, p, hp->ifindex, hp->r.total, m, PKT_KERNEL, &hp->r);
	return 0;
}

/*
 * The hook at a tracepoint of packets (net:netif_receive_skb, net:net_dev_xmit, ...): one per
 * device and event, as a hop program's device check (hop_kernel_skb), the reader of the skb (BTF
 * loads into hp), then the parse and candidates (parse) and their bodies (body): the global
 * functions of this variant (HOPTRACE_HOOK_TP below).
 */
static __always_inline int hook_kernel_skb(struct sk_buff *skb, struct net_device *dev, bool floor,
					   int (*parse)(void), int (*body)(__u32, __u32))
{
	struct hook_packet *hp;
	__u32 zero = 0, ifindex, netns;

	hook_count(HOPTRACE_C_SEEN);
	if (!dev) {
		hook_count(HOPTRACE_C_NOT_MATCHED);
		return 0;
	}
	ifindex = dev->ifindex;
	netns = dev_netns_ino(dev, true);
	if ((hop_ifindex && ifindex != hop_ifindex) || (hop_netns_ino && netns != hop_netns_ino)) {
		hook_count(HOPTRACE_C_NOT_MATCHED);
		return 0;
	}
	hp = bpf_map_lookup_elem(&hook_pkt, &zero);
	if (!hp)
		return 0;
	/* the parse's and the bodies' packet: a pointer kept in the map reads back as a scalar */
	__builtin_memset(&hp->r, 0, sizeof(hp->r));
	if (pkt_reader_from_skb(skb, &hp->r, &hp->ethertype, true)) {
		hook_count(HOPTRACE_C_PARSE_TRUNCATED);
		return 0;
	}
	hp->r.ctx = skb;
	hp->r.floor = floor;
	hp->shinfo = (__u64)(long)(skb->head + skb->end);
	hp->ifindex = ifindex;
	hp->netns = netns;
	if (parse())
		hook_run_bodies(hp, NULL, NULL, body);
	return 0;
}

/*
 * The sock_ops hook's tagger of a socket (hop.bpf.h's tag_tcp_segment asks): of the traces whose
 * filter takes it, the lowest slot's, so that one trace's ID rides each segment. The candidates by
 * ports come from the sets the tc hook uses; at most HOPTRACE_HOOK_TAG_CHECKS of them are checked a
 * word, one left past them counted. No per-CPU scratch: a softirq may run the hook in the middle of
 * a process's run of it.
 */
static __always_inline bool tcp_tagger(struct bpf_sock_ops *skops, bool floor,
				       const struct hoptrace_hook_settings **hs)
{
	const struct hoptrace_trace_set *proto, *sport, *dport;
	const struct hoptrace_hook_wildcards *wild;
	struct sock_flow s = {};
	__u64 cookie = 0;
	__u32 key = 0;

	wild = bpf_map_lookup_elem(&wildcards, &key);
	if (!read_sock_flow(skops, &s))
		return false;
	key = IPPROTO_TCP_;
	proto = bpf_map_lookup_elem(&by_proto, &key);
	key = s.sport;
	sport = bpf_map_lookup_elem(&by_sport, &key);
	key = s.dport;
	dport = bpf_map_lookup_elem(&by_dport, &key);
	if (!wild || !proto || !sport || !dport)
		return false;
	/* Before 5.15 sock_ops has no netns cookie: the floor's taggers take every netns
	 * (attach.go). */
	if (!floor)
		cookie = bpf_get_netns_cookie(skops);
#pragma unroll
	for (int i = 0; i < HOPTRACE_HOOK_WORDS; i++) {
		__u64 w = proto->w[i] & (sport->w[i] | wild->sport.w[i]) &
			  (dport->w[i] | wild->dport.w[i]);

		for (int j = 0; j < HOPTRACE_HOOK_TAG_CHECKS && w; j++) {
			__u32 slot = i * 64 + lowest_bit(w);
			const struct hoptrace_hook_filter *f = bpf_map_lookup_elem(&filters, &slot);

			w &= w - 1;
			if (f && (!f->netns_cookie || f->netns_cookie == cookie) &&
			    hook_filter_takes_flow(f, IPPROTO_TCP_, s.family, s.saddr, s.daddr,
						   s.sport, s.dport)) {
				*hs = bpf_map_lookup_elem(&settings, &slot);
				return *hs != NULL;
			}
		}
		if (w)
			hook_count(HOPTRACE_HOOK_C_OVERFLOW);
	}
	return false;
}

/* The sock_ops hook: one per cgroup, the TCP tagger of every trace that tags there. */
#define HOPTRACE_HOOK_SOCK_OPS                                                                     \
	SEC("sockops") int hook_sock_ops(struct bpf_sock_ops *skops)                               \
	{                                                                                          \
		return tag_tcp_segment(skops, false);                                              \
	}                                                                                          \
	SEC("sockops") int hook_sock_ops_floor(struct bpf_sock_ops *skops)                         \
	{                                                                                          \
		return tag_tcp_segment(skops, true);                                               \
	}

/* The tracepoint hooks and their floor variants, with their bodies as global functions: the
 * tracepoint's skb and device as a hop program's (hop.bpf.h's HOPTRACE_PROG_TP_BTF and _XMIT), and,
 * as hop_tp_btf's, hook_tp_btf attached at the hop's event (the agent's AttachTo). */
#define HOPTRACE_HOOK_TP                                                                           \
	__attribute__((noinline)) int hook_tp_parse(void)                                          \
	{                                                                                          \
		return hook_parse_kernel_skb(false);                                               \
	}                                                                                          \
	__attribute__((noinline)) int hook_tp_parse_floor(void)                                    \
	{                                                                                          \
		return hook_parse_kernel_skb(true);                                                \
	}                                                                                          \
	__attribute__((noinline)) int hook_body_tp(__u32 slot, __u32 extra)                        \
	{                                                                                          \
		return hook_body_kernel_skb(slot, extra);                                          \
	}                                                                                          \
	SEC("tp_btf/netif_receive_skb") int BPF_PROG(hook_tp_btf, struct sk_buff *skb)             \
	{                                                                                          \
		return hook_kernel_skb(skb, skb->dev, false, hook_tp_parse, hook_body_tp);         \
	}                                                                                          \
	SEC("tp_btf/netif_receive_skb") int BPF_PROG(hook_tp_btf_floor, struct sk_buff *skb)       \
	{                                                                                          \
		return hook_kernel_skb(skb, skb->dev, true, hook_tp_parse_floor, hook_body_tp);    \
	}                                                                                          \
	SEC("tp_btf/net_dev_xmit")                                                                 \
	int BPF_PROG(hook_tp_btf_xmit, struct sk_buff *skb, int rc, struct net_device *dev)        \
	{                                                                                          \
		return hook_kernel_skb(skb, dev, false, hook_tp_parse, hook_body_tp);              \
	}                                                                                          \
	SEC("tp_btf/net_dev_xmit")                                                                 \
	int BPF_PROG(hook_tp_btf_xmit_floor, struct sk_buff *skb, int rc, struct net_device *dev)  \
	{                                                                                          \
		return hook_kernel_skb(skb, dev, true, hook_tp_parse_floor, hook_body_tp);         \
	}

/* The tc hook and its floor variant (hop.bpf.h's), each with its body as a global function. */
#define HOPTRACE_HOOK_TC                                                                           \
	__attribute__((noinline)) int hook_body_tc(struct __sk_buff *skb, __u32 slot, __u32 extra) \
	{                                                                                          \
		return hook_body_skb_l2(skb, slot, extra, false);                                  \
	}                                                                                          \
	__attribute__((noinline)) int hook_body_tc_floor(struct __sk_buff *skb, __u32 slot,        \
							 __u32 extra)                              \
	{                                                                                          \
		return hook_body_skb_l2(skb, slot, extra, true);                                   \
	}                                                                                          \
	SEC("tc") int hook_tc(struct __sk_buff *skb)                                               \
	{                                                                                          \
		return hook_skb_l2(skb, false, hook_body_tc);                                      \
	}                                                                                          \
	SEC("tc") int hook_tc_floor(struct __sk_buff *skb)                                         \
	{                                                                                          \
		return hook_skb_l2(skb, true, hook_body_tc_floor);                                 \
	}

#endif /* __HOPTRACE_HOOK_BPF_H */
