// Package collector streams the agent's record batches to the collector
// (hoptrace.v1.Collector/StreamRecords). Batches wait in the bounded queue
// while the collector is away; the client reconnects with backoff forever.
package collector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hoptrace/hoptrace/agent/internal/backoff"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	"github.com/hoptrace/hoptrace/agent/internal/tracer"
)

// Client sends batches from Queue, and every CountersEvery the cumulative
// counters of every running trace.
type Client struct {
	Addr          string
	Node          string
	Queue         *stream.Queue
	Counters      func() []tracer.TraceCounters
	CountersEvery time.Duration
	Log           *slog.Logger
	// DialOptions override the insecure default (tests).
	DialOptions []grpc.DialOption

	seq uint64
}

// Run streams until ctx ends, reconnecting after every failure.
func (c *Client) Run(ctx context.Context) error {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.CountersEvery <= 0 {
		c.CountersEvery = time.Second
	}
	opts := c.DialOptions
	if opts == nil {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(c.Addr, opts...)
	if err != nil {
		return fmt.Errorf("collector %s: %w", c.Addr, err)
	}
	defer conn.Close()
	client := pb.NewCollectorClient(conn)
	bo := backoff.Backoff{}
	for {
		sent, err := c.stream(ctx, client)
		if ctx.Err() != nil || errors.Is(err, errStopped) {
			return nil
		}
		if sent > 0 {
			bo.Reset()
		}
		c.Log.Warn("collector stream ended, reconnecting", "addr", c.Addr, "err", err)
		if !bo.Sleep(ctx) {
			return nil
		}
	}
}

// MonotonicToRealtime is CLOCK_REALTIME - CLOCK_MONOTONIC now: a record's
// ts_ns (bpf_ktime_get_ns) plus this is the node's wall clock.
func MonotonicToRealtime() int64 {
	var mono, real unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono)
	_ = unix.ClockGettime(unix.CLOCK_REALTIME, &real)
	return real.Nano() - mono.Nano()
}

func (c *Client) batch(trace string, gen uint64, records []byte, seq uint64) *pb.RecordBatch {
	if seq == 0 {
		c.seq++
		seq = c.seq
	}
	return &pb.RecordBatch{
		Node: c.Node, Trace: trace, Generation: gen, BatchSeq: seq,
		Records: records, RecordSize: record.Size,
		AgentDropped: c.Queue.Dropped(),
		Clock:        &pb.NodeClock{MonotonicToRealtimeNs: MonotonicToRealtime()},
	}
}

// stream runs one StreamRecords call; it returns how many batches it sent.
func (c *Client) stream(ctx context.Context, client pb.CollectorClient) (int, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := client.StreamRecords(sctx)
	if err != nil {
		return 0, err
	}
	sent := 0
	// A successful Send only means the message is buffered: batches sent
	// just before the connection died may never arrive. Keep the last ones
	// and resend them (same batch_seq) on the next stream.
	var inflight []*stream.Batch
	requeue := func() {
		for i := len(inflight) - 1; i >= 0; i-- {
			c.Queue.PushFront(inflight[i])
		}
		inflight = nil
	}
	send := func(b *pb.RecordBatch) error {
		if err := st.Send(b); err != nil {
			if errors.Is(err, io.EOF) {
				// The real error comes from RecvMsg.
				_, err = st.CloseAndRecv()
			}
			return err
		}
		sent++
		return nil
	}
	sendCounters := func() error {
		if c.Counters == nil {
			return nil
		}
		for _, tc := range c.Counters() {
			b := c.batch(tc.Trace, tc.Generation, nil, 0)
			b.Counters = tc.Hops
			if err := send(b); err != nil {
				return err
			}
		}
		return nil
	}
	if err := sendCounters(); err != nil {
		return sent, err
	}
	next := time.Now().Add(c.CountersEvery)
	for {
		wait := time.Until(next)
		pctx, pcancel := context.WithTimeout(ctx, max(wait, time.Millisecond))
		b := c.Queue.Pop(pctx)
		pcancel()
		if ctx.Err() != nil {
			if b != nil {
				c.Queue.PushFront(b)
			}
			_, err := st.CloseAndRecv()
			return sent, err
		}
		if err := sctx.Err(); err != nil {
			requeue()
			return sent, err
		}
		if b != nil {
			m := c.batch(b.Trace, b.Generation, b.Records, b.Seq)
			b.Seq = m.BatchSeq
			if err := send(m); err != nil {
				inflight = append(inflight, b)
				requeue()
				return sent, err
			}
			inflight = append(inflight, b)
			if len(inflight) > maxInflight {
				inflight = inflight[1:]
			}
		}
		if !time.Now().Before(next) {
			if err := sendCounters(); err != nil {
				requeue()
				return sent, err
			}
			next = time.Now().Add(c.CountersEvery)
		}
		if b == nil && c.Queue.Closed() {
			// The agent is stopping and everything was sent.
			if err := sendCounters(); err != nil {
				return sent, err
			}
			_, err := st.CloseAndRecv()
			if err != nil {
				requeue()
			}
			return sent, errDone(err)
		}
	}
}

// maxInflight bounds the batches kept for a resend after a broken stream.
const maxInflight = 64

// errStopped: the queue is closed and drained; Run returns.
var errStopped = errors.New("queue closed")

func errDone(err error) error {
	if err != nil {
		return err
	}
	return errStopped
}
