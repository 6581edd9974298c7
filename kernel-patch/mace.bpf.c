// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * MACE as eBPF: the latency a container adds to each of its packets, from
 * the container's side to the host's outer device (egress) and back
 * (ingress), on one of MACE's three event paths (include/mace.h).
 *
 * Packets carry no tag here: each event computes a key from the packet
 * (ICMP echo identifier/sequence, else a hash of invariant header fields),
 * the path's first event stores the key with its timestamp in a pending
 * table, and the last event looks it up and emits one record. Syscall
 * events have no packet: they are tied to it through the thread (sendto ->
 * net_dev_queue in the sending thread; skb_copy_datagram_iovec -> recv*
 * exit in the receiving thread).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_tracing.h>

#include "mace.h"
#include "parse.bpf.h"

#define IPPROTO_ICMP_	1
#define IPPROTO_ICMPV6_ 58

/* Load-time settings, written by the agent (agent/internal/preset). */
const volatile __u32 mace_path = MACE_PATH_INNER_DEV;
const volatile __u32 inner_ifindex = 0;	  /* the container's device (its eth0) */
const volatile __u32 inner_netns_ino = 0; /* the container's netns */
const volatile __u32 outer_ifindex = 0;	  /* the host's device toward the wire */
const volatile __u32 outer_netns_ino = 0; /* the host's netns */

struct pending {
	__u64 ts_ns;
	__u32 tid;
	__u32 pad;
};

struct recv_pending {
	__u64 key;
	__u64 ts_ns;
	__u8 proto;
};

#define MACE_RINGBUF_BYTES (4 << 20)
/* Above this much unread data a record wakes the agent at once (see emit). */
#define MACE_WAKEUP_BYTES (MACE_RINGBUF_BYTES / 2)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, MACE_RINGBUF_BYTES);
} mace_events SEC(".maps");

/* Keys that passed the first event of their direction, waiting for the last. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct pending);
} egress_pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct pending);
} ingress_pending SEC(".maps");

/* syscalls path: thread -> sendto/sendmsg entry time, until its packet is queued. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u64);
} send_ts SEC(".maps");

/* syscalls path: thread -> the datagram it is copying out, until recv* returns. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct recv_pending);
} recv_pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MACE_C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} mace_counters SEC(".maps");

/* Keep the shared layouts in this object's BTF for the layout test. */
const struct mace_event *unused_mace_event __attribute__((unused));
const enum mace_counter *unused_mace_counter __attribute__((unused));
const enum mace_path *unused_mace_path __attribute__((unused));

static __always_inline void mace_count(enum mace_counter c)
{
	__u32 k = c;
	__u64 *v = bpf_map_lookup_elem(&mace_counters, &k);

	if (v)
		*v += 1;
}

