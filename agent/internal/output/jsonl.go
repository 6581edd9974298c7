// Package output prints the standalone agent's JSON lines (docs/design.md,
// "Standalone agent"): status, record and counters lines, each with a type.
package output

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// Writer writes JSON lines; safe for concurrent use.
type Writer struct {
	mu sync.Mutex
	w  *bufio.Writer
}

// NewWriter wraps w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: bufio.NewWriter(w)} }

// Flush flushes buffered lines.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Flush()
}

var statusJSON = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// Status writes {"type":"status", ...TraceStatus in protojson (proto field names)...}.
func (w *Writer) Status(st *pb.TraceStatus) error {
	b, err := statusJSON.Marshal(st)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return err
	}
	body := bytes.TrimPrefix(buf.Bytes(), []byte("{"))
	w.mu.Lock()
	defer w.mu.Unlock()
	w.w.WriteString(`{"type":"status"`)
	if len(body) > 1 { // not just "}"
		w.w.WriteByte(',')
	}
	w.w.Write(body)
	w.w.WriteByte('\n')
	return w.w.Flush()
}

// RecordLine is one record line.
type RecordLine struct {
	Type     string `json:"type"`
	Trace    string `json:"trace"`
	Hop      string `json:"hop"`
	HopIndex uint16 `json:"hop_index"`
	PacketID uint32 `json:"packet_id"`
	FlowHash uint32 `json:"flow_hash"`
	TsNs     uint64 `json:"ts_ns"`
	Ifindex  uint32 `json:"ifindex"`
	WireLen  uint32 `json:"wire_len"`
	CPU      uint16 `json:"cpu"`
	Flags    uint16 `json:"flags"`
}

// Records writes one line per record of a batch; hopName names hop indexes.
func (w *Writer) Records(trace string, raw []byte, hopName func(uint16) string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	enc := json.NewEncoder(w.w)
	var r record.Record
	for off := 0; off+record.Size <= len(raw); off += record.Size {
		if err := record.Decode(raw[off:off+record.Size], &r); err != nil {
			return err
		}
		line := RecordLine{Type: "record", Trace: trace, Hop: hopName(r.HopIndex), HopIndex: r.HopIndex,
			PacketID: r.PacketID, FlowHash: r.FlowHash, TsNs: r.TsNs, Ifindex: r.Ifindex, WireLen: r.WireLen,
			CPU: r.CPU, Flags: r.Flags}
		if err := enc.Encode(&line); err != nil {
			return err
		}
	}
	return w.w.Flush()
}

// CountersLine is one counters line: the HopCounters fields in snake_case,
// as JSON numbers, named by record.CounterKeys.
type CountersLine struct {
	Type     string
	Trace    string
	Hop      string
	HopIndex uint32
	At       string
	Values   []uint64 // indexed by record.Counter
	Actions  *pb.HopActionValues
}

// MarshalJSON writes the fixed fields, then one field per counter.
func (c CountersLine) MarshalJSON() ([]byte, error) {
	out := map[string]any{"type": c.Type, "trace": c.Trace, "hop": c.Hop, "hop_index": c.HopIndex}
	if c.At != "" {
		out["at"] = c.At
	}
	for i, key := range record.CounterKeys {
		var v uint64
		if i < len(c.Values) {
			v = c.Values[i]
		}
		out[key] = v
	}
	// Hop actions: "count": {"by": FIELD or "", "keys": {KEY: N}}, "histogram": {"field", "buckets": [{"le", "count"}]}.
	if a := c.Actions; a != nil {
		if a.GetCount() {
			keys := map[string]uint64{}
			for k, v := range a.GetCounts() {
				keys[fmt.Sprint(k)] = v
			}
			out["count"] = map[string]any{"by": fieldKey(a.GetCountBy()), "keys": keys}
		}
		if a.GetHistogram() != 0 {
			var buckets []map[string]uint64
			for b, n := range a.GetBuckets() {
				if n != 0 {
					buckets = append(buckets, map[string]uint64{"le": 1<<uint(b) - 1, "count": n})
				}
			}
			out["histogram"] = map[string]any{"field": fieldKey(a.GetHistogram()), "buckets": buckets}
		}
	}
	return json.Marshal(out)
}

