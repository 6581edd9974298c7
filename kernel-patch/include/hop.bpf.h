/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The hop programs' library: load-time settings, maps, the flow filter, ID
 * tagging and the record a hop emits. hoptrace.bpf.c instantiates every
 * program; the dispatcher's per-node objects instantiate only what a node
 * needs, with the same names, through the HOPTRACE_PROG_* macros below.
 *
 * Include vmlinux.h and the libbpf headers before this file.
 *
 * Every program comes twice: NAME for kernels from 5.18, and NAME_floor for
 * 5.10 up to them, which does without bpf_loop (5.17), fetching atomics and
 * bpf_check_mtu (5.12), bpf_xdp_get_buff_len (5.18) and the netns cookie in
 * sock_ops (5.15). The agent picks the variant its kernel runs; the floor
 * argument below is a compile-time constant that selects the code.
 */
#ifndef __HOPTRACE_HOP_BPF_H
#define __HOPTRACE_HOP_BPF_H

#include "hoptrace.h"
#include "parse.bpf.h"
#include "hook.h"

/*
 * The hop body's settings (hop_index, trace_slot, sampling, tagging, following, actions): in a hop
 * program of its own the load-time constants below, which the verifier folds (HS(name) is name, and
 * its hs argument is HOP_CONST, unused); in the hook (hook.bpf.h, HOPTRACE_HOOK) the matched
 * trace's entry of the settings map, hs, read at run time.
 */
#ifdef HOPTRACE_HOOK
#define HS(name) (hs->name)
#define HOP_SLOT (hs->slot)
#else
#define HS(name) (name)
#define HOP_SLOT 0
#endif
#define HOP_CONST ((const struct hoptrace_hook_settings *)0)

#define TCX_NEXT_ (-1) /* let the next tcx/tc program run: never decide a packet's fate */
#define SK_PASS_  1

/* Load-time settings, written by the agent before load (docs/design.md). */
const volatile __u16 hop_index = 0;
const volatile __u16 trace_slot = 0;
const volatile __u32 hop_ifindex = 0;
const volatile __u32 hop_netns_ino = 0;
const volatile __u8 hop_tag_udp = 0;
/* The top bits of the IDs this trace writes (the dispatcher gives each trace its own). */
const volatile __u8 id_origin = 1;
/* Hops take a packet that carries an ID of this origin even when its addresses or ports no longer
 * match the filter: an address translation (DNAT, SNAT, masquerade) rewrote them after it was
 * tagged. 0: the filter alone decides (standalone plans, presets). */
const volatile __u8 follow_origin = 0;
const volatile __u32 sample_every = 1;
const volatile __u8 filter_proto = 0;
const volatile __u8 filter_family = 0;
const volatile __u32 filter_src[4] = {};
const volatile __u32 filter_src_mask[4] = {};
const volatile __u32 filter_dst[4] = {};
const volatile __u32 filter_dst_mask[4] = {};
const volatile __u16 filter_sport = 0;
const volatile __u16 filter_dport = 0;
const volatile __u64 tag_netns_cookie = 0;
/* Hop actions (docs/design.md). Each is a load-time constant, so an
 * action a hop does not use is a constant-false branch the verifier never
 * walks: the object stays generic and the hot path pays nothing for it. */
const volatile __u8 act_count = 0;    /* 1: count matched packets (count_keys) */
const volatile __u8 act_count_by = 0; /* enum hoptrace_field keying the count; NONE = one total */
const volatile __u8 act_hist = 0;     /* enum hoptrace_field of the log2 histogram; NONE = none */
/* record: [FIELDS]: enum hoptrace_field of each value carried with the record (struct
 * hoptrace_values); act_record[0] == NONE: no values, the 32-byte record alone. */
const volatile __u8 act_record[HOPTRACE_VALUES_MAX] = {};
const volatile __u8 act_prev_ts = 0; /* 1: remember this hop's timestamp of each traced packet
					(prev_ts) for a later hop's latency on this node */
/* capture: N: the first N bytes (at most HOPTRACE_CAPTURE_MAX) of each traced packet ride with its
 * record (struct hoptrace_capture); 0: none. */
const volatile __u8 act_capture = 0;

/* One per agent: every hop of every trace writes here. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
} records SEC(".maps");

/* One per trace per node: the sequence that sampling and IDs come from. The
 * floor variants take the lock: their kernels cannot fetch-and-add. */
struct id_seq {
	__u64 next;
	struct bpf_spin_lock lock;
};

#ifdef HOPTRACE_HOOK
#define HOP_MAP_SLOTS HOPTRACE_HOOK_SLOTS /* the hook: one entry (or range) per trace slot */
#else
#define HOP_MAP_SLOTS 1
#endif

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HOP_MAP_SLOTS);
	__type(key, __u32);
	__type(value, struct id_seq);
} id_state SEC(".maps");

/* One per loaded hop: a counter for every outcome. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HOPTRACE_C_MAX *HOP_MAP_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* Hop actions: one per loaded hop. count by FIELD: key = the field's value
 * (0 without by); the values take non-fetching atomic adds (5.10 has them). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, HOPTRACE_COUNT_KEYS);
#ifdef HOPTRACE_HOOK
	__type(key, struct hoptrace_hook_count_key);
#else
	__type(key, __u64);
#endif
	__type(value, __u64);
} count_keys SEC(".maps");

/* histogram: FIELD, log2 buckets per CPU (summed by the agent, like counters). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HOPTRACE_HIST_BUCKETS *HOP_MAP_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} hist_buckets SEC(".maps");

/* The last timestamp of each traced packet on this node, written by hops
 * with act_prev_ts: ONE per agent (MapReplacements), LRU so it stays bounded;
 * a hop whose packet has no entry counts HOPTRACE_C_LATENCY_MISS. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, HOPTRACE_PREV_TS_ENTRIES);
	__type(key, struct hoptrace_prev_ts_key);
	__type(value, __u64);
} prev_ts SEC(".maps");

/* Tracepoints' copy of a packet's first bytes (pkt_copy_head). */
struct pkt_copy {
	__u8 bytes[PKT_COPY_BUF];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pkt_copy);
} pkt_scratch SEC(".maps");

/* Keep the record layout in this object's BTF for the layout tests. */
const struct hoptrace_record *unused_record_type __attribute__((unused));
const struct hoptrace_values *unused_values_type __attribute__((unused));
const struct hoptrace_addresses *unused_addresses_type __attribute__((unused));
const struct hoptrace_capture *unused_capture_type __attribute__((unused));
const enum hoptrace_counter *unused_counter_type __attribute__((unused));

static __always_inline void count(enum hoptrace_counter c, __u64 n)
{
	__u32 key = c;
	__u64 *v = bpf_map_lookup_elem(&counters, &key);

	if (v)
		*v += n;
}

/* A counter of the trace at slot: the hop's own outside the hook (slot 0), the slot's range in it.
 */
static __always_inline void slot_count(__u32 slot, enum hoptrace_counter c, __u64 n)
{
#ifdef HOPTRACE_HOOK
	__u32 key = slot * HOPTRACE_C_MAX + c;
	__u64 *v = bpf_map_lookup_elem(&counters, &key);

	if (v)
		*v += n;
#else
	count(c, n);
#endif
}

/* A hop body's counter: the hop's own, or at the hook the matched trace's (its slot's range). */
static __always_inline void hop_count(const struct hoptrace_hook_settings *hs,
				      enum hoptrace_counter c, __u64 n)
{
	slot_count(HOP_SLOT, c, n);
}

static __always_inline void count_parse_error(int status)
{
	if (status == PARSE_TRUNCATED)
		count(HOPTRACE_C_PARSE_TRUNCATED, 1);
	else if (status == PARSE_MALFORMED)
		count(HOPTRACE_C_PARSE_MALFORMED, 1);
	else
		count(HOPTRACE_C_PARSE_NON_IP, 1);
}

static __always_inline bool addr_match(const __u32 *addr, const volatile __u32 *want,
				       const volatile __u32 *mask, __u8 family)
{
	if ((addr[0] & mask[0]) != want[0])
		return false;
	if (family == 4)
		return true;
	return (addr[1] & mask[1]) == want[1] && (addr[2] & mask[2]) == want[2] &&
	       (addr[3] & mask[3]) == want[3];
}

static __always_inline bool flow_match(__u8 family, __u8 proto, const __u32 *saddr,
				       const __u32 *daddr, __u16 sport, __u16 dport)
{
	if (filter_proto && proto != filter_proto)
		return false;
	if (filter_family && family != filter_family)
		return false;
	if (filter_family && (!addr_match(saddr, filter_src, filter_src_mask, family) ||
			      !addr_match(daddr, filter_dst, filter_dst_mask, family)))
		return false;
	if (filter_sport && sport != filter_sport)
		return false;
	if (filter_dport && dport != filter_dport)
		return false;
	return true;
}

/* hop_parse's status for a packet the filter refuses (beside parse.bpf.h's PARSE_*). */
#define HOP_NOT_MATCHED 0x100

/* Whether a packet of protocol proto that the filter refuses may still be the trace's, translated:
 * it is followed by its ID, and a translation keeps the protocol. */
static __always_inline bool hop_may_follow(__u8 proto)
{
	return follow_origin && (!filter_proto || proto == filter_proto);
}

/* A packet the filter refused: the trace's all the same when it carries an ID of the trace's origin
 * (HOPTRACE_F_FOLLOWED), else HOP_NOT_MATCHED, whatever its ID's parse found. */
static __always_inline int hop_follow(enum pkt_source src, struct pkt_reader *r, struct pkt_info *p)
{
	if (!hop_may_follow(p->proto) || parse_id(src, r, p) || !p->id ||
	    p->id >> HOPTRACE_ID_SEQ_BITS != follow_origin) {
		p->id = 0;
		return HOP_NOT_MATCHED;
	}
	p->flags |= HOPTRACE_F_FOLLOWED;
	return PARSE_OK;
}

/* The packet's headers, then the filter, then, only for a matching packet (or one a hop may
 * follow), its ID: a packet of another flow pays no TCP option scan. */
static __always_inline int hop_parse(enum pkt_source src, struct pkt_reader *r, __u16 ethertype,
				     struct pkt_info *p)
{
	int status = parse_headers(src, r, 0, ethertype, p);

	if (status)
		return status;
	if (!flow_match(p->family, p->proto, p->saddr, p->daddr, p->sport, p->dport))
		return hop_follow(src, r, p);
	return parse_id(src, r, p);
}

/* What the fast path (parse.bpf.h's fast_flow_*) made of a frame. */
enum fast_verdict {
	FAST_GENERAL, /* undecided, or maybe followed by its ID: the general parser decides */
	FAST_TAKEN,   /* the filter's flow: the general parser resumes at fast_resume's */
	FAST_REFUSED, /* another flow, counted as the general path would count it: done */
};

static __always_inline enum fast_verdict hop_fast_verdict(bool decided, const struct fast_flow *f)
{
	if (!decided)
		return FAST_GENERAL;
	if (flow_match(f->family, f->proto, f->saddr, f->daddr, f->sport, f->dport))
		return FAST_TAKEN;
	if (!f->no_id && hop_may_follow(f->proto))
		return FAST_GENERAL;
	count(HOPTRACE_C_SEEN, 1);
	count(HOPTRACE_C_NOT_MATCHED, 1);
	return FAST_REFUSED;
}

/*
 * A segment of the filter's flow that the fast path read untagged (fast_tcp_untagged), when no
 * action reads the fields of every matched packet: counted as hop_finish counts it, without the
 * general parse. At sample: 100 that is 99 segments in 100.
 */
static __always_inline bool hop_fast_untagged(const struct fast_flow *f, __u32 wire_len)
{
	if (!f->tcp_untagged || act_count || (act_hist && act_hist != HOPTRACE_FIELD_LATENCY))
		return false;
	count(HOPTRACE_C_SEEN, 1);
	count(HOPTRACE_C_MATCHED, 1);
	count(HOPTRACE_C_BYTES, wire_len);
	count(HOPTRACE_C_UNTAGGED, 1);
	return true;
}

/* Whether to try the fast path: without a filter every packet matches, nothing to refuse early. */
static __always_inline bool hop_has_filter(void)
{
	return !hop_general_only && (filter_proto || filter_family || filter_sport || filter_dport);
}

