/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Packet parsing shared by every hop program: Ethernet, 802.1Q/802.1ad,
 * IPv4 (with options), IPv6 (bounded extension-header walk), TCP options,
 * the UDP surplus ID, and one level of VXLAN or Geneve encapsulation.
 *
 * Every read goes through pkt_load(), which knows where the bytes live (an
 * skb for tc/cgroup, an xdp_buff, or kernel memory for tracepoints), so one
 * parser serves all attach kinds. It reads linear packets directly and
 * tracepoints' packets from a one-call copy of their first bytes; helpers
 * are the fallback, so the result never depends on the path taken. A read
 * past the end is "truncated"; an impossible header value is "malformed".
 * Neither ever yields an ID.
 */
#ifndef __HOPTRACE_PARSE_BPF_H
#define __HOPTRACE_PARSE_BPF_H

#include "hoptrace.h"

#define ETH_HLEN_	  14
#define ETH_P_IP_	  0x0800
#define ETH_P_IPV6_	  0x86DD
#define ETH_P_8021Q_	  0x8100
#define ETH_P_8021AD_	  0x88A8
#define ETH_P_TEB_	  0x6558 /* transparent Ethernet bridging (Geneve) */
#define IPPROTO_HOPOPTS_  0
#define IPPROTO_ROUTING_  43
#define IPPROTO_FRAGMENT_ 44
#define IPPROTO_AH_	  51
#define IPPROTO_DSTOPTS_  60
#define IPPROTO_TCP_	  6
#define IPPROTO_UDP_	  17

#define MAX_VLAN_TAGS	  2
#define MAX_IPV6_EXT_HDRS 6
#define TCP_MAX_OPT_LEN	  40

enum pkt_source {
	PKT_SKB,    /* __sk_buff: bpf_skb_load_bytes */
	PKT_XDP,    /* xdp_md: bpf_xdp_load_bytes */
	PKT_KERNEL, /* kernel pointer (tracepoints, fentry, kprobe) */
};

enum parse_status {
	PARSE_OK = 0,
	PARSE_TRUNCATED,
	PARSE_MALFORMED,
	PARSE_NON_IP,
};

/* The loader tests' reference: 1 sends every packet through the general parser (hop_has_filter) and
 * every TCP option list through the walk (parse_tcp_id's common layouts). */
const volatile __u8 hop_general_only = 0;

/* Packets whose bytes are all in the linear data, up to this length, are
 * read with direct packet access; a power of two minus one, so a mask proves
 * every offset's bound to the verifier (offset + size <= MAX_PACKET_OFF, 0xffff). */
#define PKT_DIRECT_MAX 0x7fff

/* Tracepoints copy the first PKT_COPY_MAX bytes (every header of a tunnelled
 * packet, TCP options included) into a per-CPU buffer once; the buffer has
 * room for a read of up to PKT_COPY_MAX bytes at any offset below it, so
 * masks prove every access to the verifier. */
#define PKT_COPY_MAX 256
#define PKT_COPY_BUF (2 * PKT_COPY_MAX)

struct pkt_reader {
	void *ctx;	   /* __sk_buff *, xdp_md *, or PKT_KERNEL's struct sk_buff * */
	const __u8 *kbase; /* PKT_KERNEL: first byte at offset 0 */
	const __u8 *data;  /* PKT_SKB/PKT_XDP with direct: linear data at offset 0 */
	const __u8 *data_end;
	__u32 head;	  /* direct: the first head bytes lie in [data, data_end) */
	__u8 direct;	  /* plain loads, no helper, for the bytes below head */
	const __u8 *copy; /* PKT_KERNEL: the first copy_len bytes, copied at once, or NULL */
	__u32 copy_len;
	__u32 len;   /* bytes readable from offset 0 */
	__u32 total; /* bytes the packet has from offset 0 (> len when an skb is paged) */
	__u8 floor;  /* a compile-time constant: the floor variant (hop.bpf.h), no bpf_loop */
	/* Compile-time constants for socket-read, which offers no action fields and sees the
	 * packet a socket received: a tunnel's packet reaches a socket decapsulated, so there is
	 * no tunnel to descend into. Without both, 6.1's verifier (which marks every scalar
	 * precise once a program calls bpf_loop's callback) gave up at 1M instructions. */
	__u8 no_fields; /* leave pkt_info's action fields (tos .. tcp_ack) unset */
	__u8 no_tunnel; /* parse the outermost packet only */
	/* Compile-time: tc and cgroup hops' segment count in a called function (hop.bpf.h's
	 * skb_segments), not inlined: cgroup_skb's frame has no room for it beside bpf_loop's
	 * callback on 6.1; a call costs a tagged TCP packet ~8 ns, so tc inlines it. */
	__u8 call_segments;
#ifdef HOPTRACE_HOOK
	/* PKT_KERNEL in a hook's body (hook.bpf.h): the TCP segment count the hook read once for
	 * every body it runs; in the hook's object only (hop programs' readers stay 64 bytes) */
	__u32 segs;
#endif
};