// fieldKey names a Field as specs do ("" for none).
func fieldKey(f pb.Field) string {
	if f <= 0 || int(f) >= len(record.FieldKeys) {
		return ""
	}
	return record.FieldKeys[f]
}

// Counters writes one counters line per hop.
func (w *Writer) Counters(trace string, hops []*pb.HopCounters) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	enc := json.NewEncoder(w.w)
	for _, c := range hops {
		line := CountersLine{Type: "counters", Trace: trace, Hop: c.GetHop(), HopIndex: c.GetHopIndex(), Values: c.GetValues(),
			Actions: c.GetActions()}
		if c.GetAt() != nil {
			line.At = c.GetAt().AsTime().UTC().Format("2006-01-02T15:04:05.000000000Z")
		}
		if err := enc.Encode(&line); err != nil {
			return fmt.Errorf("counters line: %w", err)
		}
	}
	return w.w.Flush()
}

// EventLine is one event probe's cumulative results (a spec's events:).
type EventLine struct {
	Type       string            `json:"type"` // "event"
	Trace      string            `json:"trace"`
	Event      string            `json:"event"`
	EventIndex uint32            `json:"event_index"`
	Seen       uint64            `json:"seen"`
	Matched    uint64            `json:"matched"`
	CountBy    string            `json:"count_by,omitempty"`
	Counts     map[string]uint64 `json:"counts,omitempty"`
	Histogram  string            `json:"histogram,omitempty"`
	Buckets    []BucketLine      `json:"buckets,omitempty"`
	// histogram: latency: hits with no start for their key.
	LatencyMissed uint64         `json:"latency_missed,omitempty"`
	Recorded      []RecordedLine `json:"recorded,omitempty"`
}

// RecordedLine is one argument of an event's record action, since attach;
// min, max and last are two's complement bits when the argument is unsigned
// and above 2^63 - 1.
type RecordedLine struct {
	Arg    string  `json:"arg"`
	Count  uint64  `json:"count"`
	Sum    float64 `json:"sum"`
	Min    int64   `json:"min"`
	Max    int64   `json:"max"`
	Last   int64   `json:"last"`
	Signed bool    `json:"signed"`
}

// BucketLine is one non-empty log2 bucket: le = 2^b - 1.
type BucketLine struct {
	Le    uint64 `json:"le"`
	Count uint64 `json:"count"`
}

// Events writes one event line per event probe.
func (w *Writer) Events(trace string, events []*pb.EventValues) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	enc := json.NewEncoder(w.w)
	for _, e := range events {
		line := EventLine{Type: "event", Trace: trace, Event: e.GetEvent(), EventIndex: e.GetEventIndex(),
			Seen: e.GetSeen(), Matched: e.GetMatched(), CountBy: e.GetCountBy(), Histogram: e.GetHistogram(),
			LatencyMissed: e.GetLatencyMissed()}
		for _, r := range e.GetRecorded() {
			line.Recorded = append(line.Recorded, RecordedLine{Arg: r.GetArg(), Count: r.GetCount(), Sum: r.GetSum(),
				Min: r.GetMin(), Max: r.GetMax(), Last: r.GetLast(), Signed: r.GetSigned()})
		}
		if e.GetCount() {
			line.Counts = map[string]uint64{}
			for k, v := range e.GetCounts() {
				line.Counts[strconv.FormatUint(k, 10)] = v
			}
		}
		for b, n := range e.GetBuckets() {
			if n > 0 {
				line.Buckets = append(line.Buckets, BucketLine{Le: 1<<uint(b) - 1, Count: n})
			}
		}
		if err := enc.Encode(&line); err != nil {
			return fmt.Errorf("event line: %w", err)
		}
	}
	return w.w.Flush()
}
