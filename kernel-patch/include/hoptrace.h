/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The one definition of every shape that crosses the kernel/user boundary.
 * Go (agent/internal/record/record_gen.go), Python (hoptrace.kernel_abi) and
 * the proto's enum Counter are generated from this object's BTF by
 * agent/cmd/vocabgen (make vocab); make proto-check fails when they are
 * stale, and tests compare them with the BTF again.
 */
#ifndef __HOPTRACE_H
#define __HOPTRACE_H

/* Wire and ID constants. An enum rather than #defines so they reach the
 * object's BTF, from which agent/cmd/vocabgen generates the Go and Python
 * mirrors (make vocab). */
enum hoptrace_wire {
	/* RFC 6994: experimental TCP option 253 carrying a 16-bit ExID. */
	HOPTRACE_TCPOPT_KIND = 253,
	HOPTRACE_TCPOPT_EXID = 0x4854, /* "HT" */
	HOPTRACE_TCPOPT_LEN = 8,       /* kind, len, ExID(2), packet ID(4) */
	/* UDP: the ID is the 4-byte surplus area after the UDP length (RFC 9868). */
	HOPTRACE_UDP_ID_LEN = 4,
	HOPTRACE_VXLAN_PORT = 4789,
	HOPTRACE_GENEVE_PORT = 6081,
	/* Packet IDs: the trace's origin in the top 8 bits (the dispatcher gives
	 * each applied trace its own), a per-trace sequence in the low 24 bits, so
	 * IDs of one origin never repeat within 16 M packets. ID 0 means "no ID". */
	HOPTRACE_ID_SEQ_BITS = 24,
	HOPTRACE_ID_SEQ_MASK = (1u << 24) - 1,
	/* Origins the dispatcher gives applied traces: 1..this. The ones above
	 * are presets' and standalone plans', by node name: their IDs never pass
	 * for an applied trace's at a hop that follows IDs (follow_origin). */
	HOPTRACE_TRACE_ORIGINS = 239,
	/* Hops in one trace's path (hop_index < this): the dispatcher refuses
	 * longer paths and the collector keeps per-packet join state bounded. */
	HOPTRACE_MAX_HOPS = 64,
	/* Hop actions' maps. log2 buckets: bucket b holds values in
	 * [2^(b-1), 2^b - 1], bucket 0 holds 0, so 65 cover every u64. */
	HOPTRACE_HIST_BUCKETS = 65,
	/* Distinct keys of one hop's count by FIELD; a key beyond them is
	 * counted in HOPTRACE_C_COUNT_KEYS_FULL. */
	HOPTRACE_COUNT_KEYS = 1024,
	/* Packets whose last timestamp on a node is remembered for the latency
	 * field (LRU, one map per agent; misses: HOPTRACE_C_LATENCY_MISS). */
	HOPTRACE_PREV_TS_ENTRIES = 65536,
	/* Event probes (event.bpf.h): predicate terms of one event's where:
	 * (unrolled), values of one `in [..]` term, and the highest byte offset
	 * of an argument in a tracepoint's record (tracefs format). */
	HOPTRACE_EVENT_TERMS = 4,
	HOPTRACE_EVENT_IN_VALUES = 8,
	HOPTRACE_EVENT_ARGS_BYTES = 4096,
	/* Where an event's arguments come from (event.bpf.h's ev_source): a
	 * tracepoint's record (offsets from tracefs), or a kernel function's
	 * first HOPTRACE_EVENT_FUNCTION_ARGS arguments (arg0.., by index) at a
	 * kprobe or an fentry. HOPTRACE_EVENT_ARG_PID as an argument's offset
	 * is the current task's process id instead (function events' pid). */
	HOPTRACE_EVENT_SOURCE_TRACEPOINT = 0,
	HOPTRACE_EVENT_SOURCE_KPROBE = 1,
	HOPTRACE_EVENT_SOURCE_FENTRY = 2,
	HOPTRACE_EVENT_FUNCTION_ARGS = 5,
	HOPTRACE_EVENT_ARG_PID = 0xffff,
	/* A where: term on a tracepoint's string argument (== or != a text of
	 * up to HOPTRACE_EVENT_TEXT_MAX characters, e.g. net_dev_xmit's name):
	 * where the record keeps the string (event.bpf.h's ev_term_text_kind). */
	HOPTRACE_EVENT_TEXT_MAX = 15,
	HOPTRACE_EVENT_TEXT_DATA_LOC =
	    1, /* __data_loc char[]: u32 len << 16 | offset in the record */
	HOPTRACE_EVENT_TEXT_REL_LOC =
	    2,			       /* __rel_loc char[]: the same, offset from the field's end */
	HOPTRACE_EVENT_TEXT_ARRAY = 3, /* char NAME[N]: the characters in the record itself */
	/* Fields one hop's record action carries per packet (struct hoptrace_values);
	 * also the arguments one event's record action keeps statistics of. */
	HOPTRACE_VALUES_MAX = 4,
	/* Event times remembered for a later event's latency (one LRU map per
	 * trace per node; a later event that finds none counts LATENCY_MISS). */
	HOPTRACE_EVENT_MARKS = 16384,
	/* One packet in this many of a trace carries the addresses every hop saw (struct
	 * hoptrace_addresses): the IDs whose sequence is 1 modulo it, so each hop describes the
	 * same packets and the collector compares them hop by hop (what a NAT rewrote, where). A
	 * power of two. */
	HOPTRACE_ADDRESSES_EVERY = 64,
	/* The capture action (capture: N): at most this many bytes of each traced packet, from the
	 * start of the frame as the hop sees it, ride with its record (struct hoptrace_capture). */
	HOPTRACE_CAPTURE_MAX = 128,
	/* struct hoptrace_capture's link_type: pcap's LINKTYPE_* of its first byte (tcpdump.org's
	 * link-layer header types), so a pcap writer needs no table. */
	HOPTRACE_CAPTURE_LINK_ETHERNET = 1, /* tc, xdp, kernel hops of an skb with a MAC header */
	HOPTRACE_CAPTURE_LINK_RAW = 101,    /* cgroup hops, kernel hops of an skb without one: IP */
};

