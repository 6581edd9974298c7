package output

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

func lines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func TestJSONLines(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	st := &pb.TraceStatus{Trace: "t", Generation: 3, Active: true, Hops: []*pb.HopStatus{
		{HopIndex: 0, Name: "a", Attached: true}, {HopIndex: 1, Name: "b", Error: "hop b: device eth9 not found in netns c1"}}}
	if err := w.Status(st); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 2*record.Size)
	record.Encode(raw, &record.Record{TsNs: 5, PacketID: 0x07000001, FlowHash: 9, Ifindex: 2, WireLen: 60, HopIndex: 1, TraceSlot: 1, CPU: 1, Flags: record.FlagUDP})
	record.Encode(raw[record.Size:], &record.Record{TsNs: 6, PacketID: 0x07000002, HopIndex: 0})
	if err := w.Batch(&pb.RecordBatch{Trace: "t", Records: raw}, func(i uint16) string { return []string{"a", "b"}[i] }); err != nil {
		t.Fatal(err)
	}
	if err := w.Counters("t", 3, []*pb.HopCounters{{HopIndex: 1, Hop: "b", Values: counterValues(map[record.Counter]uint64{record.CSeen: 10, record.CRecorded: 2, record.CParseNonIP: 1})}}); err != nil {
		t.Fatal(err)
	}
	got := lines(t, &buf)
	if len(got) != 4 {
		t.Fatalf("%d lines", len(got))
	}
	if !strings.HasPrefix(buf.String(), `{"type":"status",`) {
		t.Errorf("status line does not start with its type: %s", buf.String())
	}
	s := got[0]
	hops := s["hops"].([]any)
	if s["trace"] != "t" || s["active"] != true || len(hops) != 2 ||
		hops[1].(map[string]any)["error"] != "hop b: device eth9 not found in netns c1" ||
		hops[0].(map[string]any)["hop_index"] != float64(0) {
		t.Errorf("status %v", s)
	}
	r := got[1]
	want := map[string]any{"type": "record", "trace": "t", "hop": "b", "hop_index": 1.0, "packet_id": float64(0x07000001),
		"flow_hash": 9.0, "ts_ns": 5.0, "ifindex": 2.0, "wire_len": 60.0, "cpu": 1.0, "flags": float64(record.FlagUDP)}
	for k, v := range want {
		if r[k] != v {
			t.Errorf("record %s = %v, want %v", k, r[k], v)
		}
	}
	if got[2]["hop"] != "a" {
		t.Errorf("second record hop %v", got[2]["hop"])
	}
	c := got[3]
	if c["type"] != "counters" || c["hop"] != "b" || c["hop_index"] != 1.0 || c["seen"] != 10.0 || c["parse_non_ip"] != 1.0 || c["too_big"] != 0.0 ||
		c["generation"] != 3.0 {
		t.Errorf("counters %v", c)
	}
	for _, absent := range []string{"values", "addresses"} {
		if _, ok := r[absent]; ok {
			t.Errorf("record without trailers has %s: %v", absent, r)
		}
	}
	if _, ok := c["watermark_ns"]; ok {
		t.Errorf("counters outside a heartbeat carry a watermark: %v", c)
	}
}