/*
 * Where hop_parse_fast resumes a frame the fast path decided and the filter takes, in one word:
 * the inner IP header's offset << 16, VXLAN at bit 8, the family (4 or 6, so never 0). Not the
 * fast_flow: the general path then keeps none of it live, and the fast path's checks set no
 * registers for it (that took six instructions on each).
 */
static __always_inline __u32 fast_resume(const struct fast_flow *f)
{
	return f->l3 << 16 | f->vxlan << 8 | f->family;
}

/* hop_parse for a frame the fast path decided and the filter takes (resume: fast_resume's): its
 * innermost IP packet's fields as the fast path checked them (fast_l3), or where they are past
 * the direct reads, the general parser from that IP header on; then its ID. Either way not the
 * outer headers again. */
static __always_inline int hop_parse_fast(enum pkt_source src, struct pkt_reader *r, __u32 resume,
					  struct pkt_info *p)
{
	__u32 l3 = resume >> 16;
	__u8 family = resume & 0xff;
	int status;

	if (resume & 0x100)
		p->flags |= HOPTRACE_F_ENCAP_VXLAN;
	if (!fast_l3(r, l3, family, p)) {
		status = parse_l3(src, r, l3, family == 4 ? ETH_P_IP_ : ETH_P_IPV6_, p);
		if (status)
			return status;
	}
	return parse_id(src, r, p);
}

static __always_inline __u32 mix32(__u32 h, __u32 v)
{
	/* murmur3 round: cheap, and the same on every node */
	v *= 0xcc9e2d51;
	v = (v << 15) | (v >> 17);
	v *= 0x1b873593;
	h ^= v;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 flow_hash(const struct pkt_info *p)
{
	__u32 h = p->proto;

	h = mix32(h, p->saddr[0]);
	h = mix32(h, p->daddr[0]);
	if (p->family == 6) {
		h = mix32(h, p->saddr[1]);
		h = mix32(h, p->saddr[2]);
		h = mix32(h, p->saddr[3]);
		h = mix32(h, p->daddr[1]);
		h = mix32(h, p->daddr[2]);
		h = mix32(h, p->daddr[3]);
	}
	h = mix32(h, ((__u32)p->sport << 16) | p->dport);
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	return h;
}

/*
 * Takes the next sequence number of this trace; returns a new ID when the
 * packet is sampled, 0 when it is not. IDs are (salt << 24 | seq), so an
 * origin's IDs do not repeat within 16 M sampled packets.
 */
static __always_inline __u32 next_id(const struct hoptrace_hook_settings *hs, bool floor)
{
	__u32 key = HOP_SLOT;
	struct id_seq *seq = bpf_map_lookup_elem(&id_state, &key);
	__u64 n;

	if (!seq)
		return 0;
	if (floor) {
		bpf_spin_lock(&seq->lock);
		n = seq->next++;
		bpf_spin_unlock(&seq->lock);
	} else {
		n = __sync_fetch_and_add(&seq->next, 1);
	}
	if (HS(sample_every) > 1) {
		if (n % HS(sample_every))
			return 0;
		n /= HS(sample_every);
	}
	return ((__u32)HS(id_origin) << HOPTRACE_ID_SEQ_BITS) |
	       (((__u32)n + 1) & HOPTRACE_ID_SEQ_MASK);
}

/* Never a wake-up: one schedules the agent onto the traced packet's CPU, in the middle of its
 * path (measured with hoptrace mace: +6 to +37 us per traced echo), and costs an irq_work there.
 * The agent polls the ring on a timer instead (agent/internal/stream/reader.go). */
static __always_inline void submit_record(const struct hoptrace_hook_settings *hs,
					  struct hoptrace_record *rec)
{
	bpf_ringbuf_submit(rec, BPF_RB_NO_WAKEUP);
	hop_count(hs, HOPTRACE_C_RECORDED, 1);
}

/* The record's sample: the record, its values (a record action), the addresses the hop saw (one
 * packet in HOPTRACE_ADDRESSES_EVERY) and its first bytes (a capture action). A reserve's size must
 * be constant where the verifier walks it: eight calls, each on its own path. */
static __always_inline struct hoptrace_record *reserve_sample(bool with_values, bool with_addresses,
							      bool with_capture)
{
	const __u64 rec = sizeof(struct hoptrace_record), vals = sizeof(struct hoptrace_values),
		    addrs = sizeof(struct hoptrace_addresses),
		    cap = sizeof(struct hoptrace_capture);

	if (with_capture) {
		if (with_values)
			return with_addresses
				   ? bpf_ringbuf_reserve(&records, rec + vals + addrs + cap, 0)
				   : bpf_ringbuf_reserve(&records, rec + vals + cap, 0);
		return with_addresses ? bpf_ringbuf_reserve(&records, rec + addrs + cap, 0)
				      : bpf_ringbuf_reserve(&records, rec + cap, 0);
	}
	if (with_values)
		return with_addresses ? bpf_ringbuf_reserve(&records, rec + vals + addrs, 0)
				      : bpf_ringbuf_reserve(&records, rec + vals, 0);
	return with_addresses ? bpf_ringbuf_reserve(&records, rec + addrs, 0)
			      : bpf_ringbuf_reserve(&records, rec, 0);
}

/* Whether this packet's records carry the addresses each hop saw: the same packets at every hop,
 * chosen by their ID alone. */
static __always_inline bool describes_addresses(__u32 packet_id)
{
	return (packet_id & (HOPTRACE_ADDRESSES_EVERY - 1)) == 1;
}

/* 6.2+; weak, so that the agent's loader turns it into NULL where it is missing. */
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym __weak;

#define CHECKSUM_PARTIAL_ 3

/*
 * tc's ctx is the kernel's struct sk_buff. Where the kfunc that says so is
 * missing (before 6.2), read the fields through bpf_probe_read_kernel from
 * the ctx address itself (a root agent may pass a pointer to a helper).
 */
static __always_inline __u8 skb_ip_summed(struct __sk_buff *skb, bool floor)
{
	struct sk_buff *kskb;

	if (!floor && bpf_cast_to_kern_ctx) {
		kskb = bpf_cast_to_kern_ctx(skb);
		return BPF_CORE_READ_BITFIELD(kskb, ip_summed);
	}
	kskb = (struct sk_buff *)skb;
	return BPF_CORE_READ_BITFIELD_PROBED(kskb, ip_summed);
}

/* Would growing the packet by `grow` bytes pass the device's MTU? */
static __always_inline bool exceeds_mtu(struct __sk_buff *skb, __u32 grow, bool floor)
{
	struct sk_buff *kskb = (struct sk_buff *)skb;
	__u32 mtu_len = 0, mtu, network_len;

	if (!floor && bpf_cast_to_kern_ctx) {
		/* 6.2+: what bpf_check_mtu checks of a non-GSO packet, by two BTF loads from the
		 * device instead of a helper call (a NULL device reads 0: untagged) */
		struct net_device *dev = ((struct sk_buff *)bpf_cast_to_kern_ctx(skb))->dev;

		mtu = dev->mtu;
		network_len = skb->len - dev->hard_header_len;
		return !mtu || network_len + grow > mtu;
	}
	if (!floor)
		return bpf_check_mtu(skb, 0, &mtu_len, grow, 0) != 0;
	/* Before 5.12: what bpf_check_mtu checks, from the device itself. */
	mtu = BPF_CORE_READ(kskb, dev, mtu);
	network_len = skb->len - BPF_CORE_READ(kskb, dev, hard_header_len);
	return !mtu || network_len + grow > mtu;
}

/* The IPv4 header from its total length to its checksum (pkt_info's ip_words): a UDP tag
 * writes it back in one call. */
struct ipv4_len_to_check {
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__sum16 check;
} __attribute__((packed));

/* RFC 1624, eqn. 3: the checksum after one 16-bit word changed, HC' = ~(~HC + ~m + m'). */
static __always_inline __sum16 csum_replace16(__sum16 check, __be16 old, __be16 new)
{
	__u32 sum = (__u16)~check + (__u16)~old + (__u16) new;

	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__sum16)~sum;
}

/*
 * A CHECKSUM_PARTIAL packet's UDP checksum is finished later (by the stack
 * or the NIC) over everything from csum_start to the end of the skb, which
 * now includes the ID. Take the ID's share out of the seed in advance, so the
 * finished checksum covers the UDP length only, as the receiver checks it.
 * The share depends on the ID's alignment: at an odd offset its bytes pair
 * the other way round (RFC 1071 byte-order independence).
 */
static __always_inline int udp_csum_exclude_id(struct __sk_buff *skb, const struct pkt_info *p,
					       __be32 id_be, bool floor)
{
	__u32 share = id_be;

	if (skb_ip_summed(skb, floor) != CHECKSUM_PARTIAL_)
		return 0; /* a finished checksum covers the UDP length only already */
	if (p->udp_len & 1)
		share = ((share & 0x00ff00ff) << 8) | ((share & 0xff00ff00) >> 8);
	/* With BPF_F_PSEUDO_HDR on a CHECKSUM_PARTIAL skb the helper edits the
	 * seed itself: seed = fold(seed - share). */
	return bpf_l4_csum_replace(skb, p->l4_off + offsetof(struct udphdr, check), share, 0,
				   BPF_F_PSEUDO_HDR | sizeof(share));
}

/*
 * Appends the ID after the UDP payload, in the surplus area that UDP's own
 * length does not cover (RFC 9868). The receiver's UDP stack trims it before
 * the socket (pskb_trim_rcsum in __udp4_lib_rcv / udpv6_rcv), so applications
 * get their bytes unchanged; the UDP checksum does not cover it. Only the IP
 * length (and the IPv4 header checksum) change.
 */
static __always_inline int tag_udp_packet(const struct hoptrace_hook_settings *hs,
					  struct __sk_buff *skb, struct pkt_info *p, bool floor)
{
	__u32 ip_end = p->l3_off + p->ip_len;
	__u32 id;
	__be32 id_be;

	/* Bytes after the IP packet (padding) would end up between payload and ID. */
	if (ip_end != skb->len || p->flags & (HOPTRACE_F_ENCAP_VXLAN | HOPTRACE_F_ENCAP_GENEVE))
		return HOPTRACE_C_UNTAGGED;
	/* A GSO packet's trailer would be copied to, or lost from, its segments. */
	if (skb->gso_segs > 1 || skb->gso_size)
		return HOPTRACE_C_GSO_SKIPPED;
	/* Never grow past the device MTU: the packet goes out untagged instead. */
	if (exceeds_mtu(skb, HOPTRACE_UDP_ID_LEN, floor))
		return HOPTRACE_C_TOO_BIG;

	id = next_id(hs, floor);
	if (!id)
		return HOPTRACE_C_UNTAGGED;
	if (bpf_skb_change_tail(skb, skb->len + HOPTRACE_UDP_ID_LEN, 0))
		return HOPTRACE_C_TAG_FAILED;
	id_be = bpf_htonl(id);
	if (bpf_skb_store_bytes(skb, ip_end, &id_be, sizeof(id_be), 0))
		return HOPTRACE_C_TAG_FAILED;
	if (udp_csum_exclude_id(skb, p, id_be, floor))
		return HOPTRACE_C_TAG_FAILED;

	if (p->family == 4) {
		struct ipv4_len_to_check *v4 = (struct ipv4_len_to_check *)p->ip_words;
		__be16 new_len = bpf_htons(p->ip_len + HOPTRACE_UDP_ID_LEN);

		__u32 off = p->l3_off + offsetof(struct iphdr, tot_len);
		__u8 *data = (__u8 *)(long)skb->data, *end = (__u8 *)(long)skb->data_end;

		/* the length and the header checksum in one write, not a store and a csum helper */
		v4->check = csum_replace16(v4->check, v4->tot_len, new_len);
		v4->tot_len = new_len;
		/* Written directly where the header is linear (the helpers moved the packet: its
		 * pointers read again): about 20 ns less a datagram than bpf_skb_store_bytes. */
		if (!floor && off < 256 && data + off + sizeof(*v4) <= end)
			__builtin_memcpy(data + off, v4, sizeof(*v4));
		else if (bpf_skb_store_bytes(skb, off, v4, sizeof(*v4), 0))
			return HOPTRACE_C_TAG_FAILED;
	} else {
		__be16 payload_len =
		    bpf_htons(p->ip_len - sizeof(struct ipv6hdr) + HOPTRACE_UDP_ID_LEN);

		if (bpf_skb_store_bytes(skb, p->l3_off + offsetof(struct ipv6hdr, payload_len),
					&payload_len, sizeof(payload_len), 0))
			return HOPTRACE_C_TAG_FAILED;
	}
	p->ip_len += HOPTRACE_UDP_ID_LEN;
	p->id = id;
	p->flags |= HOPTRACE_F_TAGGED_HERE;
	return HOPTRACE_C_TAGGED;
}

