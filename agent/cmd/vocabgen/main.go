// Command vocabgen generates the user-space mirrors of kernel-patch/include/hoptrace.h
// from the BTF of the compiled object, so the C header stays the one definition of
// the record layout, its flags, the wire constants and the per-hop counters,
// and hop.bpf.h's program macros the one definition of the program names:
//
//	vocabgen -object kernel-patch/build/hoptrace.bpf.o \
//	    -go agent/internal/record/record_gen.go \
//	    -go-programs agent/internal/loader/programs_gen.go \
//	    -python proto/gen/python/hoptrace/kernel_abi.py \
//	    -proto proto/hoptrace/v1/counters.proto
//
// `make vocab` runs it; `make proto-check` fails when its output in git is stale.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/format"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
)

const (
	recordStruct  = "hoptrace_record"
	valuesStruct  = "hoptrace_values"
	addrsStruct   = "hoptrace_addresses"
	captureStruct = "hoptrace_capture"
	flagEnum      = "hoptrace_record_flag"
	counterEnum   = "hoptrace_counter"
	wireEnum      = "hoptrace_wire"
	fieldEnum     = "hoptrace_field"
	eventOpEnum   = "hoptrace_event_op"
	eventKeyEnum  = "hoptrace_event_key"
	source        = "kernel-patch/include/hoptrace.h"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vocabgen:", err)
		os.Exit(1)
	}
}

func run() error {
	object := flag.String("object", "", "BPF object whose BTF holds the hoptrace.h types")
	goOut := flag.String("go", "", "Go file to write (package record)")
	goProgramsOut := flag.String("go-programs", "", "Go file to write (package loader): program names")
	pyOut := flag.String("python", "", "Python module to write")
	protoOut := flag.String("proto", "", "proto file to write (enum Counter)")
	allowOut := flag.String("allowlist", "", "Go file to write (package allowlist): what the shipped objects use")
	allowObjects := flag.String("allowlist-objects", "", "KIND=OBJECT,... the objects the allowlist is made of")
	flag.Parse()
	if *object == "" {
		return fmt.Errorf("need -object")
	}
	v, err := readVocabulary(*object)
	if err != nil {
		return err
	}
	outputs := []struct {
		path   string
		render func(*vocabulary) ([]byte, error)
	}{{*goOut, renderGo}, {*goProgramsOut, renderGoPrograms}, {*pyOut, renderPython}, {*protoOut, renderProto}}
	if *allowOut != "" {
		policies, err := readPolicies(*allowObjects)
		if err != nil {
			return err
		}
		outputs = append(outputs, struct {
			path   string
			render func(*vocabulary) ([]byte, error)
		}{*allowOut, func(*vocabulary) ([]byte, error) { return renderAllowlist(policies) }})
	}
	for _, o := range outputs {
		if o.path == "" {
			continue
		}
		text, err := o.render(v)
		if err != nil {
			return fmt.Errorf("%s: %w", o.path, err)
		}
		if err := os.WriteFile(o.path, text, 0o644); err != nil {
			return err
		}
	}
	return nil
}

type member struct {
	Name   string
	Offset uint32 // bytes
	Size   uint32 // bytes
	Signed bool
}

type constant struct {
	Name  string // the C name without its prefix, e.g. "SEEN"
	Value uint64
}

type vocabulary struct {
	RecordSize  uint32
	ValuesSize  uint32 // sizeof(struct hoptrace_values), its layout checked by checkLayout
	AddrsSize   uint32 // sizeof(struct hoptrace_addresses), its layout checked by checkLayout
	CaptureSize uint32 // sizeof(struct hoptrace_capture), its layout checked by checkLayout
	Record      []member
	Flags       []constant
	Counters    []constant // without HOPTRACE_C_MAX
	Wire        []constant
	Fields      []constant // without HOPTRACE_FIELD_MAX
	EventOps    []constant // without HOPTRACE_EVENT_OP_MAX
	EventKeys   []constant
	Programs    []program // sorted by name
}

type program struct {
	Name    string // ELF function name, e.g. hop_tc
	Section string // e.g. tc, tp_btf/net_dev_xmit
}

