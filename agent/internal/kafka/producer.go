// Package kafka publishes the agent's record batches to a Kafka topic, the
// transport beside the direct gRPC stream (internal/collector) for more than
// one collector: collectors in a consumer group each join the packets of the
// partitions they own.
//
// What goes where (docs/operations.md, "Kafka"):
//   - a batch's records are split by packet: each record goes to partition
//     PartitionOf(trace, packet_id, partitions), so every record of one
//     packet, from every node, lands in one partition and one collector joins
//     it; one message per partition that has records of the batch;
//   - counters, event probes' values, the node's watermark and clock (a
//     heartbeat with no records) go to every partition: each partition is a
//     complete, ordered stream for whoever owns it, including the watermark
//     that lets its join expire packets (it follows the records it vouches
//     for in the partition, because one idempotent producer keeps each
//     partition in order).
//
// Each message's value is a hoptrace.v1.RecordBatch (protobuf) with header
// FormatHeader = FormatValue; collectors skip (and count) anything else.
// While the brokers are away franz-go buffers up to MaxBufferedBytes, then
// the agent's own bounded queue fills and drops its oldest batches (counted).
package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"google.golang.org/protobuf/proto"

	"github.com/hoptrace/hoptrace/agent/internal/backoff"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	"github.com/hoptrace/hoptrace/agent/internal/transport"
)

// The header that marks a hoptrace message; collectors count and skip
// messages without it (another producer writing to the topic).
const (
	FormatHeader = "hoptrace-format"
	FormatValue  = "RecordBatch/v1"
)

// Config is where and how to publish (the --kafka-* flags).
type Config struct {
	Brokers []string
	Topic   string
	// TLS toward the brokers: nil = plaintext.
	TLS *tls.Config
	// SASL: "" (none), "plain", "scram-sha-256" or "scram-sha-512".
	SASLMechanism, SASLUser, SASLPassword string
	// MaxBufferedBytes bounds what franz-go holds for brokers that do not
	// answer; beyond it the agent's queue (--buffer-bytes) takes over.
	MaxBufferedBytes int
}

// Validate reports an unusable configuration.
func (c Config) Validate() error {
	if len(c.Brokers) == 0 || c.Topic == "" {
		return errors.New("kafka: need --kafka-brokers and --kafka-topic")
	}
	switch c.SASLMechanism {
	case "", "plain", "scram-sha-256", "scram-sha-512":
	default:
		return fmt.Errorf("kafka: --kafka-sasl-mechanism %q: want plain, scram-sha-256 or scram-sha-512", c.SASLMechanism)
	}
	if c.SASLMechanism != "" && c.SASLUser == "" {
		return errors.New("kafka: SASL needs --kafka-sasl-user and its password file")
	}
	return nil
}

