// Package record mirrors the kernel/user shapes of kernel-patch/include/hoptrace.h:
// struct hoptrace_record (one timestamp of one packet at one hop), its flags,
// the wire constants and enum hoptrace_counter (per-hop counters). The
// mirrors are generated from the object's BTF (record_gen.go, `make vocab`);
// TestRecordLayoutMatchesBTF compares them with the BTF again.
package record

import (
	"encoding/binary"
	"fmt"
)

//go:generate sh -c "cd ../../.. && make vocab"

// Field describes one member of struct hoptrace_record as the Go side reads it.
type Field struct {
	Name   string // C member name
	Offset uint32 // bytes
	Size   uint32 // bytes
}

func errShort(n int) error { return fmt.Errorf("record: %d bytes, want %d", n, Size) }

// TraceSlot reads only the trace_slot of a raw record, for routing.
func TraceSlot(b []byte) uint16 { return binary.LittleEndian.Uint16(b[OffsetTraceSlot:]) }

// HopIndex reads only the hop_index of a raw record.
func HopIndex(b []byte) uint16 { return binary.LittleEndian.Uint16(b[OffsetHopIndex:]) }

// HasValues says whether a raw record is followed by a struct hoptrace_values (the record action).
func HasValues(b []byte) bool {
	return len(b) >= Size && binary.LittleEndian.Uint16(b[OffsetFlags:])&FlagValues != 0
}

// Values is struct hoptrace_values: the record action's fields and their values of one packet.
type Values struct {
	Fields []ActionField
	Values []uint64
}

// DecodeValues reads one struct hoptrace_values (layout checked against BTF by vocabgen).
func DecodeValues(b []byte) (Values, error) {
	if len(b) < ValuesSize {
		return Values{}, fmt.Errorf("record values: %d bytes, want %d", len(b), ValuesSize)
	}
	le := binary.LittleEndian
	n := int(le.Uint32(b[ValuesMax:]))
	if n > ValuesMax {
		return Values{}, fmt.Errorf("record values: count %d > %d", n, ValuesMax)
	}
	v := Values{Fields: make([]ActionField, n), Values: make([]uint64, n)}
	for i := 0; i < n; i++ {
		v.Fields[i] = ActionField(b[i])
		v.Values[i] = le.Uint64(b[8+8*i:])
	}
	return v, nil
}

// Counters holds one hop's counters summed over CPUs, indexed by Counter.
type Counters [CMax]uint64