// layoutMember is one member a reader decodes: its byte offset, its element count (0: not an array)
// and the size of one element.
type layoutMember struct {
	name           string
	offset, nelems uint32
	size           uint32
}

// The trailers a record may carry, as the Go and Python readers decode them.
var (
	// u8 field[N] at 0, u32 count at N, u64 value[N] at 8, N = 4 (HOPTRACE_VALUES_MAX)
	valuesLayout = []layoutMember{{"field", 0, 4, 1}, {"count", 4, 0, 4}, {"value", 8, 4, 8}}
	// u32 saddr[4], u32 daddr[4], u16 sport, u16 dport, u8 proto, u8 family, u8 pad[2]
	addrsLayout = []layoutMember{{"saddr", 0, 4, 4}, {"daddr", 16, 4, 4}, {"sport", 32, 0, 2},
		{"dport", 34, 0, 2}, {"proto", 36, 0, 1}, {"family", 37, 0, 1}, {"pad", 38, 2, 1}}
	// u32 wire_len, u16 captured, u16 link_type, u8 bytes[N], N = 128 (HOPTRACE_CAPTURE_MAX)
	captureLayout = []layoutMember{{"wire_len", 0, 0, 4}, {"captured", 4, 0, 2}, {"link_type", 6, 0, 2},
		{"bytes", 8, 128, 1}}
)

// checkLayout checks the struct is what the readers decode (want), and returns its size.
func checkLayout(spec *btf.Spec, name string, want []layoutMember) (uint32, error) {
	var st *btf.Struct
	if err := spec.TypeByName(name, &st); err != nil {
		return 0, fmt.Errorf("struct %s: %w", name, err)
	}
	if len(st.Members) != len(want) {
		return 0, fmt.Errorf("struct %s: %d members, the readers decode %d", name, len(st.Members), len(want))
	}
	for i, m := range st.Members {
		w := want[i]
		typ, n := btf.UnderlyingType(m.Type), uint32(0)
		if arr, ok := typ.(*btf.Array); ok {
			typ, n = btf.UnderlyingType(arr.Type), arr.Nelems
		}
		in, ok := typ.(*btf.Int)
		if !ok || m.Name != w.name || uint32(m.Offset)/8 != w.offset || n != w.nelems || in.Size != w.size {
			return 0, fmt.Errorf("struct %s: member %d (%s) is not the layout the readers decode", name, i, m.Name)
		}
	}
	return st.Size, nil
}

