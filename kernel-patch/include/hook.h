/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The hook program's shapes (hook.bpf.h, docs/design.md "Many traces on a device"): one program per
 * device and direction holds the traces that cross it in its maps. The agent writes a trace's
 * filter and settings into its slot, then its bits into the sets that find it.
 */
#ifndef __HOPTRACE_HOOK_H
#define __HOPTRACE_HOOK_H

enum hoptrace_hook_limits {
	HOPTRACE_HOOK_WORDS = 4,     /* u64 words of a struct hoptrace_trace_set */
	HOPTRACE_HOOK_SLOTS = 256,   /* trace slots: HOPTRACE_HOOK_WORDS * 64 */
	HOPTRACE_HOOK_MATCHED = 8,   /* hop bodies one packet runs at most; the rest counted */
	HOPTRACE_HOOK_ORIGINS = 256, /* origin_slots' entries: an ID's top 8 bits */
	/* the sock_ops hook's candidate filters checked a word for a socket's tagger; one left past
	 * them is counted at HOPTRACE_HOOK_C_OVERFLOW */
	HOPTRACE_HOOK_TAG_CHECKS = 16,
	/* hook_counters' entry (beside enum hoptrace_counter's SEEN, NOT_MATCHED, PARSE_*) of the
	 * traces a packet matched beyond HOPTRACE_HOOK_MATCHED, whose bodies did not run */
	HOPTRACE_HOOK_C_OVERFLOW = 17, /* HOPTRACE_C_MAX */
	HOPTRACE_HOOK_C_MAX,
};

/* A set of trace slots: bit s % 64 of w[s / 64]. */
struct hoptrace_trace_set {
	__u64 w[HOPTRACE_HOOK_WORDS];
};

/* The sets of the traces that take any source and any destination port, and of those that follow
 * IDs of their origin (follow_origin; origin_slots by origin): one entry. */
struct hoptrace_hook_wildcards {
	struct hoptrace_trace_set sport;
	struct hoptrace_trace_set dport;
	struct hoptrace_trace_set follow; /* every trace that follows IDs, of any origin */
};

/* A trace's filter, hop.bpf.h's filter_* constants: addresses and masks in network order, ports
 * in host order, 0 for any; netns_cookie, the sock_ops hook's (hop.bpf.h's tag_netns_cookie): the
 * sender's netns, 0 for any. */
struct hoptrace_hook_filter {
	__u32 src[4];
	__u32 src_mask[4];
	__u32 dst[4];
	__u32 dst_mask[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 family;
	__u8 pad[2];
	__u64 netns_cookie;
};

/* A trace's hop at this hook, hop.bpf.h's load-time constants of the same names. slot: the
 * trace's entry in the hook's maps (filters, settings, and the slot-indexed counters, id_state,
 * count_keys, hist_buckets); trace_slot: what its records carry. */
struct hoptrace_hook_settings {
	__u16 slot;
	__u16 hop_index;
	__u16 trace_slot;
	__u8 hop_tag_udp;
	__u8 id_origin;
	__u8 follow_origin;
	__u8 act_count;
	__u8 act_count_by;
	__u8 act_hist;
	__u8 act_record[4]; /* HOPTRACE_VALUES_MAX */
	__u8 act_prev_ts;
	__u8 act_capture;
	__u8 pad[2];
	__u32 sample_every;
};

/* count_keys' key at the hook: a trace's count by FIELD, keyed by its slot as well. */
struct hoptrace_hook_count_key {
	__u64 value;
	__u32 slot;
	__u32 pad;
};

#endif /* __HOPTRACE_HOOK_H */