// TLSConfig builds the TLS settings of --kafka-tls: ca ("" = the system's
// roots) verifies the brokers; cert and key (both or neither) are this
// client's certificate for brokers that ask for one.
func TLSConfig(ca, cert, key string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("kafka CA: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka CA %s: no certificate in it", ca)
		}
	}
	if (cert == "") != (key == "") {
		return nil, errors.New("kafka: --kafka-cert and --kafka-key go together")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("kafka client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// PartitionOf is the partition of a packet's records: FNV-1a over the trace
// name and the packet ID's 4 little-endian bytes, modulo the partition count.
// Every agent computes the same one, so a packet's records from every node
// meet in one partition (the collector's join key includes both).
func PartitionOf(trace string, packetID uint32, partitions int) int32 {
	return int32(packetHash(traceHash(trace), packetID) % uint32(partitions))
}

const (
	fnvOffset = 2166136261
	fnvPrime  = 16777619
)

func traceHash(trace string) uint32 {
	h := uint32(fnvOffset)
	for i := 0; i < len(trace); i++ {
		h ^= uint32(trace[i])
		h *= fnvPrime
	}
	return h
}

func packetHash(h, id uint32) uint32 {
	for i := 0; i < 4; i++ {
		h ^= id & 0xff
		h *= fnvPrime
		id >>= 8
	}
	return h
}

// SplitByPartition splits packed records into one slice per partition (nil
// where a partition has none), keeping their order. This is the price of
// keying by packet: one message per partition instead of one per batch
// (BenchmarkSplitByPartition).
func SplitByPartition(trace string, records []byte, partitions int) [][]byte {
	n := len(records) / record.Size
	th := traceHash(trace)
	of := make([]int32, n)
	sizes := make([]int, partitions)
	for i := range n {
		id := binary.LittleEndian.Uint32(records[i*record.Size+record.OffsetPacketID:])
		p := int32(packetHash(th, id) % uint32(partitions))
		of[i] = p
		sizes[p] += record.Size
	}
	// one allocation for all parts, each part a slice of it
	buf := make([]byte, 0, n*record.Size)
	out := make([][]byte, partitions)
	for p, size := range sizes {
		if size > 0 {
			out[p] = buf[len(buf) : len(buf) : len(buf)+size]
			buf = buf[:len(buf)+size]
		}
	}
	for i, p := range of {
		out[p] = append(out[p], records[i*record.Size:(i+1)*record.Size]...)
	}
	return out
}

// SplitTrailersByPartition splits a batch's trailers the way SplitByPartition splits its records:
// each record with a trailer's flag takes the next one of its kind, and it goes to the record's
// partition, in order.
func SplitTrailersByPartition(trace string, records []byte, tr stream.Trailers, partitions int) []stream.Trailers {
	out := make([]stream.Trailers, partitions)
	if tr.Len() == 0 {
		return out
	}
	th := traceHash(trace)
	kinds := tr.Buffers()
	var next [len(kinds)]int
	for i := 0; i+record.Size <= len(records); i += record.Size {
		rec := records[i:]
		var p *stream.Trailers
		for k, tb := range kinds {
			if !tb.On(rec) || next[k]+tb.Size > len(*tb.Buf) {
				continue
			}
			if p == nil {
				id := binary.LittleEndian.Uint32(rec[record.OffsetPacketID:])
				p = &out[packetHash(th, id)%uint32(partitions)]
			}
			dst := p.Buffers()[k].Buf
			*dst = append(*dst, (*tb.Buf)[next[k]:next[k]+tb.Size]...)
			next[k] += tb.Size
		}
	}
	for i := range out { // the few names of the batch's functions, with each part that has values
		if len(out[i].Values) > 0 {
			out[i].Functions = tr.Functions
		}
	}
	return out
}

// Producer publishes the batches of its Batcher's queue, and every
// CountersEvery a heartbeat per trace (counters, watermark, clock) to every
// partition.
type Producer struct {
	Config
	transport.Batcher
	Log *slog.Logger
	// PartitionsEvery: how often the topic's partition count is read again.
	PartitionsEvery time.Duration

	cl *kgo.Client

	recordsSent, messagesSent, heartbeats atomic.Uint64
	produceErrors, recordsFailed          atomic.Uint64
	partitions                            atomic.Int64
	recordsInFlight                       atomic.Int64 // produced, not yet acknowledged or refused
	buffered                              atomic.Pointer[kgo.Client]
	up                                    atomic.Bool
	lastAck                               atomic.Int64 // unix ns
}

// Stats are the producer's counters for /metrics.
type Stats struct {
	RecordsSent, MessagesSent, Heartbeats uint64
	// ProduceErrors: messages the brokers refused for good; RecordsFailed:
	// the records they carried (lost, also counted as dropped).
	ProduceErrors, RecordsFailed uint64
	// Partitions of the topic as last read (0 = not known yet).
	Partitions int64
	// BufferedBytes / BufferedRecords: produced but not yet acknowledged.
	BufferedBytes, BufferedRecords int64
	// RecordsInFlight: hoptrace records in those messages (heartbeats carry
	// none), the records the brokers still owe an answer for.
	RecordsInFlight int64
	// Up: the topic's partitions are known, and the brokers acknowledged a
	// message in the last 5 s or nothing waits for them.
	Up bool
}

// Stats returns the counters so far.
func (p *Producer) Stats() Stats {
	s := Stats{RecordsSent: p.recordsSent.Load(), MessagesSent: p.messagesSent.Load(),
		Heartbeats: p.heartbeats.Load(), ProduceErrors: p.produceErrors.Load(),
		RecordsFailed: p.recordsFailed.Load(), Partitions: p.partitions.Load(),
		RecordsInFlight: p.recordsInFlight.Load()}
	if cl := p.buffered.Load(); cl != nil {
		s.BufferedBytes = cl.BufferedProduceBytes()
		s.BufferedRecords = cl.BufferedProduceRecords()
	}
	recent := time.Since(time.Unix(0, p.lastAck.Load())) < 5*time.Second
	s.Up = p.up.Load() && (recent || s.BufferedRecords == 0)
	return s
}

func (p *Producer) options() ([]kgo.Opt, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	maxBuf := p.MaxBufferedBytes
	if maxBuf <= 0 {
		maxBuf = 64 << 20
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(p.Brokers...),
		kgo.DefaultProduceTopic(p.Topic),
		kgo.ClientID("hoptrace-agent-" + p.Node),
		// Partitions are chosen here (PartitionOf), never by the client.
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.MaxBufferedBytes(maxBuf),
		// Retry for as long as the brokers are away (franz-go's default: no
		// retry limit, no delivery timeout): the buffer bound, not a timeout,
		// decides what is given up (in the agent's counted queue).
		kgo.RecordDeliveryTimeout(0),
		kgo.UnknownTopicRetries(-1),
		kgo.ProducerLinger(5 * time.Millisecond),
		kgo.ProducerBatchCompression(kgo.Lz4Compression(), kgo.NoCompression()),
	}
	if p.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(p.TLS.Clone()))
	}
	if m := p.saslMechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

func (p *Producer) saslMechanism() sasl.Mechanism {
	switch p.SASLMechanism {
	case "plain":
		return plain.Auth{User: p.SASLUser, Pass: p.SASLPassword}.AsMechanism()
	case "scram-sha-256":
		return scram.Auth{User: p.SASLUser, Pass: p.SASLPassword}.AsSha256Mechanism()
	case "scram-sha-512":
		return scram.Auth{User: p.SASLUser, Pass: p.SASLPassword}.AsSha512Mechanism()
	}
	return nil
}

// Run publishes until ctx ends or the queue is closed and drained (then it
// flushes what franz-go still holds, bounded by ctx).
func (p *Producer) Run(ctx context.Context) error {
	if p.Log == nil {
		p.Log = slog.Default()
	}
	if p.PartitionsEvery <= 0 {
		p.PartitionsEvery = 10 * time.Second
	}
	opts, err := p.options()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	p.cl = cl
	p.buffered.Store(cl)
	defer cl.Close()
	adm := kadm.NewClient(cl)

	// Records wait in the queue (bounded, counted) until the topic's
	// partition count is known: the brokers may be away at start.
	bo := backoff.Backoff{}
	for p.partitions.Load() == 0 {
		if err := p.readPartitions(ctx, adm); err != nil {
			p.Log.Warn("kafka: cannot read the topic's partitions yet; records wait in the queue",
				"brokers", strings.Join(p.Brokers, ","), "topic", p.Topic, "err", err)
			if !bo.Sleep(ctx) {
				return nil
			}
		}
	}
	p.up.Store(true)
	nextCounters := time.Now()
	nextPartitions := time.Now().Add(p.PartitionsEvery)
	for {
		if !time.Now().Before(nextCounters) {
			p.heartbeat(ctx)
			nextCounters = time.Now().Add(p.Every())
		}
		if !time.Now().Before(nextPartitions) {
			if err := p.readPartitions(ctx, adm); err != nil {
				p.Log.Warn("kafka: cannot read the topic's partitions", "err", err)
			}
			nextPartitions = time.Now().Add(p.PartitionsEvery)
		}
		b := p.Pop(ctx, nextCounters)
		if ctx.Err() != nil {
			if b != nil {
				p.Queue.PushFront(b)
			}
			return nil
		}
		if b != nil {
			p.publish(ctx, b)
			b.Delivered() // the Kafka client holds its messages now
			continue
		}
		if p.Queue.Closed() {
			// The agent is stopping and everything was handed over: a last
			// heartbeat, then wait for the acknowledgements (bounded by ctx).
			p.heartbeat(ctx)
			if err := cl.Flush(ctx); err != nil && ctx.Err() == nil {
				return fmt.Errorf("kafka flush: %w", err)
			}
			return nil
		}
	}
}

// readPartitions reads the topic's partition count. A change re-routes
// packets: those in flight across the change may be joined incomplete.
func (p *Producer) readPartitions(ctx context.Context, adm *kadm.Client) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	topics, err := adm.ListTopics(rctx, p.Topic)
	if err != nil {
		p.up.Store(false)
		return err
	}
	td, ok := topics[p.Topic]
	if !ok || td.Err != nil {
		if ok {
			err = td.Err
		}
		return fmt.Errorf("topic %s: %w (create it first; see docs/operations.md)", p.Topic, errors.Join(err, errNoTopic))
	}
	n := int64(len(td.Partitions))
	// The brokers answer again after an outage: up once more (not only at start).
	p.up.Store(true)
	if old := p.partitions.Swap(n); old != 0 && old != n {
		p.Log.Warn("kafka: the topic's partition count changed; packets in flight may be joined incomplete",
			"topic", p.Topic, "was", old, "now", n)
	}
	return nil
}

