package agent

import (
	"strconv"

	"github.com/hoptrace/hoptrace/agent/internal/clock"
	"github.com/hoptrace/hoptrace/agent/internal/collector"
	"github.com/hoptrace/hoptrace/agent/internal/kafka"
	"github.com/hoptrace/hoptrace/agent/internal/metrics"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/session"
	"github.com/hoptrace/hoptrace/agent/internal/signing"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	"github.com/hoptrace/hoptrace/agent/internal/tracer"
)

// parts are what /metrics reads from; nil members are left out.
type parts struct {
	mgr       *tracer.Manager
	queues    []*stream.Queue // every sink's queue (the printer's, the collector's or Kafka's)
	outQueue  *stream.Queue   // the one toward the collector or Kafka (else the printer's)
	clock     *clock.Node
	client    *collector.Client
	producer  *kafka.Producer
	session   *session.Session
	verifier  *signing.Verifier // nil: --insecure, nothing checked
	clockSync bool
}

func newRegistry(p parts) *metrics.Registry {
	r := &metrics.Registry{}
	read := func() (uint64, uint64) { return p.mgr.RecordsRead() }
	r.Counter("hoptrace_agent_records_read_total", "Records read from the ring buffer.",
		func() float64 { n, _ := read(); return float64(n) })
	r.Counter("hoptrace_agent_ring_holds_let_go_total", "Batches whose records the ring buffer stopped keeping before they were handed off (more than half the ring held behind, a collector away): a killed agent loses those; a restarted one takes the rest over from the pinned ring.",
		func() float64 { return float64(p.mgr.RingLetGo()) })
	if p.client != nil {
		r.Counter("hoptrace_agent_records_sent_total", "Records sent to the collector (resends included).",
			func() float64 { return float64(p.client.Stats().RecordsSent) })
		r.Counter("hoptrace_agent_batches_sent_total", "Record batches sent to the collector (resends included).",
			func() float64 { return float64(p.client.Stats().BatchesSent) })
		r.Counter("hoptrace_agent_batches_resent_total", "Batches sent again, with their batch_seq, after a broken stream.",
			func() float64 { return float64(p.client.Stats().BatchesResent) })
	}
	if p.producer != nil {
		ks := func() kafka.Stats { return p.producer.Stats() }
		r.Counter("hoptrace_agent_records_sent_total", "Records acknowledged by the Kafka brokers.",
			func() float64 { return float64(ks().RecordsSent) })
		r.Counter("hoptrace_agent_kafka_messages_sent_total", "Messages acknowledged by the Kafka brokers (a batch is split into one per partition).",
			func() float64 { return float64(ks().MessagesSent) })
		r.Counter("hoptrace_agent_kafka_heartbeats_total", "Heartbeats (counters, watermark, clock) published to every partition.",
			func() float64 { return float64(ks().Heartbeats) })
		r.Counter("hoptrace_agent_kafka_produce_errors_total", "Messages the brokers refused for good (their records are counted as dropped, reason kafka_refused).",
			func() float64 { return float64(ks().ProduceErrors) })
		r.Gauge("hoptrace_agent_kafka_buffered_bytes", "Bytes produced but not yet acknowledged (bounded by --kafka-buffer-bytes; beyond it the queue holds).",
			func() float64 { return float64(ks().BufferedBytes) })
		r.Gauge("hoptrace_agent_kafka_buffered_messages", "Messages produced but not yet acknowledged.",
			func() float64 { return float64(ks().BufferedRecords) })
		r.Gauge("hoptrace_agent_kafka_partitions", "Partitions of the topic as last read (0 = not known yet: records wait in the queue).",
			func() float64 { return float64(ks().Partitions) })
	}
	hooks := p.mgr.Hooks() // nil without --hooks: none attached, nothing missed
	r.Gauge("hoptrace_agent_hooks", "Hook programs attached (--hooks): a tc hook per device and direction the traces' tc hops are at, a tracepoint hook per device and event their tracepoint hops are at, a sock_ops hook per cgroup they tag TCP in.",
		func() float64 { n, _ := hooks.Stats(); return float64(n) })
	r.Counter("hoptrace_agent_hook_overflow_total", "Traces' hops the hooks did not run for a packet: more than 8 traces took it at a tc or tracepoint hook (those traces have no record of it there), or a socket's tagger was past the sock_ops hook's checks.",
		func() float64 { _, n := hooks.Stats(); return float64(n) })
	r.Gauge("hoptrace_agent_buffered_records", "Records on the node not yet acknowledged: the queue toward the collector or Kafka, plus records handed to the Kafka client and not yet acknowledged (`hoptrace agents`: BUFFERED).",
		func() float64 { return float64(transportStatus(p).GetBufferedRecords()) })
	r.Gauge("hoptrace_agent_queue_bytes", "Record bytes waiting for the collector.",
		func() float64 { _, b := p.outQueue.Len(); return float64(b) })
	r.Gauge("hoptrace_agent_queue_batches", "Batches waiting for the collector.",
		func() float64 { n, _ := p.outQueue.Len(); return float64(n) })
	r.Gauge("hoptrace_agent_queue_capacity_bytes", "Bound of the queue (--buffer-bytes).",
		func() float64 { return float64(p.outQueue.Max()) })
	r.Gauge("hoptrace_agent_queue_fill_ratio", "queue_bytes / queue_capacity_bytes.",
		func() float64 { _, b := p.outQueue.Len(); return float64(b) / float64(p.outQueue.Max()) })

	hops := func() []tracer.TraceCounters { return p.mgr.Counters() }
	r.CounterVec("hoptrace_agent_records_dropped_total",
		"Records lost, by reason: queue_full (the agent's bound, oldest dropped; each sink's queue counts its own), ringbuf_full (the kernel could not reserve; per-hop counters summed), unrouted (no running trace for the slot).",
		func() []metrics.Sample {
			var queued uint64
			for _, q := range p.queues {
				queued += q.Dropped()
			}
			var ring uint64
			for _, tc := range hops() {
				for _, h := range tc.Hops {
					if v := h.GetValues(); len(v) > int(record.CRingbufFull) {
						ring += v[record.CRingbufFull]
					}
				}
			}
			_, unrouted := read()
			var refused uint64
			if p.producer != nil {
				refused = p.producer.Stats().RecordsFailed
			}
			return []metrics.Sample{
				{Labels: []string{"reason", "kafka_refused"}, Value: float64(refused)},
				{Labels: []string{"reason", "queue_full"}, Value: float64(queued)},
				{Labels: []string{"reason", "ringbuf_full"}, Value: float64(ring)},
				{Labels: []string{"reason", "unrouted"}, Value: float64(unrouted)},
			}
		})
	r.CounterVec("hoptrace_agent_hop_events_total",
		"Per-hop BPF counters (enum hoptrace_counter) since the hop was attached.",
		func() []metrics.Sample {
			var out []metrics.Sample
			for _, tc := range hops() {
				for _, h := range tc.Hops {
					for i, v := range h.GetValues() {
						if i >= len(record.CounterKeys) {
							break
						}
						out = append(out, metrics.Sample{Labels: []string{"trace", tc.Trace, "hop", h.GetHop(),
							"hop_index", strconv.Itoa(int(h.GetHopIndex())), "counter", record.CounterKeys[i]},
							Value: float64(v)})
					}
				}
			}
			return out
		})
	if p.verifier != nil {
		r.CounterVec("hoptrace_agent_signature_refusals_total",
			"Dispatcher commands (and plan files) refused before anything was loaded, detached or run, by type (plan, remove, preset, command: one that does not parse) and reason: unsigned, node (signed for another), certificate (not of the trusted CA, expired), revoked (on the CA's CRL), role (not a dispatcher certificate), signature (bytes changed or forged), payload (malformed), expired (past its expiry or signed in the future, beyond --max-clock-skew), replayed (sequence or generation not newer than one taken).",
			func() []metrics.Sample {
				var out []metrics.Sample
				for _, r := range p.verifier.Refusals() {
					out = append(out, metrics.Sample{Labels: []string{"type", r.Type, "reason", string(r.Reason)}, Value: float64(r.Count)})
				}
				return out
			})
	}
	r.Gauge("hoptrace_agent_traces_active", "Traces attached on this node.",
		func() float64 { return float64(len(p.mgr.Running())) })

	if p.clock != nil {
		st := func() clock.Stats { return p.clock.Stats() }
		r.Gauge("hoptrace_agent_clock_mapping_gap_seconds", "Uncertainty of the last CLOCK_REALTIME - CLOCK_MONOTONIC reading.",
			func() float64 { return float64(st().MapGapNs) / 1e9 })
		if p.clockSync {
			r.Gauge("hoptrace_agent_clock_offset_seconds", "Node wall clock - collector clock (Cristian, min-delay probe of the last round).",
				func() float64 { return float64(st().Last.OffsetNs) / 1e9 })
			r.Gauge("hoptrace_agent_clock_bound_seconds", "Error bound of the offset (delay/2).",
				func() float64 { return float64(st().Last.BoundNs) / 1e9 })
			r.Gauge("hoptrace_agent_clock_delay_seconds", "Round-trip delay of the min-delay probe.",
				func() float64 { return float64(st().Last.DelayNs) / 1e9 })
			r.Gauge("hoptrace_agent_clock_drift_ppm", "Drift of the offset, least squares over the last rounds.",
				func() float64 { return st().DriftPPM })
			r.Counter("hoptrace_agent_clock_rounds_total", "Clock rounds that got an estimate.",
				func() float64 { return float64(st().Rounds) })
			r.Counter("hoptrace_agent_clock_round_failures_total", "Clock rounds with no answer.",
				func() float64 { return float64(st().RoundFailures) })
			r.Gauge("hoptrace_agent_clock_authenticated", "1 when clock rounds are authenticated (HMAC and nonce), 0 for plain NTP.",
				func() float64 { return b2f(st().Authenticated) })
			if p.clock.Stats().Authenticated {
				r.Gauge("hoptrace_agent_clock_key_valid", "1 while the node holds a current clock key (without one no round runs).",
					func() float64 { return b2f(st().KeyValid) })
				r.CounterVec("hoptrace_agent_clock_replies_refused_total",
					"Clock replies refused, never used, by reason: unauthenticated (no MAC), key (another key_id), mac (forged, or its times or nonce rewritten), nonce (authentic but answering another probe: late, or played again), malformed.",
					func() []metrics.Sample {
						var out []metrics.Sample
						for _, reason := range []string{clock.RefusedUnauthenticated, clock.RefusedKey, clock.RefusedMAC, clock.RefusedNonce, clock.RefusedMalformed} {
							out = append(out, metrics.Sample{Labels: []string{"reason", reason}, Value: float64(st().Refused[reason])})
						}
						return out
					})
			}
		}
	}
	r.CounterVec("hoptrace_agent_reconnects_total", "Connections made again after the first, per peer.",
		func() []metrics.Sample {
			var out []metrics.Sample
			if p.session != nil {
				out = append(out, metrics.Sample{Labels: []string{"peer", "dispatcher"}, Value: float64(again(p.session.Registrations()))})
			}
			if p.client != nil {
				out = append(out, metrics.Sample{Labels: []string{"peer", "collector"}, Value: float64(again(p.client.Stats().Streams))})
			}
			return out
		})
	r.GaugeVec("hoptrace_agent_connected", "1 while the peer's stream is up.",
		func() []metrics.Sample {
			var out []metrics.Sample
			if p.session != nil {
				out = append(out, metrics.Sample{Labels: []string{"peer", "dispatcher"}, Value: b2f(p.session.Connected())})
			}
			if p.client != nil {
				out = append(out, metrics.Sample{Labels: []string{"peer", "collector"}, Value: b2f(p.client.Stats().Connected)})
			}
			if p.producer != nil {
				out = append(out, metrics.Sample{Labels: []string{"peer", "kafka"}, Value: b2f(p.producer.Stats().Up)})
			}
			return out
		})
	return r
}

func again(n uint64) uint64 {
	if n == 0 {
		return 0
	}
	return n - 1
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