/* The innermost packet: its flow, where its headers are, and its ID. */
struct pkt_info {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 family; /* 4 or 6 */
	__u16 flags; /* enum hoptrace_record_flag */
	__u32 id;    /* 0: the packet carries no ID */
	__u32 l3_off;
	__u32 l4_off;
	__u32 ip_len;  /* whole IP packet: header(s) + payload, from the IP header */
	__u32 udp_len; /* UDP length field */
	__u8 fragment; /* first fragment: ports, but only part of the datagram (no ID, never tagged)
			*/
	/* Header fields for hop actions (enum hoptrace_field), kept from the loads the parser makes
	 * anyway: a few register moves, no extra packet reads. */
	__u8 tos;	  /* IPv4 TOS / IPv6 traffic class */
	__u8 ttl;	  /* IPv4 TTL / IPv6 hop limit */
	__u8 tcp_flags;	  /* TCP header byte 13 */
	__u16 ip_id;	  /* IPv4 identification */
	__u16 tcp_window; /* unscaled */
	__u32 tcp_seq;
	__u32 tcp_ack;
	/* IPv4 header bytes 2-11, total length to checksum, as read: what a UDP tag rewrites with
	 * one store (hop.bpf.h's tag_udp_packet) */
	__u8 ip_words[10];
	__u8 tcp_doff; /* TCP data offset (header length / 4), 0 before the TCP header was read; in
			  the struct's tail padding */
};

static __always_inline int pkt_load(enum pkt_source src, struct pkt_reader *r, __u32 off, void *to,
				    __u32 n)
{
	if (off > r->len || n > r->len - off)
		return -1;
	/* Direct packet access: plain loads instead of a helper call per header.
	 * Decided once per packet (pkt_set_direct), so the verifier walks one
	 * way per packet, not both ways per header; a paged skb switches once,
	 * to the helper, at its first read past the head. */
	if (__builtin_constant_p(n) && src != PKT_KERNEL && r->direct) {
		if (off <= r->head && n <= r->head - off) {
			const __u8 *from;

			barrier_var(off);
			from = r->data + (off & PKT_DIRECT_MAX);
			if (from + n > r->data_end) /* cannot happen: off + n <= head */
				return -1;
			__builtin_memcpy(to, from, n);
			return 0;
		}
		/* Only a paged skb's head is direct (head < len): past it, the helper
		 * reads this and every later header. Elsewhere head == len. */
		if (src != PKT_SKB || r->floor)
			return -1;
		r->direct = 0;
	}
	/* Tracepoints: the headers were copied in one helper call (pkt_copy_head). */
	if (__builtin_constant_p(n) && src == PKT_KERNEL && r->copy && off + n <= r->copy_len) {
		barrier_var(off);
		__builtin_memcpy(to, r->copy + (off & (PKT_COPY_MAX - 1)), n);
		return 0;
	}
	switch (src) {
	case PKT_SKB:
		return bpf_skb_load_bytes(r->ctx, off, to, n);
	case PKT_XDP:
		/* Before 5.18 (the floor) an XDP frame is one buffer: direct reads only. */
		return r->floor ? -1 : bpf_xdp_load_bytes(r->ctx, off, to, n);
	default:
		return bpf_probe_read_kernel(to, n, r->kbase + off);
	}
}

/* Direct packet access when the whole packet is linear (tc, cgroup_skb, XDP
 * without fragments): then every read pkt_load() allows is inside it. With
 * head_only, a paged skb's linear head too: TCP's GSO packets keep their
 * headers there (66 bytes) and their payload in pages, and the helper costs
 * about 20 ns a header on them (bpf_stats in place). */
static __always_inline void pkt_set_direct(struct pkt_reader *r, const __u8 *data,
					   const __u8 *data_end, bool head_only)
{
	__u32 len = r->len;

	if (head_only && data_end - data < len)
		len = data_end - data;
	if (len > PKT_DIRECT_MAX)
		return;
	barrier_var(len);
	len &= PKT_DIRECT_MAX; /* no-op: bounds it for the verifier */
	if (data + len > data_end)
		return;
	r->data = data;
	r->data_end = data_end;
	r->head = len;
	r->direct = 1;
}

/*
 * A field of a kernel object. `btf` (a compile-time constant) says the pointer
 * is BTF-typed: a tp_btf, fentry or fexit argument, or a pointer loaded from
 * one. Then a plain load reads the field (the verifier checks it; through a
 * NULL pointer it reads 0). Otherwise (kprobes, pointers kept in maps) it is a
 * bpf_probe_read_kernel call, 20-30 ns each in place: a system-wide
 * tracepoint hop made four of them for every packet of the machine just to
 * find its device (perf record of a traced UDP flow).
 */
#define KERNEL_FIELD(btf, ptr, field) ((btf) ? (ptr)->field : BPF_CORE_READ(ptr, field))

/* The inode number of a device's network namespace, as `ip netns identify` names it. */
static __always_inline __u32 dev_netns_ino(const struct net_device *dev, bool btf)
{
	return btf ? dev->nd_net.net->ns.inum : BPF_CORE_READ(dev, nd_net.net, ns.inum);
}

/* A struct sk_buff in kernel memory (tracepoints, fentry, kprobes) as a
 * reader: from the Ethernet header when the skb has one, else from L3, and
 * then *ethertype is the skb's protocol. -1 when its offsets disagree. `btf`
 * as in KERNEL_FIELD. */