/* What the hop programs read for the action fields beyond the record's own
 * (enum hoptrace_field); filled only when an action asks for them. */
struct hop_meta {
	__u64 cgroup;
	__u32 mark;
	__u32 priority;
	__u32 netns;
	__u32 queue_mapping;
	__u32 gso_segs;
	__u32 gso_size;
	__u32 pid;
	__u32 drop_reason;
	__u64 drop_location; /* skb:kfree_skb's location: the drop_function field */
	__u32 task_pid;	     /* socket-read: the reader's tgid, recorded instead of the ifindex */
	__u32 rmem;
	__u32 backlog;
	__u64 comm;
	/* The capture action: not 0 when the packet as the hop reads it begins with its IP header
	 * (cgroup hops; kernel hops of an skb without a MAC header: its ethertype), 0 with an
	 * Ethernet header. Set only with the action, as it is: a link type chosen from it at the
	 * parse (a branch on the ethertype, carried through it) cost kernel hops +20 % verified
	 * instructions. */
	__u16 capture_l3;
};

/* Does any of this hop's actions read a packet or task field? Load-time constant. Tested once
 * before a hop's field reads: each act_reads below is 8 loads of the constants (the verifier
 * prunes the branches they decide, not the loads), 150 instructions per packet for a hop that
 * reads none (bench: BenchmarkActionCost's non_matching and timestamp rows). */
static __always_inline bool act_reads_any(const struct hoptrace_hook_settings *hs)
{
	return (HS(act_count) && HS(act_count_by)) || HS(act_hist) || HS(act_record)[0];
}

/* Does this hop's count, histogram or record read `field`? Load-time constant. */
static __always_inline bool act_reads(const struct hoptrace_hook_settings *hs,
				      enum hoptrace_field field)
{
	return (HS(act_count) && HS(act_count_by) == field) || HS(act_hist) == field ||
	       HS(act_record)[0] == field || HS(act_record)[1] == field ||
	       HS(act_record)[2] == field || HS(act_record)[3] == field;
}

/* floor(log2(v)) + 1, 0 for 0: unrolled, no loop (5.10 has no bpf_loop, and a
 * bounded loop costs verifier states). */
static __always_inline __u32 log2_bucket(__u64 v)
{
	__u32 b = 0;

	if (v >> 32) {
		v >>= 32;
		b += 32;
	}
	if (v >> 16) {
		v >>= 16;
		b += 16;
	}
	if (v >> 8) {
		v >>= 8;
		b += 8;
	}
	if (v >> 4) {
		v >>= 4;
		b += 4;
	}
	if (v >> 2) {
		v >>= 2;
		b += 2;
	}
	if (v >> 1) {
		v >>= 1;
		b += 1;
	}
	return b + (__u32)(v & 1);
}

/* p: NULL at the hops that read a packet parsed earlier (socket-read's queue, uprobe), where the
 * dispatcher offers no header field. */
static __always_inline __u64 field_value(__u8 field, const struct pkt_info *p, __u32 ifindex,
					 __u32 wire_len, const struct hop_meta *m, __u64 latency)
{
	switch (field) {
	case HOPTRACE_FIELD_CPU:
		return bpf_get_smp_processor_id();
	case HOPTRACE_FIELD_LEN:
		return wire_len;
	case HOPTRACE_FIELD_IFINDEX:
		return ifindex;
	case HOPTRACE_FIELD_MARK:
		return m->mark;
	case HOPTRACE_FIELD_PRIORITY:
		return m->priority;
	case HOPTRACE_FIELD_LATENCY:
		return latency;
	case HOPTRACE_FIELD_NETNS:
		return m->netns;
	case HOPTRACE_FIELD_CGROUP:
		return m->cgroup;
	case HOPTRACE_FIELD_QUEUE_MAPPING:
		return m->queue_mapping;
	case HOPTRACE_FIELD_GSO_SEGS:
		return m->gso_segs;
	case HOPTRACE_FIELD_GSO_SIZE:
		return m->gso_size;
	case HOPTRACE_FIELD_TOS:
		return p ? p->tos : 0;
	case HOPTRACE_FIELD_TTL:
		return p ? p->ttl : 0;
	case HOPTRACE_FIELD_IP_ID:
		return p ? p->ip_id : 0;
	case HOPTRACE_FIELD_TCP_FLAGS:
		return p ? p->tcp_flags : 0;
	case HOPTRACE_FIELD_TCP_WINDOW:
		return p ? p->tcp_window : 0;
	case HOPTRACE_FIELD_TCP_SEQ:
		return p ? p->tcp_seq : 0;
	case HOPTRACE_FIELD_TCP_ACK:
		return p ? p->tcp_ack : 0;
	case HOPTRACE_FIELD_PID:
		return m->pid;
	case HOPTRACE_FIELD_DROP_REASON:
		return m->drop_reason;
	case HOPTRACE_FIELD_DROP_FUNCTION:
		return m->drop_location;
	case HOPTRACE_FIELD_RMEM:
		return m->rmem;
	case HOPTRACE_FIELD_BACKLOG:
		return m->backlog;
	case HOPTRACE_FIELD_COMM:
		return m->comm;
	}
	return 0;
}

static __always_inline void count_by_key(__u64 key)
{
	__u64 one = 1, *v = bpf_map_lookup_elem(&count_keys, &key);

	if (v) {
		__sync_fetch_and_add(v, 1); /* result unused: a plain atomic add, 5.10 has it */
		return;
	}
	if (!bpf_map_update_elem(&count_keys, &key, &one, BPF_NOEXIST))
		return;
	/* Another CPU added the key first, or the map is full. */
	v = bpf_map_lookup_elem(&count_keys, &key);
	if (v)
		__sync_fetch_and_add(v, 1);
	else
		count(HOPTRACE_C_COUNT_KEYS_FULL, 1);
}

/* count by FIELD of a hop body: the hop's own, or at the hook the matched trace's (its slot in the
 * key). */
static __always_inline void hop_count_by_key(const struct hoptrace_hook_settings *hs, __u64 key)
{
#ifdef HOPTRACE_HOOK
	struct hoptrace_hook_count_key k = {.value = key, .slot = hs->slot};
	__u64 one = 1, *v = bpf_map_lookup_elem(&count_keys, &k);

	if (v) {
		__sync_fetch_and_add(v, 1);
		return;
	}
	if (!bpf_map_update_elem(&count_keys, &k, &one, BPF_NOEXIST))
		return;
	v = bpf_map_lookup_elem(&count_keys, &k);
	if (v)
		__sync_fetch_and_add(v, 1);
	else
		hop_count(hs, HOPTRACE_C_COUNT_KEYS_FULL, 1);
#else
	count_by_key(key);
#endif
}

static __always_inline void hist_add(__u64 value)
{
	__u32 key = log2_bucket(value);
	__u64 *v;

	barrier_var(key);
	if (key >= HOPTRACE_HIST_BUCKETS)
		return;
	v = bpf_map_lookup_elem(&hist_buckets, &key);
#ifdef HOPTRACE_TEST_REFUSED_HISTOGRAM
	/* Only in the loader's test of refused actions (never in a shipped object): without the
	 * null check the verifier refuses the histogram action, and only it. */
	*v += 1;
	return;
#endif
	if (v)
		*v += 1;
}

/* A hop body's histogram: the hop's own, or at the hook the matched trace's slot's buckets. */
static __always_inline void hop_hist_add(const struct hoptrace_hook_settings *hs, __u64 value)
{
#ifdef HOPTRACE_HOOK
	__u32 key = log2_bucket(value);
	__u64 *v;

	barrier_var(key);
	if (key >= HOPTRACE_HIST_BUCKETS)
		return;
	key += hs->slot * HOPTRACE_HIST_BUCKETS;
	v = bpf_map_lookup_elem(&hist_buckets, &key);
	if (v)
		*v += 1;
#else
	hist_add(value);
#endif
}

/* The record action's values of this packet, in the order of act_record (the dispatcher refuses
 * latency there: the joined records' timestamps already carry it per packet), written in place in
 * the record's sample: a copy on the stack cost 40 bytes of it, which the kernel hops lack. */
static __always_inline void record_values(const struct hoptrace_hook_settings *hs,
					  struct hoptrace_values *vals, const struct pkt_info *p,
					  __u32 ifindex, __u32 wire_len, const struct hop_meta *m)
{
	__u32 n = 0;

	__builtin_memset(vals, 0, sizeof(*vals));
#pragma unroll
	for (int i = 0; i < HOPTRACE_VALUES_MAX; i++) {
		if (!HS(act_record)[i])
			break;
		vals->field[i] = HS(act_record)[i];
		vals->value[i] = field_value(HS(act_record)[i], p, ifindex, wire_len, m, 0);
		n++;
	}
	vals->count = n;
}

/*
 * The latency field: time since the previous hop of the same packet on this
 * node, from prev_ts; then this hop's own timestamp for the next one.
 * Returns false when the packet has no earlier timestamp here (a miss).
 */
static __always_inline bool prev_hop_latency(const struct hoptrace_hook_settings *hs,
					     __u32 packet_id, __u64 ts, __u64 *latency)
{
	struct hoptrace_prev_ts_key key = {.packet_id = packet_id, .trace_slot = HS(trace_slot)};
	bool found = false;

	if (HS(act_hist) == HOPTRACE_FIELD_LATENCY) {
		__u64 *prev = bpf_map_lookup_elem(&prev_ts, &key);

		if (prev && *prev <= ts) {
			*latency = ts - *prev;
			found = true;
		} else {
			hop_count(hs, HOPTRACE_C_LATENCY_MISS, 1);
		}
	}
	if (HS(act_prev_ts))
		bpf_map_update_elem(&prev_ts, &key, &ts, BPF_ANY);
	return found;
}

/*
 * The capture action: the packet's first min(act_capture, what the reader r of its parse can give)
 * bytes into the sample; src (an skb, an XDP frame or kernel memory) is a constant of the caller's,
 * m->capture_l3 says what the first byte begins (HOPTRACE_CAPTURE_LINK_*). Only those bytes are the
 * packet's (the agent zeroes the rest, reader.go): zeroing 128 bytes of ring here would cost every
 * captured packet more than the copy. A copy that fails leaves captured 0.
 *
 * Where no helper reads the packet by offset (kernel hops, XDP frames before 5.18), the hop reads
 * HOPTRACE_CAPTURE_MAX bytes from its start whatever its length, so that the length stays
 * imprecise and the verifier prunes the paths that reach here with different ones (as a helper's
 * size argument it is precise: the floor variants of the kernel hops then passed 1M instructions,
 * XDP's doubled). Past the packet's last byte that reads the rest of its buffer: an skb's head is
 * followed by its skb_shared_info at skb->end, an XDP frame's tailroom holds one. Not from
 * pkt_scratch (pkt_copy_head's copy): testing that pointer here kept it live through the parse,
 * and states with and without it apart (+30 % verified instructions on the floor variants).
 */
