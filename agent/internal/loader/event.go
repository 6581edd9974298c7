package loader

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/tracefs"
)

// EventArg is one tracepoint argument as event.bpf.h reads it.
type EventArg struct {
	Offset uint16
	Size   uint8 // 0 = not used
	Signed bool
}

// EventTerm is one resolved where: term: an integer argument and its
// values, or a string argument (TextKind, record.EventText*) and its Text.
type EventTerm struct {
	Arg      EventArg
	Op       record.EventOp
	Values   []uint64
	TextKind uint8
	Text     string
}

// EventArgs is where an event's arguments are found: a tracepoint's tracefs
// format, or a kernel function's arguments (FunctionArgs).
type EventArgs interface {
	Arg(name string) (tracefs.Arg, bool)
	Names() string
}

// FunctionEventArgs are a kernel function event's arguments: arg0.. (from
// the function's BTF, or Count u64 registers when BTF does not describe it)
// and pid, the current task's process id.
type FunctionEventArgs struct{ Args []tracefs.Arg }

// FunctionPID is the pseudo-argument of function events: the current task's process id.
const FunctionPID = "pid"

// UnknownFunctionArgs are a kprobe's arguments when BTF does not describe
// its function: n registers, u64 each.
func UnknownFunctionArgs(n int) FunctionEventArgs {
	f := FunctionEventArgs{}
	for i := 0; i < n; i++ {
		f.Args = append(f.Args, tracefs.Arg{Name: fmt.Sprintf("arg%d", i), Offset: uint16(i), Size: 8})
	}
	return f
}

func (f FunctionEventArgs) Arg(name string) (tracefs.Arg, bool) {
	if name == FunctionPID {
		return tracefs.Arg{Name: name, Offset: record.EventArgPID, Size: 4, Signed: true}, true
	}
	for _, a := range f.Args {
		if a.Name == name && int(a.Offset) < record.EventFunctionArgs {
			return a, true
		}
	}
	return tracefs.Arg{}, false
}

func (f FunctionEventArgs) Names() string {
	names := []string{}
	for _, a := range f.Args {
		if int(a.Offset) < record.EventFunctionArgs {
			names = append(names, a.Name)
		}
	}
	return strings.Join(append(names, FunctionPID), ", ")
}

// EventConfig is everything one event program is specialised with (the
// ev_* and act_count constants of event.bpf.h).
type EventConfig struct {
	Program string
	// Source: record.EventSource*; Function: the kernel function of a kprobe
	// or fentry event (set as an fentry program's AttachTo).
	Source   uint8
	Function string
	Terms    []EventTerm
	Count    bool
	Key      record.EventKey
	KeyArg   EventArg
	Hist     bool
	HistArg  EventArg
	// Record: the arguments whose statistics are kept (record: [ARGS]).
	Record []EventArg
	// Mark: remember this event's time under MarkArg's value for a later
	// event's latency; MarkIndex is this event's events[i].
	Mark      bool
	MarkIndex uint32
	MarkArg   EventArg
	// Latency: histogram the ns since events[LatencySince]'s time under
	// LatencyArg's value (the histogram then holds no argument).
	Latency      bool
	LatencySince uint32
	LatencyArg   EventArg
}

// UsesMarks: the event needs its trace's event_marks map.
func (c *EventConfig) UsesMarks() bool { return c.Mark || c.Latency }

