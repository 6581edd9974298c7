/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Path discovery (hoptrace discover): the record of one device crossing.
 * Go mirror: agent/internal/preset/discover.go (DecodeCrossing), checked
 * against this object's BTF by discover_test.go.
 */
#ifndef __HOPTRACE_DISCOVER_H
#define __HOPTRACE_DISCOVER_H

enum hoptrace_direction {
	HOPTRACE_DIR_INGRESS = 1, /* net:netif_receive_skb: the device received the packet */
	HOPTRACE_DIR_EGRESS = 2,  /* net:net_dev_queue: the device is about to send it */
};

/* One tagged packet crossing one device. 32 bytes, no padding. */
struct hoptrace_crossing {
	__u64 ts_ns;	 /* bpf_ktime_get_ns(): CLOCK_MONOTONIC of the node */
	__u32 packet_id; /* never 0 */
	__u32 flow_hash; /* as in struct hoptrace_record */
	__u32 ifindex;	 /* the device, in its own netns */
	__u32 netns_ino; /* inode of the device's netns (nsfs), one the agent owns */
	__u32 wire_len;	 /* skb length from the parse start, L2 included when present */
	__u8 direction;	 /* enum hoptrace_direction */
	__u8 pad;
	__u16 flags; /* enum hoptrace_record_flag */
};

#endif /* __HOPTRACE_DISCOVER_H */
