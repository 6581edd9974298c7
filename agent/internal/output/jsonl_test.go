package output

import (
	"bytes"
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
	if err := w.Records("t", raw, func(i uint16) string { return []string{"a", "b"}[i] }); err != nil {
		t.Fatal(err)
	}
	if err := w.Counters("t", []*pb.HopCounters{{HopIndex: 1, Hop: "b", Values: counterValues(map[record.Counter]uint64{record.CSeen: 10, record.CRecorded: 2, record.CParseNonIP: 1})}}); err != nil {
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
	if c["type"] != "counters" || c["hop"] != "b" || c["hop_index"] != 1.0 || c["seen"] != 10.0 || c["parse_non_ip"] != 1.0 || c["too_big"] != 0.0 {
		t.Errorf("counters %v", c)
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
	if err := w.Counters("t", []*pb.HopCounters{hc}); err != nil {
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