// FieldError is a problem with one field of the user's spec
// ("events[0].where[1]"): the dispatcher shows it as is.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// ResolveEvent checks an EventAttach against its arguments on this node (the
// tracepoint's format, or the function's FunctionArgs) and returns its
// load-time constants. Errors are *FieldError naming events[i] and the part
// of it at fault.
func ResolveEvent(ea *pb.EventAttach, format EventArgs) (EventConfig, error) {
	field := fmt.Sprintf("events[%d]", ea.GetEventIndex())
	tp := "tracepoint " + ea.GetTracepointGroup() + ":" + ea.GetTracepointEvent()
	cfg := EventConfig{Program: ea.GetProgram(), Count: ea.GetCount(), Source: record.EventSourceTracepoint}
	switch ea.GetKind() {
	case pb.AttachKind_ATTACH_KIND_UNSPECIFIED, pb.AttachKind_ATTACH_KIND_TRACEPOINT:
	case pb.AttachKind_ATTACH_KIND_KPROBE:
		cfg.Source, cfg.Function, tp = record.EventSourceKprobe, ea.GetFunction(), "function "+ea.GetFunction()
	case pb.AttachKind_ATTACH_KIND_FENTRY:
		cfg.Source, cfg.Function, tp = record.EventSourceFentry, ea.GetFunction(), "function "+ea.GetFunction()
	default:
		return cfg, &FieldError{field, fmt.Sprintf("events attach to tracepoints, kprobes or fentry, not %s", ea.GetKind())}
	}
	arg := func(name, where string) (EventArg, error) {
		a, ok := format.Arg(name)
		if !ok {
			return EventArg{}, &FieldError{where, fmt.Sprintf("%s has no argument %q (arguments: %s)", tp, name, format.Names())}
		}
		if a.Unsupported != "" {
			return EventArg{}, &FieldError{where, fmt.Sprintf("argument %s of %s is %s: only integers of 1, 2, 4 or 8 bytes can be compared, keyed or histogrammed", name, strings.TrimPrefix(tp, "tracepoint "), a.Unsupported)}
		}
		if a.Offset != record.EventArgPID && int(a.Offset)+int(a.Size) > record.EventArgsBytes {
			return EventArg{}, &FieldError{where, fmt.Sprintf("argument %s of %s is at offset %d, beyond %d", name, tp, a.Offset, record.EventArgsBytes)}
		}
		return EventArg{Offset: a.Offset, Size: a.Size, Signed: a.Signed}, nil
	}
	if len(ea.GetWhere()) > record.EventTerms {
		return cfg, &FieldError{field + ".where", fmt.Sprintf("at most %d terms, got %d", record.EventTerms, len(ea.GetWhere()))}
	}
	for i, t := range ea.GetWhere() {
		where := fmt.Sprintf("%s.where[%d]", field, i)
		if t.GetText() != "" {
			term, err := textTerm(t, format, where, tp)
			if err != nil {
				return cfg, err
			}
			cfg.Terms = append(cfg.Terms, term)
			continue
		}
		if a, ok := format.Arg(t.GetArg()); ok && a.Text != 0 {
			return cfg, &FieldError{where, fmt.Sprintf("argument %s of %s is %s: compare it with == or != and a quoted text, e.g. %s == \"eth0\"", a.Name, strings.TrimPrefix(tp, "tracepoint "), a.Unsupported, a.Name)}
		}
		a, err := arg(t.GetArg(), where)
		if err != nil {
			return cfg, err
		}
		op := record.EventOp(t.GetOp())
		if op == record.EventOpNone || op >= record.EventOpMax {
			return cfg, &FieldError{where, fmt.Sprintf("operator %d is not one of the catalogue's", t.GetOp())}
		}
		n := len(t.GetValues())
		if n == 0 || n > record.EventInValues || (op != record.EventOpIn && n != 1) {
			return cfg, &FieldError{where, fmt.Sprintf("%d values (one, or 1..%d for in)", n, record.EventInValues)}
		}
		term := EventTerm{Arg: a, Op: op}
		for _, v := range t.GetValues() {
			term.Values = append(term.Values, uint64(v))
		}
		cfg.Terms = append(cfg.Terms, term)
	}
	switch ea.GetCountBy() {
	case pb.EventKey_EVENT_KEY_TOTAL:
	case pb.EventKey_EVENT_KEY_CPU:
		cfg.Key = record.EventKeyCPU
	case pb.EventKey_EVENT_KEY_ARG:
		a, err := arg(ea.GetCountByArg(), field+".actions")
		if err != nil {
			return cfg, err
		}
		cfg.Key, cfg.KeyArg = record.EventKeyArg, a
	default:
		return cfg, &FieldError{field + ".actions", fmt.Sprintf("count key %d unknown", ea.GetCountBy())}
	}
	if h := ea.GetHistogramArg(); h != "" {
		a, err := arg(h, field+".actions")
		if err != nil {
			return cfg, err
		}
		cfg.Hist, cfg.HistArg = true, a
	}
	if len(ea.GetRecordArgs()) > record.ValuesMax {
		return cfg, &FieldError{field + ".actions", fmt.Sprintf("record of %d arguments, at most %d", len(ea.GetRecordArgs()), record.ValuesMax)}
	}
	for _, name := range ea.GetRecordArgs() {
		a, err := arg(name, field+".actions")
		if err != nil {
			return cfg, err
		}
		cfg.Record = append(cfg.Record, a)
	}
	if name := ea.GetMarkArg(); name != "" {
		a, err := arg(name, field+".key")
		if err != nil {
			return cfg, err
		}
		cfg.Mark, cfg.MarkIndex, cfg.MarkArg = true, ea.GetEventIndex(), a
	}
	if name := ea.GetLatencyArg(); name != "" {
		if cfg.Hist {
			return cfg, &FieldError{field + ".actions", "one histogram per event: an argument's or the latency"}
		}
		a, err := arg(name, field+".key")
		if err != nil {
			return cfg, err
		}
		cfg.Latency, cfg.LatencySince, cfg.LatencyArg = true, ea.GetLatencySince(), a
	}
	return cfg, nil
}