/* record.flags */
enum hoptrace_record_flag {
	HOPTRACE_F_IPV6 = 1 << 0,
	HOPTRACE_F_TCP = 1 << 1,
	HOPTRACE_F_UDP = 1 << 2,
	HOPTRACE_F_ENCAP_VXLAN = 1 << 3,  /* ID found inside a VXLAN packet */
	HOPTRACE_F_ENCAP_GENEVE = 1 << 4, /* ID found inside a Geneve packet */
	HOPTRACE_F_TAGGED_HERE = 1 << 5,  /* this hop wrote the ID */
	HOPTRACE_F_VLAN = 1 << 6,
	HOPTRACE_F_VALUES = 1 << 7, /* a struct hoptrace_values follows the record in its sample */
	/* socket-read hops: the record's ifindex holds the reading task's pid
	 * (tgid), not a device; the packet arrived on the device hops before. */
	HOPTRACE_F_TASK = 1 << 8,
	/* the packet's addresses or ports no longer match the filter (an address translation
	 * rewrote them): the hop took it by its ID, whose origin is the trace's */
	HOPTRACE_F_FOLLOWED = 1 << 9,
	/* a struct hoptrace_addresses follows the record (and its values) in its sample */
	HOPTRACE_F_ADDRESSES = 1 << 10,
	/* a struct hoptrace_capture follows the record (its values and addresses) in its sample */
	HOPTRACE_F_CAPTURE = 1 << 11,
	/* a tagged TCP skb whose wire segments this hop does not count (socket-read, a kernel hop's
	 * floor variant): the collector does not judge the packet's segments here */
	HOPTRACE_F_UNCOUNTED = 1 << 12,
};