func readVocabulary(object string) (*vocabulary, error) {
	spec, err := btf.LoadSpec(object)
	if err != nil {
		return nil, fmt.Errorf("BTF of %s: %w", object, err)
	}
	var rec *btf.Struct
	if err := spec.TypeByName(recordStruct, &rec); err != nil {
		return nil, fmt.Errorf("struct %s: %w", recordStruct, err)
	}
	v := &vocabulary{RecordSize: rec.Size}
	if v.ValuesSize, err = checkLayout(spec, valuesStruct, valuesLayout); err != nil {
		return nil, err
	}
	if v.AddrsSize, err = checkLayout(spec, addrsStruct, addrsLayout); err != nil {
		return nil, err
	}
	if v.CaptureSize, err = checkLayout(spec, captureStruct, captureLayout); err != nil {
		return nil, err
	}
	for _, m := range rec.Members {
		in, ok := btf.UnderlyingType(m.Type).(*btf.Int)
		if !ok || m.BitfieldSize != 0 || m.Offset%8 != 0 {
			return nil, fmt.Errorf("struct %s: member %s is not a whole integer", recordStruct, m.Name)
		}
		v.Record = append(v.Record, member{m.Name, uint32(m.Offset) / 8, in.Size, in.Encoding&btf.Signed != 0})
	}
	enums := []struct {
		name, prefix string
		out          *[]constant
	}{{flagEnum, "HOPTRACE_F_", &v.Flags}, {counterEnum, "HOPTRACE_C_", &v.Counters}, {wireEnum, "HOPTRACE_", &v.Wire}, {fieldEnum, "HOPTRACE_FIELD_", &v.Fields},
		{eventOpEnum, "HOPTRACE_EVENT_OP_", &v.EventOps}, {eventKeyEnum, "HOPTRACE_EVENT_KEY_", &v.EventKeys}}
	for _, e := range enums {
		var enum *btf.Enum
		if err := spec.TypeByName(e.name, &enum); err != nil {
			return nil, fmt.Errorf("enum %s (is it anchored in hoptrace.bpf.c?): %w", e.name, err)
		}
		for _, ev := range enum.Values {
			name, ok := strings.CutPrefix(ev.Name, e.prefix)
			if !ok {
				return nil, fmt.Errorf("enum %s: %s lacks the prefix %s", e.name, ev.Name, e.prefix)
			}
			*e.out = append(*e.out, constant{name, ev.Value})
		}
	}
	last := v.Counters[len(v.Counters)-1]
	if last.Name != "MAX" || last.Value != uint64(len(v.Counters)-1) {
		return nil, fmt.Errorf("enum %s must be dense from 0 and end with HOPTRACE_C_MAX", counterEnum)
	}
	for i, c := range v.Counters {
		if c.Value != uint64(i) {
			return nil, fmt.Errorf("enum %s: %s = %d, want %d (dense)", counterEnum, c.Name, c.Value, i)
		}
	}
	v.Counters = v.Counters[:len(v.Counters)-1]
	for i, f := range v.Fields {
		if f.Value != uint64(i) {
			return nil, fmt.Errorf("enum %s: %s = %d, want %d (dense)", fieldEnum, f.Name, f.Value, i)
		}
	}
	if len(v.Fields) < 2 || v.Fields[0].Name != "NONE" || v.Fields[len(v.Fields)-1].Name != "MAX" {
		return nil, fmt.Errorf("enum %s must start with HOPTRACE_FIELD_NONE and end with HOPTRACE_FIELD_MAX", fieldEnum)
	}
	v.Fields = v.Fields[:len(v.Fields)-1]
	for i, o := range v.EventOps {
		if o.Value != uint64(i) {
			return nil, fmt.Errorf("enum %s: %s = %d, want %d (dense)", eventOpEnum, o.Name, o.Value, i)
		}
	}
	if len(v.EventOps) < 2 || v.EventOps[0].Name != "NONE" || v.EventOps[len(v.EventOps)-1].Name != "MAX" {
		return nil, fmt.Errorf("enum %s must start with HOPTRACE_EVENT_OP_NONE and end with HOPTRACE_EVENT_OP_MAX", eventOpEnum)
	}
	v.EventOps = v.EventOps[:len(v.EventOps)-1]

	coll, err := ebpf.LoadCollectionSpec(object)
	if err != nil {
		return nil, fmt.Errorf("programs of %s: %w", object, err)
	}
	// Plans name a program; its _floor variant (hop.bpf.h) is the loader's choice, not a name of its own.
	for name, ps := range coll.Programs {
		if base, ok := strings.CutSuffix(name, floorSuffix); ok {
			if coll.Programs[base] == nil {
				return nil, fmt.Errorf("program %s has no %s to be the floor variant of", name, base)
			}
			continue
		}
		if coll.Programs[name+floorSuffix] == nil {
			return nil, fmt.Errorf("program %s has no %s%s variant (hop.bpf.h's program macros)", name, name, floorSuffix)
		}
		v.Programs = append(v.Programs, program{name, ps.SectionName})
	}
	sort.Slice(v.Programs, func(i, j int) bool { return v.Programs[i].Name < v.Programs[j].Name })
	return v, nil
}

// goName turns C words into a Go identifier, keeping Go's initialisms.
func goName(c string) string {
	initialisms := map[string]string{
		"ID": "ID", "IP": "IP", "IPV6": "IPv6", "TCP": "TCP", "UDP": "UDP", "VXLAN": "VXLAN",
		"VLAN": "VLAN", "GSO": "GSO", "NS": "Ns", "CPU": "CPU", "TC": "TC", "XDP": "XDP", "TP": "TP", "BTF": "BTF", "SKB": "SKB", "TCPOPT": "TCPOpt", "EXID": "ExID", "TOS": "TOS", "TTL": "TTL", "PID": "PID",
	}
	var b strings.Builder
	for _, w := range strings.Split(strings.ToUpper(c), "_") {
		if s, ok := initialisms[w]; ok {
			b.WriteString(s)
			continue
		}
		if w != "" {
			b.WriteString(w[:1] + strings.ToLower(w[1:]))
		}
	}
	return b.String()
}

