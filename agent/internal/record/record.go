// Package record mirrors the kernel/user shapes of kernel-patch/include/hoptrace.h:
// struct hoptrace_record (one timestamp of one packet at one hop), its flags,
// the wire constants and enum hoptrace_counter (per-hop counters). The
// mirrors are generated from the object's BTF (record_gen.go, `make vocab`);
// TestRecordLayoutMatchesBTF compares them with the BTF again.
package record

import (
	"encoding/binary"
	"fmt"
	"net/netip"
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

// Trailer is a struct that may follow a record in its ring sample, announced by a flag of the
// record's: the record action's values, then the addresses the hop saw, then the capture action's
// bytes, in that order.
type Trailer struct {
	Flag uint16
	Size int
}

var (
	ValuesTrailer    = Trailer{FlagValues, ValuesSize}
	AddressesTrailer = Trailer{FlagAddresses, AddressesSize}
	CaptureTrailer   = Trailer{FlagCapture, CaptureSize}
)

// Capture is struct hoptrace_capture: the first bytes of one packet at one hop.
type Capture struct {
	WireLen  uint32 // the packet's length from Bytes[0] on
	LinkType uint16 // CaptureLinkEthernet or CaptureLinkRaw (pcap's LINKTYPE_*)
	Bytes    []byte // the captured bytes, len = the struct's captured
}

// DecodeCapture reads one struct hoptrace_capture (layout checked against BTF by vocabgen).
func DecodeCapture(b []byte) (Capture, error) {
	if len(b) < CaptureSize {
		return Capture{}, fmt.Errorf("record capture: %d bytes, want %d", len(b), CaptureSize)
	}
	n := int(binary.LittleEndian.Uint16(b[4:]))
	if n > CaptureMax {
		return Capture{}, fmt.Errorf("record capture: %d bytes captured, at most %d", n, CaptureMax)
	}
	return Capture{WireLen: binary.LittleEndian.Uint32(b), LinkType: binary.LittleEndian.Uint16(b[6:]), Bytes: b[8 : 8+n]}, nil
}

// ScrubCapture zeroes the bytes of a struct hoptrace_capture past its captured ones: the hop writes
// only those, and the rest of its ring sample holds whatever the ring held before.
func ScrubCapture(b []byte) {
	if len(b) < CaptureSize {
		return
	}
	n := min(int(binary.LittleEndian.Uint16(b[4:])), CaptureMax)
	clear(b[8+n : CaptureSize])
}

// On says whether a raw record is followed by this trailer.
func (t Trailer) On(rec []byte) bool {
	return len(rec) >= Size && binary.LittleEndian.Uint16(rec[OffsetFlags:])&t.Flag != 0
}

// HasValues says whether a raw record is followed by a struct hoptrace_values (the record action).
func HasValues(b []byte) bool { return ValuesTrailer.On(b) }

// Addresses is struct hoptrace_addresses: the innermost 5-tuple one hop saw.
type Addresses struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
}

// DecodeAddresses reads one struct hoptrace_addresses (layout checked against BTF by vocabgen).
func DecodeAddresses(b []byte) (Addresses, error) {
	if len(b) < AddressesSize {
		return Addresses{}, fmt.Errorf("record addresses: %d bytes, want %d", len(b), AddressesSize)
	}
	a := Addresses{SrcPort: binary.LittleEndian.Uint16(b[32:]), DstPort: binary.LittleEndian.Uint16(b[34:]), Proto: b[36]}
	switch family := b[37]; family {
	case 4:
		a.Src, a.Dst = netip.AddrFrom4([4]byte(b[0:4])), netip.AddrFrom4([4]byte(b[16:20]))
	case 6:
		a.Src, a.Dst = netip.AddrFrom16([16]byte(b[0:16])), netip.AddrFrom16([16]byte(b[16:32]))
	default:
		return Addresses{}, fmt.Errorf("record addresses: family %d", family)
	}
	return a, nil
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