static __always_inline void capture_packet(const struct hoptrace_hook_settings *hs,
					   struct hoptrace_capture *cap, enum pkt_source src,
					   const struct pkt_reader *r, const struct hop_meta *m,
					   __u32 wire_len)
{
	long err;
	__u32 n;

	/* no branch: (capture_l3 + 0xffff) >> 16 is 1 for an ethertype, 0 for 0 */
	__u32 l3 = m->capture_l3 + 0xffff;

	barrier_var(l3);
	l3 >>= 16;
	cap->link_type = HOPTRACE_CAPTURE_LINK_ETHERNET +
			 l3 * (HOPTRACE_CAPTURE_LINK_RAW - HOPTRACE_CAPTURE_LINK_ETHERNET);
	cap->wire_len = wire_len;
	cap->captured = 0;
	if (src == PKT_KERNEL) {
		/* the skb's linear bytes: a paged skb's payload is in its pages */
		if (bpf_probe_read_kernel(cap->bytes, HOPTRACE_CAPTURE_MAX, r->kbase))
			return;
		cap->captured = r->len < HS(act_capture) ? r->len : HS(act_capture);
		return;
	}
	if (src == PKT_XDP && r->floor) {
		/* Before 5.18 no helper reads a frame: it is one buffer, read as memory, as a
		 * kernel hop's (the frame's tailroom holds its skb_shared_info). */
		void *data = (void *)(long)((struct xdp_md *)r->ctx)->data;

		if (bpf_probe_read_kernel(cap->bytes, HOPTRACE_CAPTURE_MAX, data))
			return;
		cap->captured = wire_len < HS(act_capture) ? wire_len : HS(act_capture);
		return;
	}
	/* an skb or a frame, whole, through the helpers */
	n = wire_len < HS(act_capture) ? wire_len : HS(act_capture);
	barrier_var(n);
	if (!n || n > HOPTRACE_CAPTURE_MAX)
		return;
	barrier_var(n);
	/* no-op for n in [1, MAX]: bounds the helpers' size to it for the verifier */
	n = ((n - 1) & (HOPTRACE_CAPTURE_MAX - 1)) + 1;
	if (src == PKT_SKB)
		err = bpf_skb_load_bytes(r->ctx, 0, cap->bytes, n);
	else
		err = bpf_xdp_load_bytes(r->ctx, 0, cap->bytes, n);
	if (!err)
		cap->captured = n;
}

/* The record action's values slot that carries a segmented skb's count: the action's own gso_segs,
 * else the first free slot (load-time constants); -1: four other fields, the count is not carried.
 */
static __always_inline int segs_slot(const struct hoptrace_hook_settings *hs)
{
#pragma unroll
	for (int i = 0; i < HOPTRACE_VALUES_MAX; i++)
		if (!HS(act_record)[i] || HS(act_record)[i] == HOPTRACE_FIELD_GSO_SEGS)
			return i;
	return -1;
}

/* Emits the record's sample: the record, then, each when the hop has it, the record action's values
 * (act_record[0], HOPTRACE_F_VALUES: written in place from p, ifindex and m, see record_values;
 * a skb that stands for segs > 1 wire segments carries segs as a gso_segs value, in a values
 * trailer of its own at a hop without the action: the only records that grow),
 * the addresses addrs, the parsed packet, describes (HOPTRACE_F_ADDRESSES; NULL: none) and the
 * packet's first bytes (act_capture, HOPTRACE_F_CAPTURE), read from src by r (see capture_packet; r
 * NULL at hops without a packet to read: socket-read's queue, uprobe). */
static __always_inline void emit_record(const struct hoptrace_hook_settings *hs, __u32 packet_id,
					__u32 flow_hash, __u16 flags, __u32 record_ifindex,
					__u32 wire_len, __u64 ts, const struct pkt_info *p,
					__u32 ifindex, const struct hop_meta *m,
					const struct pkt_info *addrs, enum pkt_source src,
					const struct pkt_reader *r, __u32 segs)
{
	/* decided once and kept in a register (see emit_packet_record): the verifier then ties the
	 * reserve's size to the values written below */
	__u32 segmented = segs > 1;
	barrier_var(segmented);
#ifdef HOPTRACE_HOOK
	/* the hook's settings are read once and kept in registers for the same reason: read twice
	 * from the map, the two could differ for all the verifier knows. 64 bits wide: before 5.13
	 * the verifier forgets a narrower scalar spilled to the stack. */
	__u64 with_values_ = hs->act_record[0] != 0, with_capture_ = hs->act_capture && r;
	__u64 any_values_ = with_values_ | segmented;

	barrier_var(any_values_);
	barrier_var(with_capture_);
#define EMIT_ANY_VALUES	    any_values_
#define EMIT_RESERVE_VALUES any_values_ /* the very register the writes below test */
#define EMIT_WITH_VALUES    with_values_
#define EMIT_WITH_CAPTURE   with_capture_
#else
#define EMIT_ANY_VALUES	    1
#define EMIT_RESERVE_VALUES (act_record[0] || segmented)
#define EMIT_WITH_VALUES    act_record[0]
#define EMIT_WITH_CAPTURE   (act_capture && r)
#endif
	struct hoptrace_record *rec = reserve_sample(EMIT_RESERVE_VALUES, addrs, EMIT_WITH_CAPTURE);
	void *next;
	int slot = segs_slot(hs);

	if (!rec) {
		hop_count(hs, HOPTRACE_C_RINGBUF_FULL, 1);
		return;
	}
	rec->ts_ns = ts;
	rec->packet_id = packet_id;
	rec->flow_hash = flow_hash;
	rec->ifindex = record_ifindex;
	rec->wire_len = wire_len;
	rec->hop_index = HS(hop_index);
	rec->trace_slot = HS(trace_slot);
	rec->cpu = bpf_get_smp_processor_id();
	rec->flags = flags;
	next = rec + 1;
	if (EMIT_ANY_VALUES && EMIT_WITH_VALUES) {
		struct hoptrace_values *vals = next;

		rec->flags |= HOPTRACE_F_VALUES;
		record_values(hs, vals, p, ifindex, wire_len, m);
		if (segmented && slot >= 0 && slot < HOPTRACE_VALUES_MAX) {
			vals->field[slot] = HOPTRACE_FIELD_GSO_SEGS;
			vals->value[slot] = segs;
			if (!HS(act_record)[slot])
				vals->count = slot + 1;
		}
		next += sizeof(struct hoptrace_values);
	} else if (EMIT_ANY_VALUES && segmented) {
		struct hoptrace_values *vals = next;

		rec->flags |= HOPTRACE_F_VALUES;
		__builtin_memset(vals, 0, sizeof(*vals));
		vals->field[0] = HOPTRACE_FIELD_GSO_SEGS;
		vals->count = 1;
		vals->value[0] = segs;
		next += sizeof(struct hoptrace_values);
	}
	if (addrs) {
		struct hoptrace_addresses *a = next;

		rec->flags |= HOPTRACE_F_ADDRESSES;
		/* struct pkt_info begins with the same saddr..family */
		__builtin_memcpy(a, addrs, offsetof(struct hoptrace_addresses, pad));
		a->pad[0] = 0;
		a->pad[1] = 0;
		next += sizeof(*a);
	}
	if (EMIT_WITH_CAPTURE) {
		rec->flags |= HOPTRACE_F_CAPTURE;
		capture_packet(hs, next, src, r, m, wire_len);
	}
	submit_record(hs, rec);
}
#undef EMIT_ANY_VALUES
#undef EMIT_RESERVE_VALUES
#undef EMIT_WITH_VALUES
#undef EMIT_WITH_CAPTURE

/* The wire segments a tagged TCP skb stands for (0 for any other packet), from its shared info's
 * gso_segs and gso_size. A GSO skb a guest or a tun/tap writer handed in (SKB_GSO_DODGY) has 0
 * segments there until the stack counts them on egress (qdisc_pkt_len_init): counted here as the
 * kernel counts them, DIV_ROUND_UP(TCP payload, gso_size). */
static __always_inline __u32 tcp_segments(__u32 gso_segs, __u32 gso_size, const struct pkt_info *p)
{
	__u32 headers = p->l4_off - p->l3_off + p->tcp_doff * 4;

	if (gso_segs)
		return gso_segs;
	if (!gso_size || !p->tcp_doff || p->ip_len <= headers)
		return 0;
	return (p->ip_len - headers + gso_size - 1) / gso_size;
}

/* tc and cgroup hops: the count from the context's gso_segs and gso_size. */
static __always_inline __u32 skb_segments_inline(struct __sk_buff *skb, const struct pkt_info *p)
{
	if (!p->id || p->proto != IPPROTO_TCP_)
		return 0;

	__u32 gso_segs = skb->gso_segs, gso_size = skb->gso_size;

	barrier_var(gso_segs);
	barrier_var(gso_size);
	return tcp_segments(gso_segs, gso_size, p);
}

/* cgroup hops' full variants call it (pkt_reader's call_segments): inlined, its registers made
 * their frames too big for 6.1's verifier beside bpf_loop's callback. The floor variants have no
 * callback, and no calls (TestFloorVariantsHaveNoCalls). */
static __noinline __u32 skb_segments(struct __sk_buff *skb, const struct pkt_info *p)
{
	return skb_segments_inline(skb, p);
}

/* Kernel hops (full variants): the count from the struct sk_buff's shared info, at head + end (an
 * offset on 64-bit); computed, so not BTF-typed: probed reads. Called, as skb_segments is; the
 * floor variants, whose frames have no room for it inlined, mark the record HOPTRACE_F_UNCOUNTED.
 * A hook reads the count once a packet, for its bodies (pkt_reader's segs).
 */
#ifndef HOPTRACE_HOOK
static __noinline __u32 kernel_segments(struct sk_buff *skb, const struct pkt_info *p)
{
	if (!p->id || p->proto != IPPROTO_TCP_)
		return 0;

	struct skb_shared_info *shinfo =
	    (void *)(BPF_CORE_READ(skb, head) + BPF_CORE_READ(skb, end));

	return tcp_segments(BPF_CORE_READ(shinfo, gso_segs), BPF_CORE_READ(shinfo, gso_size), p);
}
#endif

/* A parsed packet's record, with the addresses this hop saw when its ID says so. The decision is
 * taken once, and kept in a register clang may not recompute from the ID: the verifier then knows
 * it on each path, from the reserve's size to the copy (had clang tested the ID again, it could not
 * tie the two), and walks one copy of the record's code. */
static __always_inline void emit_packet_record(const struct hoptrace_hook_settings *hs,
					       const struct pkt_info *p, __u32 record_ifindex,
					       __u32 wire_len, __u64 ts, __u32 ifindex,
					       const struct hop_meta *m, enum pkt_source src,
					       const struct pkt_reader *r)
{
	__u32 describes = describes_addresses(p->id);
	__u16 flags = p->flags;
	__u32 segs = 0;

	barrier_var(describes);
	if (p->proto == IPPROTO_TCP_) { /* only TCP skbs carry their ID through GSO and GRO */
		if (src == PKT_SKB)
			segs = r->call_segments ? skb_segments(r->ctx, p)
						: skb_segments_inline(r->ctx, p);
		else if (src == PKT_KERNEL && r && !r->floor)
#ifdef HOPTRACE_HOOK
			segs = r->segs;
#else
			segs = kernel_segments(r->ctx, p);
#endif
		else if (src == PKT_KERNEL)
			flags |=
			    HOPTRACE_F_UNCOUNTED; /* socket-read, floor: taken whole where seen */
	}
	emit_record(hs, p->id, flow_hash(p), flags, record_ifindex, wire_len, ts, p, ifindex, m,
		    describes ? p : NULL, src, r, segs);
}

/* The part every hop shares once it has parsed the packet; true when it
 * emitted the packet's record. src and r: where a capture action reads the packet (r NULL:
 * nowhere, see emit_record). */