// What an import needs beside the records: the trace's hops on this node
// (once per generation, before its first line), the node's clock when it
// moved, and each record's trailers in order.
func TestImportLines(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.Node = "host-a"
	described := 0
	w.Describe = func(trace string) (*pb.TraceStatus, map[uint32]string) {
		described++
		return &pb.TraceStatus{Trace: trace, Generation: 4, Hops: []*pb.HopStatus{{HopIndex: 2, Name: "a-out"}, {HopIndex: 3, Name: "a-wire"}}},
			map[uint32]string{2: "NOT_SPECIFIED", 77: "NETFILTER_DROP"}
	}
	raw := make([]byte, 3*record.Size)
	record.Encode(raw, &record.Record{TsNs: 100, PacketID: 0x01000041, HopIndex: 2, Flags: record.FlagUDP | record.FlagValues | record.FlagAddresses})
	record.Encode(raw[record.Size:], &record.Record{TsNs: 101, PacketID: 0x01000042, HopIndex: 2, Flags: record.FlagUDP})
	record.Encode(raw[2*record.Size:], &record.Record{TsNs: 102, PacketID: 0x01000043, HopIndex: 3, Flags: record.FlagValues | record.FlagCapture})
	values := make([]byte, 2*record.ValuesSize)
	values[0], values[1] = byte(record.FieldLen), byte(record.FieldDropReason)
	binary.LittleEndian.PutUint32(values[record.ValuesMax:], 2)
	binary.LittleEndian.PutUint64(values[8:], 60)
	binary.LittleEndian.PutUint64(values[16:], 1<<63+5) // a u64 beyond int64 stays exact
	second := values[record.ValuesSize:]
	second[0], second[1] = byte(record.FieldTTL), byte(record.FieldDropFunction)
	binary.LittleEndian.PutUint32(second[record.ValuesMax:], 2)
	binary.LittleEndian.PutUint64(second[8:], 63)
	binary.LittleEndian.PutUint64(second[16:], 1<<63+9) // the function's ID, named by the batch
	capture := make([]byte, record.CaptureSize)
	binary.LittleEndian.PutUint32(capture, 102)
	binary.LittleEndian.PutUint16(capture[4:], 3)
	binary.LittleEndian.PutUint16(capture[6:], record.CaptureLinkEthernet)
	copy(capture[8:], []byte{0x52, 0x54, 0x00})
	addresses := make([]byte, record.AddressesSize)
	copy(addresses[0:], []byte{198, 18, 1, 2})
	copy(addresses[16:], []byte{198, 18, 2, 2})
	binary.LittleEndian.PutUint16(addresses[32:], 40000)
	binary.LittleEndian.PutUint16(addresses[34:], 11111)
	addresses[36], addresses[37] = 17, 4
	clk := &pb.NodeClock{MonotonicToRealtimeNs: 1_700_000_000_000_000_000, OffsetNs: -3700, BoundNs: 40, SampledAtNs: 1_700_000_000_000_000_001}
	batch := &pb.RecordBatch{Trace: "t", Generation: 4, Records: raw, RecordSize: record.Size, Values: values, Addresses: addresses,
		Captures: capture, Functions: map[uint64]string{1<<63 + 9: "nft_do_chain", 63: "not a function: the ttl"}, Clock: clk}
	hop := func(i uint16) string { return map[uint16]string{2: "a-out", 3: "a-wire"}[i] }
	if err := w.Batch(batch, hop); err != nil {
		t.Fatal(err)
	}
	// The same clock again (its mapping moved by less than a microsecond): no new line.
	batch.Clock = &pb.NodeClock{MonotonicToRealtimeNs: clk.MonotonicToRealtimeNs + 300, OffsetNs: -3700, BoundNs: 40, SampledAtNs: clk.SampledAtNs}
	batch.Records, batch.Values, batch.Addresses, batch.Captures = raw[record.Size:2*record.Size], nil, nil, nil
	if err := w.Batch(batch, hop); err != nil {
		t.Fatal(err)
	}
	// A new round: a clock line. A heartbeat: counters with its watermark and drops.
	if err := w.Heartbeat(&pb.RecordBatch{Trace: "t", Generation: 4, WatermarkNs: 99, AgentDropped: 7,
		Clock:    &pb.NodeClock{MonotonicToRealtimeNs: clk.MonotonicToRealtimeNs, OffsetNs: -3800, BoundNs: 30, SampledAtNs: clk.SampledAtNs + 1e9},
		Counters: []*pb.HopCounters{{HopIndex: 2, Hop: "a-out", AttachedNs: 50, Values: counterValues(nil)}}}); err != nil {
		t.Fatal(err)
	}
	got := lines(t, &buf)
	var types []string
	for _, l := range got {
		types = append(types, l["type"].(string))
	}
	if want := "trace clock record record record record clock counters"; strings.Join(types, " ") != want {
		t.Fatalf("lines %q, want %q:\n%s", strings.Join(types, " "), want, buf.String())
	}
	if described != 1 {
		t.Errorf("trace described %d times, want once", described)
	}
	tr := got[0]
	hops := tr["hops"].([]any)
	if tr["node"] != "host-a" || tr["generation"] != 4.0 || len(hops) != 2 || hops[1].(map[string]any)["name"] != "a-wire" ||
		hops[1].(map[string]any)["hop_index"] != 3.0 || tr["drop_reasons"].(map[string]any)["77"] != "NETFILTER_DROP" {
		t.Errorf("trace line %v", tr)
	}
	// Exact integers: decode the clock and values as numbers, not float64.
	var c ClockLine
	if err := json.Unmarshal([]byte(strings.Split(buf.String(), "\n")[1]), &c); err != nil {
		t.Fatal(err)
	}
	if c.Node != "host-a" || c.MonotonicToRealtimeNs != clk.MonotonicToRealtimeNs || c.OffsetNs != -3700 || c.BoundNs != 40 ||
		c.SampledAtNs != clk.SampledAtNs {
		t.Errorf("clock line %+v", c)
	}
	var first RecordLine
	if err := json.Unmarshal([]byte(strings.Split(buf.String(), "\n")[2]), &first); err != nil {
		t.Fatal(err)
	}
	if len(first.Values) != 2 || first.Values["len"] != 60 || first.Values["drop_reason"] != 1<<63+5 {
		t.Errorf("first record's values %v", first.Values)
	}
	if a := first.Addresses; a == nil || *a != (AddressesLine{Proto: 17, Src: "198.18.1.2", SrcPort: 40000, Dst: "198.18.2.2", DstPort: 11111}) {
		t.Errorf("first record's addresses %+v", first.Addresses)
	}
	if _, ok := got[3]["values"]; ok {
		t.Errorf("second record has no trailers: %v", got[3])
	}
	if v := got[4]["values"].(map[string]any); len(v) != 2 || v["ttl"] != 63.0 || got[4]["addresses"] != nil {
		t.Errorf("third record: the second values, no addresses: %v", got[4])
	}
	var third RecordLine
	if err := json.Unmarshal([]byte(strings.Split(buf.String(), "\n")[4]), &third); err != nil {
		t.Fatal(err)
	}
	// Only the names of its own functions: a value of another field is no function's ID.
	if third.Values["drop_function"] != 1<<63+9 || len(third.Functions) != 1 || third.Functions["9223372036854775817"] != "nft_do_chain" {
		t.Errorf("third record's function %v %v", third.Values, third.Functions)
	}
	if c := third.Capture; c == nil || *c != (CaptureLine{WireLen: 102, LinkType: record.CaptureLinkEthernet, Bytes: "525400"}) {
		t.Errorf("third record's capture %+v", third.Capture)
	}
	if first.Functions != nil || first.Capture != nil {
		t.Errorf("first record: no functions, no capture: %+v", first)
	}
	if got[6]["offset_ns"] != -3800.0 {
		t.Errorf("new round's clock line %v", got[6])
	}
	if cl := got[7]; cl["watermark_ns"] != 99.0 || cl["agent_dropped"] != 7.0 || cl["attached_ns"] != 50.0 || cl["generation"] != 4.0 {
		t.Errorf("heartbeat's counters line %v", cl)
	}
	// A record that announces a trailer its batch lacks is an error, not a shifted pairing.
	err := w.Batch(&pb.RecordBatch{Trace: "t", Generation: 4, Records: raw[:record.Size]}, hop)
	if err == nil || !strings.Contains(err.Error(), "announces values") {
		t.Errorf("record without its values: %v", err)
	}
	err = w.Batch(&pb.RecordBatch{Trace: "t", Generation: 4, Records: raw[2*record.Size:], Values: second}, hop)
	if err == nil || !strings.Contains(err.Error(), "announces a capture") {
		t.Errorf("record without its capture: %v", err)
	}
}