// textTerm resolves a term comparing a string argument with a text.
func textTerm(t *pb.EventTerm, format EventArgs, where, tp string) (EventTerm, error) {
	a, ok := format.Arg(t.GetArg())
	if !ok {
		return EventTerm{}, &FieldError{where, fmt.Sprintf("%s has no argument %q (arguments: %s)", tp, t.GetArg(), format.Names())}
	}
	name := strings.TrimPrefix(tp, "tracepoint ")
	if a.Text == 0 {
		kind := "an integer"
		if a.Unsupported != "" {
			kind = a.Unsupported
		} else if a.Type != "" {
			kind += " (" + a.Type + ")"
		}
		return EventTerm{}, &FieldError{where, fmt.Sprintf("argument %s of %s is %s, not a string: compare it with a number, not a text", a.Name, name, kind)}
	}
	op := record.EventOp(t.GetOp())
	if op != record.EventOpEq && op != record.EventOpNe {
		return EventTerm{}, &FieldError{where, fmt.Sprintf("a string argument (%s) is compared with == or != only", a.Name)}
	}
	if len(t.GetValues()) != 0 {
		return EventTerm{}, &FieldError{where, "a term has a text or values, not both"}
	}
	text, most := t.GetText(), record.EventTextMax
	if a.TextCap > 0 && a.TextCap < most {
		most = a.TextCap
	}
	if len(text) > most || strings.IndexByte(text, 0) >= 0 {
		why := fmt.Sprintf("text %q: 1 to %d bytes, no NUL", text, most)
		if most == a.TextCap {
			why += fmt.Sprintf(" (%s of %s holds %d characters)", a.Name, name, a.TextCap)
		}
		return EventTerm{}, &FieldError{where, why}
	}
	if int(a.Offset)+4 > record.EventArgsBytes {
		return EventTerm{}, &FieldError{where, fmt.Sprintf("argument %s of %s is at offset %d, beyond %d", a.Name, tp, a.Offset, record.EventArgsBytes)}
	}
	return EventTerm{Arg: EventArg{Offset: a.Offset}, Op: op, TextKind: a.Text, Text: text}, nil
}

