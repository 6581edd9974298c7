/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Iron (Khalid et al., NSDI'18): network softirq CPU per container, as
 * caused (processing done for its packets) and as charged (softirq time
 * spent while its task was the one interrupted). Shared by iron.bpf.c and
 * agent/internal/preset/iron.go.
 */
#ifndef __HOPTRACE_IRON_H
#define __HOPTRACE_IRON_H

#define IRON_NET_TX_SOFTIRQ 2 /* enum { ..., NET_TX_SOFTIRQ = 2, NET_RX_SOFTIRQ = 3 } */
#define IRON_NET_RX_SOFTIRQ 3
#define IRON_MAX_OWNERS	    8 /* distinct owners per softirq batch sharing its overhead */

/* caused: key = netns inode of the packet's container (0: the host / unattributed). */
struct iron_caused {
	__u64 ns;      /* per-packet processing time + its share of the batch overhead */
	__u64 packets; /* packets processed on its behalf */
};

/* Who a softirq interrupted. */
enum iron_victim_kind {
	IRON_TASK = 0,	    /* an ordinary task: the scheduler charges it */
	IRON_IDLE = 1,	    /* the idle task: nobody is charged */
	IRON_KSOFTIRQD = 2, /* the softirq thread: deferred work, charged to itself */
};

struct iron_charged_key {
	__u64 cgroup_id; /* bpf_get_current_cgroup_id() of the interrupted task */
	__u32 netns_ino; /* its network namespace */
	__u32 tgid;
	__u32 kind; /* enum iron_victim_kind */
	__u32 pad;
};

struct iron_charged {
	__u64 ns;
	__u64 softirqs;
};

#endif /* __HOPTRACE_IRON_H */
