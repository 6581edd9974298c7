package loader_test

import (
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// A tagged TCP skb that stands for several wire segments (gso_segs, as BPF_PROG_TEST_RUN sets it: a GSO skb
// before the cut, a GRO skb after the merge) carries their number as a gso_segs value; a skb of one segment
// (gso_segs 0 or 1) leaves the 32-byte record alone, and a hop with a record action puts the count in the
// first slot its fields leave free.
func TestSegmentedSkbRecordCarriesItsCount(t *testing.T) {
	h := newHarness(t)
	taggedSized := func(id uint32, payload int) []byte {
		return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(40000, 5000, tu.TCPIDOption(id), make([]byte, payload)), 0))
	}
	tagged := func(id uint32) []byte { return taggedSized(id, 1000) }
	untagged := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(40000, 5000, nil, make([]byte, 1000)), 0))
	cases := []struct {
		name   string
		action [record.ValuesMax]record.ActionField
		segs   uint32
		want   []record.ActionField // the values' fields; nil: no values at all
		values []uint64
		dodgy  int // a TCP payload of this many bytes and gso_segs 0 (a tun/tap writer's GSO skb)
	}{
		{"one segment", [record.ValuesMax]record.ActionField{}, 1, nil, nil, 0},
		{"not GSO", [record.ValuesMax]record.ActionField{}, 0, nil, nil, 0},
		{"GSO", [record.ValuesMax]record.ActionField{}, 45, []record.ActionField{record.FieldGSOSegs}, []uint64{45}, 0},
		{"GSO, record: [len]", [record.ValuesMax]record.ActionField{record.FieldLen}, 3,
			[]record.ActionField{record.FieldLen, record.FieldGSOSegs}, []uint64{uint64(len(tagged(1))), 3}, 0},
		{"one segment, record: [len]", [record.ValuesMax]record.ActionField{record.FieldLen}, 1,
			[]record.ActionField{record.FieldLen}, []uint64{uint64(len(tagged(1)))}, 0},
		{"GSO, record: [gso_segs, len]", [record.ValuesMax]record.ActionField{record.FieldGSOSegs, record.FieldLen}, 7,
			[]record.ActionField{record.FieldGSOSegs, record.FieldLen}, []uint64{7, uint64(len(tagged(1)))}, 0},
		// SKB_GSO_DODGY: gso_segs 0 until egress counts them; DIV_ROUND_UP(payload, gso_size) here
		{"GSO from tun, 2500 bytes", [record.ValuesMax]record.ActionField{}, 0, []record.ActionField{record.FieldGSOSegs}, []uint64{3}, 2500},
		{"GSO from tun, 2000 bytes", [record.ValuesMax]record.ActionField{}, 0, []record.ActionField{record.FieldGSOSegs}, []uint64{2}, 2000},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hop := h.load(t, loader.HopConfig{Actions: loader.Actions{Record: c.action}})
			id := uint32(0x07000310 + i) // none 1 modulo HOPTRACE_ADDRESSES_EVERY: no addresses trailer
			first := tagged(id)
			if c.dodgy > 0 {
				first = taggedSized(id, c.dodgy)
			}
			for _, pkt := range [][]byte{first, untagged} { // no ID: no record
				opts := &ebpf.RunOptions{Data: pkt, DataOut: make([]byte, len(pkt)+256),
					Context: skbCtxFull{GSOSegs: c.segs, GSOSize: 1000}}
				if _, err := hop.Program.Run(opts); err != nil {
					t.Fatal(err)
				}
			}
			samples := h.rawSamples(t)
			if len(samples) != 1 {
				t.Fatalf("%d samples, want 1", len(samples))
			}
			s := samples[0]
			var rec record.Record
			if err := record.Decode(s, &rec); err != nil {
				t.Fatal(err)
			}
			if rec.PacketID != id || rec.Flags&record.FlagTCP == 0 {
				t.Fatalf("record %+v, want ID %#x, TCP", rec, id)
			}
			if c.want == nil {
				if len(s) != record.Size || record.HasValues(s) {
					t.Fatalf("a skb of one segment: %d bytes, values %v; want the %d-byte record alone", len(s), record.HasValues(s), record.Size)
				}
				return
			}
			if !record.HasValues(s) || len(s) != record.Size+record.ValuesSize {
				t.Fatalf("%d bytes, values %v; want the record and its values", len(s), record.HasValues(s))
			}
			v, err := record.DecodeValues(s[record.Size:])
			if err != nil {
				t.Fatal(err)
			}
			if len(v.Fields) != len(c.want) {
				t.Fatalf("values %+v, want fields %v = %v", v, c.want, c.values)
			}
			for j := range c.want {
				if v.Fields[j] != c.want[j] || v.Values[j] != c.values[j] {
					t.Fatalf("values %+v, want fields %v = %v", v, c.want, c.values)
				}
			}
			if binary.LittleEndian.Uint32(s[record.OffsetWireLen:]) != uint32(len(first)) {
				t.Fatalf("wire_len %d", rec.WireLen)
			}
		})
	}
}