static __always_inline int pkt_reader_from_skb(const struct sk_buff *skb, struct pkt_reader *r,
					       __u16 *ethertype, bool btf)
{
	/* head and data stay probed reads: plain loads of these two pointers made the
	 * verifier walk half as many instructions again (147 k -> 223 k for hop_tp_btf). */
	unsigned char *head = BPF_CORE_READ(skb, head);
	__u16 mac = KERNEL_FIELD(btf, skb, mac_header);
	__u16 nh = KERNEL_FIELD(btf, skb, network_header);
	__u32 tail = KERNEL_FIELD(btf, skb, tail);
	__u32 len = KERNEL_FIELD(btf, skb, len);
	__u32 start;

	*ethertype = 0;
	if (mac != (__u16)~0U && nh > mac && nh - mac >= ETH_HLEN_) {
		start = mac;
	} else {
		start = nh;
		*ethertype = bpf_ntohs(KERNEL_FIELD(btf, skb, protocol));
	}
	if (tail < start)
		return -1;
	r->kbase = head + start;
	r->len = tail - start;
	/* skb->len counts from skb->data; add what lies between start and data. */
	r->total = len + (BPF_CORE_READ(skb, data) - (head + start));
	if (r->total < r->len)
		r->total = r->len;
	return 0;
}

/* Skips Ethernet and up to two VLAN tags; returns the L3 offset and ethertype. */
static __always_inline int parse_l2(enum pkt_source src, struct pkt_reader *r, __u32 *off,
				    __u16 *ethertype, __u16 *flags)
{
	__u8 eth[ETH_HLEN_];
	__u16 proto;

	if (pkt_load(src, r, *off, eth, sizeof(eth)))
		return PARSE_TRUNCATED;
	proto = ((__u16)eth[12] << 8) | eth[13];
	*off += ETH_HLEN_;

#pragma unroll
	for (int i = 0; i < MAX_VLAN_TAGS; i++) {
		__u8 tag[4];

		if (proto != ETH_P_8021Q_ && proto != ETH_P_8021AD_)
			break;
		if (pkt_load(src, r, *off, tag, sizeof(tag)))
			return PARSE_TRUNCATED;
		proto = ((__u16)tag[2] << 8) | tag[3];
		*off += sizeof(tag);
		*flags |= HOPTRACE_F_VLAN;
	}
	*ethertype = proto;
	return PARSE_OK;
}

struct ext_state {
	__u32 l4;
	__u8 next;
	__u8 fragment;
	int status;
};

struct ext_walk {
	struct pkt_reader r;
	struct ext_state st;
};

/* The floor variants' walk state: in a map, not on the stack, because the
 * verifier does not track map values. Each pass of their bounded loops then
 * starts from the same state and is pruned, instead of forking per header. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ext_state);
} ext_scratch SEC(".maps");

static __always_inline bool ipv6_is_ext(__u8 next)
{
	return next == IPPROTO_HOPOPTS_ || next == IPPROTO_ROUTING_ || next == IPPROTO_DSTOPTS_ ||
	       next == IPPROTO_AH_ || next == IPPROTO_FRAGMENT_;
}

/* One IPv6 extension header per call; bpf_loop keeps the verifier's work
 * linear in the number of headers. */
static __always_inline long ext_step(enum pkt_source src, struct pkt_reader *r, struct ext_state *w)
{
	__u8 ext[8];

	if (!ipv6_is_ext(w->next))
		return 1;
	/* Every extension header is at least 8 bytes (RFC 8200 4.3-4.6, RFC 4302). */
	if (pkt_load(src, r, w->l4, ext, sizeof(ext))) {
		w->status = PARSE_TRUNCATED;
		return 1;
	}
	if (w->next == IPPROTO_FRAGMENT_) {
		/* Non-first fragment: no L4 header here. */
		if ((((__u16)ext[2] << 8) | ext[3]) & 0xfff8) {
			w->status = PARSE_NON_IP;
			return 1;
		}
		w->fragment =
		    ext[3] & 1; /* M flag; offset 0 without M is an atomic fragment (RFC 6946) */
		w->l4 += 8;
	} else if (w->next == IPPROTO_AH_) {
		w->l4 += ((__u32)ext[1] + 2) * 4; /* RFC 4302: 4-byte words minus 2 */
	} else {
		w->l4 += ((__u32)ext[1] + 1) * 8; /* RFC 8200: 8-byte units minus 1 */
	}
	w->next = ext[0];
	return 0;
}

static long ext_step_skb(__u64 index, void *data)
{
	struct ext_walk *w = data;

	return ext_step(PKT_SKB, &w->r, &w->st);
}

static long ext_step_xdp(__u64 index, void *data)
{
	struct ext_walk *w = data;

	return ext_step(PKT_XDP, &w->r, &w->st);
}

static long ext_step_kernel(__u64 index, void *data)
{
	struct ext_walk *w = data;

	return ext_step(PKT_KERNEL, &w->r, &w->st);
}

/* An IPv4 header's fields (ip: in the packet or a copy of it, checked), as parse_l3 keeps them. */
static __always_inline void ipv4_fields(const struct iphdr *ip, const struct pkt_reader *r,
					struct pkt_info *p)
{
	p->family = 4;
	if (!r->no_fields) {
		p->tos = ip->tos;
		p->ttl = ip->ttl;
		p->ip_id = bpf_ntohs(ip->id);
	}
	p->proto = ip->protocol;
	__builtin_memcpy(p->ip_words, (const __u8 *)ip + offsetof(struct iphdr, tot_len),
			 sizeof(p->ip_words));
	p->saddr[0] = ip->saddr;
	p->daddr[0] = ip->daddr;
}