const header = "Code generated by agent/cmd/vocabgen from the BTF of kernel-patch/build/hoptrace.bpf.o (" + source + "); DO NOT EDIT. Run `make vocab`."

func renderGo(v *vocabulary) ([]byte, error) {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("// %s\n\npackage record\n\nimport \"encoding/binary\"\n\n", header)
	p("// Size is sizeof(struct %s).\nconst Size = %d\n\n", recordStruct, v.RecordSize)
	p("// ValuesSize is sizeof(struct %s): u8 field[4], u32 count, u64 value[4].\nconst ValuesSize = %d\n\n", valuesStruct, v.ValuesSize)
	p("// AddressesSize is sizeof(struct %s): u32 saddr[4], u32 daddr[4], u16 sport, u16 dport, u8 proto, u8 family, u8 pad[2].\nconst AddressesSize = %d\n\n", addrsStruct, v.AddrsSize)
	p("// CaptureSize is sizeof(struct %s): u32 wire_len, u16 captured, u16 link_type, u8 bytes[128].\nconst CaptureSize = %d\n\n", captureStruct, v.CaptureSize)
	p("// Record is struct %s, decoded from its little-endian bytes.\ntype Record struct {\n", recordStruct)
	for _, m := range v.Record {
		p("\t%s %s\n", goName(m.Name), goInt(m))
	}
	p("}\n\n// Fields is the layout Decode relies on, in C declaration order.\nvar Fields = []Field{\n")
	for _, m := range v.Record {
		p("\t{%q, %d, %d},\n", m.Name, m.Offset, m.Size)
	}
	p("}\n\n// Byte offsets of the members, for readers that route raw records.\nconst (\n")
	for _, m := range v.Record {
		p("\tOffset%s = %d\n", goName(m.Name), m.Offset)
	}
	p(")\n\n// Decode fills r from one ring buffer sample without allocating.\nfunc Decode(b []byte, r *Record) error {\n")
	p("\tif len(b) < Size {\n\t\treturn errShort(len(b))\n\t}\n\tle := binary.LittleEndian\n")
	for _, m := range v.Record {
		p("\tr.%s = %s\n", goName(m.Name), goRead(m))
	}
	p("\treturn nil\n}\n\n// Encode writes r into b (len >= Size); the inverse of Decode, for tests and tools.\n")
	p("func Encode(b []byte, r *Record) {\n\tle := binary.LittleEndian\n")
	for _, m := range v.Record {
		p("\t%s\n", goWrite(m, "r."+goName(m.Name)))
	}
	p("}\n\n// Record flags: enum %s.\nconst (\n", flagEnum)
	for _, f := range v.Flags {
		p("\tFlag%s = %d\n", goName(f.Name), f.Value)
	}
	p(")\n\n// Wire and ID constants: enum %s.\nconst (\n", wireEnum)
	for _, w := range v.Wire {
		p("\t%s = %d\n", goName(w.Name), w.Value)
	}
	p(")\n\n// Counter is enum %s: the index into a hop's percpu counters map\n", counterEnum)
	p("// and into HopCounters.values on the wire.\ntype Counter uint32\n\nconst (\n")
	for _, c := range v.Counters {
		p("\tC%s Counter = %d\n", goName(c.Name), c.Value)
	}
	p("\tCMax Counter = %d\n)\n\n// CounterKeys names each counter as JSON output, metrics and the collector do, by index.\n", len(v.Counters))
	p("var CounterKeys = [CMax]string{\n")
	for _, c := range v.Counters {
		p("\t%q,\n", strings.ToLower(c.Name))
	}
	p("}\n\n// ActionField is enum %s: what a hop's count (by) or histogram reads.\ntype ActionField uint8\n\nconst (\n", fieldEnum)
	for _, f := range v.Fields {
		p("\tField%s ActionField = %d\n", goName(f.Name), f.Value)
	}
	p("\tFieldMax ActionField = %d\n)\n\n// FieldKeys names each field as specs, the collector and reports do, by value.\n", len(v.Fields))
	p("var FieldKeys = [FieldMax]string{\n")
	for _, f := range v.Fields {
		p("\t%q,\n", strings.ToLower(f.Name))
	}
	p("}\n\n// EventOp is enum %s: the operator of an event's where: term.\ntype EventOp uint8\n\nconst (\n", eventOpEnum)
	for _, o := range v.EventOps {
		p("\tEventOp%s EventOp = %d\n", goName(o.Name), o.Value)
	}
	p("\tEventOpMax EventOp = %d\n)\n\n// EventKey is enum %s: what an event's count is keyed by.\ntype EventKey uint8\n\nconst (\n", len(v.EventOps), eventKeyEnum)
	for _, k := range v.EventKeys {
		p("\tEventKey%s EventKey = %d\n", goName(k.Name), k.Value)
	}
	p(")\n")
	p("\n// counterCNames and flagCNames are the C names, for the BTF comparison in tests.\n")
	p("var counterCNames = [CMax]string{\n")
	for _, c := range v.Counters {
		p("\t\"HOPTRACE_C_%s\",\n", c.Name)
	}
	p("}\n\nvar flagCNames = map[string]uint16{\n")
	for _, f := range v.Flags {
		p("\t\"HOPTRACE_F_%s\": Flag%s,\n", f.Name, goName(f.Name))
	}
	p("}\n")
	return format.Source(b.Bytes())
}