/* One timestamp of one packet at one hop. 32 bytes, no padding. */
struct hoptrace_record {
	__u64 ts_ns;	  /* bpf_ktime_get_ns(): CLOCK_MONOTONIC of the node */
	__u32 packet_id;  /* never 0 in a record */
	__u32 flow_hash;  /* hash of the innermost 5-tuple as this hop saw it: equal at every
			     hop unless an address translation rewrote the packet */
	__u32 ifindex;	  /* device the packet was seen on (its own netns); with
			     HOPTRACE_F_TASK the reading task's pid instead */
	__u32 wire_len;	  /* skb/frame length at this hop, L2 included when present */
	__u16 hop_index;  /* index in the trace's path */
	__u16 trace_slot; /* agent-local number of the trace */
	__u16 cpu;
	__u16 flags; /* enum hoptrace_record_flag */
};

/* The record action's values (record: [FIELDS]): in the same ring buffer sample, right after the
 * struct hoptrace_record whose flags has HOPTRACE_F_VALUES. Self-describing, so the agent and the
 * collector need no plan to read it. 40 bytes, no padding. */
struct hoptrace_values {
	__u8 field[HOPTRACE_VALUES_MAX];  /* enum hoptrace_field of each value; NONE past count */
	__u32 count;			  /* values used */
	__u64 value[HOPTRACE_VALUES_MAX]; /* in the order of the hop's record: list */
};

/* The innermost 5-tuple as one hop saw it: in the same sample, after the record and its values,
 * when the record's flags has HOPTRACE_F_ADDRESSES. The parser's own layout (struct pkt_info
 * begins with it), so a hop copies it in one go. 40 bytes, no padding. */
struct hoptrace_addresses {
	__u32 saddr[4]; /* network order; IPv4 in saddr[0] */
	__u32 daddr[4];
	__u16 sport; /* host order */
	__u16 dport;
	__u8 proto;
	__u8 family; /* 4 or 6 */
	__u8 pad[2];
};

/* The capture action's bytes (capture: N): in the same sample, after the record, its values and its
 * addresses, when the record's flags has HOPTRACE_F_CAPTURE. bytes[captured..] are not the packet's
 * (the hop writes only the first captured ones; the agent zeroes the rest before they leave the
 * node). 136 bytes, no padding. */
struct hoptrace_capture {
	__u32 wire_len; /* the packet's length from bytes[0] on (pcap's original length) */
	__u16
	    captured; /* bytes[0..captured) are the packet's: min(N, its bytes the hop can read) */
	__u16 link_type; /* HOPTRACE_CAPTURE_LINK_*: what bytes[0] begins */
	__u8 bytes[HOPTRACE_CAPTURE_MAX];
};

/* Per-hop counters: one per-CPU array entry per reason, summed by the agent.
 * The one list: Go, Python and the proto's enum Counter are generated from
 * it (make vocab), and the wire carries the values indexed by it. */
