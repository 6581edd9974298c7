// Package output prints the agent's JSON lines (docs/design.md, "Standalone
// agent"): status, trace, clock, record, counters and event lines, each with
// a type. They carry what the collector stream carries (the RecordBatch
// messages of internal/transport), so `hoptrace import` makes the same
// report of a file as a collector of the stream.
package output

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// Writer writes JSON lines; safe for concurrent use.
type Writer struct {
	mu sync.Mutex
	w  *bufio.Writer
	// Node names this node in trace and clock lines.
	Node string
	// Describe gives a running trace's status (its hops on this node) for
	// the trace's line, and the names of this kernel's drop reasons when the
	// trace has drop hops; nil, or a nil status, writes none.
	Describe func(trace string) (*pb.TraceStatus, map[uint32]string)

	described map[traceGeneration]bool
	clock     *ClockLine // the last clock line written
}

type traceGeneration struct {
	trace      string
	generation uint64
}

// NewWriter wraps w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriter(w), described: map[traceGeneration]bool{}}
}

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

// TraceLine names a trace's hops on this node, before the trace's first
// other line of each generation: an import rebuilds the path from every
// node's trace lines.
type TraceLine struct {
	Type       string    `json:"type"` // "trace"
	Trace      string    `json:"trace"`
	Generation uint64    `json:"generation"`
	Node       string    `json:"node"`
	Hops       []HopLine `json:"hops"`
	// DropReasons names the values of enum skb_drop_reason a drop hop of
	// the trace records, as this node's kernel numbers them.
	DropReasons map[uint32]string `json:"drop_reasons,omitempty"`
}

// HopLine is one hop of a trace line.
type HopLine struct {
	HopIndex uint32 `json:"hop_index"`
	Name     string `json:"name"`
}

// traceLocked writes the trace line of (trace, generation) unless written.
func (w *Writer) traceLocked(trace string, generation uint64) error {
	key := traceGeneration{trace, generation}
	if w.Describe == nil || w.described[key] {
		return nil
	}
	st, reasons := w.Describe(trace)
	if st == nil {
		return nil
	}
	line := TraceLine{Type: "trace", Trace: trace, Generation: st.GetGeneration(), Node: w.Node, DropReasons: reasons}
	for _, h := range st.GetHops() {
		line.Hops = append(line.Hops, HopLine{HopIndex: h.GetHopIndex(), Name: h.GetName()})
	}
	// Batches of an older generation still queued name the hops as now.
	w.described[key] = true
	w.described[traceGeneration{trace, st.GetGeneration()}] = true
	return json.NewEncoder(w.w).Encode(&line)
}

// ClockLine is the node's clock (NodeClock, as a RecordBatch carries it)
// for the record lines after it: wall = ts_ns + monotonic_to_realtime_ns;
// master = wall - offset_ns (+ drift, as collector/clock.py maps).
type ClockLine struct {
	Type                  string  `json:"type"` // "clock"
	Node                  string  `json:"node"`
	MonotonicToRealtimeNs int64   `json:"monotonic_to_realtime_ns"`
	OffsetNs              int64   `json:"offset_ns,omitempty"`
	BoundNs               int64   `json:"bound_ns,omitempty"`
	DriftPPM              float64 `json:"drift_ppm,omitempty"`
	DelayNs               int64   `json:"delay_ns,omitempty"`
	SampledAtNs           int64   `json:"sampled_at_ns,omitempty"`
}

// clockStep is how far the monotonic->realtime mapping or the bound may move
// before a new clock line says so: below what a clock round resolves.
const clockStep = int64(time.Microsecond)