// floorSuffix names a program's variant for kernels from 5.10 (hop.bpf.h).
const floorSuffix = "_floor"

// programGoName is the loader's constant for a program: ProgTC for hop_tc, ProgTagTCP for tag_tcp.
func programGoName(name string) string {
	return "Prog" + goName(strings.TrimPrefix(name, "hop_"))
}

func renderGoPrograms(v *vocabulary) ([]byte, error) {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("// %s\n\npackage loader\n\n", strings.Replace(header, "("+source+")", "(kernel-patch/include/hop.bpf.h)", 1))
	p("// Program names of the objects (ELF function names, one per HOPTRACE_PROG_* macro).\nconst (\n")
	for _, pr := range v.Programs {
		p("\t%s = %q // SEC(%q)\n", programGoName(pr.Name), pr.Name, pr.Section)
	}
	p(")\n\n// FloorSuffix names each program's variant for kernels from 5.10 (hop.bpf.h).\nconst FloorSuffix = %q\n", floorSuffix)
	return format.Source(b.Bytes())
}

func goInt(m member) string {
	t := fmt.Sprintf("uint%d", m.Size*8)
	if m.Signed {
		t = t[1:]
	}
	return t
}

func goRead(m member) string {
	if m.Size == 1 {
		return fmt.Sprintf("%s(b[%d])", goInt(m), m.Offset)
	}
	read := fmt.Sprintf("le.Uint%d(b[%d:])", m.Size*8, m.Offset)
	if m.Signed {
		return fmt.Sprintf("%s(%s)", goInt(m), read)
	}
	return read
}

func goWrite(m member, value string) string {
	if m.Size == 1 {
		return fmt.Sprintf("b[%d] = uint8(%s)", m.Offset, value)
	}
	if m.Signed {
		value = fmt.Sprintf("uint%d(%s)", m.Size*8, value)
	}
	return fmt.Sprintf("le.PutUint%d(b[%d:], %s)", m.Size*8, m.Offset, value)
}