static __always_inline bool hop_finish(const struct hoptrace_hook_settings *hs, int status,
				       struct pkt_info *p, __u32 ifindex, __u32 wire_len,
				       const struct hop_meta *m, enum pkt_source src,
				       const struct pkt_reader *r)
{
	__u64 ts, latency = 0;
	__u32 record_ifindex;
	bool has_latency = false;

	if (status == HOP_NOT_MATCHED) {
		hop_count(hs, HOPTRACE_C_NOT_MATCHED, 1);
		return false;
	}
	if (status) {
		count_parse_error(status); /* never at the hook: it counts them once */
		return false;
	}
	hop_count(hs, HOPTRACE_C_MATCHED, 1);
	hop_count(hs, HOPTRACE_C_BYTES, wire_len);
	/* count and histogram (other than latency) see every matched packet, sampled or not */
	if (HS(act_count))
		hop_count_by_key(hs, HS(act_count_by)
					 ? field_value(HS(act_count_by), p, ifindex, wire_len, m, 0)
					 : 0);
	if (HS(act_hist) && HS(act_hist) != HOPTRACE_FIELD_LATENCY)
		hop_hist_add(hs, field_value(HS(act_hist), p, ifindex, wire_len, m, 0));
	if (!p->id) {
		hop_count(hs, HOPTRACE_C_UNTAGGED, 1);
		return false;
	}
	ts = bpf_ktime_get_ns();
	if (HS(act_prev_ts) || HS(act_hist) == HOPTRACE_FIELD_LATENCY)
		has_latency = prev_hop_latency(hs, p->id, ts, &latency);
	if (HS(act_hist) == HOPTRACE_FIELD_LATENCY && has_latency)
		hop_hist_add(hs, latency);
	/* socket-read: the reader's pid stands in the record's ifindex (HOPTRACE_F_TASK) */
	record_ifindex = m->task_pid ? m->task_pid : ifindex;
	emit_packet_record(hs, p, record_ifindex, wire_len, ts, ifindex, m, src, r);
	return true;
}

/* Where a task is current (socket-read, uprobe): its fields, read only when asked for. */
static __always_inline void task_meta(struct hop_meta *m)
{
	m->task_pid = bpf_get_current_pid_tgid() >> 32;
	m->pid = m->task_pid;
	if (act_reads(HOP_CONST, HOPTRACE_FIELD_COMM)) {
		/* Zeroed: 6.1's helper copies the name up to its NUL and leaves the rest as it was
		 * (strscpy, no padding), so a short name would carry stack bytes. */
		char comm[16] = {};

		if (!bpf_get_current_comm(comm, sizeof(comm)))
			__builtin_memcpy(&m->comm, comm, sizeof(m->comm));
	}
}

/* socket-read: the receiving socket's fields, read only when asked for. */
static __always_inline void sock_meta(struct sock *sk, struct hop_meta *m)
{
	if (act_reads(HOP_CONST, HOPTRACE_FIELD_RMEM))
		m->rmem = BPF_CORE_READ(sk, sk_backlog.rmem_alloc.counter);
	if (act_reads(HOP_CONST, HOPTRACE_FIELD_BACKLOG))
		m->backlog = BPF_CORE_READ(sk, sk_backlog.len);
}

/*
 * The part of hop_finish for the hops that find a packet parsed earlier by
 * its IDs (socket-read's queue, uprobe): the task's and socket's fields, the
 * cpu, len and latency; the record names the task (HOPTRACE_F_TASK).
 */
static __always_inline void hop_finish_read(__u32 packet_id, __u32 flow_hash, __u32 wire_len,
					    __u16 flags, const struct hop_meta *m)
{
	__u64 ts, latency = 0;

	count(HOPTRACE_C_MATCHED, 1);
	count(HOPTRACE_C_BYTES, wire_len);
	if (act_count)
		hop_count_by_key(HOP_CONST, act_count_by
						? field_value(act_count_by, NULL, 0, wire_len, m, 0)
						: 0);
	if (act_hist && act_hist != HOPTRACE_FIELD_LATENCY)
		hist_add(field_value(act_hist, NULL, 0, wire_len, m, 0));
	if (!packet_id) {
		count(HOPTRACE_C_UNTAGGED, 1);
		return;
	}
	ts = bpf_ktime_get_ns();
	if ((act_prev_ts || act_hist == HOPTRACE_FIELD_LATENCY) &&
	    prev_hop_latency(HOP_CONST, packet_id, ts, &latency) &&
	    act_hist == HOPTRACE_FIELD_LATENCY)
		hist_add(latency);
	flags |= HOPTRACE_F_TASK;
	emit_record(HOP_CONST, packet_id, flow_hash, flags, m->task_pid, wire_len, ts, NULL, 0, m,
		    NULL, PKT_KERNEL, NULL, 0);
}

/* The netns inode of a tc or cgroup_skb packet's device: tc's ctx is the kernel's sk_buff (see
 * skb_ip_summed for the two ways of reading it). */
static __always_inline __u32 skb_netns_ino(struct __sk_buff *skb, bool floor)
{
	struct sk_buff *kskb = (struct sk_buff *)skb;

	if (!floor && bpf_cast_to_kern_ctx)
		kskb = bpf_cast_to_kern_ctx(skb);
	return BPF_CORE_READ(kskb, dev, nd_net.net, ns.inum);
}

/* tc and cgroup_skb: the action fields in __sk_buff, read only when asked for. task_current: the
 * program runs in the sending task (cgroup_skb; the dispatcher allows pid at cgroup-egress only).
 */
static __always_inline void skb_meta(const struct hoptrace_hook_settings *hs, struct __sk_buff *skb,
				     struct hop_meta *m, bool task_current, bool floor)
{
	if (!act_reads_any(hs))
		return;
	if (act_reads(hs, HOPTRACE_FIELD_MARK)) {
		m->mark = skb->mark;
		barrier_var(m->mark);
	}
	if (act_reads(hs, HOPTRACE_FIELD_PRIORITY)) {
		m->priority = skb->priority;
		barrier_var(m->priority);
	}
	if (act_reads(hs, HOPTRACE_FIELD_QUEUE_MAPPING)) {
		m->queue_mapping = skb->queue_mapping;
		barrier_var(m->queue_mapping);
	}
	if (act_reads(hs, HOPTRACE_FIELD_GSO_SEGS)) {
		m->gso_segs = skb->gso_segs;
		barrier_var(m->gso_segs);
	}
	if (act_reads(hs, HOPTRACE_FIELD_GSO_SIZE)) {
		m->gso_size = skb->gso_size;
		barrier_var(m->gso_size);
	}
	if (act_reads(hs, HOPTRACE_FIELD_NETNS))
		m->netns = skb_netns_ino(skb, floor);
	if (act_reads(hs, HOPTRACE_FIELD_CGROUP))
		m->cgroup =
		    bpf_skb_cgroup_id(skb); /* the socket's cgroup; 0 without a full socket */
	if (task_current && act_reads(hs, HOPTRACE_FIELD_PID))
		m->pid = bpf_get_current_pid_tgid() >> 32;
}

/* tc (tcx) ingress or egress: the frame starts with its Ethernet header. */
static __always_inline int hop_skb_l2(struct __sk_buff *skb, bool floor)
{
	/* Read ctx fields once, up front: clang must not fold them into one
	 * offset pointer, which the verifier refuses for ctx. */
	__u32 ifindex = skb->ifindex, len = skb->len;
	__u32 resume = 0; /* fast_resume's, or 0: the general parser */
	int status;

	barrier_var(ifindex);
	barrier_var(len);
	if (hop_has_filter()) {
		struct fast_flow f = {}; /* 6.1 refuses reads of a stack slot no path wrote */
		bool fast = fast_flow_l2((const __u8 *)(long)skb->data,
					 (const __u8 *)(long)skb->data_end, len, &f);

		enum fast_verdict verdict = hop_fast_verdict(fast, &f);

		if (verdict == FAST_REFUSED ||
		    (verdict == FAST_TAKEN && hop_fast_untagged(&f, len)))
			return TCX_NEXT_;
		resume = verdict == FAST_TAKEN ? fast_resume(&f) : 0;
	}
	/* Zeroed after the fast path: a packet it refuses pays no stack stores for them. */
	struct pkt_reader r = {.ctx = skb, .len = len, .total = len, .floor = floor};
	struct pkt_info p = {};
	struct hop_meta m = {};

	skb_meta(HOP_CONST, skb, &m, false, floor);
	/* The floor (5.10's verifier) keeps direct reads to whole-linear packets. */
	pkt_set_direct(&r, (const __u8 *)(long)skb->data, (const __u8 *)(long)skb->data_end,
		       !floor);
	count(HOPTRACE_C_SEEN, 1);
	status = resume ? hop_parse_fast(PKT_SKB, &r, resume, &p) : hop_parse(PKT_SKB, &r, 0, &p);
	if (!status && !p.id && !p.fragment && hop_tag_udp && p.proto == IPPROTO_UDP_) {
		int outcome = tag_udp_packet(HOP_CONST, skb, &p, floor);

		if (outcome == HOPTRACE_C_TAGGED) {
			count(HOPTRACE_C_TAGGED, 1);
			len += HOPTRACE_UDP_ID_LEN;
		} else if (outcome != HOPTRACE_C_UNTAGGED) {
			count(outcome,
			      1); /* too big, GSO, or failed: also counted untagged below */
		}
	}
	hop_finish(HOP_CONST, status, &p, ifindex, len, &m, PKT_SKB, &r);
	return TCX_NEXT_;
}

/* cgroup_skb: the packet starts at its IP header. */
static __always_inline int hop_skb_l3(struct __sk_buff *skb, bool floor)
{
	__u32 ifindex = skb->ifindex, len = skb->len;
	__u16 ethertype = bpf_ntohs(skb->protocol);
	__u32 resume = 0; /* fast_resume's, or 0: the general parser */
	int status;

	barrier_var(ifindex);
	barrier_var(len);
	if (hop_has_filter()) {
		struct fast_flow f = {}; /* 6.1 refuses reads of a stack slot no path wrote */
		bool fast =
		    fast_flow_l3((const __u8 *)(long)skb->data, (const __u8 *)(long)skb->data_end,
				 len, 0, bpf_htons(ethertype ? ethertype : ETH_P_IP_), &f);

		enum fast_verdict verdict = hop_fast_verdict(fast, &f);

		if (verdict == FAST_REFUSED ||
		    (verdict == FAST_TAKEN && hop_fast_untagged(&f, len)))
			return SK_PASS_;
		resume = verdict == FAST_TAKEN ? fast_resume(&f) : 0;
	}
	/* Zeroed after the fast path: a packet it refuses pays no stack stores for them. */
	struct pkt_reader r = {
	    .ctx = skb, .len = len, .total = len, .floor = floor, .call_segments = !floor};
	struct pkt_info p = {};
	struct hop_meta m = {};

	skb_meta(HOP_CONST, skb, &m, true, floor);
	pkt_set_direct(&r, (const __u8 *)(long)skb->data, (const __u8 *)(long)skb->data_end,
		       !floor);
	if (act_capture)
		m.capture_l3 = ETH_P_IP_; /* the packet starts at its IP header */
	count(HOPTRACE_C_SEEN, 1);
	status = resume ? hop_parse_fast(PKT_SKB, &r, resume, &p)
			: hop_parse(PKT_SKB, &r, ethertype ? ethertype : ETH_P_IP_, &p);
	hop_finish(HOP_CONST, status, &p, ifindex, len, &m, PKT_SKB, &r);
	return SK_PASS_;
}

/* An XDP frame's length with its fragments; the floor (before 5.18) has no helper for them. */
static __always_inline __u32 xdp_frame_len(struct xdp_md *ctx, const __u8 *data,
					   const __u8 *data_end, bool floor)
{
	return floor ? data_end - data : bpf_xdp_get_buff_len(ctx);
}

static __always_inline int hop_xdp_frame(struct xdp_md *ctx, bool floor)
{
	const __u8 *data = (const __u8 *)(long)ctx->data;
	const __u8 *data_end = (const __u8 *)(long)ctx->data_end;
	__u32 ifindex = ctx->ingress_ifindex;
	__u32 resume = 0; /* fast_resume's, or 0: the general parser */
	__u32 len;

	barrier_var(ifindex);
	if (hop_has_filter()) {
		struct fast_flow f = {}; /* 6.1 refuses reads of a stack slot no path wrote */
		/* the linear part's length: a frame with fragments takes the general path */
		bool fast = fast_flow_l2(data, data_end, data_end - data, &f);

		enum fast_verdict verdict = hop_fast_verdict(fast, &f);

		/* the length only for an untagged segment: the helper call is not free */
		if (verdict == FAST_REFUSED ||
		    (verdict == FAST_TAKEN && f.tcp_untagged &&
		     hop_fast_untagged(&f, xdp_frame_len(ctx, data, data_end, floor))))
			return XDP_PASS;
		resume = verdict == FAST_TAKEN ? fast_resume(&f) : 0;
	}
	len = xdp_frame_len(ctx, data, data_end, floor);
	/* Zeroed after the fast path: a packet it refuses pays no stack stores for them. */
	struct pkt_reader r = {.ctx = ctx, .len = len, .total = len, .floor = floor};
	struct pkt_info p = {};
	/* XDP has no sk_buff: none of its fields (the dispatcher refuses them) */
	struct hop_meta m = {};

	pkt_set_direct(&r, data, data_end, false);
	count(HOPTRACE_C_SEEN, 1);
	hop_finish(HOP_CONST,
		   resume ? hop_parse_fast(PKT_XDP, &r, resume, &p) : hop_parse(PKT_XDP, &r, 0, &p),
		   &p, ifindex, len, &m, PKT_XDP, &r);
	return XDP_PASS;
}