static __always_inline __u32 mace_mix(__u32 h, __u32 v)
{
	/* murmur3 round, as hop.bpf.h's flow hash */
	v *= 0xcc9e2d51;
	v = (v << 15) | (v >> 17);
	v *= 0x1b873593;
	h ^= v;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 mace_fmix(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/*
 * Link-local scope: an IPv6 link-local source or destination (fe80::/10,
 * RFC 4291 2.5.6) or link-local multicast (ff02::/16: ND, MLD), IPv4
 * 169.254.0.0/16 (RFC 3927) or 224.0.0.0/24 (RFC 5771). A router never
 * forwards these, so they cannot reach the outer device from a routed or
 * NATed container: counted as seen they would only lower the coverage (a
 * fresh interface sends MLD reports for its first seconds).
 */
static __always_inline bool link_local(const struct pkt_info *p)
{
	__u32 s = bpf_ntohl(p->saddr[0]), d = bpf_ntohl(p->daddr[0]);

	if (p->family == 4)
		return (s >> 16) == 0xa9fe || (d >> 16) == 0xa9fe || (d >> 8) == 0xe00000;
	return (s >> 22) == (0xfe80 >> 6) || (d >> 22) == (0xfe80 >> 6) || (d >> 16) == 0xff02;
}

/*
 * The key of the innermost packet (a VXLAN/Geneve packet on the outer device
 * is keyed by what it carries, so both ends agree). Returns 0 when the packet
 * has no key.
 */
static __always_inline __u64 packet_key(enum pkt_source src, struct pkt_reader *r, __u16 ethertype,
					__u8 *proto)
{
	struct pkt_info p = {};
	__u32 h1 = 0x6d616365, h2 = 0x686f7074; /* two seeds: a 64-bit key from two 32-bit hashes */
	__u32 extra[2] = {};

	if (parse_packet(src, r, 0, ethertype, &p)) {
		mace_count(MACE_C_PARSE_ERROR);
		return 0;
	}
	if (link_local(&p)) {
		mace_count(MACE_C_LINK_LOCAL);
		return 0;
	}
	*proto = p.proto;
	if ((p.proto == IPPROTO_ICMP_ && p.family == 4) ||
	    (p.proto == IPPROTO_ICMPV6_ && p.family == 6)) {
		__u8 icmp[8];

		if (pkt_load(src, r, p.l4_off, icmp, sizeof(icmp))) {
			mace_count(MACE_C_PARSE_ERROR);
			return 0;
		}
		/* Echo request/reply (RFC 792 types 8/0, RFC 4443 types 128/129): exact key. */
		if (icmp[0] == 8 || icmp[0] == 0 || icmp[0] == 128 || icmp[0] == 129)
			return MACE_KEY_ICMP | (p.family == 6 ? MACE_KEY_ICMP_V6 : 0) |
			       ((__u64)icmp[0] << 32) | ((__u64)icmp[4] << 24) |
			       ((__u64)icmp[5] << 16) | ((__u64)icmp[6] << 8) | icmp[7];
	}

	for (int i = 0; i < 4; i++) {
		if (i > 0 && p.family != 6)
			break;
		h1 = mace_mix(h1, p.saddr[i]);
		h2 = mace_mix(h2, p.daddr[i]);
	}
	if (p.family == 4) {
		__u16 ip_id = 0;

		/* The IPv4 ID: what tells apart two datagrams of one flow with equal payloads. */
		pkt_load(src, r, p.l3_off + 4, &ip_id, sizeof(ip_id));
		h1 = mace_mix(h1, ip_id);
	}
	h1 = mace_mix(h1, p.proto);
	h2 = mace_mix(h2, ((__u32)p.sport << 16) | p.dport);
	if (p.proto == IPPROTO_TCP_)
		pkt_load(src, r, p.l4_off + 4, extra, 4); /* sequence number */
	else if (p.proto == IPPROTO_UDP_ && p.udp_len >= 16)
		pkt_load(src, r, p.l4_off + 8, extra, 8); /* first payload bytes */
	else
		pkt_load(src, r, p.l4_off, extra, 8);
	h1 = mace_mix(h1, extra[0]);
	h2 = mace_mix(h2, extra[1]);
	return (((__u64)mace_fmix(h1) << 32) | mace_fmix(h2 ^ h1)) & ~MACE_KEY_ICMP;
}

/* The key of a struct sk_buff in kernel memory (as hop_kernel_skb reads it). */
static __always_inline __u64 skb_key(const struct sk_buff *skb, __u8 *proto)
{
	/* The unrolled parser (no bpf_loop, 5.17) on every kernel: one object from 5.10 up. MACE
	 * loads once per run, so its larger verification costs nothing per packet. */
	struct pkt_reader r = {.floor = 1};
	__u16 ethertype;

	if (pkt_reader_from_skb(skb, &r, &ethertype, true)) { /* every caller is tp_btf */
		mace_count(MACE_C_PARSE_ERROR);
		return 0;
	}
	return packet_key(PKT_KERNEL, &r, ethertype, proto);
}

enum dev_role {
	DEV_OTHER = 0,
	DEV_INNER,
	DEV_OUTER,
};

static __always_inline enum dev_role dev_role(const struct net_device *dev)
{
	__u32 ifindex, ino;

	if (!dev)
		return DEV_OTHER;
	ifindex = dev->ifindex; /* a tp_btf argument or skb->dev of one: BTF-typed (KERNEL_FIELD) */
	if (ifindex != inner_ifindex && ifindex != outer_ifindex)
		return DEV_OTHER;
	ino = dev_netns_ino(dev, true);
	if (ifindex == inner_ifindex && ino == inner_netns_ino)
		return DEV_INNER;
	if (ifindex == outer_ifindex && ino == outer_netns_ino)
		return DEV_OUTER;
	return DEV_OTHER;
}

/* The path's first event: remember when the packet with this key was there. */
static __always_inline void mark_start(void *pending, __u64 key, __u64 ts, enum mace_counter seen,
				       enum mace_counter collision, bool count_collision)
{
	struct pending v = {.ts_ns = ts, .tid = (__u32)bpf_get_current_pid_tgid()};

	if (seen != MACE_C_MAX)
		mace_count(seen);
	if (bpf_map_update_elem(pending, &key, &v, BPF_NOEXIST) && count_collision) {
		/* Another packet with this key is still in flight (or was lost): the
		 * newer one wins, and the collision is counted. */
		mace_count(collision);
		bpf_map_update_elem(pending, &key, &v, BPF_ANY);
	}
}

static __always_inline void emit(__u64 key, __u64 start, __u64 end, __u32 tid, __u8 direction,
				 __u8 proto)
{
	struct mace_event *e = bpf_ringbuf_reserve(&mace_events, sizeof(*e), 0);

	if (!e) {
		mace_count(MACE_C_RINGBUF_FULL);
		return;
	}
	e->key = key;
	e->ts_start_ns = start;
	e->ts_end_ns = end;
	e->tid = tid;
	e->direction = direction;
	e->proto = proto;
	e->cpu = bpf_get_smp_processor_id();
	/*
	 * No wakeup per record: the agent polls (agent/internal/preset/mace.go).
	 * A default submit queues an irq_work that wakes the agent's epoll on this
	 * CPU, which is the measured application's (the whole echo runs in its
	 * sendto: softirqs run at local_bh_enable). The agent then preempts that
	 * application on its way back to user space, adding 6-37 us to exactly
	 * the container's echoes and to none of the host's (which emit nothing):
	 * measured with sched_switch, it was most of the gap between the corrected
	 * and the native RTT (docs/mace.md). Only a ring half full wakes it.
	 */
	bool full = bpf_ringbuf_query(&mace_events, BPF_RB_AVAIL_DATA) > MACE_WAKEUP_BYTES;

	bpf_ringbuf_submit(e, full ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

/* The path's last event: pair with the first one and report. */
static __always_inline bool mark_end(void *pending, __u64 key, __u64 ts, __u8 direction, __u8 proto,
				     bool tid_from_end)
{
	struct pending *v = bpf_map_lookup_elem(pending, &key);
	__u64 start;
	__u32 tid;

	if (!v)
		return false;
	start = v->ts_ns;
	tid = tid_from_end ? (__u32)bpf_get_current_pid_tgid() : v->tid;
	bpf_map_delete_elem(pending, &key);
	emit(key, start, ts, tid, direction, proto);
	return true;
}

static __always_inline void egress_start(const struct sk_buff *skb, __u64 ts)
{
	__u8 proto = 0;
	__u64 key = skb_key(skb, &proto);

	if (key)
		mark_start(&egress_pending, key, ts, MACE_C_EGRESS_SEEN, MACE_C_EGRESS_COLLISION,
			   true);
}

static __always_inline void outer_xmit(const struct sk_buff *skb, __u64 ts)
{
	__u8 proto = 0;
	__u64 key;

	mace_count(MACE_C_OUTER_EGRESS);
	key = skb_key(skb, &proto);
	if (key && mark_end(&egress_pending, key, ts, MACE_EGRESS, proto, false))
		mace_count(MACE_C_EGRESS_REPORTED);
}

/* Outer device receive. On max-dev a packet has several receive events
 * (netif_rx or GRO, then netif_receive_skb): the earliest stays. */
static __always_inline void outer_receive(const struct sk_buff *skb, __u64 ts, bool earliest)
{
	__u8 proto = 0;
	__u64 key = skb_key(skb, &proto);

	if (!key)
		return;
	if (earliest) {
		mace_count(MACE_C_OUTER_INGRESS);
		mark_start(&ingress_pending, key, ts, MACE_C_MAX, MACE_C_INGRESS_COLLISION, true);
	} else if (mace_path == MACE_PATH_MAX_DEV) {
		/* the GRO/netif_rx event came first and counted it; a device without one starts
		 * here */
		mark_start(&ingress_pending, key, ts, MACE_C_MAX, MACE_C_INGRESS_COLLISION, false);
	} else {
		mace_count(MACE_C_OUTER_INGRESS);
		mark_start(&ingress_pending, key, ts, MACE_C_MAX, MACE_C_INGRESS_COLLISION, true);
	}
}

/* net:net_dev_queue: before the qdisc; skb->dev is the sending device. */
SEC("tp_btf/net_dev_queue")
int BPF_PROG(mace_dev_queue, struct sk_buff *skb)
{
	__u64 ts = bpf_ktime_get_ns();
	__u32 tid;
	__u64 *sent;

	if (mace_path == MACE_PATH_INNER_DEV || dev_role(skb->dev) != DEV_INNER)
		return 0;
	if (mace_path == MACE_PATH_MAX_DEV) {
		egress_start(skb, ts);
		return 0;
	}
	/* syscalls: the packet a thread queues during its sendto/sendmsg is that call's. */
	tid = (__u32)bpf_get_current_pid_tgid();
	sent = bpf_map_lookup_elem(&send_ts, &tid);
	if (!sent)
		return 0;
	ts = *sent;
	bpf_map_delete_elem(&send_ts, &tid);
	egress_start(skb, ts);
	return 0;
}

/* net:net_dev_xmit fires after the driver took the skb: a veth has already
 * moved it to its peer, so the device is the event's own argument. */
SEC("tp_btf/net_dev_xmit")
int BPF_PROG(mace_dev_xmit, struct sk_buff *skb, int rc, struct net_device *dev)
{
	__u64 ts = bpf_ktime_get_ns();
	enum dev_role role = dev_role(dev);

	if (rc != 0) /* NETDEV_TX_OK: anything else was not sent */
		return 0;
	if (role == DEV_OUTER)
		outer_xmit(skb, ts);
	else if (role == DEV_INNER && mace_path == MACE_PATH_INNER_DEV)
		egress_start(skb, ts);
	return 0;
}

/* net:netif_receive_skb: the stack takes the packet (every receive path). */
SEC("tp_btf/netif_receive_skb")
int BPF_PROG(mace_receive_skb, struct sk_buff *skb)
{
	__u64 ts = bpf_ktime_get_ns();
	enum dev_role role = dev_role(skb->dev);
	__u8 proto = 0;
	__u64 key;

	if (role == DEV_OUTER) {
		outer_receive(skb, ts, false);
	} else if (role == DEV_INNER && mace_path != MACE_PATH_SYSCALLS) {
		key = skb_key(skb, &proto);
		if (!key)
			return 0;
		mace_count(MACE_C_INGRESS_SEEN);
		if (mark_end(&ingress_pending, key, ts, MACE_INGRESS, proto, true))
			mace_count(MACE_C_INGRESS_REPORTED);
	}
	return 0;
}

/* max-dev: the earliest receive events a device can have. A NIC with NAPI
 * hands packets to GRO; a veth without NAPI goes through netif_rx. */
SEC("tp_btf/napi_gro_receive_entry")
int BPF_PROG(mace_gro_receive, struct sk_buff *skb)
{
	__u64 ts = bpf_ktime_get_ns();

	if (mace_path == MACE_PATH_MAX_DEV && dev_role(skb->dev) == DEV_OUTER)
		outer_receive(skb, ts, true);
	return 0;
}

SEC("tp_btf/netif_rx")
int BPF_PROG(mace_netif_rx, struct sk_buff *skb)
{
	__u64 ts = bpf_ktime_get_ns();

	if (mace_path == MACE_PATH_MAX_DEV && dev_role(skb->dev) == DEV_OUTER)
		outer_receive(skb, ts, true);
	return 0;
}

/* syscalls path, egress: the send call's entry time, per thread. */
static __always_inline int send_enter(void)
{
	__u32 tid;
	__u64 ts;

	/* No namespace filter here: a thread may send on a socket of another
	 * netns than its own (setns, then socket(), then back). Whether the send
	 * was the container's is decided where its packet shows up: on the
	 * container's device, in this thread (mace_dev_queue). */
	if (mace_path != MACE_PATH_SYSCALLS)
		return 0;
	tid = (__u32)bpf_get_current_pid_tgid();
	ts = bpf_ktime_get_ns();
	bpf_map_update_elem(&send_ts, &tid, &ts, BPF_ANY);
	return 0;
}

/* A send that queued nothing on the container's device (loopback, error)
 * must not lend its time to the thread's next packet. */
static __always_inline int send_exit(void)
{
	__u32 tid;

	if (mace_path != MACE_PATH_SYSCALLS)
		return 0;
	tid = (__u32)bpf_get_current_pid_tgid();
	bpf_map_delete_elem(&send_ts, &tid);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_sendto")
int mace_enter_sendto(void *ctx)
{
	return send_enter();
}

SEC("tracepoint/syscalls/sys_enter_sendmsg")
int mace_enter_sendmsg(void *ctx)
{
	return send_enter();
}

SEC("tracepoint/syscalls/sys_exit_sendto")
int mace_exit_sendto(void *ctx)
{
	return send_exit();
}

SEC("tracepoint/syscalls/sys_exit_sendmsg")
int mace_exit_sendmsg(void *ctx)
{
	return send_exit();
}

/* syscalls path, ingress: the datagram a thread copies out during recv*
 * (skb_copy_datagram_iter fires net:skb_copy_datagram_iovec). */
SEC("tp_btf/skb_copy_datagram_iovec")
int BPF_PROG(mace_copy_datagram, const struct sk_buff *skb, int len)
{
	struct sock *sk = skb->sk;
	struct recv_pending rp = {};
	struct pending *v;
	__u32 tid;

	/* The socket's namespace, not the thread's (see send_enter). */
	if (mace_path != MACE_PATH_SYSCALLS || !sk ||
	    sk->__sk_common.skc_net.net->ns.inum != inner_netns_ino)
		return 0;
	rp.key = skb_key(skb, &rp.proto);
	if (!rp.key)
		return 0;
	mace_count(MACE_C_INGRESS_SEEN);
	v = bpf_map_lookup_elem(&ingress_pending, &rp.key);
	if (!v)
		return 0;
	rp.ts_ns = v->ts_ns;
	bpf_map_delete_elem(&ingress_pending, &rp.key);
	tid = (__u32)bpf_get_current_pid_tgid();
	bpf_map_update_elem(&recv_pending, &tid, &rp, BPF_ANY);
	return 0;
}

static __always_inline int recv_exit(struct trace_event_raw_sys_exit *ctx)
{
	struct recv_pending *rp;
	__u32 tid;

	if (mace_path != MACE_PATH_SYSCALLS)
		return 0;
	tid = (__u32)bpf_get_current_pid_tgid();
	rp = bpf_map_lookup_elem(&recv_pending, &tid);
	if (!rp)
		return 0;
	if (ctx->ret >= 0) {
		emit(rp->key, rp->ts_ns, bpf_ktime_get_ns(), tid, MACE_INGRESS, rp->proto);
		mace_count(MACE_C_INGRESS_REPORTED);
	}
	bpf_map_delete_elem(&recv_pending, &tid);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_recvfrom")
int mace_exit_recvfrom(struct trace_event_raw_sys_exit *ctx)
{
	return recv_exit(ctx);
}

SEC("tracepoint/syscalls/sys_exit_recvmsg")
int mace_exit_recvmsg(struct trace_event_raw_sys_exit *ctx)
{
	return recv_exit(ctx);
}

SEC("tracepoint/syscalls/sys_exit_recvmmsg")
int mace_exit_recvmmsg(struct trace_event_raw_sys_exit *ctx)
{
	return recv_exit(ctx);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
