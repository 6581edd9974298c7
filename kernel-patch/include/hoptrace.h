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
	/* Packet IDs: origin node salt in the top 8 bits, a per-trace sequence in
	 * the low 24 bits, so IDs of one origin never repeat within 16 M packets.
	 * ID 0 means "no ID". */
	HOPTRACE_ID_SEQ_BITS = 24,
	HOPTRACE_ID_SEQ_MASK = (1u << 24) - 1,
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
	/* socket-read hops: the record's ifindex holds the reading task's pid
	 * (tgid), not a device; the packet arrived on the device hops before. */
	HOPTRACE_F_TASK = 1 << 7,
};

/* One timestamp of one packet at one hop. 32 bytes, no padding. */
struct hoptrace_record {
	__u64 ts_ns;	  /* bpf_ktime_get_ns(): CLOCK_MONOTONIC of the node */
	__u32 packet_id;  /* never 0 in a record */
	__u32 flow_hash;  /* hash of the innermost 5-tuple: equal at every hop */
	__u32 ifindex;	  /* device the packet was seen on (its own netns); with
			     HOPTRACE_F_TASK the reading task's pid instead */
	__u32 wire_len;	  /* skb/frame length at this hop, L2 included when present */
	__u16 hop_index;  /* index in the trace's path */
	__u16 trace_slot; /* agent-local number of the trace */
	__u16 cpu;
	__u16 flags; /* enum hoptrace_record_flag */
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
	HOPTRACE_C_MAX,
};

/*
 * The field catalogue of hop actions (count by FIELD, histogram: FIELD): the
 * one list. Go (record.Field*), Python (hoptrace.kernel_abi.FIELDS) and the
 * proto's enum Field are generated from it (make vocab). Which attach kinds
 * can give each field is hoptrace.dispatcher.actions.FIELD_AVAILABILITY,
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
	HOPTRACE_FIELD_MAX,
};

/* prev_ts key: a packet of one trace on this node. */
struct hoptrace_prev_ts_key {
	__u32 packet_id;
	__u16 trace_slot;
	__u16 pad;
};

#endif /* __HOPTRACE_H */
