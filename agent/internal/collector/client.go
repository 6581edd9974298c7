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
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hoptrace/hoptrace/agent/internal/backoff"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	"github.com/hoptrace/hoptrace/agent/internal/transport"
)

// Client sends the batches of its Batcher's queue, and every CountersEvery
// its heartbeats (every running trace's cumulative counters).
type Client struct {
	transport.Batcher
	Addr string
	Log  *slog.Logger
	// DialOptions override the insecure default (tests).
	DialOptions []grpc.DialOption
	// Creds are the transport credentials when DialOptions is nil (nil =
	// plaintext, --insecure): mutual TLS from internal/tlsconf.
	Creds credentials.TransportCredentials
	// Conn, when set, is the connection to stream on (NewConn; the caller
	// closes it): ClockKeys asks for clock keys over the same one.
	Conn *grpc.ClientConn

	recordsSent, batchesSent, batchesResent atomic.Uint64
	streams                                 atomic.Uint64
	connected                               atomic.Bool

	// sentClocks: the clock each batch kept for a resend was first sent
	// with, by batch_seq. A resend carries it again, so a collector that
	// restarted maps the resent records onto the very master times its
	// predecessor did: a point it writes again for them (an exemplar of a
	// window written just before the crash, whose written-before mark did
	// not move yet) is the same point, and overwrites itself. A fresh clock
	// moves them some ns: a second point. Only Run's goroutine uses it.
	sentClocks map[uint64]*pb.NodeClock
}

// Stats are the client's counters for /metrics.
type Stats struct {
	RecordsSent, BatchesSent, BatchesResent uint64
	// Streams started (the first and every reconnect).
	Streams   uint64
	Connected bool
}

// Stats returns the counters so far.
func (c *Client) Stats() Stats {
	return Stats{RecordsSent: c.recordsSent.Load(), BatchesSent: c.batchesSent.Load(),
		BatchesResent: c.batchesResent.Load(), Streams: c.streams.Load(), Connected: c.connected.Load()}
}

// Run streams until ctx ends, reconnecting after every failure.
func (c *Client) Run(ctx context.Context) error {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	conn := c.Conn
	if conn == nil {
		var err error
		if conn, err = NewConn(c.Addr, c.Creds, c.DialOptions); err != nil {
			return err
		}
		defer conn.Close()
	}
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

// NewConn is the agent's connection to the collector at addr (gRPC dials
// lazily, at the first call): creds (nil = plaintext), or opts instead.
func NewConn(addr string, creds credentials.TransportCredentials, opts []grpc.DialOption) (*grpc.ClientConn, error) {
	if opts == nil {
		if creds == nil {
			creds = insecure.NewCredentials()
		}
		opts = []grpc.DialOption{grpc.WithTransportCredentials(creds),
			// A fixed window (no BDP growth) bounds what the stream can
			// have accepted but the collector not yet consumed below what
			// the resend keeps (resendBytes).
			grpc.WithInitialWindowSize(streamWindow), grpc.WithInitialConnWindowSize(streamWindow)}
	}
	opts = append(slices.Clip(opts), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(newBatchCodec())))
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("collector %s: %w", addr, err)
	}
	return conn, nil
}

