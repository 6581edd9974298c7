"""What the collector stores in InfluxDB: measurement names, tag values and field prefixes, defined once.

The exporter (`influx.py`) writes these names, the read side (`hoptrace.results.store`) queries them, and
the Grafana dashboards (deploy/) use them: a contract.

* `segment_stats` - per trace, segment, interval (1 s, time = window start) and collector. Tags `trace`,
  `segment` ("from>to", or `end_to_end`), `from_hop`, `to_hop`, `collector` (the writing collector's
  `--instance`: windows of one trace, segment and second from several collectors are separate points that
  add up, never overwrite each other). Mergeable fields, which the report and the dashboards sum over time
  and collectors: `count`, `sum_ns`, `min_ns`, `max_ns`, `below_bound_count` (ints), the latency sketch
  `bp<k>`/`bn<k>`/`bz` and the jitter's `jitter_sum_ns`, `jitter_count` and sketch `jp<k>`/`jz` (bucket
  counts, `sketch.py`). Window-only fields (exact over this window and collector): `mean_ns` (float),
  `p50_ns`, `p90_ns`, `p99_ns`, `incomplete` (ints). Segment `end_to_end` (first hop -> last hop of the path)
  also carries `packets` (packets joined in the window) and `complete` (packets seen at every hop).
  vNetTracer's metrics (`aggregate.py` says how): `from_count` (N_i, packets seen at from_hop), `loss_count`,
  `loss_rate` (float), `tracer_lost` (records the tracer lost, never in loss_count), `before_attach`
  (packets seen at from_hop that passed to_hop before it was attached, never in loss_count; written only
  when not 0), `jitter_ns` (float),
  `jitter_p99_ns`, `same_node` (bool: both hops on one node, the latency is that node's processing time),
  `below_clock_bound` (bool: median latency below the two nodes' clock bounds), `below_bound_count` and
  `clock_bound_ns` (the sum of the two nodes' clock bounds, the largest in the window; 0 on one node).
* `segment_drops` - a trace with `drops: true`: per trace, segment (end_to_end too), interval, collector,
  node, reason and function, the lost packets that node's kernel reported dropping (skb:kfree_skb) for that
  reason in that function. Tags `trace`, `segment`, `node`, `reason` (enum skb_drop_reason's name on that
  node's kernel without SKB_DROP_REASON_, e.g. `NETFILTER_DROP`), `function` (the kernel function that freed
  them, from the node's kallsyms, e.g. `nft_do_chain`; `unknown` where its agent could not read kallsyms;
  absent from an older agent's), `collector`; int field `count`. Time: the window's start, as
  `segment_stats`; written only for windows with drops.
* `hop_latency` - exemplars: one point per segment of the packets kept as examples (`AggregateConfig`: the
  slowest few per trace and window, and 1 in N by packet ID). Tags `trace`, `segment` ("from>to"),
  `from_hop`, `to_hop`, `from_node`, `to_node`; fields `latency_ns` (int), `packet_id` (int), and
  `below_clock_bound` (bool, written only when true: a cross-node latency below the clocks' alignment
  bound, e.g. negative). Time: the packet's master time at `from_hop`. Each exemplar seen at the first and
  last hop of the path also gets a point with segment `end_to_end` (from_hop = first hop, to_hop = last
  hop). InfluxDB keeps one point per measurement + tag set + timestamp, so two packets of a segment seen at
  the same nanosecond would overwrite each other. The packet ID is NOT a tag (one series per packet would
  explode the series index); instead the exporter moves a colliding point's timestamp forward by 1 ns until
  it is unused in that series (`influx.TimestampDeduper`). `latency_ns` is never changed.
* `hop_counters` - per trace, hop, node and interval. Tags `trace`, `hop`, `node`, and for a hop whose
  spec named its netns by a workload (`netns: container:NAME` or `pod:NAMESPACE/NAME`) `container` (the
  Docker container's name) and `pod` (`namespace/name`, when the container is a pod's); int fields `matched`,
  `tagged`, `untagged`, `parse_errors`, `lost_events`, `bytes` (deltas of the agent's counters over the
  interval), and from the records themselves `packets` (int), `packets_per_s`, `bytes_per_s` (floats; bytes
  without hoptrace's ID). The two groups are separate points of the same series and time (InfluxDB merges
  the fields).
* `node_clock` - per node, each time a new clock estimate arrives (at most 1/s). Tag `node`; fields
  `offset_ns`, `delay_ns`, `bound_ns` (ints), `drift_ppm` (float), and with an estimate whose offset jumped
  beyond its bounds (`clock.py`: at once, whatever the rate) `jump_ns` and `jump_allowed_ns` (ints). Time:
  master time of arrival.
* `tracer_loss` - records the tracer lost, per interval. Tags `trace`, `node`, `hop` (absent for a node-wide
  loss), `reason` (`ringbuf_full`, `agent_dropped`, `collector_cut`); int field `records`.
* `hop_counts`, `hop_histogram`, `hop_recorded` - hops' in-kernel count, histogram and record actions
  (`actions.py`).
* `hop_addresses` - what each hop saw of the packets that describe their addresses (one in 64, by ID:
  `addresses.py`), as those packets settle. Tags `trace`, `hop`, `protocol` (`tcp`, `udp` or the number),
  `source` (the address: clients' ports vary), `destination` ("address:port", "[v6]:port"); int field
  `packets` (since the previous point of the series). Time: master time when they settled.
* `address_translations` - where two consecutive hops of such a packet saw different tuples. Tags `trace`,
  `from_hop`, `to_hop`, `kind` (`dnat`, `snat`, `dnat+snat`), `before`, `after` (what changed: "address:port",
  the address alone when the port stayed, both ends "src > dst" for `dnat+snat`); int field `packets`.
* `hop_capture` - a hop's `capture: N` action (`captures.py`): one point per traced packet the hop saw. Tags
  `trace`, `hop`, `node`; fields `packet_id`, `wire_len` (the packet's length from its first byte on),
  `link_type` (pcap's LINKTYPE_*: 1 Ethernet, 101 raw IP), all ints, and `bytes` (string: the first bytes,
  base64). Time: the record's master time. At most `CaptureConfig.per_trace_per_s` points per trace and
  second (every hop's count); the rest are dropped and counted. Two packets at one hop and nanosecond would
  share a point: the later overwrites.
* `event_counts`, `event_histogram`, `event_recorded`, `event_latency_missed` - a spec's event probes
  (`events.py`).

Tags with an empty value are left out (line protocol does not allow them).
"""