/* PKT_KERNEL: one bpf_probe_read_kernel() for the first bytes instead of one
 * per header. Without the buffer, pkt_load() reads each header itself. */
static __always_inline void pkt_copy_head(struct pkt_reader *r)
{
	__u32 key = 0, n = r->len < PKT_COPY_MAX ? r->len : PKT_COPY_MAX;
	struct pkt_copy *buf = bpf_map_lookup_elem(&pkt_scratch, &key);

	barrier_var(n);
	if (!buf || !n || n > PKT_COPY_MAX)
		return;
	barrier_var(n);
	n &= PKT_COPY_BUF - 1; /* no-op: bounds the size for the verifier */
	if (bpf_probe_read_kernel(buf->bytes, n, r->kbase))
		return;
	r->copy = buf->bytes;
	r->copy_len = n;
}

/*
 * Tracepoints, fentry and kprobes see a struct sk_buff in kernel memory.
 * The device and namespace checks come first: they are what make a
 * system-wide event cheap for the packets of other hops and other agents.
 */
static __always_inline int hop_kernel_skb(struct sk_buff *skb, struct net_device *dev,
					  __u32 drop_reason, void *drop_location, bool btf,
					  bool floor)
{
	struct pkt_reader r = {.ctx = skb, .floor = floor};
	struct pkt_info p = {};
	struct hop_meta m = {};
	__u16 ethertype;
	__u32 ifindex;

	count(HOPTRACE_C_SEEN, 1);
	if (!dev) {
		count(HOPTRACE_C_NOT_MATCHED, 1);
		return 0;
	}
	ifindex = KERNEL_FIELD(btf, dev, ifindex);
	if (hop_netns_ino || act_reads(HOP_CONST, HOPTRACE_FIELD_NETNS))
		m.netns = dev_netns_ino(dev, btf);
	if ((hop_ifindex && ifindex != hop_ifindex) ||
	    (hop_netns_ino && m.netns != hop_netns_ino)) {
		count(HOPTRACE_C_NOT_MATCHED, 1);
		return 0;
	}

	if (pkt_reader_from_skb(skb, &r, &ethertype, btf)) {
		count(HOPTRACE_C_PARSE_TRUNCATED, 1);
		return 0;
	}
	/* skb:kfree_skb with its reason: UDP trims a datagram's ID off (pskb_trim_rcsum) before it
	 * drops it for want of a socket; on a linear skb only the tail moved, so the ID is read
	 * below skb->end, as hop_sock_read does. */
	if (act_reads(HOP_CONST, HOPTRACE_FIELD_DROP_REASON) && !KERNEL_FIELD(btf, skb, data_len)) {
		__u32 end = KERNEL_FIELD(btf, skb, end), start = r.kbase - BPF_CORE_READ(skb, head);

		if (end > start && end - start > r.len)
			r.len = r.total = end - start;
	}
	pkt_copy_head(&r);
	if (act_reads_any(HOP_CONST)) {
		if (act_reads(HOP_CONST, HOPTRACE_FIELD_MARK))
			m.mark = KERNEL_FIELD(btf, skb, mark);
		if (act_reads(HOP_CONST, HOPTRACE_FIELD_PRIORITY))
			m.priority = KERNEL_FIELD(btf, skb, priority);
		if (act_reads(HOP_CONST, HOPTRACE_FIELD_QUEUE_MAPPING))
			m.queue_mapping = KERNEL_FIELD(btf, skb, queue_mapping);
		if (act_reads(HOP_CONST, HOPTRACE_FIELD_GSO_SEGS) ||
		    act_reads(HOP_CONST, HOPTRACE_FIELD_GSO_SIZE)) {
			/* skb_shinfo(): the shared info sits at head + end (an offset on 64-bit);
			 * computed, so not BTF-typed: probed reads */
			struct skb_shared_info *shinfo =
			    (void *)(KERNEL_FIELD(btf, skb, head) + KERNEL_FIELD(btf, skb, end));

			m.gso_segs = BPF_CORE_READ(shinfo, gso_segs);
			m.gso_size = BPF_CORE_READ(shinfo, gso_size);
		}
	}
	m.drop_reason = drop_reason;
	m.drop_location = (__u64)(long)drop_location;
	/* the reader starts at the MAC header when the skb has one (ethertype 0), else at IP */
	if (act_capture)
		m.capture_l3 = ethertype;
	/* wire_len from the parse start: L2 included when the skb has it, as at tc */
	hop_finish(HOP_CONST, hop_parse(PKT_KERNEL, &r, ethertype, &p), &p, ifindex, r.total, &m,
		   PKT_KERNEL, &r);
	return 0;
}

/*
 * kretprobe hops: a kretprobe sees only the function's return value, so its
 * entry kprobe (hop_kretprobe_entry, loaded in the same collection) stashes
 * the skb argument by thread, and the return emits the packet's record from
 * it. ONE map per hop, LRU so a return that never comes (a nested call of
 * the same thread) cannot fill it.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);   /* kret_key() */
	__type(value, __u64); /* the struct sk_buff pointer */
} kret_skbs SEC(".maps");

/* The calling thread; idle CPUs' softirqs all run as pid 0, so those are keyed by CPU (a softirq
 * is not preempted: its entry and return run on one CPU). */
static __always_inline __u64 kret_key(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	return tid ? tid : (1ULL << 32) | bpf_get_smp_processor_id();
}

/* The entry kprobe: the hop's device and namespace checks first, so only its packets are kept. */
static __always_inline int hop_kret_entry(struct sk_buff *skb)
{
	struct net_device *dev = BPF_CORE_READ(skb, dev);
	__u64 key = kret_key(), skb_ptr = (__u64)(long)skb;

	if (!dev || (hop_ifindex && BPF_CORE_READ(dev, ifindex) != hop_ifindex) ||
	    (hop_netns_ino && BPF_CORE_READ(dev, nd_net.net, ns.inum) != hop_netns_ino))
		return 0;
	bpf_map_update_elem(&kret_skbs, &key, &skb_ptr, BPF_ANY);
	return 0;
}

/* The kretprobe: the skb its entry kept (the function must not free it: the hop's function takes
 * an skb it hands back to its caller, spec/README.md). */
static __always_inline int hop_kret_return(bool floor)
{
	__u64 key = kret_key(), *skb_ptr = bpf_map_lookup_elem(&kret_skbs, &key);
	struct sk_buff *skb;

	if (!skb_ptr) {
		count(HOPTRACE_C_SEEN, 1);
		count(HOPTRACE_C_NOT_MATCHED, 1);
		return 0;
	}
	skb = (struct sk_buff *)(long)*skb_ptr;
	bpf_map_delete_elem(&kret_skbs, &key);
	return hop_kernel_skb(skb, BPF_CORE_READ(skb, dev), 0, NULL, false, floor);
}

/* uprobe hops: the packet each thread read last at a socket-read hop, by
 * thread ID. ONE per agent (MapReplacements), LRU so it stays bounded. */
struct sock_read_last {
	__u32 packet_id;
	__u32 flow_hash;
	__u32 wire_len;
	__u16 trace_slot;
	__u16 flags;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); /* the reader's thread ID (the kernel's pid) */
	__type(value, struct sock_read_last);
} sock_read_last SEC(".maps");

static __always_inline void remember_read(__u32 packet_id, __u32 flow_hash, __u32 wire_len,
					  __u16 flags)
{
	struct sock_read_last last = {.packet_id = packet_id,
				      .flow_hash = flow_hash,
				      .wire_len = wire_len,
				      .trace_slot = trace_slot,
				      .flags = flags};
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	bpf_map_update_elem(&sock_read_last, &tid, &last, BPF_ANY);
}

/*
 * socket-read: the reading task copies the packet to user space, inside its
 * recvmsg(), so `current` is the reader. UDP before 6.6 (the agent picks):
 * skb:consume_skb, which skb_consume_udp() fires (via __consume_stateless_skb,
 * 4.13+) right after udp_recvmsg() copied the datagram;
 * skb:skb_copy_datagram_iovec does not fire there for linear skbs
 * (copy_linear_skb). TCP: skb:skb_copy_datagram_iovec, fired by tcp_recvmsg()
 * before each copy from an skb. Both exist from 5.10.
 *
 * The hop is scoped by the receiving socket's network namespace (TCP's
 * skb->sk; UDP's queued skbs have none, so the reading task's), not by a
 * device: in the socket queue skb->dev is reused (UDP's dev_scratch), so the
 * arrival device comes from skb->skb_iif.
 *
 * The ID: TCP's option sits in the header that the queue retains in the
 * skb's linear buffer. UDP's surplus ID bytes were trimmed off the skb by
 * __udp4_lib_rcv / udpv6_rcv (pskb_trim_rcsum), which on a linear skb only
 * moves the tail: the bytes stay in the buffer, which the queued skb still
 * owns, and the IP header still counts them. So for a linear skb the reader
 * may read up to skb->end; a paged skb's ID may have gone with its page and
 * is not read (counted untagged).
 */
static __always_inline int hop_sock_read(struct sk_buff *skb, bool widen_to_end, bool floor)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct sock *sk;
	/* socket-read: no header fields (actions.py), decapsulated packets (parse.bpf.h) */
	struct pkt_reader r = {.floor = floor, .no_fields = 1, .no_tunnel = 1};
	struct pkt_info p = {};
	struct hop_meta m = {};
	__u16 ethertype;
	__u32 ifindex;
	int status;

	count(HOPTRACE_C_SEEN, 1);
	/* The receiving socket's netns; UDP's queued skbs have no skb->sk (udp_recvmsg's caller is
	 * in the socket's netns as a rule), so the reader's there. */
	sk = skb->sk; /* tp_btf: BTF-typed (KERNEL_FIELD) */
	if ((sk ? sk->__sk_common.skc_net.net->ns.inum
		: BPF_CORE_READ(task, nsproxy, net_ns, ns.inum)) != hop_netns_ino) {
		count(HOPTRACE_C_NOT_MATCHED, 1);
		return 0;
	}
	if (pkt_reader_from_skb(skb, &r, &ethertype, true)) {
		count(HOPTRACE_C_PARSE_TRUNCATED, 1);
		return 0;
	}
	if (widen_to_end && !skb->data_len) {
		__u32 end = skb->end;
		__u32 start = r.kbase - skb->head;

		if (end > start && end - start > r.len) {
			r.len = end - start;
			if (r.total < r.len)
				r.total = r.len;
		}
	}
	pkt_copy_head(&r);
	ifindex = skb->skb_iif;
	status = hop_parse(PKT_KERNEL, &r, ethertype, &p);
	task_meta(&m);
	if (sk) /* UDP's queued skb has none: the agent refuses rmem and backlog there */
		sock_meta(sk, &m);
	if (m.task_pid)
		p.flags |= HOPTRACE_F_TASK;
	/* wire_len as the device hops saw the packet: L2 and IP length, ID included */
	if (hop_finish(HOP_CONST, status, &p, ifindex, p.l3_off + p.ip_len, &m, PKT_KERNEL, NULL))
		remember_read(p.id, flow_hash(&p), p.l3_off + p.ip_len, p.flags);
	return 0;
}

