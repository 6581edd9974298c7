/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * MACE (Misa et al., "Measure the Added Container Expense"): the record and
 * counters shared by mace.bpf.c and agent/internal/preset (mace.go mirrors
 * them; a test compares that mirror with this object's BTF).
 */
#ifndef __HOPTRACE_MACE_H
#define __HOPTRACE_MACE_H

/* MACE's three event paths (the poster's Fig. 2). */
enum mace_path {
	MACE_PATH_INNER_DEV = 0, /* veth net_dev_xmit -> outer net_dev_xmit; outer rx -> veth rx */
	MACE_PATH_MAX_DEV = 1,	/* veth net_dev_queue -> outer xmit; earliest outer rx -> veth rx */
	MACE_PATH_SYSCALLS = 2, /* sendto/sendmsg -> outer xmit; outer rx -> recv* exit */
};

enum mace_direction {
	MACE_EGRESS = 1,
	MACE_INGRESS = 2,
};

/*
 * Packet keys, so packets pair without a tag:
 *  ICMP echo: MACE_KEY_ICMP | v6 << 40 | type << 32 | identifier << 16 | sequence (exact);
 *  anything else: a 63-bit hash of the invariant header fields (addresses,
 *  IPv4 ID, protocol, ports, TCP sequence or the first 8 UDP payload bytes).
 */
#define MACE_KEY_ICMP	 (1ULL << 63)
#define MACE_KEY_ICMP_V6 (1ULL << 40)

/* One packet's overhead: the container-side event and the outer device's. 32 bytes. */
struct mace_event {
	__u64 key;
	__u64 ts_start_ns; /* bpf_ktime_get_ns() at the path's first event */
	__u64 ts_end_ns;   /* and at its last */
	__u32 tid;	   /* thread at the container-side event (sender or receiver) */
	__u8 direction;	   /* enum mace_direction */
	__u8 proto;	   /* IP protocol of the innermost packet */
	__u16 cpu;	   /* CPU of the last event */
};

enum mace_counter {
	MACE_C_EGRESS_SEEN = 0,	 /* container packets at the egress path's first event */
	MACE_C_EGRESS_REPORTED,	 /* ... that reached the outer device: one record each */
	MACE_C_EGRESS_COLLISION, /* a key still pending when another packet brought it */
	MACE_C_INGRESS_SEEN,	 /* container packets at the ingress path's last event */
	MACE_C_INGRESS_REPORTED, /* ... whose outer device event was found: one record each */
	MACE_C_INGRESS_COLLISION,
	MACE_C_OUTER_EGRESS,  /* packets the outer device sent (any container) */
	MACE_C_OUTER_INGRESS, /* packets the outer device received (any container) */
	MACE_C_PARSE_ERROR,   /* not IP, truncated or malformed: no key */
	MACE_C_RINGBUF_FULL,  /* record lost */
	MACE_C_LINK_LOCAL,    /* events on link-local packets (ND, MLD, fe80::, 224.0.0.0/24): a
			       * router never forwards them to the outer device; not keyed */
	MACE_C_MAX,
};

#endif /* __HOPTRACE_MACE_H */