// textWords is a text as event.bpf.h compares it: NUL-padded to 16 bytes, two little-endian words.
func textWords(text string) [2]uint64 {
	var b [16]byte
	copy(b[:], text)
	return [2]uint64{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])}
}

func (c *EventConfig) variables() (map[string]any, error) {
	var (
		size, signed, op, nvalues [record.EventTerms]uint8
		offs                      [record.EventTerms]uint16
		values                    [record.EventTerms][record.EventInValues]uint64
		textKind                  [record.EventTerms]uint8
		text                      [record.EventTerms][2]uint64
	)
	for i, t := range c.Terms {
		if i >= record.EventTerms {
			return nil, fmt.Errorf("%d terms, at most %d", len(c.Terms), record.EventTerms)
		}
		offs[i], size[i], signed[i], op[i], nvalues[i] = t.Arg.Offset, t.Arg.Size, boolU8(t.Arg.Signed), uint8(t.Op), uint8(len(t.Values))
		copy(values[i][:], t.Values)
		if t.TextKind != 0 {
			textKind[i], text[i] = t.TextKind, textWords(t.Text)
		}
	}
	var (
		recOff          [record.ValuesMax]uint16
		recSize, recSig [record.ValuesMax]uint8
	)
	if len(c.Record) > record.ValuesMax {
		return nil, fmt.Errorf("record of %d arguments, at most %d", len(c.Record), record.ValuesMax)
	}
	for i, a := range c.Record {
		recOff[i], recSize[i], recSig[i] = a.Offset, a.Size, boolU8(a.Signed)
	}
	return map[string]any{
		"ev_source":   c.Source,
		"ev_record_n": uint8(len(c.Record)), "ev_record_off": recOff, "ev_record_size": recSize,
		"ev_record_signed": recSig,
		"ev_mark":          boolU8(c.Mark), "ev_mark_index": c.MarkIndex,
		"ev_mark_off": c.MarkArg.Offset, "ev_mark_size": c.MarkArg.Size, "ev_mark_signed": boolU8(c.MarkArg.Signed),
		"ev_latency": boolU8(c.Latency), "ev_latency_since": c.LatencySince,
		"ev_latency_off": c.LatencyArg.Offset, "ev_latency_size": c.LatencyArg.Size,
		"ev_latency_signed": boolU8(c.LatencyArg.Signed),
		"ev_term_off":       offs, "ev_term_size": size, "ev_term_signed": signed, "ev_term_op": op,
		"ev_term_nvalues": nvalues, "ev_term_values": values,
		"ev_term_text_kind": textKind, "ev_term_text": text,
		"act_count": boolU8(c.Count), "ev_key": uint8(c.Key),
		"ev_key_off": c.KeyArg.Offset, "ev_key_size": c.KeyArg.Size, "ev_key_signed": boolU8(c.KeyArg.Signed),
		"ev_hist":     boolU8(c.Hist),
		"ev_hist_off": c.HistArg.Offset, "ev_hist_size": c.HistArg.Size, "ev_hist_signed": boolU8(c.HistArg.Signed),
	}, nil
}

// Event is one loaded event program with its own counters and action maps.
type Event struct {
	Collection *ebpf.Collection
	Program    *ebpf.Program
	Counters   *ebpf.Map
	CountKeys  *ebpf.Map
	Hist       *ebpf.Map
	Stats      *ebpf.Map // event_stats (record: [ARGS])
	Config     EventConfig
}