var errNoTopic = errors.New("no such topic")

// message is the Batcher's message, with the records the brokers refused
// counted as dropped too.
func (p *Producer) message(trace string, gen uint64, records []byte, tr stream.Trailers, seq uint64) *pb.RecordBatch {
	m := p.Message(trace, gen, records, tr, seq)
	m.AgentDropped += p.recordsFailed.Load()
	return m
}

func (p *Producer) produce(ctx context.Context, m *pb.RecordBatch, partition int32, records int) {
	value, err := proto.Marshal(m)
	if err != nil { // cannot happen with well-formed messages; counted, never a crash
		p.produceErrors.Add(1)
		p.recordsFailed.Add(uint64(records))
		return
	}
	r := &kgo.Record{Key: []byte(m.GetTrace()), Value: value, Partition: partition,
		Headers: []kgo.RecordHeader{{Key: FormatHeader, Value: []byte(FormatValue)}}}
	// Produce blocks while franz-go's buffer is full (brokers away): the
	// agent's queue then holds, and drops its oldest, counted.
	p.recordsInFlight.Add(int64(records))
	p.cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
		p.recordsInFlight.Add(-int64(records))
		if err != nil {
			if ctx.Err() == nil {
				p.Log.Error("kafka: message refused, records lost", "partition", partition, "records", records, "err", err)
			}
			p.produceErrors.Add(1)
			p.recordsFailed.Add(uint64(records))
			return
		}
		p.lastAck.Store(time.Now().UnixNano())
		p.messagesSent.Add(1)
		p.recordsSent.Add(uint64(records))
	})
}