/*
 * socket-read for UDP where the receive path frees the datagram later, on
 * another CPU (skb_attempt_defer_free in skb_consume_udp, 6.18), so no event
 * sees the skb at the read: the IDs of a socket's datagrams are queued when
 * they are queued (sock:sk_data_ready, the skb at the tail of
 * sk_receive_queue) and taken in the same order when the application reads
 * one (sock:sock_recv_length, in the reader's recvmsg). Every datagram of a
 * socket with a queue takes a slot (ID 0 when not traced) so that reads and
 * slots stay in step. Limits: MSG_PEEK reads take no slot; datagrams that
 * were queued before the socket's first traced one are skipped by count;
 * a datagram that finds SOCK_READ_SLOTS unread ones drops their IDs and
 * skips their reads the same way (counted sock_read_lost), so a read never
 * takes another datagram's ID.
 */
#define SOCK_READ_SLOTS 64 /* power of two */
#define MSG_PEEK_	2
#define IPPROTO_UDP_SK_ 17

struct sock_read_slot {
	__u32 packet_id; /* 0: a datagram that is not traced */
	__u32 flow_hash;
	__u32 wire_len;
	__u32 ifindex;
	__u16 flags;
	__u16 pad;
};

struct sock_read_queue {
	struct bpf_spin_lock lock;
	__u32 head; /* next slot a read takes */
	__u32 tail; /* next slot a datagram fills */
	__u32 skip; /* reads of datagrams queued before this queue existed */
	struct sock_read_slot slots[SOCK_READ_SLOTS];
};

/* Per socket, freed with it; bpf_sk_storage_get from tp_btf is 5.11+, these
 * events 6.2 (sock_recv_length) and 6.6 (sk_data_ready). */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_read_queue);
} sock_read_queues SEC(".maps");

static __always_inline bool sock_read_scope(struct sock *sk)
{
	return BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum) == hop_netns_ino &&
	       BPF_CORE_READ_BITFIELD_PROBED(sk, sk_protocol) == IPPROTO_UDP_SK_;
}

static __always_inline int hop_sock_read_enqueue(struct sock *sk, bool floor)
{
	struct sock_read_slot slot = {};
	struct sock_read_queue *q;
	struct pkt_reader r = {.floor = floor, .no_fields = 1, .no_tunnel = 1};
	struct pkt_info p = {};
	struct sk_buff *skb;
	__u32 end, start, queued, lost = 0;
	bool created = false;
	__u16 ethertype;

	if (!sock_read_scope(sk))
		return 0;
	/* The datagram just queued (__udp_enqueue_schedule_skb calls sk_data_ready after
	 * __skb_queue_tail); an empty queue points at itself. */
	skb = BPF_CORE_READ(sk, sk_receive_queue.prev);
	if (!skb || (void *)skb == (void *)&sk->sk_receive_queue)
		return 0;
	if (!pkt_reader_from_skb(skb, &r, &ethertype, false)) {
		if (!BPF_CORE_READ(skb, data_len)) { /* the trimmed ID: see hop_sock_read */
			end = BPF_CORE_READ(skb, end);
			start = r.kbase - BPF_CORE_READ(skb, head);
			if (end > start && end - start > r.len) {
				r.len = end - start;
				if (r.total < r.len)
					r.total = r.len;
			}
		}
		pkt_copy_head(&r);
		if (!hop_parse(PKT_KERNEL, &r, ethertype, &p)) {
			slot.packet_id = p.id;
			slot.flow_hash = flow_hash(&p);
			slot.wire_len = p.l3_off + p.ip_len;
			slot.flags = p.flags;
			slot.ifindex = BPF_CORE_READ(skb, skb_iif);
		}
	}
	/* Datagrams already waiting, read before this one (no helper may run under the lock). */
	queued = BPF_CORE_READ(sk, sk_receive_queue.qlen) - 1 +
		 BPF_CORE_READ((struct udp_sock *)sk, reader_queue.qlen);
	q = bpf_sk_storage_get(&sock_read_queues, sk, 0, 0);
	if (!q) {
		if (!slot.packet_id)
			return 0; /* no queue until the socket gets a traced datagram */
		q = bpf_sk_storage_get(&sock_read_queues, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
		if (!q)
			return 0;
		created = true;
	}
	bpf_spin_lock(&q->lock);
	if (q->tail - q->head >= SOCK_READ_SLOTS) {
		/* Full: start over as if created now, skipping the reads of all that waits. */
		lost = q->tail - q->head;
		q->head = q->tail;
		created = true;
	}
	if (created)
		q->skip = queued;
	q->slots[q->tail & (SOCK_READ_SLOTS - 1)] = slot;
	q->tail++;
	bpf_spin_unlock(&q->lock);
	if (lost)
		count(HOPTRACE_C_SOCK_READ_LOST, lost);
	return 0;
}

static __always_inline int hop_sock_read_dequeue(struct sock *sk, int ret, int flags)
{
	struct sock_read_slot slot = {};
	struct sock_read_queue *q;
	struct hop_meta m = {};
	bool have = false;

	count(HOPTRACE_C_SEEN, 1);
	if (ret < 0 || (flags & MSG_PEEK_) || !sock_read_scope(sk)) {
		count(HOPTRACE_C_NOT_MATCHED, 1);
		return 0;
	}
	q = bpf_sk_storage_get(&sock_read_queues, sk, 0, 0);
	if (!q) {
		count(HOPTRACE_C_NOT_MATCHED, 1);
		return 0;
	}
	bpf_spin_lock(&q->lock);
	if (q->skip) {
		q->skip--;
	} else if (q->head != q->tail) {
		slot = q->slots[q->head & (SOCK_READ_SLOTS - 1)];
		q->head++;
		have = true;
	}
	bpf_spin_unlock(&q->lock);
	if (!have || !slot.flow_hash) {
		count(HOPTRACE_C_NOT_MATCHED, 1);
		return 0;
	}
	task_meta(&m);
	sock_meta(sk, &m);
	hop_finish_read(slot.packet_id, slot.flow_hash, slot.wire_len, slot.flags, &m);
	if (slot.packet_id)
		remember_read(slot.packet_id, slot.flow_hash, slot.wire_len, slot.flags);
	return 0;
}

/*
 * uprobe and uretprobe hops on an application's function: no packet here, so
 * the record is of the packet this thread read last at a socket-read hop of
 * the same trace on this node (sock_read_last). A thread that read no traced
 * packet, or another trace's, records nothing (counted not matched).
 */
static __always_inline int hop_user_function(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct sock_read_last *last;
	struct hop_meta m = {};

	count(HOPTRACE_C_SEEN, 1);
	last = bpf_map_lookup_elem(&sock_read_last, &tid);
	if (!last || last->trace_slot != trace_slot || !last->packet_id) {
		count(HOPTRACE_C_NOT_MATCHED, 1);
		return 0;
	}
	task_meta(&m);
	hop_finish_read(last->packet_id, last->flow_hash, last->wire_len, last->flags, &m);
	return 0;
}

/* sock_ops ctx fields, read one by one: the verifier refuses a ctx pointer
 * that clang has advanced to share between loads. */
#define READ_SKOPS(dst, field)                                                                     \
	do {                                                                                       \
		dst = skops->field;                                                                \
		barrier_var(dst);                                                                  \
	} while (0)

/* A socket's flow as a tagger matches it: its sender's side is the source. */
struct sock_flow {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u8 family;
};

/* The socket's flow; false: neither IPv4 nor IPv6. */
static __always_inline bool read_sock_flow(struct bpf_sock_ops *skops, struct sock_flow *s)
{
	__u32 sk_family, local_port, remote_port;

	READ_SKOPS(sk_family, family);
	if (sk_family == 2 /* AF_INET */) {
		s->family = 4;
		READ_SKOPS(s->saddr[0], local_ip4);
		READ_SKOPS(s->daddr[0], remote_ip4);
	} else if (sk_family == 10 /* AF_INET6 */) {
		s->family = 6;
		READ_SKOPS(s->saddr[0], local_ip6[0]);
		READ_SKOPS(s->saddr[1], local_ip6[1]);
		READ_SKOPS(s->saddr[2], local_ip6[2]);
		READ_SKOPS(s->saddr[3], local_ip6[3]);
		READ_SKOPS(s->daddr[0], remote_ip6[0]);
		READ_SKOPS(s->daddr[1], remote_ip6[1]);
		READ_SKOPS(s->daddr[2], remote_ip6[2]);
		READ_SKOPS(s->daddr[3], remote_ip6[3]);
	} else {
		return false;
	}
	READ_SKOPS(local_port, local_port);
	READ_SKOPS(remote_port, remote_port);
	/* local_port is host order; remote_port is the network-order port << 16. */
	s->sport = local_port;
	s->dport = bpf_ntohl(remote_port);
	return true;
}

/* sock_ops: does this socket send the traced flow? */
static __always_inline bool sock_match(struct bpf_sock_ops *skops, bool floor)
{
	struct sock_flow s = {};

	/* Before 5.15 sock_ops has no netns cookie: the floor tags in every netns (attach.go). */
	if (!floor && tag_netns_cookie && bpf_get_netns_cookie(skops) != tag_netns_cookie)
		return false;
	return read_sock_flow(skops, &s) &&
	       flow_match(s.family, IPPROTO_TCP_, s.saddr, s.daddr, s.sport, s.dport);
}

/* The ID that HDR_OPT_LEN drew for the segment a socket is sending on this CPU, until
 * WRITE_HDR_OPT writes it: the kernel runs the two back to back for one skb, under the socket's
 * lock. A softirq may send another socket's segment in between; cookie tells them apart, and an ID
 * taken over that way is counted in HOPTRACE_C_TAG_FAILED, never written into the wrong segment. */
struct tcp_pending_id {
	__u64 cookie;
	__u32 id;
	__u32 slot; /* the tagging trace's (the sock_ops hook's slot; 0 in a tagger of its own) */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tcp_pending_id);
} tcp_pending SEC(".maps");

#ifndef HOPTRACE_HOOK
/* The tagger that takes a socket's segments: this program's trace, when its filter takes the socket
 * (*hs: HOP_CONST). The sock_ops hook has its own (hook.bpf.h): the lowest slot's trace that takes
 * it. */
static __always_inline bool tcp_tagger(struct bpf_sock_ops *skops, bool floor,
				       const struct hoptrace_hook_settings **hs)
{
	*hs = HOP_CONST;
	return sock_match(skops, floor);
}
#else
static __always_inline bool tcp_tagger(struct bpf_sock_ops *skops, bool floor,
				       const struct hoptrace_hook_settings **hs);
#endif

/*
 * TCP: a matching socket's sampled segments, SYN included, carry option 253
 * + ExID + ID (RFC 6994); the others carry no option bytes at all, so their
 * headers are what they would be untraced (the receiver's header prediction
 * and coalescing still take them). The MSS keeps room for the option on every
 * segment, so a sampled one never outgrows the MTU.
 */