/* The same of an IPv6 header; its next header is the caller's (extension headers may follow). */
static __always_inline void ipv6_fields(const struct ipv6hdr *ip6, const struct pkt_reader *r,
					struct pkt_info *p)
{
	p->family = 6;
	p->flags |= HOPTRACE_F_IPV6;
	if (!r->no_fields) {
		/* RFC 8200: the traffic class straddles the version and the flow label. */
		p->tos = (ip6->priority << 4) | (ip6->flow_lbl[0] >> 4);
		p->ttl = ip6->hop_limit;
	}
	__builtin_memcpy(p->saddr, &ip6->saddr, 16);
	__builtin_memcpy(p->daddr, &ip6->daddr, 16);
}

/* A UDP header's fields (checked by the caller). */
static __always_inline void udp_fields(const struct udphdr *udp, struct pkt_info *p)
{
	p->sport = bpf_ntohs(udp->source);
	p->dport = bpf_ntohs(udp->dest);
	p->udp_len = bpf_ntohs(udp->len);
	p->flags |= HOPTRACE_F_UDP;
}

/* A TCP header's ports, all parse_l3 reads of it. */
static __always_inline void tcp_ports(const __be16 *ports, struct pkt_info *p)
{
	p->sport = bpf_ntohs(ports[0]);
	p->dport = bpf_ntohs(ports[1]);
	p->flags |= HOPTRACE_F_TCP;
}

/* IPv4 or IPv6 header and the L4 ports. Fills the flow and offsets. */
static __always_inline int parse_l3(enum pkt_source src, struct pkt_reader *r, __u32 off,
				    __u16 ethertype, struct pkt_info *p)
{
	p->l3_off = off;
	if (ethertype == ETH_P_IP_) {
		struct iphdr ip;
		__u32 ihl;

		if (pkt_load(src, r, off, &ip, sizeof(ip)))
			return PARSE_TRUNCATED;
		ihl = ip.ihl * 4;
		if (ip.version != 4 || ihl < sizeof(ip))
			return PARSE_MALFORMED;
		p->ip_len = bpf_ntohs(ip.tot_len);
		if (p->ip_len < ihl)
			return PARSE_MALFORMED;
		/* The packet must hold what its header claims. */
		if (p->ip_len > r->total - off)
			return PARSE_TRUNCATED;
		/* Later fragments have no L4 header: nothing to identify. */
		if (bpf_ntohs(ip.frag_off) & 0x1fff)
			return PARSE_NON_IP;
		p->fragment = !!(bpf_ntohs(ip.frag_off) & 0x2000); /* MF: the first of several */
		ipv4_fields(&ip, r, p);
		p->l4_off = off + ihl;
	} else if (ethertype == ETH_P_IPV6_) {
		struct ipv6hdr ip6;
		__u8 next;
		__u32 l4 = off + sizeof(ip6);

		if (pkt_load(src, r, off, &ip6, sizeof(ip6)))
			return PARSE_TRUNCATED;
		if (ip6.version != 6)
			return PARSE_MALFORMED;
		p->ip_len = sizeof(ip6) + bpf_ntohs(ip6.payload_len);
		if (p->ip_len > r->total - off)
			return PARSE_TRUNCATED;
		ipv6_fields(&ip6, r, p);
		if (r->floor) {
			/* Without bpf_loop (before 5.17): the same step, unrolled. */
			__u32 key = 0;
			struct ext_state *w = bpf_map_lookup_elem(&ext_scratch, &key);

			if (!w)
				return PARSE_TRUNCATED;
			w->l4 = l4;
			w->next = ip6.nexthdr;
			w->fragment = 0;
			w->status = 0;
			/* Unrolled: 5.10 refuses a loop whose back-edge is a fall-through. */
#pragma unroll
			for (int i = 0; i < MAX_IPV6_EXT_HDRS; i++)
				if (ext_step(src, r, w))
					break;
			if (w->status)
				return w->status;
			l4 = w->l4;
			next = w->next;
			p->fragment = w->fragment;
		} else {
			struct ext_walk w = {.r = *r, .st = {.l4 = l4, .next = ip6.nexthdr}};

			bpf_loop(MAX_IPV6_EXT_HDRS,
				 src == PKT_SKB	  ? ext_step_skb
				 : src == PKT_XDP ? ext_step_xdp
						  : ext_step_kernel,
				 &w, 0);
			if (w.st.status)
				return w.st.status;
			l4 = w.st.l4;
			next = w.st.next;
			p->fragment = w.st.fragment;
		}
		if (l4 > off + p->ip_len)
			return PARSE_MALFORMED;
		p->proto = next;
		p->l4_off = l4;
	} else {
		return PARSE_NON_IP;
	}

	if (p->proto == IPPROTO_UDP_) {
		struct udphdr udp;

		if (pkt_load(src, r, p->l4_off, &udp, sizeof(udp)))
			return PARSE_TRUNCATED;
		udp_fields(&udp, p);
		/* A first fragment's UDP length covers the whole datagram, not this packet. */
		if (p->udp_len < sizeof(udp) ||
		    (!p->fragment && p->l4_off - off + p->udp_len > p->ip_len))
			return PARSE_MALFORMED;
	} else if (p->proto == IPPROTO_TCP_) {
		__be16 ports[2];

		if (pkt_load(src, r, p->l4_off, ports, sizeof(ports)))
			return PARSE_TRUNCATED;
		tcp_ports(ports, p);
	}
	return PARSE_OK;
}

