package agent

import (
	"strings"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// transportStatus is how records leave the node now: sent with every
// heartbeat to the dispatcher (`hoptrace agents`), the same numbers as
// /metrics (hoptrace_agent_buffered_records, _records_dropped_total, _connected).
func transportStatus(p parts) *pb.TransportStatus {
	_, queuedBytes := p.outQueue.Len()
	st := &pb.TransportStatus{
		BufferedRecords:     uint64(queuedBytes / record.Size),
		BufferedBytes:       uint64(queuedBytes),
		BufferCapacityBytes: uint64(p.outQueue.Max()),
		DroppedRecords:      droppedRecords(p),
	}
	switch {
	case p.producer != nil:
		ks := p.producer.Stats()
		st.Kind, st.Destination, st.Topic = "kafka", strings.Join(p.producer.Brokers, ","), p.producer.Topic
		st.Connected = ks.Up
		st.Partitions = uint32(ks.Partitions)
		st.BufferedRecords += uint64(max(ks.RecordsInFlight, 0))
		st.BufferedBytes += uint64(max(ks.BufferedBytes, 0))
	case p.client != nil:
		st.Kind, st.Destination = "grpc", p.client.Addr
		st.Connected = p.client.Stats().Connected
	}
	return st
}

// droppedRecords: what the agent gave up on the way out (the bound of the
// queue toward the collector or Kafka, messages the brokers refused); the
// kernel's ring-buffer losses are per hop, and the printer's queue drops only
// its own copies.
func droppedRecords(p parts) uint64 {
	n := p.outQueue.Dropped()
	if p.producer != nil {
		n += p.producer.Stats().RecordsFailed
	}
	return n
}
