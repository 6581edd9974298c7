package collector

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	"github.com/hoptrace/hoptrace/agent/internal/tracer"
	"github.com/hoptrace/hoptrace/agent/internal/transport"
)

type sink struct {
	pb.UnimplementedCollectorServer
	mu      sync.Mutex
	batches []*pb.RecordBatch
}

func (s *sink) StreamRecords(st pb.Collector_StreamRecordsServer) error {
	for {
		b, err := st.Recv()
		if err == io.EOF {
			return st.SendAndClose(&pb.StreamSummary{})
		}
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.batches = append(s.batches, b)
		s.mu.Unlock()
	}
}

func (s *sink) records() (n int, withCounters int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.batches {
		n += len(b.GetRecords()) / int(b.GetRecordSize())
		if len(b.GetCounters()) > 0 {
			withCounters++
		}
	}
	return
}

func serve(t *testing.T, addr string) (*grpc.Server, *sink, string) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	s := &sink{}
	pb.RegisterCollectorServer(srv, s)
	go srv.Serve(lis)
	return srv, s, lis.Addr().String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestClientStreamsAndReconnects(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv, s, addr := serve(t, "127.0.0.1:0")
	q := stream.NewQueue(0)
	counters := func() []tracer.TraceCounters {
		return []tracer.TraceCounters{{Trace: "t", Generation: 1, Hops: []*pb.HopCounters{{Hop: "h", Values: []uint64{3}}}}}
	}
	// Each message a clock of its own (a new estimate, or a new sample of CLOCK_REALTIME - CLOCK_MONOTONIC).
	var clocks atomic.Int64
	clock := func(int64) *pb.NodeClock {
		return &pb.NodeClock{MonotonicToRealtimeNs: 1, OffsetNs: clocks.Add(1)}
	}
	c := &Client{Addr: addr, Batcher: transport.Batcher{Node: "n1", Queue: q, Counters: counters, CountersEvery: 50 * time.Millisecond, Clock: clock}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	q.Push(&stream.Batch{Trace: "t", Generation: 1, Records: make([]byte, 3*record.Size)})
	waitFor(t, "3 records and counters", func() bool { n, wc := s.records(); return n == 3 && wc >= 2 })
	s.mu.Lock()
	var b *pb.RecordBatch
	for _, x := range s.batches {
		if len(x.Records) > 0 {
			b = x
		}
	}
	s.mu.Unlock()
	if b.GetNode() != "n1" || b.GetRecordSize() != 32 || b.GetClock().GetOffsetNs() <= 0 || b.GetBatchSeq() == 0 {
		t.Fatalf("batch %v", b)
	}

	// Collector down: batches wait in the queue, then arrive after reconnect.
	srv.Stop()
	q.Push(&stream.Batch{Trace: "t", Generation: 1, Records: make([]byte, 5*record.Size)})
	time.Sleep(200 * time.Millisecond)
	srv2, s2, _ := serve(t, addr)
	defer srv2.Stop()
	// The batch sent while the collector went down arrives after the
	// reconnect; batches that may have been lost are resent with their
	// batch_seq, so the collector can drop duplicates.
	waitFor(t, "records after reconnect", func() bool {
		s2.mu.Lock()
		defer s2.mu.Unlock()
		for _, x := range s2.batches {
			if len(x.GetRecords()) == 5*record.Size {
				return true
			}
		}
		return false
	})
	s.mu.Lock()
	seqs := map[uint64]int{}
	firstClock := map[uint64]int64{}
	for _, x := range s.batches {
		if len(x.GetRecords()) > 0 {
			seqs[x.GetBatchSeq()] = len(x.GetRecords())
			firstClock[x.GetBatchSeq()] = x.GetClock().GetOffsetNs()
		}
	}
	s.mu.Unlock()
	s2.mu.Lock()
	resentSame := false
	for _, x := range s2.batches {
		n, ok := seqs[x.GetBatchSeq()]
		if ok && n != len(x.GetRecords()) {
			t.Errorf("batch_seq %d reused for a different batch", x.GetBatchSeq())
		}
		// The 3-record batch the first collector got is sent again with its
		// batch_seq (the collector's dedupe key is (node, batch_seq)) and the
		// clock it was first sent with: a restarted collector maps its
		// records onto the same master times.
		resentSame = resentSame || (ok && n == 3*record.Size)
		if ok && x.GetClock().GetOffsetNs() != firstClock[x.GetBatchSeq()] {
			t.Errorf("batch_seq %d resent with clock %d, first sent with %d", x.GetBatchSeq(),
				x.GetClock().GetOffsetNs(), firstClock[x.GetBatchSeq()])
		}
	}
	s2.mu.Unlock()
	if !resentSame {
		t.Error("batches of the broken stream were not resent with their batch_seq")
	}
	st := c.Stats()
	if st.BatchesResent == 0 || st.Streams < 2 || st.RecordsSent < 8 {
		t.Errorf("stats %+v", st)
	}
	// A restarted agent (a new Client) never reuses its predecessor's
	// batch_seq values.
	var maxSeq uint64
	for seq := range seqs {
		maxSeq = max(maxSeq, seq)
	}
	c2 := &Client{Batcher: transport.Batcher{Node: "n1", Queue: q}}
	if first := c2.NextSeq(); first <= maxSeq {
		t.Errorf("restarted agent's first batch_seq %d <= previous run's %d", first, maxSeq)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