struct tcpopt_scan {
	__u8 opts[64];
	__u32 len; /* option bytes, 1..40 */
	__u32 pos;
	__u32 id;
	int status;
};

/* The floor variants' option scan state, in a map as ext_scratch is. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tcpopt_scan);
} tcpopt_scratch SEC(".maps");

/* Whether opts[i] starts hoptrace's option (RFC 6994: kind 253, length 8, ExID), and its ID. */
static __always_inline bool tcpopt_is_id(const __u8 *opts, __u32 i)
{
	return opts[i & 63] == HOPTRACE_TCPOPT_KIND && opts[(i + 1) & 63] == HOPTRACE_TCPOPT_LEN &&
	       opts[(i + 2) & 63] == (HOPTRACE_TCPOPT_EXID >> 8) &&
	       opts[(i + 3) & 63] == (HOPTRACE_TCPOPT_EXID & 0xff);
}

static __always_inline __u32 tcpopt_id(const __u8 *opts, __u32 i)
{
	return ((__u32)opts[(i + 4) & 63] << 24) | ((__u32)opts[(i + 5) & 63] << 16) |
	       ((__u32)opts[(i + 6) & 63] << 8) | opts[(i + 7) & 63];
}

/* One option per call. Driven by bpf_loop so the verifier checks one step,
 * not every path through 40 options. Always inlined where the floor unrolls
 * it: a BPF-to-BPF call stops precision backtracking before 6.3 (every scalar
 * is then marked precise), and without pruning 5.10 never finishes the walk. */
static __always_inline long tcpopt_scan_step(struct tcpopt_scan *s)
{
	__u32 i = s->pos;
	__u8 kind, len;

	if (i >= s->len)
		return 1;
	kind = s->opts[i & 63];
	if (kind == 0) /* end of option list */
		return 1;
	if (kind == 1) { /* NOP */
		s->pos = i + 1;
		return 0;
	}
	if (i + 1 >= s->len) {
		s->status = PARSE_MALFORMED;
		return 1;
	}
	len = s->opts[(i + 1) & 63];
	if (len < 2 || i + len > s->len) {
		s->status = PARSE_MALFORMED;
		return 1;
	}
	if (tcpopt_is_id(s->opts, i)) {
		s->id = tcpopt_id(s->opts, i);
		return 1;
	}
	s->pos = i + len;
	return 0;
}

static long tcpopt_step(__u64 index, void *data)
{
	return tcpopt_scan_step(data);
}

/* RFC 6994 option 253 with hoptrace's ExID; 0 when absent. */
static __always_inline int parse_tcp_id(enum pkt_source src, struct pkt_reader *r,
					struct pkt_info *p)
{
	struct tcpopt_scan s = {};
	__u8 hdr[16]; /* through the window: data offset, flags, window */
	__u32 optlen;
	int ret;

	if (pkt_load(src, r, p->l4_off, hdr, sizeof(hdr)))
		return PARSE_TRUNCATED;
	if (!r->no_fields) {
		p->tcp_flags = hdr[13];
		p->tcp_window = ((__u16)hdr[14] << 8) | hdr[15];
		/* Byte by byte: the stack copy's 32-bit words need not be aligned. */
		p->tcp_seq =
		    ((__u32)hdr[4] << 24) | ((__u32)hdr[5] << 16) | ((__u32)hdr[6] << 8) | hdr[7];
		p->tcp_ack =
		    ((__u32)hdr[8] << 24) | ((__u32)hdr[9] << 16) | ((__u32)hdr[10] << 8) | hdr[11];
	}
	optlen = (hdr[12] >> 4) * 4;
	if (optlen < 20 || p->l4_off - p->l3_off + optlen > p->ip_len)
		return PARSE_MALFORMED;
	p->tcp_doff = hdr[12] >> 4;
	optlen -= 20;
	if (optlen == 0)
		return PARSE_OK;
	/* 1..40 by the data offset's 4 bits; say so to the verifier (1..64). */
	barrier_var(optlen);
	optlen = ((optlen - 1) & 63) + 1;
	/* One fixed-size load when the packet holds all 40 option bytes (direct
	 * and copied reads need a constant size); bytes past optlen are never
	 * read. Not past a paged skb's head: 40 bytes would reach into its
	 * payload, which the helper copies fragment by fragment. Linux's NOP NOP
	 * timestamps, alone (12 bytes) or with the ID (20), have constant sizes of
	 * their own: the frame may end before 40 option bytes, and XDP before 5.18
	 * (the floor) has no helper to read fewer. */
	if (src != PKT_KERNEL && r->direct && r->head < r->len)
		ret = pkt_load(src, r, p->l4_off + 20, s.opts, optlen);
	else if (optlen == 12)
		ret = pkt_load(src, r, p->l4_off + 20, s.opts, 12);
	else if (optlen == 20)
		ret = pkt_load(src, r, p->l4_off + 20, s.opts, 20);
	else
		ret = pkt_load(src, r, p->l4_off + 20, s.opts, TCP_MAX_OPT_LEN) &&
		      pkt_load(src, r, p->l4_off + 20, s.opts, optlen);
	if (ret)
		return PARSE_TRUNCATED;
	s.len = optlen;
	/* Linux's own layout, NOP NOP timestamps, alone or followed by the ID: read as the walk
	 * reads it, without a call per option (most segments of a sampled flow carry no ID). */
	if (!hop_general_only && (optlen == 12 || optlen == 20) && s.opts[0] == 1 &&
	    s.opts[1] == 1 && s.opts[2] == 8 && s.opts[3] == 10) {
		if (optlen == 12)
			return PARSE_OK;
		if (tcpopt_is_id(s.opts, 12)) {
			p->id = tcpopt_id(s.opts, 12);
			return PARSE_OK;
		}
	}
	if (r->floor) {
		/* Without bpf_loop (before 5.17): the same step, unrolled. */
		__u32 key = 0;
		struct tcpopt_scan *scan = bpf_map_lookup_elem(&tcpopt_scratch, &key);

		if (!scan)
			return PARSE_TRUNCATED;
		__builtin_memcpy(scan, &s, sizeof(s));
#pragma unroll
		for (__u32 i = 0; i < TCP_MAX_OPT_LEN; i++)
			if (tcpopt_scan_step(scan))
				break;
		p->id = scan->id;
		return scan->status;
	} else {
		bpf_loop(TCP_MAX_OPT_LEN, tcpopt_step, &s, 0);
	}
	p->id = s.id;
	return s.status;
}

