package transport

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/clock"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	"github.com/hoptrace/hoptrace/agent/internal/tracer"
)

// packed returns records whose ts_ns are ts, in order.
func packed(ts ...int64) []byte {
	out := make([]byte, len(ts)*record.Size)
	for i, t := range ts {
		binary.LittleEndian.PutUint64(out[i*record.Size:], uint64(t))
	}
	return out
}

func TestNextSeqStartsAtStartTimeAndCountsUp(t *testing.T) {
	before := uint64(time.Now().UnixNano())
	b := &Batcher{}
	first := b.NextSeq()
	if first <= before {
		t.Fatalf("first batch_seq %d <= start time %d: a restarted agent could reuse it", first, before)
	}
	if second := b.NextSeq(); second != first+1 {
		t.Errorf("second batch_seq %d, want %d", second, first+1)
	}
}

// The clock is asked for the middle of the batch's records, and the message
// carries the queue's drops and the values with their size.
func TestMessageClockAtRecordsMiddle(t *testing.T) {
	q := stream.NewQueue(record.Size)
	q.Push(&stream.Batch{Records: packed(1, 2)}) // larger than the bound: dropped, counted
	var asked []int64
	b := &Batcher{Node: "n1", Queue: q, Clock: func(mono int64) *pb.NodeClock {
		asked = append(asked, mono)
		return &pb.NodeClock{OffsetNs: 7}
	}}
	tr := stream.Trailers{Values: make([]byte, record.ValuesSize), Addresses: make([]byte, 2*record.AddressesSize),
		Captures: make([]byte, 3*record.CaptureSize), Functions: map[uint64]string{7: "nft_do_chain"}}
	m := b.Message("t", 3, packed(1000, 1500, 3000), tr, 42)
	if len(asked) != 1 || asked[0] != 2000 {
		t.Errorf("clock asked at %v, want [2000] (between the first and last record)", asked)
	}
	if m.GetNode() != "n1" || m.GetTrace() != "t" || m.GetGeneration() != 3 || m.GetBatchSeq() != 42 ||
		m.GetRecordSize() != record.Size || len(m.GetRecords()) != 3*record.Size || m.GetClock().GetOffsetNs() != 7 {
		t.Errorf("message %v", m)
	}
	if m.GetAgentDropped() != 2 {
		t.Errorf("agent_dropped %d, want the queue's 2", m.GetAgentDropped())
	}
	if m.GetValueSize() != record.ValuesSize || len(m.GetValues()) != record.ValuesSize {
		t.Errorf("values %d bytes of size %d", len(m.GetValues()), m.GetValueSize())
	}
	if len(m.GetFunctions()) != 1 || m.GetFunctions()[7] != "nft_do_chain" {
		t.Errorf("functions %v, want the values' names", m.GetFunctions())
	}
	if m.GetAddressesSize() != record.AddressesSize || len(m.GetAddresses()) != 2*record.AddressesSize {
		t.Errorf("addresses %d bytes of size %d", len(m.GetAddresses()), m.GetAddressesSize())
	}
	if m.GetCaptureSize() != record.CaptureSize || len(m.GetCaptures()) != 3*record.CaptureSize {
		t.Errorf("captures %d bytes of size %d", len(m.GetCaptures()), m.GetCaptureSize())
	}
	if b.Message("t", 3, nil, stream.Trailers{}, 43); asked[1] != 0 {
		t.Errorf("a message without records asked the clock at %d, want 0 (now)", asked[1])
	}
}

func TestMessageWithoutClockMapsHostClock(t *testing.T) {
	b := &Batcher{Queue: stream.NewQueue(0)}
	got := b.Message("t", 1, nil, stream.Trailers{}, 1).GetClock().GetMonotonicToRealtimeNs()
	host := clock.SamplePair(5).MonotonicToRealtime
	if d := got - host; d < -int64(time.Millisecond) || d > int64(time.Millisecond) {
		t.Errorf("monotonic_to_realtime %d, host's %d", got, host)
	}
}

// Heartbeats carry each trace's counters and events with the watermark: the
// oldest queued record while one waits, else now minus the reader's slack.
func TestHeartbeatsCarryCountersAndWatermark(t *testing.T) {
	q := stream.NewQueue(0)
	hops := []*pb.HopCounters{{Hop: "h", Values: []uint64{3}}}
	events := []*pb.EventValues{{Event: "e", Seen: 4}}
	b := &Batcher{Node: "n1", Queue: q, Counters: func() []tracer.TraceCounters {
		return []tracer.TraceCounters{{Trace: "a", Generation: 1, Hops: hops, Events: events}, {Trace: "b", Generation: 2}}
	}}
	now := clock.Monotonic()
	beats := b.Heartbeats()
	after := clock.Monotonic()
	if len(beats) != 2 || beats[0].GetTrace() != "a" || beats[1].GetTrace() != "b" {
		t.Fatalf("heartbeats %v", beats)
	}
	if beats[0].GetCounters()[0].GetValues()[0] != 3 || beats[0].GetEvents()[0].GetSeen() != 4 || len(beats[0].GetRecords()) != 0 {
		t.Errorf("heartbeat %v", beats[0])
	}
	if beats[1].GetBatchSeq() != beats[0].GetBatchSeq()+1 {
		t.Errorf("batch_seq %d then %d: each heartbeat is numbered anew", beats[0].GetBatchSeq(), beats[1].GetBatchSeq())
	}
	if wm := beats[0].GetWatermarkNs(); wm < now-int64(readerSlack) || wm > after-int64(readerSlack) {
		t.Errorf("watermark %d with nothing queued, want %d..%d", wm, now-int64(readerSlack), after-int64(readerSlack))
	}
	q.Push(&stream.Batch{Trace: "a", Records: packed(now-int64(time.Hour), now)})
	if wm := b.Heartbeats()[0].GetWatermarkNs(); wm != now-int64(time.Hour) {
		t.Errorf("watermark %d, want the oldest queued record's %d", wm, now-int64(time.Hour))
	}
	if (&Batcher{}).Heartbeats() != nil {
		t.Error("heartbeats without a Counters function")
	}
}

// A stopped agent (SIGSTOP) leaves records in the ring that its reader has not read: the watermark
// stays at the reader's last pass, however late the heartbeat goes out, so the collector waits for them.
func TestWatermarkWaitsForWhatTheReaderHasNotRead(t *testing.T) {
	q := stream.NewQueue(0)
	lastPass := clock.Monotonic() - int64(5*time.Second)
	b := &Batcher{Queue: q, Unqueued: func() int64 { return lastPass }}
	if wm := b.Watermark(); wm != lastPass-int64(readerSlack) {
		t.Errorf("watermark %d, want the reader's last pass %d less the slack", wm, lastPass)
	}
	older := lastPass - 2*int64(readerSlack)
	q.Push(&stream.Batch{Records: packed(older)})
	if wm := b.Watermark(); wm != older {
		t.Errorf("watermark %d, want the oldest queued record %d", wm, older)
	}
	wm := (&Batcher{Queue: stream.NewQueue(0)}).Watermark()
	if now := clock.Monotonic(); wm > now-int64(readerSlack) || wm < lastPass {
		t.Errorf("without a reader: watermark %d, want now %d less the slack", wm, now)
	}
}