static __always_inline int tag_tcp_segment(struct bpf_sock_ops *skops, bool floor)
{
	const struct hoptrace_hook_settings *hs;
	struct tcp_pending_id *pending;
	__u32 op, cb_flags, arg0, key = 0;

	READ_SKOPS(op, op);
	switch (op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
	case BPF_SOCK_OPS_TCP_LISTEN_CB:
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		if (!tcp_tagger(skops, floor, &hs))
			break;
		READ_SKOPS(cb_flags, bpf_sock_ops_cb_flags);
		bpf_sock_ops_cb_flags_set(skops, cb_flags | BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
		break;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB: {
		__u32 id;

		if (!tcp_tagger(skops, floor, &hs))
			break;
		READ_SKOPS(arg0, args[0]);
		if (arg0 & BPF_WRITE_HDR_TCP_CURRENT_MSS) { /* sizing the MSS, no segment yet */
			bpf_reserve_hdr_opt(skops, HOPTRACE_TCPOPT_LEN, 0);
			break;
		}
		hop_count(hs, HOPTRACE_C_MATCHED, 1);
		id = next_id(hs, floor);
		if (!id) { /* sampled out: no room asked, so WRITE_HDR_OPT does not run */
			hop_count(hs, HOPTRACE_C_UNTAGGED, 1);
			break;
		}
		pending = bpf_map_lookup_elem(&tcp_pending, &key);
		if (!pending || bpf_reserve_hdr_opt(skops, HOPTRACE_TCPOPT_LEN, 0)) {
			hop_count(hs, HOPTRACE_C_TAG_FAILED, 1);
			break;
		}
		pending->cookie = bpf_get_socket_cookie(skops);
		pending->id = id;
		pending->slot = HOP_SLOT;
		break;
	}
	case BPF_SOCK_OPS_WRITE_HDR_OPT_CB: {
		__u8 opt[HOPTRACE_TCPOPT_LEN];
		__u32 id;

		pending = bpf_map_lookup_elem(&tcp_pending, &key);
		if (!pending)
			break;
		id = pending->id;
		/* Room another program asked for, or an ID a nested segment took over. */
		if (!id || pending->cookie != bpf_get_socket_cookie(skops)) {
			if (tcp_tagger(skops, floor, &hs))
				hop_count(hs, HOPTRACE_C_TAG_FAILED, 1);
			break;
		}
		pending->id = 0;
		opt[0] = HOPTRACE_TCPOPT_KIND;
		opt[1] = HOPTRACE_TCPOPT_LEN;
		opt[2] = HOPTRACE_TCPOPT_EXID >> 8;
		opt[3] = HOPTRACE_TCPOPT_EXID & 0xff;
		opt[4] = id >> 24;
		opt[5] = id >> 16;
		opt[6] = id >> 8;
		opt[7] = id;
		slot_count(pending->slot,
			   bpf_store_hdr_opt(skops, opt, sizeof(opt), 0) ? HOPTRACE_C_TAG_FAILED
									 : HOPTRACE_C_TAGGED,
			   1);
		break;
	}
	}
	return SK_PASS_;
}

/* Program definitions: same names in every object the agent loads, each with
 * its _floor variant (see the top of this file). */
#define HOPTRACE_PROG_TC                                                                           \
	SEC("tc") int hop_tc(struct __sk_buff *skb)                                                \
	{                                                                                          \
		return hop_skb_l2(skb, false);                                                     \
	}                                                                                          \
	SEC("tc") int hop_tc_floor(struct __sk_buff *skb)                                          \
	{                                                                                          \
		return hop_skb_l2(skb, true);                                                      \
	}
#define HOPTRACE_PROG_XDP                                                                          \
	SEC("xdp") int hop_xdp(struct xdp_md *ctx)                                                 \
	{                                                                                          \
		return hop_xdp_frame(ctx, false);                                                  \
	}                                                                                          \
	SEC("xdp") int hop_xdp_floor(struct xdp_md *ctx)                                           \
	{                                                                                          \
		return hop_xdp_frame(ctx, true);                                                   \
	}
#define HOPTRACE_PROG_CGROUP_SKB                                                                   \
	SEC("cgroup_skb/ingress") int hop_cgroup_skb(struct __sk_buff *skb)                        \
	{                                                                                          \
		return hop_skb_l3(skb, false);                                                     \
	}                                                                                          \
	SEC("cgroup_skb/ingress") int hop_cgroup_skb_floor(struct __sk_buff *skb)                  \
	{                                                                                          \
		return hop_skb_l3(skb, true);                                                      \
	}
/* The agent retargets the event (AttachTo) before load: any event whose
 * first argument is the skb (net:net_dev_xmit, net:netif_receive_skb, ...). */
#define HOPTRACE_PROG_TP_BTF                                                                       \
	SEC("tp_btf/netif_receive_skb") int BPF_PROG(hop_tp_btf, struct sk_buff *skb)              \
	{                                                                                          \
		return hop_kernel_skb(skb, skb->dev, 0, NULL, true, false);                        \
	}                                                                                          \
	SEC("tp_btf/netif_receive_skb") int BPF_PROG(hop_tp_btf_floor, struct sk_buff *skb)        \
	{                                                                                          \
		return hop_kernel_skb(skb, skb->dev, 0, NULL, true, true);                         \
	}
/* net:net_dev_xmit fires after the driver took the skb: a veth has already
 * moved it to its peer (__dev_forward_skb sets skb->dev), so the device is the
 * event's own argument (TP_PROTO(skb, rc, dev, skb_len)). */
#define HOPTRACE_PROG_TP_BTF_XMIT                                                                  \
	SEC("tp_btf/net_dev_xmit")                                                                 \
	int BPF_PROG(hop_tp_btf_xmit, struct sk_buff *skb, int rc, struct net_device *dev)         \
	{                                                                                          \
		return hop_kernel_skb(skb, dev, 0, NULL, true, false);                             \
	}                                                                                          \
	SEC("tp_btf/net_dev_xmit")                                                                 \
	int BPF_PROG(hop_tp_btf_xmit_floor, struct sk_buff *skb, int rc, struct net_device *dev)   \
	{                                                                                          \
		return hop_kernel_skb(skb, dev, 0, NULL, true, true);                              \
	}
/* skb:kfree_skb with its drop reason (the drop_reason field) and where it was freed (location, the
 * drop_function field): the event has the reason from 5.17 (TP_PROTO(skb, location, reason)); older
 * kernels refuse this program, and their agents do not report the fields, so the dispatcher picks
 * it only for a kfree_skb hop that reads the reason. */
#define HOPTRACE_PROG_TP_BTF_KFREE                                                                 \
	SEC("tp_btf/kfree_skb")                                                                    \
	int BPF_PROG(hop_tp_btf_kfree, struct sk_buff *skb, void *location,                        \
		     enum skb_drop_reason reason)                                                  \
	{                                                                                          \
		return hop_kernel_skb(skb, skb->dev, reason, location, true, false);               \
	}                                                                                          \
	SEC("tp_btf/kfree_skb")                                                                    \
	int BPF_PROG(hop_tp_btf_kfree_floor, struct sk_buff *skb, void *location,                  \
		     enum skb_drop_reason reason)                                                  \
	{                                                                                          \
		return hop_kernel_skb(skb, skb->dev, reason, location, true, true);                \
	}
/* socket-read (hop_sock_read above): one program per protocol, each on its
 * event. UDP's macro also defines the queue pair the agent runs instead on
 * kernels that free the datagram after the read (hop_sock_read_enqueue and
 * _dequeue above; 6.6+ events): loaded in one collection (they share
 * sock_read_queues) and both attached. 5.10 has neither event. */
#define HOPTRACE_PROG_SOCK_READ_UDP                                                                \
	SEC("tp_btf/consume_skb") int BPF_PROG(hop_sock_read_udp, struct sk_buff *skb)             \
	{                                                                                          \
		return hop_sock_read(skb, true, false);                                            \
	}                                                                                          \
	SEC("tp_btf/consume_skb") int BPF_PROG(hop_sock_read_udp_floor, struct sk_buff *skb)       \
	{                                                                                          \
		return hop_sock_read(skb, true, true);                                             \
	}                                                                                          \
	SEC("tp_btf/sock_recv_length")                                                             \
	int BPF_PROG(hop_sock_read_udp_queue, struct sock *sk, int ret, int flags)                 \
	{                                                                                          \
		return hop_sock_read_dequeue(sk, ret, flags);                                      \
	}                                                                                          \
	SEC("tp_btf/sk_data_ready") int BPF_PROG(hop_sock_read_udp_enqueue, struct sock *sk)       \
	{                                                                                          \
		return hop_sock_read_enqueue(sk, false);                                           \
	}                                                                                          \
	SEC("tp_btf/sock_recv_length")                                                             \
	int BPF_PROG(hop_sock_read_udp_queue_floor, struct sock *sk, int ret, int flags)           \
	{                                                                                          \
		return hop_sock_read_dequeue(sk, ret, flags);                                      \
	}                                                                                          \
	SEC("tp_btf/sk_data_ready") int BPF_PROG(hop_sock_read_udp_enqueue_floor, struct sock *sk) \
	{                                                                                          \
		return hop_sock_read_enqueue(sk, true);                                            \
	}
#define HOPTRACE_PROG_SOCK_READ_TCP                                                                \
	SEC("tp_btf/skb_copy_datagram_iovec")                                                      \
	int BPF_PROG(hop_sock_read_tcp, struct sk_buff *skb, int len)                              \
	{                                                                                          \
		return hop_sock_read(skb, false, false);                                           \
	}                                                                                          \
	SEC("tp_btf/skb_copy_datagram_iovec")                                                      \
	int BPF_PROG(hop_sock_read_tcp_floor, struct sk_buff *skb, int len)                        \
	{                                                                                          \
		return hop_sock_read(skb, false, true);                                            \
	}
/* uprobe: and uretprobe: hops run the same program (hop_user_function above);
 * the agent attaches it as a uprobe or a uretprobe. */
#define HOPTRACE_PROG_UPROBE                                                                       \
	SEC("uprobe") int hop_uprobe(struct pt_regs *ctx)                                          \
	{                                                                                          \
		return hop_user_function();                                                        \
	}                                                                                          \
	SEC("uprobe") int hop_uprobe_floor(struct pt_regs *ctx)                                    \
	{                                                                                          \
		return hop_user_function();                                                        \
	}
#define HOPTRACE_PROG_FENTRY                                                                       \
	SEC("fentry/netif_receive_skb") int BPF_PROG(hop_fentry, struct sk_buff *skb)              \
	{                                                                                          \
		return hop_kernel_skb(skb, skb->dev, 0, NULL, true, false);                        \
	}                                                                                          \
	SEC("fentry/netif_receive_skb") int BPF_PROG(hop_fentry_floor, struct sk_buff *skb)        \
	{                                                                                          \
		return hop_kernel_skb(skb, skb->dev, 0, NULL, true, true);                         \
	}
#define HOPTRACE_PROG_KPROBE                                                                       \
	SEC("kprobe/netif_receive_skb") int BPF_KPROBE(hop_kprobe, struct sk_buff *skb)            \
	{                                                                                          \
		return hop_kernel_skb(skb, BPF_CORE_READ(skb, dev), 0, NULL, false, false);        \
	}                                                                                          \
	SEC("kprobe/netif_receive_skb") int BPF_KPROBE(hop_kprobe_floor, struct sk_buff *skb)      \
	{                                                                                          \
		return hop_kernel_skb(skb, BPF_CORE_READ(skb, dev), 0, NULL, false, true);         \
	}
/* fexit: the packet at the function's return (its arguments are still there; the skb is the
 * first). The agent retargets it (AttachTo), as fentry. */
#define HOPTRACE_PROG_FEXIT                                                                        \
	SEC("fexit/ip_route_input_noref") int BPF_PROG(hop_fexit, struct sk_buff *skb)             \
	{                                                                                          \
		return hop_kernel_skb(skb, skb->dev, 0, NULL, true, false);                        \
	}                                                                                          \
	SEC("fexit/ip_route_input_noref") int BPF_PROG(hop_fexit_floor, struct sk_buff *skb)       \
	{                                                                                          \
		return hop_kernel_skb(skb, skb->dev, 0, NULL, true, true);                         \
	}
/* kretprobe: the return (hop_kret_return) and its entry kprobe, both attached by the agent. */
#define HOPTRACE_PROG_KRETPROBE                                                                    \
	SEC("kretprobe/ip_route_input_noref") int BPF_KRETPROBE(hop_kretprobe)                     \
	{                                                                                          \
		return hop_kret_return(false);                                                     \
	}                                                                                          \
	SEC("kretprobe/ip_route_input_noref") int BPF_KRETPROBE(hop_kretprobe_floor)               \
	{                                                                                          \
		return hop_kret_return(true);                                                      \
	}                                                                                          \
	SEC("kprobe/ip_route_input_noref")                                                         \
	int BPF_KPROBE(hop_kretprobe_entry, struct sk_buff *skb)                                   \
	{                                                                                          \
		return hop_kret_entry(skb);                                                        \
	}                                                                                          \
	SEC("kprobe/ip_route_input_noref")                                                         \
	int BPF_KPROBE(hop_kretprobe_entry_floor, struct sk_buff *skb)                             \
	{                                                                                          \
		return hop_kret_entry(skb);                                                        \
	}
#define HOPTRACE_PROG_TAG_TCP                                                                      \
	SEC("sockops") int tag_tcp(struct bpf_sock_ops *skops)                                     \
	{                                                                                          \
		return tag_tcp_segment(skops, false);                                              \
	}                                                                                          \
	SEC("sockops") int tag_tcp_floor(struct bpf_sock_ops *skops)                               \
	{                                                                                          \
		return tag_tcp_segment(skops, true);                                               \
	}

#endif /* __HOPTRACE_HOP_BPF_H */