func renderPython(v *vocabulary) ([]byte, error) {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# %s\n\"\"\"The kernel/user vocabulary of %s, for Python: the record layout, its flags,\nthe wire constants and the per-hop counters.\"\"\"\n\n", header, source)
	format := "<"
	at := uint32(0)
	for _, m := range v.Record {
		if m.Offset > at {
			format += fmt.Sprintf("%dx", m.Offset-at)
		}
		code := map[uint32]string{1: "B", 2: "H", 4: "I", 8: "Q"}[m.Size]
		if m.Signed {
			code = strings.ToLower(code)
		}
		format += code
		at = m.Offset + m.Size
	}
	if v.RecordSize > at {
		format += fmt.Sprintf("%dx", v.RecordSize-at)
	}
	p("# struct %s, little-endian (struct module format).\nRECORD_FORMAT = %q\nRECORD_SIZE = %d\n", recordStruct, format, v.RecordSize)
	p("# struct %s (u8 field[4], u32 count, u64 value[4]; layout checked by vocabgen).\nVALUES_FORMAT = \"<4BI4Q\"\nVALUES_SIZE = %d\n", valuesStruct, v.ValuesSize)
	p("# struct %s (addresses in network order, ports in host order; layout checked by vocabgen).\nADDRESSES_FORMAT = \"<16s16sHHBB2x\"\nADDRESSES_SIZE = %d\n", addrsStruct, v.AddrsSize)
	p("# struct %s (u32 wire_len, u16 captured, u16 link_type, u8 bytes[128]; layout checked by vocabgen).\nCAPTURE_FORMAT = \"<IHH128s\"\nCAPTURE_SIZE = %d\n", captureStruct, v.CaptureSize)
	p("RECORD_FIELDS = (\n")
	for _, m := range v.Record {
		p("    %q,\n", m.Name)
	}
	p(")\n\n# enum %s\nRECORD_FLAGS = {\n", flagEnum)
	for _, f := range v.Flags {
		p("    %q: %d,\n", f.Name, f.Value)
	}
	p("}\n\n# enum %s (HOPTRACE_ prefix dropped)\n", wireEnum)
	for _, w := range v.Wire {
		p("%s = %d\n", w.Name, w.Value)
	}
	p("\n# Programs of the objects (kernel-patch/include/hop.bpf.h macros): ELF name -> section.\nPROGRAMS = {\n")
	for _, pr := range v.Programs {
		p("    %q: %q,\n", pr.Name, pr.Section)
	}
	p("}\n")
	p("\n# enum %s: counter names in index order (HopCounters.values).\nCOUNTERS = (\n", counterEnum)
	for _, c := range v.Counters {
		p("    %q,\n", strings.ToLower(c.Name))
	}
	p(")\n")
	p("\n# enum %s: field names by value (\"none\" = 0), as specs spell them.\nFIELDS = (\n", fieldEnum)
	for _, f := range v.Fields {
		p("    %q,\n", strings.ToLower(f.Name))
	}
	p(")\n")
	p("\n# enum %s: event where: operators by value (\"none\" = 0).\nEVENT_OPS = (\n", eventOpEnum)
	for _, o := range v.EventOps {
		p("    %q,\n", strings.ToLower(o.Name))
	}
	p(")\n")
	p("\n# enum %s: what an event's count is keyed by, by value.\nEVENT_KEYS = (\n", eventKeyEnum)
	for _, k := range v.EventKeys {
		p("    %q,\n", strings.ToLower(k.Name))
	}
	p(")\n")
	return b.Bytes(), nil
}

func renderProto(v *vocabulary) ([]byte, error) {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("// %s\n\nsyntax = \"proto3\";\n\npackage hoptrace.v1;\n\n", header)
	p("option go_package = \"github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1;hoptracev1\";\n\n")
	p("// The per-hop counters (enum %s): HopCounters.values is indexed by it.\nenum Counter {\n", counterEnum)
	for _, c := range v.Counters {
		p("  COUNTER_%s = %d;\n", c.Name, c.Value)
	}
	p("}\n\n// The field catalogue of hop actions (enum %s).\nenum Field {\n", fieldEnum)
	for _, f := range v.Fields {
		name := "FIELD_" + f.Name
		if f.Name == "NONE" {
			name = "FIELD_UNSPECIFIED"
		}
		p("  %s = %d;\n", name, f.Value)
	}
	p("}\n\n// The operators of an event's where: terms (enum %s).\nenum EventOp {\n", eventOpEnum)
	for _, o := range v.EventOps {
		name := "EVENT_OP_" + o.Name
		if o.Name == "NONE" {
			name = "EVENT_OP_UNSPECIFIED"
		}
		p("  %s = %d;\n", name, o.Value)
	}
	p("}\n\n// What an event's count is keyed by (enum %s).\nenum EventKey {\n", eventKeyEnum)
	for _, k := range v.EventKeys {
		p("  EVENT_KEY_%s = %d;\n", k.Name, k.Value)
	}
	p("}\n")
	return b.Bytes(), nil
}