/* The 4 surplus bytes after the UDP length (RFC 9868) hold the ID. Any other
 * surplus size is not ours and is left alone. */
static __always_inline int parse_udp_id(enum pkt_source src, struct pkt_reader *r,
					struct pkt_info *p)
{
	__u32 udp_end = p->l4_off - p->l3_off + p->udp_len;
	__be32 id;

	if (p->ip_len - udp_end != HOPTRACE_UDP_ID_LEN)
		return PARSE_OK;
	/* Tracepoints read only an skb's linear part: an ID in paged data stays
	 * unread (counted untagged), never guessed. */
	if (pkt_load(src, r, p->l3_off + udp_end, &id, sizeof(id)))
		return src == PKT_KERNEL ? PARSE_OK : PARSE_TRUNCATED;
	p->id = bpf_ntohl(id);
	return PARSE_OK;
}

/* Offset of the inner Ethernet frame when p is a VXLAN or Geneve packet. */
static __always_inline int tunnel_inner_offset(enum pkt_source src, struct pkt_reader *r,
					       struct pkt_info *p, __u32 *inner)
{
	if (p->proto != IPPROTO_UDP_)
		return -1;
	if (p->dport == HOPTRACE_VXLAN_PORT) {
		*inner = p->l4_off + 8 + 8; /* UDP + VXLAN header (RFC 7348) */
		p->flags |= HOPTRACE_F_ENCAP_VXLAN;
		return 0;
	}
	if (p->dport == HOPTRACE_GENEVE_PORT) {
		__u8 gnv[4];

		if (pkt_load(src, r, p->l4_off + 8, gnv, sizeof(gnv)))
			return -1;
		/* RFC 8926: only Ethernet payloads carry a frame we can parse. */
		if ((((__u16)gnv[2] << 8) | gnv[3]) != ETH_P_TEB_)
			return -1;
		*inner = p->l4_off + 8 + 8 + (gnv[0] & 0x3f) * 4;
		p->flags |= HOPTRACE_F_ENCAP_GENEVE;
		return 0;
	}
	return -1;
}

/*
 * Parses the packet at off (an Ethernet header when ethertype is 0, else the
 * L3 header of that ethertype) and descends into one tunnel: p has the
 * innermost packet's addresses and ports, not yet its ID (parse_id).
 */
static __always_inline int parse_headers(enum pkt_source src, struct pkt_reader *r, __u32 off,
					 __u16 ethertype, struct pkt_info *p)
{
	__u32 inner;
	int ret;

	if (!ethertype) {
		ret = parse_l2(src, r, &off, &ethertype, &p->flags);
		if (ret)
			return ret;
	}
	ret = parse_l3(src, r, off, ethertype, p);
	if (ret)
		return ret;
	/* Only part of a datagram: nothing to descend into, and no ID to find. */
	if (p->fragment)
		return PARSE_OK;

	if (!r->no_tunnel && !tunnel_inner_offset(src, r, p, &inner)) {
		__u16 outer_flags =
		    p->flags & (HOPTRACE_F_ENCAP_VXLAN | HOPTRACE_F_ENCAP_GENEVE | HOPTRACE_F_VLAN);

		__builtin_memset(p, 0, sizeof(*p));
		p->flags = outer_flags;
		ret = parse_l2(src, r, &inner, &ethertype, &p->flags);
		if (ret)
			return ret;
		return parse_l3(src, r, inner, ethertype, p);
	}
	return PARSE_OK;
}

