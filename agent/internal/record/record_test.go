package record

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// objectPath is the generic BPF object built by `make bpf`.
var objectPath = filepath.Join("..", "..", "..", "kernel-patch", "build", "hoptrace.bpf.o")

func loadObjectBTF(t *testing.T) *btf.Spec {
	t.Helper()
	f, err := os.Open(objectPath)
	if errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s missing: run make bpf", objectPath)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	spec, err := btf.LoadSpecFromReader(f)
	if err != nil {
		t.Fatalf("BTF of %s: %v", objectPath, err)
	}
	return spec
}

func TestRecordLayoutMatchesBTF(t *testing.T) {
	spec := loadObjectBTF(t)

	var st *btf.Struct
	if err := spec.TypeByName("hoptrace_record", &st); err != nil {
		t.Fatalf("struct hoptrace_record in BTF: %v", err)
	}
	if st.Size != Size {
		t.Errorf("sizeof(struct hoptrace_record) = %d, Go Size = %d", st.Size, Size)
	}
	if len(st.Members) != len(Fields) {
		t.Errorf("C has %d members, Go %d", len(st.Members), len(Fields))
	}
	for i, m := range st.Members {
		if i >= len(Fields) {
			t.Errorf("C member %s has no Go mirror", m.Name)
			continue
		}
		f := Fields[i]
		size, err := btf.Sizeof(m.Type)
		if err != nil {
			t.Fatal(err)
		}
		if m.Name != f.Name || m.Offset.Bytes() != f.Offset || uint32(size) != f.Size {
			t.Errorf("member %d: C %s@%d size %d, Go %s@%d size %d",
				i, m.Name, m.Offset.Bytes(), size, f.Name, f.Offset, f.Size)
		}
	}

	// The Go struct itself has the same layout, so a decoded record and the
	// raw bytes agree field by field.
	rt := reflect.TypeOf(Record{})
	if rt.Size() != Size {
		t.Errorf("Go Record is %d bytes", rt.Size())
	}
	for i := 0; i < rt.NumField(); i++ {
		if uint32(rt.Field(i).Offset) != Fields[i].Offset || uint32(rt.Field(i).Type.Size()) != Fields[i].Size {
			t.Errorf("Go field %s @%d size %d, table says %+v", rt.Field(i).Name, rt.Field(i).Offset, rt.Field(i).Type.Size(), Fields[i])
		}
	}
}

func checkEnum(t *testing.T, spec *btf.Spec, name string, want map[string]uint64) {
	t.Helper()
	var e *btf.Enum
	if err := spec.TypeByName(name, &e); err != nil {
		t.Fatalf("enum %s in BTF: %v", name, err)
	}
	seen := map[string]bool{}
	for _, v := range e.Values {
		seen[v.Name] = true
		w, ok := want[v.Name]
		if !ok {
			t.Errorf("%s: C value %s=%d has no Go mirror", name, v.Name, v.Value)
			continue
		}
		if v.Value != w {
			t.Errorf("%s: %s C=%d Go=%d", name, v.Name, v.Value, w)
		}
	}
	for n := range want {
		if !seen[n] {
			t.Errorf("%s: Go has %s, C does not", name, n)
		}
	}
}

func TestCounterEnumMatchesBTF(t *testing.T) {
	spec := loadObjectBTF(t)
	want := map[string]uint64{"HOPTRACE_C_MAX": uint64(CMax)}
	for i, n := range counterCNames {
		want[n] = uint64(i)
	}
	checkEnum(t, spec, "hoptrace_counter", want)
}

// The enum reaches BTF through its anchor in hoptrace.bpf.c; a missing enum fails.
func TestFlagEnumMatchesBTF(t *testing.T) {
	spec := loadObjectBTF(t)
	want := map[string]uint64{}
	for n, v := range flagCNames {
		want[n] = uint64(v)
	}
	checkEnum(t, spec, "hoptrace_record_flag", want)
}

func TestDecodeEncodeRoundTrip(t *testing.T) {
	in := Record{TsNs: 1<<40 + 7, PacketID: 0x01000002, FlowHash: 0xdeadbeef, Ifindex: 3, WireLen: 1514,
		HopIndex: 2, TraceSlot: 9, CPU: 1, Flags: FlagUDP | FlagTaggedHere}
	var b [Size]byte
	Encode(b[:], &in)
	var out Record
	if err := Decode(b[:], &out); err != nil {
		t.Fatal(err)
	}
	if in != out {
		t.Fatalf("round trip: %+v != %+v", out, in)
	}
	if TraceSlot(b[:]) != 9 || HopIndex(b[:]) != 2 {
		t.Fatal("TraceSlot/HopIndex")
	}
	if err := Decode(b[:31], &out); err == nil {
		t.Fatal("short record accepted")
	}
	if testing.AllocsPerRun(100, func() { _ = Decode(b[:], &out) }) != 0 {
		t.Fatal("Decode allocates")
	}
}

// FuzzDecode: any bytes decode without panicking or allocating; a whole record encodes back to itself.
func FuzzDecode(f *testing.F) {
	var b [Size]byte
	Encode(b[:], &Record{TsNs: 1, PacketID: 0x07000001, HopIndex: 2, Flags: FlagUDP})
	f.Add(b[:])
	f.Add([]byte{})
	f.Add(make([]byte, Size-1))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var r Record
		err := Decode(raw, &r)
		if len(raw) < Size {
			if err == nil {
				t.Fatalf("%d bytes decoded", len(raw))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var again [Size]byte
		Encode(again[:], &r)
		if string(again[:]) != string(raw[:Size]) {
			t.Fatalf("round trip: %x -> %+v -> %x", raw[:Size], r, again)
		}
		if TraceSlot(raw) != r.TraceSlot || HopIndex(raw) != r.HopIndex {
			t.Fatal("TraceSlot/HopIndex disagree with Decode")
		}
	})
}

// A capture decodes to its captured bytes only; ScrubCapture zeroes what follows them in place (what the
// ring held there before), and a length beyond the struct is refused, not read past.
func TestCaptureScrubAndDecode(t *testing.T) {
	raw := make([]byte, CaptureSize)
	for i := range raw {
		raw[i] = 0xee // stale ring bytes
	}
	raw[0], raw[1], raw[2], raw[3] = 0xd2, 0x04, 0, 0 // wire_len 1234
	raw[4], raw[5] = 5, 0                             // captured 5
	raw[6], raw[7] = byte(CaptureLinkRaw), 0
	copy(raw[8:], "abcde")
	ScrubCapture(raw)
	c, err := DecodeCapture(raw)
	if err != nil {
		t.Fatal(err)
	}
	if c.WireLen != 1234 || c.LinkType != CaptureLinkRaw || string(c.Bytes) != "abcde" {
		t.Fatalf("decoded %+v", c)
	}
	for i, b := range raw[8+5:] {
		if b != 0 {
			t.Fatalf("byte %d past the captured ones is %#x after ScrubCapture", 8+5+i, b)
		}
	}
	raw[4] = CaptureMax + 1
	if _, err := DecodeCapture(raw); err == nil {
		t.Fatal("a capture longer than its bytes decoded")
	}
	ScrubCapture(raw[:CaptureSize-1]) // too short: left alone, no panic
	if _, err := DecodeCapture(raw[:CaptureSize-1]); err == nil {
		t.Fatal("a short capture decoded")
	}
}