// publish splits one batch by partition and produces a message per part.
func (p *Producer) publish(ctx context.Context, b *stream.Batch) {
	n := int(p.partitions.Load())
	// The messages one batch is split into share its batch_seq: each goes to
	// another partition, and collectors deduplicate per partition by (node,
	// batch_seq).
	seq := p.NextSeq()
	trailers := SplitTrailersByPartition(b.Trace, b.Records, b.Trailers, n)
	for part, recs := range SplitByPartition(b.Trace, b.Records, n) {
		if len(recs) == 0 {
			continue
		}
		m := p.message(b.Trace, b.Generation, recs, trailers[part], seq)
		p.produce(ctx, m, int32(part), len(recs)/record.Size)
	}
}

// heartbeat sends every trace's counters with the node's watermark to every
// partition. Produced after the records it vouches for, it follows them in
// each partition.
func (p *Producer) heartbeat(ctx context.Context) {
	n := int32(p.partitions.Load())
	for _, m := range p.Heartbeats() {
		// One message, the same bytes in every partition: its clock too, so
		// every partition's owner puts the counters' and events' growth lines
		// at the same timestamps and InfluxDB keeps them once
		// (collector/actions.py, CumulativeGrowth).
		m.AgentDropped += p.recordsFailed.Load()
		for part := int32(0); part < n; part++ {
			p.produce(ctx, m, part, 0)
		}
		p.heartbeats.Add(1)
	}
}
