// Package transport is what the agent's two senders of records share: the
// gRPC stream to a collector (internal/collector) and the Kafka producer
// (internal/kafka) take batches from the same kind of queue and send the same
// hoptrace.v1.RecordBatch messages, numbered, clocked and followed by the same
// heartbeats. Each sender keeps only its own connection.
package transport

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/clock"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	"github.com/hoptrace/hoptrace/agent/internal/tracer"
)

// Batcher turns the queued batches and the running traces' counters into
// RecordBatch messages. One sender goroutine uses it: it is not safe for
// concurrent use.
type Batcher struct {
	Node  string
	Queue *stream.Queue
	// Counters are the cumulative counters and event values of every running
	// trace, sent every CountersEvery (1 s when 0) as a heartbeat.
	Counters      func() []tracer.TraceCounters
	CountersEvery time.Duration
	// Clock gives the NodeClock sent with a batch whose records were taken
	// around CLOCK_MONOTONIC time mono (0 = now); nil = the host's
	// monotonic→realtime mapping only.
	Clock func(mono int64) *pb.NodeClock
	// Unqueued is the earliest CLOCK_MONOTONIC time a record not in the
	// queue yet may carry (the reader's, tracer.Manager.Unqueued); nil: now.
	Unqueued func() int64

	seq uint64
}

// Every is the heartbeat period: CountersEvery, or 1 s.
func (b *Batcher) Every() time.Duration {
	if b.CountersEvery <= 0 {
		return time.Second
	}
	return b.CountersEvery
}

// NextSeq is the batch_seq of a new message. The collector's dedupe key is
// (node, batch_seq): a message sent again keeps its number, so a copy that
// did arrive the first time is dropped there. The sequence starts at the
// agent's start time in ns and counts up by one, so a restarted agent never
// reuses the numbers of its previous run (that would take more than one
// batch per ns).
func (b *Batcher) NextSeq() uint64 {
	if b.seq == 0 {
		b.seq = uint64(time.Now().UnixNano())
	}
	b.seq++
	return b.seq
}

// Message builds the RecordBatch of one trace's records (and their
// trailers, if any) numbered seq, with the node's clock as of the records'
// middle and what the queue has dropped so far.
func (b *Batcher) Message(trace string, gen uint64, records []byte, tr stream.Trailers, seq uint64) *pb.RecordBatch {
	var clk *pb.NodeClock
	if b.Clock != nil {
		clk = b.Clock(midTimestamp(records))
	} else {
		clk = &pb.NodeClock{MonotonicToRealtimeNs: clock.SamplePair(1).MonotonicToRealtime}
	}
	m := &pb.RecordBatch{Node: b.Node, Trace: trace, Generation: gen, BatchSeq: seq,
		Records: records, RecordSize: record.Size, AgentDropped: b.Queue.Dropped(), Clock: clk}
	if len(tr.Values) > 0 {
		m.Values, m.ValueSize, m.Functions = tr.Values, record.ValuesSize, tr.Functions
	}
	if len(tr.Addresses) > 0 {
		m.Addresses, m.AddressesSize = tr.Addresses, record.AddressesSize
	}
	if len(tr.Captures) > 0 {
		m.Captures, m.CaptureSize = tr.Captures, record.CaptureSize
	}
	return m
}

// Heartbeats are one message per running trace, each numbered anew: its
// counters, its event probes' cumulative values and the node's watermark,
// with no records.
func (b *Batcher) Heartbeats() []*pb.RecordBatch {
	if b.Counters == nil {
		return nil
	}
	watermark := b.Watermark()
	var out []*pb.RecordBatch
	for _, tc := range b.Counters() {
		m := b.Message(tc.Trace, tc.Generation, nil, stream.Trailers{}, b.NextSeq())
		m.Counters = tc.Hops
		m.Events = tc.Events
		m.WatermarkNs = watermark
		out = append(out, m)
	}
	return out
}

// Pop waits for the next queued batch until the time of the next heartbeat
// (at least 1 ms); nil when none came, ctx ended or the queue is closed and
// empty.
func (b *Batcher) Pop(ctx context.Context, until time.Time) *stream.Batch {
	pctx, cancel := context.WithTimeout(ctx, max(time.Until(until), time.Millisecond))
	defer cancel()
	return b.Queue.Pop(pctx)
}

// readerSlack covers records read from the ring buffer but not yet in the
// queue (the reader flushes a batch at N records or after 100 ms).
const readerSlack = 250 * time.Millisecond

// Watermark is how recent every record this node has not sent yet is at
// least (CLOCK_MONOTONIC): the oldest queued record, else what the reader
// has not queued yet (Unqueued: records a stopped agent left in the ring
// are older than now), less what the reader may still hold. Heartbeats
// overtake the queue, so without it a collector would take their time as the
// node's progress and cut packets whose records still wait here.
func (b *Batcher) Watermark() int64 {
	upTo := clock.Monotonic()
	if b.Unqueued != nil {
		upTo = min(upTo, b.Unqueued())
	}
	wm := upTo - int64(readerSlack)
	if oldest, ok := b.Queue.OldestTs(); ok && oldest < wm {
		wm = oldest
	}
	return wm
}

// midTimestamp is the midpoint of the first and last record's ts_ns (0 for
// no records): the batch's clock is evaluated there, so a simulated drift
// skews each record as of when it was taken, not when it was sent.
func midTimestamp(records []byte) int64 {
	if len(records) < record.Size {
		return 0
	}
	first := int64(binary.LittleEndian.Uint64(records))
	last := int64(binary.LittleEndian.Uint64(records[len(records)-record.Size:]))
	return first + (last-first)/2
}
