package stream

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/hoptrace/hoptrace/agent/internal/kallsyms"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// namesOf names the addresses it has, as a kallsyms.Namer would; others are unknown.
type namesOf map[uint64]string

func (n namesOf) Function(addr uint64) kallsyms.Function {
	if name, ok := n[addr]; ok {
		return kallsyms.Function{ID: kallsyms.FunctionID(name), Name: name}
	}
	return kallsyms.Function{Name: kallsyms.Unknown}
}

// sample is one ring sample: a record of hop, with a struct hoptrace_values of fields and values.
func sample(id uint32, hop uint16, fields []record.ActionField, values []uint64) []byte {
	raw := make([]byte, record.Size+record.ValuesSize)
	record.Encode(raw, &record.Record{TsNs: uint64(id), PacketID: id, HopIndex: hop, TraceSlot: 3,
		Flags: record.FlagUDP | record.FlagValues})
	v := raw[record.Size:]
	for i, f := range fields {
		v[i] = byte(f)
		binary.LittleEndian.PutUint64(v[8+8*i:], values[i])
	}
	binary.LittleEndian.PutUint32(v[record.ValuesMax:], uint32(len(fields)))
	return raw
}

// A drop hop's record leaves the reader with its function's ID where the kernel wrote an address,
// and the batch names the ID; an address of no function becomes 0, named nowhere. Other values
// are left as they were.
func TestReaderNamesDropFunctions(t *testing.T) {
	const nfHookSlow, udpRcv, nowhere = 0xffffffff81f81fd3, 0xffffffff820a8123, 0xffffffff80000010
	q := NewQueue(1 << 20)
	r := &Reader{out: q, maxRecords: DefaultBatchRecords, routes: map[uint16]*route{},
		Functions: namesOf{nfHookSlow: "nft_do_chain", udpRcv: "__udp4_lib_rcv"}}
	r.AddRoute(3, "drops", 1)
	drop := []record.ActionField{record.FieldDropReason, record.FieldDropFunction}
	samples := [][]byte{
		sample(1, 9, drop, []uint64{12, nfHookSlow}),
		sample(2, 9, drop, []uint64{3, udpRcv}),
		sample(3, 2, []record.ActionField{record.FieldLen, record.FieldTTL}, []uint64{nfHookSlow, 64}),
		sample(4, 9, drop, []uint64{12, nowhere}),
		sample(5, 9, drop, []uint64{12, nfHookSlow}),
	}
	var last routeCache
	r.mu.Lock()
	for _, raw := range samples {
		r.addLocked(raw, &last)
	}
	r.mu.Unlock()
	r.FlushAll()
	b := q.Pop(context.Background())
	if b == nil || b.Count() != len(samples) {
		t.Fatalf("batch %+v, want %d records", b, len(samples))
	}
	want := [][]uint64{{12, kallsyms.FunctionID("nft_do_chain")}, {3, kallsyms.FunctionID("__udp4_lib_rcv")},
		{nfHookSlow, 64}, {12, 0}, {12, kallsyms.FunctionID("nft_do_chain")}}
	for i := range samples {
		v, err := record.DecodeValues(b.Values[i*record.ValuesSize:])
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Values) != 2 || v.Values[0] != want[i][0] || v.Values[1] != want[i][1] {
			t.Errorf("record %d: values %v, want %v", i+1, v.Values, want[i])
		}
	}
	names := map[uint64]string{kallsyms.FunctionID("nft_do_chain"): "nft_do_chain",
		kallsyms.FunctionID("__udp4_lib_rcv"): "__udp4_lib_rcv"}
	if len(b.Functions) != len(names) {
		t.Fatalf("functions %v, want %v", b.Functions, names)
	}
	for id, name := range names {
		if b.Functions[id] != name {
			t.Errorf("functions %v, want %v", b.Functions, names)
		}
	}
	// The next batch names only its own.
	r.mu.Lock()
	r.addLocked(sample(6, 2, []record.ActionField{record.FieldLen}, []uint64{60}), &last)
	r.mu.Unlock()
	r.FlushAll()
	if b := q.Pop(context.Background()); b == nil || b.Functions != nil {
		t.Fatalf("a batch without drops names %v", b.Functions)
	}
}

// BenchmarkReaderDropRecord is what the reader spends on a record with values, a drop hop's (its
// location named through kallsyms.Kernel, the name kept after the first) against one without a
// drop_function:
//
//	go test -run '^$' -bench ReaderDropRecord ./internal/stream
func BenchmarkReaderDropRecord(b *testing.B) {
	for _, c := range []struct {
		name   string
		fields []record.ActionField
	}{
		{"drop", []record.ActionField{record.FieldDropReason, record.FieldDropFunction}},
		{"values", []record.ActionField{record.FieldDropReason, record.FieldLen}},
	} {
		b.Run(c.name, func(b *testing.B) {
			// an address in the kernel's text when kallsyms can be read: its first symbol's
			addr := uint64(0xffffffff81000010)
			raw := sample(1, 9, c.fields, []uint64{3, addr})
			r := &Reader{out: NewQueue(1 << 20), maxRecords: DefaultBatchRecords, routes: map[uint16]*route{},
				Functions: kallsyms.Kernel}
			r.AddRoute(3, "drops", 1)
			kallsyms.Kernel.Function(addr) // the table read, before the clock starts
			var last routeCache
			b.ResetTimer()
			r.mu.Lock()
			for range b.N {
				r.addLocked(raw, &last)
			}
			r.mu.Unlock()
		})
	}
}