// LoadEvent loads the object's event program with cfg's constants; maps are
// the program's own (count_keys, hist_buckets, counters), nothing shared.
func LoadEvent(spec *ebpf.CollectionSpec, cfg EventConfig, opts Options) (*Event, error) {
	s := spec.Copy()
	program := ProgramFor(spec, cfg.Program)
	ps, ok := s.Programs[program]
	if !ok {
		return nil, fmt.Errorf("object has no program %s (has %s)", cfg.Program, strings.Join(programNames(spec), ", "))
	}
	want := map[uint8]ebpf.ProgramType{record.EventSourceTracepoint: ebpf.TracePoint,
		record.EventSourceKprobe: ebpf.Kprobe, record.EventSourceFentry: ebpf.Tracing}[cfg.Source]
	if ps.Type != want {
		return nil, fmt.Errorf("program %s is a %s, not a %s program", program, ps.Type, want)
	}
	if cfg.Source == record.EventSourceFentry {
		ps.AttachTo = cfg.Function
	}
	for name := range s.Programs {
		if name != program {
			delete(s.Programs, name)
		}
	}
	// Only the maps the event program uses: the object's others (the LRU prev_ts, the ring buffer, the
	// discovery maps) would be created for nothing by every event load.
	used := map[string]bool{}
	for _, ins := range ps.Instructions {
		if ref := ins.Reference(); ref != "" {
			used[ref] = true
		}
	}
	for name := range s.Maps {
		if !used[name] {
			delete(s.Maps, name)
		}
	}
	for name, v := range s.Variables {
		if !used[v.SectionName] {
			delete(s.Variables, name)
		}
	}
	vars, err := cfg.variables()
	if err != nil {
		return nil, err
	}
	for name, val := range vars {
		vs, ok := s.Variables[name]
		if !ok {
			return nil, fmt.Errorf("set %s: object has no such variable", name)
		}
		if err := vs.Set(val); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	coll, err := loadCollection(s, program, opts)
	if err != nil {
		return nil, err
	}
	return &Event{Collection: coll, Program: coll.Programs[program], Counters: coll.Maps[MapCounters],
		CountKeys: coll.Maps[MapCountKeys], Hist: coll.Maps[MapHistBuckets], Stats: coll.Maps[MapEventStats],
		Config: cfg}, nil
}

// EventStat is struct hoptrace_event_stat: one argument's statistics.
type EventStat struct {
	Count, Sum, Min, Max, Last, LastNs uint64
}

// ReadStats merges the per-CPU statistics of each recorded argument: counts
// and sums add, min and max compare as the argument's signedness says, last
// is the CPU's with the newest last_ns.
func (e *Event) ReadStats() ([]EventStat, error) {
	out := make([]EventStat, len(e.Config.Record))
	for i, a := range e.Config.Record {
		var perCPU []EventStat
		if err := e.Stats.Lookup(uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("read %s[%d]: %w", MapEventStats, i, err)
		}
		less := func(x, y uint64) bool {
			if a.Signed {
				return int64(x) < int64(y)
			}
			return x < y
		}
		var m EventStat
		for _, c := range perCPU {
			if c.Count == 0 {
				continue
			}
			if m.Count == 0 || less(c.Min, m.Min) {
				m.Min = c.Min
			}
			if m.Count == 0 || less(m.Max, c.Max) {
				m.Max = c.Max
			}
			if c.LastNs >= m.LastNs {
				m.Last, m.LastNs = c.Last, c.LastNs
			}
			m.Count += c.Count
			m.Sum += c.Sum
		}
		out[i] = m
	}
	return out, nil
}

// Close releases the program and its maps (the link is closed by the caller first).
func (e *Event) Close() {
	if e != nil && e.Collection != nil {
		e.Collection.Close()
	}
}

// Read returns the event's counters and its count and histogram (the
// latency's when it has one).
func (e *Event) Read() (record.Counters, ActionValues, error) {
	c, err := ReadCounters(e.Counters)
	if err != nil {
		return c, ActionValues{}, err
	}
	var v ActionValues
	if e.Config.Count {
		if v.Counts, err = readCountKeys(e.CountKeys); err != nil {
			return c, v, err
		}
	}
	if e.Config.Hist || e.Config.Latency {
		if v.Buckets, err = readBuckets(e.Hist); err != nil {
			return c, v, err
		}
	}
	return c, v, nil
}