func counterValues(set map[record.Counter]uint64) []uint64 {
	var c record.Counters
	for k, v := range set {
		c[k] = v
	}
	return c[:]
}

func TestCountersLineCarriesActions(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	hc := &pb.HopCounters{HopIndex: 2, Hop: "c", Values: counterValues(nil), Actions: &pb.HopActionValues{
		Count: true, CountBy: pb.Field_FIELD_CPU, Counts: map[uint64]uint64{0: 7, 1: 3},
		Histogram: pb.Field_FIELD_LEN, Buckets: []uint64{0, 0, 0, 0, 0, 0, 0, 10}}}
	if err := w.Counters("t", 0, []*pb.HopCounters{hc}); err != nil {
		t.Fatal(err)
	}
	c := lines(t, &buf)[0]
	count := c["count"].(map[string]any)
	if count["by"] != "cpu" || count["keys"].(map[string]any)["0"] != 7.0 || count["keys"].(map[string]any)["1"] != 3.0 {
		t.Errorf("count %v", count)
	}
	hist := c["histogram"].(map[string]any)
	buckets := hist["buckets"].([]any)
	if hist["field"] != "len" || len(buckets) != 1 || buckets[0].(map[string]any)["le"] != 127.0 || buckets[0].(map[string]any)["count"] != 10.0 {
		t.Errorf("histogram %v", hist)
	}
}

func TestEventLine(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	buckets := make([]uint64, record.HistBuckets)
	buckets[11], buckets[64] = 150, 1
	err := w.Events("tr", []*pb.EventValues{{EventIndex: 1, Event: "frames", Count: true, CountBy: "cpu",
		Counts: map[uint64]uint64{0: 100, 1: 51}, Histogram: "len", Buckets: buckets, Seen: 900, Matched: 151}})
	if err != nil {
		t.Fatal(err)
	}
	got := lines(t, &b)
	if len(got) != 1 {
		t.Fatalf("%d lines", len(got))
	}
	l := got[0]
	if l["type"] != "event" || l["event"] != "frames" || l["event_index"] != 1.0 || l["matched"] != 151.0 || l["seen"] != 900.0 {
		t.Fatalf("line %v", l)
	}
	if c := l["counts"].(map[string]any); c["0"] != 100.0 || c["1"] != 51.0 || l["count_by"] != "cpu" {
		t.Fatalf("counts %v", l["counts"])
	}
	bs := l["buckets"].([]any)
	if len(bs) != 2 || bs[0].(map[string]any)["le"] != 2047.0 || bs[0].(map[string]any)["count"] != 150.0 ||
		bs[1].(map[string]any)["le"] != float64(^uint64(0)) {
		t.Fatalf("buckets %v", bs)
	}
}