/* The ID of a packet parse_headers parsed (and, with TCP, its header fields). */
static __always_inline int parse_id(enum pkt_source src, struct pkt_reader *r, struct pkt_info *p)
{
	if (p->fragment)
		return PARSE_OK;
	if (p->proto == IPPROTO_TCP_)
		return parse_tcp_id(src, r, p);
	if (p->proto == IPPROTO_UDP_)
		return parse_udp_id(src, r, p);
	return PARSE_OK;
}

/*
 * The common frame's flow by direct reads alone: Ethernet, IPv4 without
 * options or IPv6 without extension headers, unfragmented, UDP/TCP/other,
 * and VXLAN's inner frame of the same kinds. A packet of another flow is
 * refused here without the reader, the zeroed pkt_info or a helper. It
 * decides only what parse_headers would decide the same way, without error:
 * anything else (VLAN, Geneve, options, extension headers, fragments, a
 * header past the linear data, any doubt) returns false, and the general
 * parser takes it. Offsets are compile-time constants at every call, so each
 * bound is one comparison with data_end.
 */
struct fast_flow {
	const __u32 *saddr; /* in the packet: 1 word (IPv4) or 4 (IPv6) */
	const __u32 *daddr;
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 family;
	__u8 vxlan;	   /* the flow is VXLAN's inner packet */
	__u8 tcp_untagged; /* a TCP segment fast_tcp_untagged read: no ID, well formed */
	__u8 no_id; /* it carries no ID: neither UDP with the ID's surplus nor TCP with options */
	__u32 l3;   /* its IP header */
};

/*
 * The TCP header at l4 (hdr_len: the IP header's length, ip_len: the IP packet's) in the two
 * layouts Linux sends a segment the tagger sampled out, no options or NOP NOP timestamps: 1 when
 * parse_tcp_id would find it well formed and without an ID, 0 when it is to decide.
 */
static __always_inline __u8 fast_tcp_untagged(const __u8 *data, const __u8 *data_end, __u32 l4,
					      __u32 hdr_len, __u32 ip_len)
{
	const __u8 *tcp = data + l4;
	__u32 doff;

	if (tcp + 20 > data_end)
		return 0;
	doff = tcp[12] >> 4;
	if (hdr_len + doff * 4 > ip_len)
		return 0;
	if (doff == 5)
		return 1;
	if (doff != 8 || tcp + 20 + 12 > data_end)
		return 0;
	/* NOP NOP, timestamps (RFC 7323, appendix A) */
	return tcp[20] == 1 && tcp[21] == 1 && tcp[22] == 8 && tcp[23] == 10;
}

/* The ports at l4 as parse_l3 checks them; ip_len: the IP packet's length, hdr_len its header's. */
static __always_inline bool fast_ports(const __u8 *data, const __u8 *data_end, __u32 l4,
				       __u32 hdr_len, __u32 ip_len, struct fast_flow *f)
{
	const struct udphdr *udp = (const void *)(data + l4);
	__u16 udp_len;

	f->sport = 0;
	f->dport = 0;
	f->tcp_untagged = 0;
	f->no_id = 1;
	if (f->proto == IPPROTO_UDP_) {
		if ((const void *)(udp + 1) > (const void *)data_end)
			return false;
		udp_len = bpf_ntohs(udp->len);
		if (udp_len < sizeof(*udp) || hdr_len + udp_len > ip_len)
			return false;
		f->no_id = ip_len - hdr_len - udp_len != HOPTRACE_UDP_ID_LEN;
	} else if (f->proto == IPPROTO_TCP_) {
		/* the ports only, as parse_l3 reads them */
		if ((const void *)udp + 4 > (const void *)data_end)
			return false;
		f->tcp_untagged = fast_tcp_untagged(data, data_end, l4, hdr_len, ip_len);
		f->no_id = f->tcp_untagged;
	} else {
		return true;
	}
	f->sport = bpf_ntohs(udp->source);
	f->dport = bpf_ntohs(udp->dest);
	return true;
}

/* total: the packet's bytes from offset 0, which its IP length may not pass. */
static __always_inline bool fast_ipv4(const __u8 *data, const __u8 *data_end, __u32 total, __u32 l3,
				      struct fast_flow *f)
{
	const struct iphdr *ip = (const void *)(data + l3);
	__u16 ip_len;

	if ((const void *)(ip + 1) > (const void *)data_end)
		return false;
	/* version 4, no options; neither a later fragment nor the first of several */
	if (*(const __u8 *)ip != 0x45 || ip->frag_off & bpf_htons(0x3fff))
		return false;
	ip_len = bpf_ntohs(ip->tot_len);
	if (ip_len < sizeof(*ip) || ip_len > total - l3)
		return false;
	f->family = 4;
	f->l3 = l3;
	f->proto = ip->protocol;
	f->saddr = &ip->saddr;
	f->daddr = &ip->daddr;
	return fast_ports(data, data_end, l3 + sizeof(*ip), sizeof(*ip), ip_len, f);
}

static __always_inline bool fast_ipv6(const __u8 *data, const __u8 *data_end, __u32 total, __u32 l3,
				      struct fast_flow *f)
{
	const struct ipv6hdr *ip6 = (const void *)(data + l3);
	__u32 ip_len;