// stream runs one StreamRecords call; it returns how many batches it sent.
func (c *Client) stream(ctx context.Context, client pb.CollectorClient) (int, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := client.StreamRecords(sctx)
	if err != nil {
		return 0, err
	}
	c.streams.Add(1)
	c.connected.Store(true)
	defer c.connected.Store(false)
	sent := 0
	// A successful Send only means the message is buffered: batches sent
	// just before the connection died may never arrive (in the socket, in
	// the HTTP/2 window, in a collector that crashed before consuming them).
	// Keep the last ones and resend them (same batch_seq) on the next
	// stream; the collector drops the copies it already has by (node,
	// batch_seq). Only a clean end of the stream (the StreamSummary) says
	// everything arrived.
	var inflight []*stream.Batch
	inflightBytes := 0
	if c.sentClocks == nil {
		c.sentClocks = map[uint64]*pb.NodeClock{}
	}
	requeue := func() {
		for i := len(inflight) - 1; i >= 0; i-- {
			c.Queue.PushFront(inflight[i])
		}
		inflight, inflightBytes = nil, 0
	}
	keep := func(b *stream.Batch) {
		inflight = append(inflight, b)
		inflightBytes += len(b.Records)
		for len(inflight) > maxInflight && inflightBytes-len(inflight[0].Records) >= resendBytes {
			inflightBytes -= len(inflight[0].Records)
			delete(c.sentClocks, inflight[0].Seq)
			inflight[0].Release()
			inflight = inflight[1:]
		}
	}
	// forgetDropped drops the clocks of batches requeued and then dropped
	// by a full queue: once a new batch is sent, every requeued one still
	// there was popped before it (they are at the queue's front).
	forgetDropped := func() {
		if len(c.sentClocks) <= len(inflight) {
			return
		}
		kept := make(map[uint64]bool, len(inflight))
		for _, k := range inflight {
			kept[k.Seq] = true
		}
		for seq := range c.sentClocks {
			if !kept[seq] {
				delete(c.sentClocks, seq)
			}
		}
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
	// The trace generations this stream has sent a heartbeat of. A heartbeat names each hop's attach
	// time; records of a generation the collector has none of yet would move this node's watermark first,
	// and packets that passed a hop before it was attached (an agent restarted: no program watched) would
	// leave the join as lost. So a batch of a generation not announced yet waits for its heartbeat.
	announced := map[string]uint64{}
	sendCounters := func() error {
		for _, m := range c.Heartbeats() {
			if err := send(m); err != nil {
				return err
			}
			announced[m.GetTrace()] = m.GetGeneration()
		}
		return nil
	}
	if err := sendCounters(); err != nil {
		return sent, err
	}
	next := time.Now().Add(c.Every())
	for {
		b := c.Pop(ctx, next)
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
		if b != nil && announced[b.Trace] != b.Generation {
			if err := sendCounters(); err != nil {
				c.Queue.PushFront(b)
				requeue()
				return sent, err
			}
			next = time.Now().Add(c.Every())
			announced[b.Trace] = b.Generation // a removed trace's last batches: one heartbeat is enough
		}
		if b != nil {
			resend := b.Seq != 0
			if !resend {
				b.Seq = c.NextSeq()
			}
			m := c.Message(b.Trace, b.Generation, b.Records, b.Trailers, b.Seq)
			if first, ok := c.sentClocks[b.Seq]; ok {
				m.Clock = first // a resend: the clock it was first sent with (sentClocks)
			} else {
				c.sentClocks[b.Seq] = m.Clock
			}
			if err := send(m); err != nil {
				keep(b)
				requeue()
				return sent, err
			}
			b.Delivered() // its records may leave the ring buffer (a resend has them here)
			keep(b)
			if !resend {
				forgetDropped()
			}
			c.batchesSent.Add(1)
			c.recordsSent.Add(uint64(b.Count()))
			if resend {
				c.batchesResent.Add(1)
			}
		}
		if !time.Now().Before(next) {
			if err := sendCounters(); err != nil {
				requeue()
				return sent, err
			}
			next = time.Now().Add(c.Every())
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

// The batches kept for a resend after a broken stream: at least the last
// maxInflight, and at least resendBytes of records, which is more than the
// stream's flow-control window (streamWindow) lets be in flight.
const (
	maxInflight  = 64
	resendBytes  = 2 << 20
	streamWindow = 1 << 20
)

// errStopped: the queue is closed and drained; Run returns.
var errStopped = errors.New("queue closed")

func errDone(err error) error {
	if err != nil {
		return err
	}
	return errStopped
}