from __future__ import annotations

SEGMENT_STATS = "segment_stats"
SEGMENT_DROPS = "segment_drops"
HOP_LATENCY = "hop_latency"
HOP_COUNTERS = "hop_counters"
NODE_CLOCK = "node_clock"
TRACER_LOSS = "tracer_loss"
HOP_COUNTS = "hop_counts"
HOP_HISTOGRAM = "hop_histogram"
HOP_RECORDED = "hop_recorded"
HOP_ADDRESSES = "hop_addresses"
HOP_CAPTURE = "hop_capture"
ADDRESS_TRANSLATIONS = "address_translations"
EVENT_COUNTS = "event_counts"
EVENT_HISTOGRAM = "event_histogram"
EVENT_RECORDED = "event_recorded"
EVENT_LATENCY_MISSED = "event_latency_missed"

# The segment tag of the first hop -> last hop of a path.
END_TO_END = "end_to_end"
# The `by` tag of a count without `by` (hop_counts, event_counts).
TOTAL = "total"
# The quantiles of `segment_stats`'s p50_ns, p90_ns and p99_ns fields, and of the report.
QUANTILES = (0.5, 0.9, 0.99)
# Field prefixes of the two sketches in `segment_stats` (`sketch.LatencySketch.fields`): `bp<k>`, `bn<k>`,
# `bz` for latencies, `jp<k>`, `jz` for jitter.
LATENCY_PREFIX = "b"
JITTER_PREFIX = "j"