// clockLocked writes c as a clock line when it differs from the last one: a
// new estimate (a Cristian round), or the mapping or bound moved by
// clockStep. The mapping is refreshed every second and barely moves, so a
// file has about a line per round, not one per batch.
func (w *Writer) clockLocked(c *pb.NodeClock) error {
	if c == nil {
		return nil
	}
	line := ClockLine{Type: "clock", Node: w.Node, MonotonicToRealtimeNs: c.GetMonotonicToRealtimeNs(),
		OffsetNs: c.GetOffsetNs(), BoundNs: c.GetBoundNs(), DriftPPM: c.GetDriftPpm(), DelayNs: c.GetDelayNs(),
		SampledAtNs: c.GetSampledAtNs()}
	if last := w.clock; last != nil && last.OffsetNs == line.OffsetNs && last.SampledAtNs == line.SampledAtNs &&
		last.DriftPPM == line.DriftPPM && last.DelayNs == line.DelayNs &&
		abs(last.MonotonicToRealtimeNs-line.MonotonicToRealtimeNs) < clockStep && abs(last.BoundNs-line.BoundNs) < clockStep {
		return nil
	}
	w.clock = &line
	return json.NewEncoder(w.w).Encode(&line)
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// RecordLine is one record line; values, addresses and capture are the
// record's trailers (the record action's fields, the 5-tuple the hop saw, the
// capture action's bytes), when it has them. Functions names the kernel
// functions its values name by ID (drop_function), as the batch did.
type RecordLine struct {
	Type      string            `json:"type"`
	Trace     string            `json:"trace"`
	Hop       string            `json:"hop"`
	HopIndex  uint16            `json:"hop_index"`
	PacketID  uint32            `json:"packet_id"`
	FlowHash  uint32            `json:"flow_hash"`
	TsNs      uint64            `json:"ts_ns"`
	Ifindex   uint32            `json:"ifindex"`
	WireLen   uint32            `json:"wire_len"`
	CPU       uint16            `json:"cpu"`
	Flags     uint16            `json:"flags"`
	Values    map[string]uint64 `json:"values,omitempty"`
	Functions map[string]string `json:"functions,omitempty"`
	Addresses *AddressesLine    `json:"addresses,omitempty"`
	Capture   *CaptureLine      `json:"capture,omitempty"`
}

// CaptureLine is struct hoptrace_capture: the first bytes of the packet at
// the hop, in hex (as tcpdump -x shows them).
type CaptureLine struct {
	WireLen  uint32 `json:"wire_len"`  // the packet's length from the first byte on
	LinkType uint16 `json:"link_type"` // pcap's LINKTYPE_* of the first byte (1 Ethernet, 101 IP)
	Bytes    string `json:"bytes"`
}

// AddressesLine is struct hoptrace_addresses: the innermost 5-tuple a hop saw.
type AddressesLine struct {
	Proto   uint8  `json:"proto"`
	Src     string `json:"src"`
	SrcPort uint16 `json:"src_port"`
	Dst     string `json:"dst"`
	DstPort uint16 `json:"dst_port"`
}

// Batch writes a RecordBatch's records (one line each, with their
// trailers), after the trace's line and, when it moved, the node's clock;
// hopName names hop indexes.
func (w *Writer) Batch(m *pb.RecordBatch, hopName func(uint16) string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.traceLocked(m.GetTrace(), m.GetGeneration()); err != nil {
		return err
	}
	if err := w.clockLocked(m.GetClock()); err != nil {
		return err
	}
	enc := json.NewEncoder(w.w)
	raw, values, addresses, captures := m.GetRecords(), m.GetValues(), m.GetAddresses(), m.GetCaptures()
	size := int(m.GetRecordSize())
	if size < record.Size {
		size = record.Size
	}
	var r record.Record
	for off := 0; off+size <= len(raw); off += size {
		rec := raw[off : off+size]
		if err := record.Decode(rec, &r); err != nil {
			return err
		}
		line := RecordLine{Type: "record", Trace: m.GetTrace(), Hop: hopName(r.HopIndex), HopIndex: r.HopIndex,
			PacketID: r.PacketID, FlowHash: r.FlowHash, TsNs: r.TsNs, Ifindex: r.Ifindex, WireLen: r.WireLen,
			CPU: r.CPU, Flags: r.Flags}
		// Each trailer is in its own buffer, one per record that announces it, in record order.
		if record.ValuesTrailer.On(rec) {
			if len(values) < record.ValuesSize {
				return fmt.Errorf("record of packet %#x announces values the batch lacks", r.PacketID)
			}
			v, err := record.DecodeValues(values[:record.ValuesSize])
			if err != nil {
				return err
			}
			values = values[record.ValuesSize:]
			line.Values = map[string]uint64{}
			for i, f := range v.Fields {
				if f != record.FieldNone {
					line.Values[valueKey(f)] = v.Values[i]
				}
				if name, ok := m.GetFunctions()[v.Values[i]]; ok && f == record.FieldDropFunction {
					if line.Functions == nil {
						line.Functions = map[string]string{}
					}
					line.Functions[strconv.FormatUint(v.Values[i], 10)] = name
				}
			}
		}
		if record.AddressesTrailer.On(rec) {
			if len(addresses) < record.AddressesSize {
				return fmt.Errorf("record of packet %#x announces addresses the batch lacks", r.PacketID)
			}
			a, err := record.DecodeAddresses(addresses[:record.AddressesSize])
			if err != nil {
				return err
			}
			addresses = addresses[record.AddressesSize:]
			line.Addresses = &AddressesLine{Proto: a.Proto, Src: a.Src.String(), SrcPort: a.SrcPort,
				Dst: a.Dst.String(), DstPort: a.DstPort}
		}
		if record.CaptureTrailer.On(rec) {
			if len(captures) < record.CaptureSize {
				return fmt.Errorf("record of packet %#x announces a capture the batch lacks", r.PacketID)
			}
			c, err := record.DecodeCapture(captures[:record.CaptureSize])
			if err != nil {
				return err
			}
			captures = captures[record.CaptureSize:]
			line.Capture = &CaptureLine{WireLen: c.WireLen, LinkType: c.LinkType, Bytes: hex.EncodeToString(c.Bytes)}
		}
		if err := enc.Encode(&line); err != nil {
			return err
		}
	}
	return w.w.Flush()
}

// CountersLine is one counters line: the HopCounters fields in snake_case,
// as JSON numbers, named by record.CounterKeys.
type CountersLine struct {
	Type       string
	Trace      string
	Generation uint64
	Hop        string
	HopIndex   uint32
	At         string
	AttachedNs int64    // CLOCK_MONOTONIC, like ts_ns (0 = unknown)
	Values     []uint64 // indexed by record.Counter
	Actions    *pb.HopActionValues
	// WatermarkNs (CLOCK_MONOTONIC): every record not in the file before
	// this line is at least this recent (0 = unknown). AgentDropped: the
	// records the agent dropped on their way to this file since it started.
	WatermarkNs  int64
	AgentDropped uint64
}

// MarshalJSON writes the fixed fields, then one field per counter.
func (c CountersLine) MarshalJSON() ([]byte, error) {
	out := map[string]any{"type": c.Type, "trace": c.Trace, "hop": c.Hop, "hop_index": c.HopIndex}
	if c.At != "" {
		out["at"] = c.At
	}
	for key, v := range map[string]int64{"generation": int64(c.Generation), "attached_ns": c.AttachedNs,
		"watermark_ns": c.WatermarkNs, "agent_dropped": int64(c.AgentDropped)} {
		if v != 0 {
			out[key] = v
		}
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

// valueKey names a recorded field as specs do, or by its number when this
// agent does not know it.
func valueKey(f record.ActionField) string {
	if f < record.FieldMax {
		return record.FieldKeys[f]
	}
	return strconv.Itoa(int(f))
}

// fieldKey names a Field as specs do ("" for none).
func fieldKey(f pb.Field) string {
	if f <= 0 || int(f) >= len(record.FieldKeys) {
		return ""
	}
	return record.FieldKeys[f]
}

// Counters writes one counters line per hop of a trace's generation.
func (w *Writer) Counters(trace string, generation uint64, hops []*pb.HopCounters) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.countersLocked(&pb.RecordBatch{Trace: trace, Generation: generation, Counters: hops}); err != nil {
		return err
	}
	return w.w.Flush()
}

// Heartbeat writes a heartbeat message (internal/transport) as the counters
// lines of its hops, with its watermark and drops, and its event lines.
func (w *Writer) Heartbeat(m *pb.RecordBatch) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.traceLocked(m.GetTrace(), m.GetGeneration()); err != nil {
		return err
	}
	if err := w.clockLocked(m.GetClock()); err != nil {
		return err
	}
	if err := w.countersLocked(m); err != nil {
		return err
	}
	if err := w.eventsLocked(m.GetTrace(), m.GetEvents()); err != nil {
		return err
	}
	return w.w.Flush()
}

func (w *Writer) countersLocked(m *pb.RecordBatch) error {
	if len(m.GetCounters()) == 0 {
		return nil
	}
	if err := w.traceLocked(m.GetTrace(), m.GetGeneration()); err != nil {
		return err
	}
	enc := json.NewEncoder(w.w)
	for _, c := range m.GetCounters() {
		line := CountersLine{Type: "counters", Trace: m.GetTrace(), Generation: m.GetGeneration(), Hop: c.GetHop(),
			HopIndex: c.GetHopIndex(), AttachedNs: c.GetAttachedNs(), Values: c.GetValues(), Actions: c.GetActions(),
			WatermarkNs: m.GetWatermarkNs(), AgentDropped: m.GetAgentDropped()}
		if c.GetAt() != nil {
			line.At = formatTime(c.GetAt().AsTime())
		}
		if err := enc.Encode(&line); err != nil {
			return fmt.Errorf("counters line: %w", err)
		}
	}
	return nil
}

func formatTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000000Z") }

// EventLine is one event probe's cumulative results (a spec's events:).
type EventLine struct {
	Type       string            `json:"type"` // "event"
	Trace      string            `json:"trace"`
	At         string            `json:"at,omitempty"`
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
	if err := w.eventsLocked(trace, events); err != nil {
		return err
	}
	return w.w.Flush()
}

func (w *Writer) eventsLocked(trace string, events []*pb.EventValues) error {
	enc := json.NewEncoder(w.w)
	for _, e := range events {
		line := EventLine{Type: "event", Trace: trace, Event: e.GetEvent(), EventIndex: e.GetEventIndex(),
			Seen: e.GetSeen(), Matched: e.GetMatched(), CountBy: e.GetCountBy(), Histogram: e.GetHistogram(),
			LatencyMissed: e.GetLatencyMissed()}
		if e.GetAt() != nil {
			line.At = formatTime(e.GetAt().AsTime())
		}
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
	return nil
}