enum hoptrace_counter {
	HOPTRACE_C_SEEN = 0,	    /* every packet the hop program ran on */
	HOPTRACE_C_MATCHED,	    /* passed device, namespace and filter */
	HOPTRACE_C_RECORDED,	    /* a record went to the ring buffer */
	HOPTRACE_C_TAGGED,	    /* this hop wrote a new ID */
	HOPTRACE_C_UNTAGGED,	    /* matched, but carries no ID (sampled out, or not taggable) */
	HOPTRACE_C_TOO_BIG,	    /* would exceed the MTU with the ID: left untagged */
	HOPTRACE_C_GSO_SKIPPED,	    /* a GSO packet: not tagged (the ID would be copied to every
				       segment) */
	HOPTRACE_C_NOT_MATCHED,	    /* filtered out (device, namespace, flow) */
	HOPTRACE_C_PARSE_TRUNCATED, /* headers end before the packet says they do */
	HOPTRACE_C_PARSE_MALFORMED, /* impossible header values */
	HOPTRACE_C_PARSE_NON_IP,    /* not IPv4/IPv6 */
	HOPTRACE_C_RINGBUF_FULL,    /* record lost: ring buffer full */
	HOPTRACE_C_BYTES,	    /* wire bytes of matched packets */
	HOPTRACE_C_TAG_FAILED,	    /* a helper refused to grow or write the packet */
	HOPTRACE_C_LATENCY_MISS,    /* latency: no earlier timestamp of the packet on this node
				       (evicted from prev_ts, or that hop did not see it) */
	HOPTRACE_C_COUNT_KEYS_FULL, /* count by FIELD: a new key found count_keys full */
	/* socket-read (UDP, the 6.6+ queue pair): IDs dropped when a socket held more unread
	 * datagrams than its slots (their reads record nothing) */
	HOPTRACE_C_SOCK_READ_LOST,
	HOPTRACE_C_MAX,
};

/*
 * The field catalogue of hop actions (count by FIELD, histogram: FIELD): the
 * one list. Go (record.Field*), Python (hoptrace.kernel_abi.FIELDS) and the
 * proto's enum Field are generated from it (make vocab). Which attach kinds
 * can give each field is hoptrace.spec.actions.FIELD_AVAILABILITY,
 * checked against this list by tests.
 */
enum hoptrace_field {
	HOPTRACE_FIELD_NONE = 0,
	HOPTRACE_FIELD_CPU,	 /* bpf_get_smp_processor_id(): every hop */
	HOPTRACE_FIELD_LEN,	 /* the record's wire_len: every hop */
	HOPTRACE_FIELD_IFINDEX,	 /* the record's ifindex: every hop */
	HOPTRACE_FIELD_MARK,	 /* skb->mark: hops that see an sk_buff (not xdp) */
	HOPTRACE_FIELD_PRIORITY, /* skb->priority: hops that see an sk_buff (not xdp) */
	HOPTRACE_FIELD_LATENCY,	 /* ns since the previous hop of the same packet on the same node
				    (prev_ts); traced (ID-carrying) packets only */
	/* From the sk_buff, read with CO-RE; not at xdp (an XDP frame has no sk_buff). */
	HOPTRACE_FIELD_NETNS, /* inode of the network namespace of the skb's device */
	/* cgroup v2 id of the skb's socket (bpf_skb_cgroup_id: tc and cgroup hops); 0 without a
	 * local full socket, as at most ingress hops. */
	HOPTRACE_FIELD_CGROUP,
	HOPTRACE_FIELD_QUEUE_MAPPING, /* skb->queue_mapping: the device queue */
	HOPTRACE_FIELD_GSO_SEGS,      /* skb_shinfo(skb)->gso_segs; 0 without GSO */
	HOPTRACE_FIELD_GSO_SIZE, /* skb_shinfo(skb)->gso_size: bytes per segment; 0 without GSO */
	/* From the innermost IP/TCP header, as parse.bpf.h's parser found it: every hop. */
	HOPTRACE_FIELD_TOS,   /* IPv4 TOS / IPv6 traffic class (DSCP << 2 | ECN) */
	HOPTRACE_FIELD_TTL,   /* IPv4 TTL / IPv6 hop limit */
	HOPTRACE_FIELD_IP_ID, /* IPv4 identification; 0 for IPv6 */
	/* Byte 13 of the TCP header (CWR ECE URG ACK PSH RST SYN FIN); 0 if not TCP. */
	HOPTRACE_FIELD_TCP_FLAGS,
	HOPTRACE_FIELD_TCP_WINDOW, /* the TCP header's window, unscaled; 0 if not TCP */
	/* The process (tgid, as ps shows it) where a task is current: the sender at cgroup-egress
	 * (sendmsg -> ip_output), the reader at socket-read and uprobe hops; at tc, xdp and ingress
	 * hops the packet is handled in softirq or by a qdisc, and the current task is whoever was
	 * interrupted. Needs bpf_get_current_pid_tgid in cgroup_skb programs (the agent probes). */
	HOPTRACE_FIELD_PID,
	/* skb:kfree_skb's reason argument (enum skb_drop_reason; the event has it from 5.17). */
	HOPTRACE_FIELD_DROP_REASON,
	/* The TCP header's sequence and acknowledgment numbers, as on the wire; 0 if not TCP. */
	HOPTRACE_FIELD_TCP_SEQ,
	HOPTRACE_FIELD_TCP_ACK,
	/* socket-read hops: the receiving socket at the read. Bytes its receive queue holds
	 * (sk_rmem_alloc: TCP before this skb is copied, UDP after this datagram left it), and
	 * bytes in its backlog (sk_backlog.len: what arrived while the reader owned the socket). */
	HOPTRACE_FIELD_RMEM,
	HOPTRACE_FIELD_BACKLOG,
	/* socket-read and uprobe hops: the reading task's name (bpf_get_current_comm), its first
	 * 8 bytes as a little-endian u64 (NUL-padded); a key of count by, shown as the name. */
	HOPTRACE_FIELD_COMM,
	/* skb:kfree_skb's location argument: the return address in the kernel function that freed
	 * the packet (the caller of sk_skb_reason_drop). A drops: true hop records it beside
	 * drop_reason; the agent gives its function's name instead (its /proc/kallsyms symbol:
	 * record.FunctionID of the name in the value, the name beside it), never the address, which
	 * KASLR randomizes. */
	HOPTRACE_FIELD_DROP_FUNCTION,
	HOPTRACE_FIELD_MAX,
};

