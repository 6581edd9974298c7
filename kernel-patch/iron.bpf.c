// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Iron's accounting as eBPF: network softirq CPU per container.
 *
 * - charged: every NET_RX/NET_TX softirq (irq:softirq_entry -> exit) runs in
 *   the context of whatever task the CPU was running; the scheduler bills
 *   that task's cgroup for it ("a randomly chosen victim", Gleixner).
 * - caused: inside a NET_RX softirq, each packet's processing is the time
 *   from its net:netif_receive_skb to the next packet's (or the softirq's
 *   end): delivery is synchronous there, so that is the packet's whole trip
 *   through the stack. The packet's container is the netns of the device it
 *   is received on; time spent on it in the host netns (wire, bridge, VXLAN)
 *   waits, keyed by the skb, until the same skb reaches a container device.
 *   The batch's remaining time (net_rx_action, polling, softirq entry and
 *   exit) is shared among the batch's packets' containers by packet count,
 *   as Iron shares the per-batch cost.
 * NET_TX softirqs (transmit completion, qdisc runs) are charged like the
 * others but caused by nobody in particular here: they go to netns 0.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#include "iron.h"

#define PF_KTHREAD_ 0x00200000 /* include/linux/sched.h */

/* The host's netns inode: packets on its devices wait for their container. */
const volatile __u32 host_netns_ino = 0;

struct cpu_state {
	__u64 sirq_start;
	__u64 seg_start;
	__u64 seg_skb;
	__u64 seg_sum;
	struct iron_charged_key victim;
	__u32 vec;
	__u32 active;
	__u32 seg_open;
	__u32 seg_owner;
	__u32 npkts;
	__u32 overflow; /* packets of owners beyond IRON_MAX_OWNERS */
	__u32 owners[IRON_MAX_OWNERS];
	__u32 counts[IRON_MAX_OWNERS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_state);
} iron_cpu SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct iron_caused);
} iron_caused SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct iron_charged_key);
	__type(value, struct iron_charged);
} iron_charged SEC(".maps");

/* Host-netns processing time of an skb that has not reached a container yet. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u64);
} iron_pending SEC(".maps");

const struct iron_caused *unused_iron_caused __attribute__((unused));
const struct iron_charged_key *unused_iron_charged_key __attribute__((unused));
const struct iron_charged *unused_iron_charged __attribute__((unused));

static __always_inline struct cpu_state *cpu_state(void)
{
	__u32 k = 0;

	return bpf_map_lookup_elem(&iron_cpu, &k);
}

static __always_inline void add_caused(__u32 owner, __u64 ns, __u64 packets)
{
	struct iron_caused *c = bpf_map_lookup_elem(&iron_caused, &owner);

	if (!c) {
		struct iron_caused zero = {};

		bpf_map_update_elem(&iron_caused, &owner, &zero, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&iron_caused, &owner);
		if (!c)
			return;
	}
	/* Plain atomic adds only (BPF_XADD, every kernel): clang turns an add of a
	 * constant 0 into an atomic OR, which 5.10 refuses (atomic ops are 5.12). */
	__sync_fetch_and_add(&c->ns, ns);
	if (packets)
		__sync_fetch_and_add(&c->packets, packets);
}

static __always_inline void note_owner(struct cpu_state *s, __u32 owner)
{
	s->npkts++;
	for (int i = 0; i < IRON_MAX_OWNERS; i++) {
		if (s->counts[i] && s->owners[i] == owner) {
			s->counts[i]++;
			return;
		}
		if (!s->counts[i]) {
			s->owners[i] = owner;
			s->counts[i] = 1;
			return;
		}
	}
	s->overflow++;
}