	if ((const void *)(ip6 + 1) > (const void *)data_end)
		return false;
	/* no extension header (a fragment header is one) */
	if (ip6->version != 6 || ipv6_is_ext(ip6->nexthdr))
		return false;
	ip_len = sizeof(*ip6) + bpf_ntohs(ip6->payload_len);
	if (ip_len > total - l3)
		return false;
	f->family = 6;
	f->l3 = l3;
	f->proto = ip6->nexthdr;
	f->saddr = (const __u32 *)&ip6->saddr;
	f->daddr = (const __u32 *)&ip6->daddr;
	return fast_ports(data, data_end, l3 + sizeof(*ip6), sizeof(*ip6), ip_len, f);
}

/* After the outer packet (f, its L4 header at l4): true when f is decided, as it stands when it is
 * no tunnel, as VXLAN's inner packet when it is VXLAN; false for Geneve and an undecided inner
 * frame. */
static __always_inline bool fast_inner(const __u8 *data, const __u8 *data_end, __u32 total,
				       __u32 l4, struct fast_flow *f)
{
	const __u32 inner_eth = l4 + 8 + 8; /* UDP, VXLAN (RFC 7348) */
	const __u8 *eth = data + inner_eth;

	if (f->proto != IPPROTO_UDP_ || f->dport != HOPTRACE_VXLAN_PORT)
		return f->proto != IPPROTO_UDP_ || f->dport != HOPTRACE_GENEVE_PORT;
	if (eth + ETH_HLEN_ > data_end)
		return false;
	f->vxlan = 1;
	if (eth[12] == 0x08 && eth[13] == 0x00)
		return fast_ipv4(data, data_end, total, inner_eth + ETH_HLEN_, f);
	if (eth[12] == 0x86 && eth[13] == 0xdd)
		return fast_ipv6(data, data_end, total, inner_eth + ETH_HLEN_, f);
	return false;
}

/* The innermost flow of an IP packet at l3 (its ethertype in network order); false: not decided. */
static __always_inline bool fast_flow_l3(const __u8 *data, const __u8 *data_end, __u32 total,
					 __u32 l3, __be16 ethertype, struct fast_flow *f)
{
	f->vxlan = 0;
	if (ethertype == bpf_htons(ETH_P_IP_))
		return fast_ipv4(data, data_end, total, l3, f) &&
		       fast_inner(data, data_end, total, l3 + sizeof(struct iphdr), f);
	if (ethertype == bpf_htons(ETH_P_IPV6_))
		return fast_ipv6(data, data_end, total, l3, f) &&
		       fast_inner(data, data_end, total, l3 + sizeof(struct ipv6hdr), f);
	return false;
}

/* The same from an Ethernet header at offset 0 (tc, XDP). */
static __always_inline bool fast_flow_l2(const __u8 *data, const __u8 *data_end, __u32 total,
					 struct fast_flow *f)
{
	const struct ethhdr *eth = (const void *)data;

	if ((const void *)(eth + 1) > (const void *)data_end)
		return false;
	return fast_flow_l3(data, data_end, total, ETH_HLEN_, eth->h_proto, f);
}

/*
 * parse_l3 of a frame the fast path decided: its innermost IP packet at l3 (family 4 or 6), from
 * the linear data it read, without checking again what it checked (IPv4 without options,
 * unfragmented; IPv6 without extension headers; both within the packet; a UDP length within the
 * IP packet) and without pkt_load's copy of each header. False when the headers are not in r's
 * direct reads as the verifier sees them: then parse_l3 reads them.
 */
static __always_inline bool fast_l3(const struct pkt_reader *r, __u32 l3, __u8 family,
				    struct pkt_info *p)
{
	const __u32 ip_hlen = family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);
	const __u8 *data = r->data, *l4;

	/* l3 < 256 on any frame the fast path decides (VXLAN in IPv6: 84): the mask bounds it */
	if (!r->direct || l3 > 0xff)
		return false;
	l4 = data + (l3 & 0xff) + ip_hlen;
	if (l4 + sizeof(struct udphdr) > r->data_end) /* as much of L4 as either reads */
		return false;
	p->l3_off = l3;
	p->l4_off = l3 + ip_hlen;
	if (family == 4) {
		const struct iphdr *ip = (const void *)(data + (l3 & 0xff));

		p->ip_len = bpf_ntohs(ip->tot_len);
		ipv4_fields(ip, r, p);
	} else {
		const struct ipv6hdr *ip6 = (const void *)(data + (l3 & 0xff));

		p->ip_len = sizeof(*ip6) + bpf_ntohs(ip6->payload_len);
		ipv6_fields(ip6, r, p);
		p->proto = ip6->nexthdr;
	}
	if (p->proto == IPPROTO_UDP_)
		udp_fields((const struct udphdr *)l4, p);
	else if (p->proto == IPPROTO_TCP_)
		tcp_ports((const __be16 *)l4, p);
	return true;
}

/* parse_headers, then parse_id. */
static __always_inline int parse_packet(enum pkt_source src, struct pkt_reader *r, __u32 off,
					__u16 ethertype, struct pkt_info *p)
{
	int ret = parse_headers(src, r, off, ethertype, p);

	return ret ? ret : parse_id(src, r, p);
}

#endif /* __HOPTRACE_PARSE_BPF_H */