/*
 * The operators of an event's where: terms (events[i].where, event.bpf.h):
 * the one list. Go (record.EventOp*), Python (hoptrace.kernel_abi.EVENT_OPS)
 * and the proto's enum EventOp are generated from it (make vocab).
 */
enum hoptrace_event_op {
	HOPTRACE_EVENT_OP_NONE = 0,
	HOPTRACE_EVENT_OP_EQ,  /* arg == value */
	HOPTRACE_EVENT_OP_NE,  /* arg != value */
	HOPTRACE_EVENT_OP_LT,  /* arg < value (signed if the argument is) */
	HOPTRACE_EVENT_OP_GT,  /* arg > value (signed if the argument is) */
	HOPTRACE_EVENT_OP_BIT, /* (arg & value) != 0 */
	HOPTRACE_EVENT_OP_IN,  /* arg equals one of up to HOPTRACE_EVENT_IN_VALUES values */
	HOPTRACE_EVENT_OP_MAX,
};

/* What an event's count is keyed by (events[i].actions count by:). */
enum hoptrace_event_key {
	HOPTRACE_EVENT_KEY_TOTAL = 0, /* one total, key 0 */
	HOPTRACE_EVENT_KEY_CPU,	      /* bpf_get_smp_processor_id() */
	HOPTRACE_EVENT_KEY_ARG,	      /* an argument's value */
};

/* An event's record action (record: [ARGS]): per argument and CPU, what the
 * probe saw since it was attached; the agent sums count and sum (two's
 * complement for signed arguments), takes min and max, and the last value of
 * the CPU with the newest last_ns. */
struct hoptrace_event_stat {
	__u64 count;
	__u64 sum;
	__u64 min;
	__u64 max;
	__u64 last;
	__u64 last_ns;
};

/* event_marks key: one event's time, by the value of its key argument. */
struct hoptrace_event_mark_key {
	__u32 event_index; /* events[i] of the marking event */
	__u32 pad;
	__u64 value;
};

/* prev_ts key: a packet of one trace on this node. */
struct hoptrace_prev_ts_key {
	__u32 packet_id;
	__u16 trace_slot;
	__u16 pad;
};

#endif /* __HOPTRACE_H */