static __always_inline void close_segment(struct cpu_state *s, __u64 now)
{
	__u64 cost;

	if (!s->seg_open)
		return;
	s->seg_open = 0;
	cost = now - s->seg_start;
	s->seg_sum += cost;
	if (s->seg_owner) {
		add_caused(s->seg_owner, cost, 1);
		note_owner(s, s->seg_owner);
		return;
	}
	/* host netns: the container this skb is for is not known yet */
	__u64 *p = bpf_map_lookup_elem(&iron_pending, &s->seg_skb);

	if (p) {
		__sync_fetch_and_add(p, cost);
	} else {
		bpf_map_update_elem(&iron_pending, &s->seg_skb, &cost, BPF_ANY);
	}
	note_owner(s, 0);
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(iron_softirq_entry, unsigned int vec)
{
	/* bpf_get_current_task_btf is 5.11: read the task with CO-RE instead. */
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct cpu_state *s;
	char comm[10];

	if (vec != IRON_NET_RX_SOFTIRQ && vec != IRON_NET_TX_SOFTIRQ)
		return 0;
	s = cpu_state();
	if (!s)
		return 0;
	__builtin_memset(s, 0, sizeof(*s));
	s->sirq_start = bpf_ktime_get_ns();
	s->vec = vec;
	s->active = 1;
	s->victim.tgid = bpf_get_current_pid_tgid() >> 32;
	s->victim.cgroup_id = bpf_get_current_cgroup_id();
	s->victim.netns_ino = BPF_CORE_READ(task, nsproxy, net_ns, ns.inum);
	if (s->victim.tgid == 0) {
		s->victim.kind = IRON_IDLE;
	} else if (BPF_CORE_READ(task, flags) & PF_KTHREAD_) {
		bpf_get_current_comm(comm, sizeof(comm));
		if (comm[0] == 'k' && comm[1] == 's' && comm[2] == 'o' && comm[3] == 'f' &&
		    comm[4] == 't' && comm[5] == 'i' && comm[6] == 'r' && comm[7] == 'q' &&
		    comm[8] == 'd')
			s->victim.kind = IRON_KSOFTIRQD;
	}
	return 0;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(iron_receive_skb, struct sk_buff *skb)
{
	__u64 now = bpf_ktime_get_ns();
	struct cpu_state *s = cpu_state();
	__u64 key = (__u64)skb;
	__u32 owner;
	__u64 *pending;

	if (!s || !s->active || s->vec != IRON_NET_RX_SOFTIRQ)
		return 0;
	close_segment(s, now);
	owner = BPF_CORE_READ(skb, dev, nd_net.net, ns.inum);
	if (owner == host_netns_ino) {
		owner = 0;
	} else {
		/* The skb reached its container: the host-side time was on its behalf. */
		pending = bpf_map_lookup_elem(&iron_pending, &key);
		if (pending) {
			add_caused(owner, *pending, 0);
			bpf_map_delete_elem(&iron_pending, &key);
		}
	}
	s->seg_open = 1;
	s->seg_owner = owner;
	s->seg_skb = key;
	s->seg_start = bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(iron_softirq_exit, unsigned int vec)
{
	__u64 now = bpf_ktime_get_ns();
	struct cpu_state *s = cpu_state();
	struct iron_charged *ch;
	__u64 total, overhead;

	if (!s || !s->active || s->vec != vec)
		return 0;
	close_segment(s, now);
	s->active = 0;
	total = now - s->sirq_start;

	ch = bpf_map_lookup_elem(&iron_charged, &s->victim);
	if (!ch) {
		struct iron_charged zero = {};

		bpf_map_update_elem(&iron_charged, &s->victim, &zero, BPF_NOEXIST);
		ch = bpf_map_lookup_elem(&iron_charged, &s->victim);
	}
	if (ch) {
		__sync_fetch_and_add(&ch->ns, total);
		__sync_fetch_and_add(&ch->softirqs, 1);
	}

	overhead = total > s->seg_sum ? total - s->seg_sum : 0;
	if (!s->npkts) {
		add_caused(0, overhead, 0);
		return 0;
	}
	for (int i = 0; i < IRON_MAX_OWNERS; i++) {
		if (!s->counts[i])
			break;
		add_caused(s->owners[i], overhead * s->counts[i] / s->npkts, 0);
	}
	if (s->overflow)
		add_caused(0, overhead * s->overflow / s->npkts, 0);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