// objectPolicy is what the programs of one shipped object use, per program type.
type objectPolicy struct {
	Kind  string // "hops", "mace", "iron"
	Types map[ebpf.ProgramType]*typeUse
}

type typeUse struct {
	Attach  map[ebpf.AttachType]bool
	Helpers map[asm.BuiltinFunc]bool
	Kfuncs  map[string]bool
}

func readPolicies(list string) ([]objectPolicy, error) {
	var out []objectPolicy
	for _, item := range strings.Split(list, ",") {
		kind, path, ok := strings.Cut(item, "=")
		if !ok || kind == "" || path == "" {
			return nil, fmt.Errorf("-allowlist-objects: want KIND=OBJECT, got %q", item)
		}
		spec, err := ebpf.LoadCollectionSpec(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		pol := objectPolicy{Kind: kind, Types: map[ebpf.ProgramType]*typeUse{}}
		for _, ps := range spec.Programs {
			use := pol.Types[ps.Type]
			if use == nil {
				use = &typeUse{map[ebpf.AttachType]bool{}, map[asm.BuiltinFunc]bool{}, map[string]bool{}}
				pol.Types[ps.Type] = use
			}
			use.Attach[ps.AttachType] = true
			for _, ins := range ps.Instructions {
				switch {
				case ins.IsBuiltinCall():
					use.Helpers[asm.BuiltinFunc(ins.Constant)] = true
				case ins.IsKfuncCall():
					use.Kfuncs[ins.Reference()] = true
				}
			}
		}
		out = append(out, pol)
	}
	return out, nil
}

func sortedKeys[K comparable](m map[K]bool, name func(K) string) []string {
	var out []string
	for k := range m {
		out = append(out, name(k))
	}
	sort.Strings(out)
	return out
}

func renderAllowlist(policies []objectPolicy) ([]byte, error) {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("// Code generated by agent/cmd/vocabgen from the objects hoptrace ships (kernel-patch/build/*.bpf.o); DO NOT EDIT. Run `make vocab`.\n\n")
	p("package allowlist\n\nimport (\n\t\"github.com/cilium/ebpf\"\n\t\"github.com/cilium/ebpf/asm\"\n)\n\n")
	p("// shipped is, per kind of object, what hoptrace's own programs use: their program and attach types,\n")
	p("// helpers and kfuncs. Nothing else is loaded.\nvar shipped = map[Object]map[ebpf.ProgramType]typePolicy{\n")
	for _, pol := range policies {
		p("\t%q: {\n", pol.Kind)
		types := make([]ebpf.ProgramType, 0, len(pol.Types))
		for t := range pol.Types {
			types = append(types, t)
		}
		sort.Slice(types, func(i, j int) bool { return types[i].String() < types[j].String() })
		for _, t := range types {
			use := pol.Types[t]
			p("\t\tebpf.%s: {\n\t\t\tattach: set(", t)
			for _, a := range sortedKeys(use.Attach, func(a ebpf.AttachType) string { return "ebpf.Attach" + a.String() }) {
				p("%s, ", a)
			}
			p("),\n\t\t\thelpers: set(")
			for _, h := range sortedKeys(use.Helpers, func(f asm.BuiltinFunc) string { return "asm." + f.String() }) {
				p("%s, ", h)
			}
			p("),\n\t\t\tkfuncs: set[string](")
			for _, k := range sortedKeys(use.Kfuncs, func(k string) string { return strconv.Quote(k) }) {
				p("%s, ", k)
			}
			p("),\n\t\t},\n")
		}
		p("\t},\n")
	}
	p("}\n")
	return format.Source(b.Bytes())
}
