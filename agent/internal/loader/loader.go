// Package loader turns a TracePlan's hops into loaded BPF programs: one
// collection per hop, cut down from the plan's CO-RE object to the one
// program the hop needs, its const volatile variables set
// (docs/design.md), and the agent's shared maps passed in.
package loader

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// Map names of the contract.
const (
	MapRecords  = "records"
	MapIDState  = "id_state"
	MapCounters = "counters"
	// Hop actions (hop.bpf.h): per hop, except prev_ts, one per agent.
	MapCountKeys   = "count_keys"
	MapHistBuckets = "hist_buckets"
	MapPrevTS      = "prev_ts"
	// UDP socket-read's per-socket queue of IDs (sk_storage, 5.11+ from
	// tracing): created only for the programs that use it.
	MapSockReadQueues = "sock_read_queues"
	// The packet each thread read last at a socket-read hop, for uprobe
	// hops: one per agent, like prev_ts.
	MapSockReadLast = "sock_read_last"
	// Event probes (event.bpf.h): an event's record statistics, and the
	// times marking events leave for later ones' latencies (one per trace).
	MapEventStats = "event_stats"
	MapEventMarks = "event_marks"
	// A kretprobe hop's skbs between entry and return: created only for it.
	MapKretSkbs = "kret_skbs"
)

// dropUnreferencedMaps removes the named maps from s when no program left in
// it uses them, so a hop does not create maps (or need map types) it never uses.
func dropUnreferencedMaps(s *ebpf.CollectionSpec, names ...string) {
	used := map[string]bool{}
	for _, ps := range s.Programs {
		for _, ins := range ps.Instructions {
			if ref := ins.Reference(); ref != "" {
				used[ref] = true
			}
		}
	}
	for _, name := range names {
		if !used[name] {
			delete(s.Maps, name)
		}
	}
}

// LoadSpec parses the plan's object: inline bytes, else object_path
// (relative paths are tried against baseDir, then the working directory).
func LoadSpec(plan *pb.TracePlan, baseDir string) (*ebpf.CollectionSpec, error) {
	if len(plan.GetObject()) > 0 {
		spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(plan.GetObject()))
		if err != nil {
			return nil, fmt.Errorf("parse plan object (%d bytes): %w", len(plan.GetObject()), err)
		}
		return spec, nil
	}
	p := plan.GetObjectPath()
	if p == "" {
		return nil, errors.New("plan has neither object nor object_path")
	}
	var lastErr error
	for _, c := range ObjectCandidates(p, baseDir) {
		spec, err := ebpf.LoadCollectionSpec(c)
		if err == nil {
			return spec, nil
		}
		lastErr = fmt.Errorf("load object %s: %w", c, err)
		if !errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	return nil, lastErr
}

// ObjectCandidates are the files a plan's object_path p names, in the order LoadSpec tries them: a
// relative p against baseDir, then as it is.
func ObjectCandidates(p, baseDir string) []string {
	if !filepath.IsAbs(p) && baseDir != "" {
		return []string{filepath.Join(baseDir, p), p}
	}
	return []string{p}
}

// HopConfig is everything one hop's program is specialised with before load.
type HopConfig struct {
	Name    string // hop name, for errors
	Program string // the plan names it; constants in programs_gen.go
	// Companion is a second program kept in the same collection (sharing its
	// maps), e.g. the UDP socket-read's enqueue side; "" = none.
	Companion string

	// Program type refinements applied to the ProgramSpec before load.
	AttachTo   string           // tp_btf event / fentry function
	AttachType ebpf.AttachType  // cgroup_skb ingress/egress
	ProgType   ebpf.ProgramType // 0 = as in the object

	HopIndex       uint16
	TraceSlot      uint16
	Ifindex        uint32
	NetnsIno       uint32
	TagUDP         bool
	IDOrigin       uint8 // the top 8 bits of the IDs this hop writes
	FollowOrigin   uint8 // also take packets with IDs of this origin the filter refuses; 0: none
	SampleEvery    uint32
	Filter         FilterConstants
	TagNetnsCookie uint64
	Actions        Actions
}

// Actions are a hop's count and histogram actions (HopActions, typed by the
// dispatcher): the act_* const volatile variables of hop.bpf.h.
type Actions struct {
	Count     bool
	CountBy   record.ActionField // FieldNone: one total
	Histogram record.ActionField // FieldNone: no histogram
	PrevTS    bool               // remember traced packets' timestamps for a later hop's latency
	// Record: fields whose values ride with each traced packet's record (FieldNone past the last).
	Record [record.ValuesMax]record.ActionField
	// Capture: the first bytes of each traced packet ride with its record (struct
	// hoptrace_capture); 0: none, at most record.CaptureMax.
	Capture uint8
}

// ActionsFromPlan checks a plan's HopActions against the field catalogue.
func ActionsFromPlan(a *pb.HopActions) (Actions, error) {
	if a == nil {
		return Actions{}, nil
	}
	for _, f := range append([]pb.Field{a.GetCountBy(), a.GetHistogram()}, a.GetRecord()...) {
		if f < 0 || int(f) >= int(record.FieldMax) {
			return Actions{}, fmt.Errorf("actions: field %d is not in the catalogue (0..%d)", f, record.FieldMax-1)
		}
	}
	if a.GetCountBy() != 0 && !a.GetCount() {
		return Actions{}, errors.New("actions: count_by without count")
	}
	out := Actions{Count: a.GetCount(), CountBy: record.ActionField(a.GetCountBy()),
		Histogram: record.ActionField(a.GetHistogram()), PrevTS: a.GetPrevTs()}
	if len(a.GetRecord()) > record.ValuesMax {
		return Actions{}, fmt.Errorf("actions: record of %d fields, at most %d", len(a.GetRecord()), record.ValuesMax)
	}
	for i, f := range a.GetRecord() {
		if f == 0 {
			return Actions{}, fmt.Errorf("actions: record field %d is unspecified", i)
		}
		out.Record[i] = record.ActionField(f)
	}
	if a.GetCapture() > record.CaptureMax {
		return Actions{}, fmt.Errorf("actions: capture of %d bytes, at most %d", a.GetCapture(), record.CaptureMax)
	}
	out.Capture = uint8(a.GetCapture())
	return out, nil
}

// Hop is one loaded hop program with its own counters and action maps.
type Hop struct {
	Collection *ebpf.Collection
	Program    *ebpf.Program
	// ProgramName is the variant loaded: HopConfig.Program, or its _floor twin
	// where the kernel needs it or its verifier gave up on the full one.
	ProgramName string
	Companion   *ebpf.Program // HopConfig.Companion, nil without one
	Counters    *ebpf.Map
	Actions     Actions
	CountKeys   *ebpf.Map // nil when the object has no actions
	Hist        *ebpf.Map
}

// ActionValues are a hop's cumulative count and histogram.
type ActionValues struct {
	Counts  map[uint64]uint64          // count key -> packets (nil without count)
	Buckets [record.HistBuckets]uint64 // log2 buckets summed over CPUs
}

// ReadActions reads the hop's count and histogram (zero values for actions it does not run).
func (h *Hop) ReadActions() (ActionValues, error) {
	var out ActionValues
	var err error
	if h.Actions.Count && h.CountKeys != nil {
		if out.Counts, err = readCountKeys(h.CountKeys); err != nil {
			return out, err
		}
	}
	if h.Actions.Histogram != record.FieldNone && h.Hist != nil {
		if out.Buckets, err = readBuckets(h.Hist); err != nil {
			return out, err
		}
	}
	return out, nil
}

// readCountKeys reads a count_keys map: key -> count.
func readCountKeys(m *ebpf.Map) (map[uint64]uint64, error) {
	out := map[uint64]uint64{}
	if m == nil {
		return out, nil
	}
	var k, v uint64
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("read %s: %w", MapCountKeys, err)
	}
	return out, nil
}

// readBuckets sums a hist_buckets map over CPUs.
func readBuckets(m *ebpf.Map) ([record.HistBuckets]uint64, error) {
	var out [record.HistBuckets]uint64
	if m == nil {
		return out, nil
	}
	var per []uint64
	for i := uint32(0); i < record.HistBuckets && i < m.MaxEntries(); i++ {
		if err := m.Lookup(i, &per); err != nil {
			return out, fmt.Errorf("read %s[%d]: %w", MapHistBuckets, i, err)
		}
		for _, v := range per {
			out[i] += v
		}
	}
	return out, nil
}

// Close releases the programs and maps (links are closed by the caller first).
func (h *Hop) Close() {
	if h != nil && h.Collection != nil {
		h.Collection.Close()
	}
}

// ReadCounters sums the hop's percpu counters over all CPUs.
func (h *Hop) ReadCounters() (record.Counters, error) {
	return ReadCounters(h.Counters)
}

// ReadCounters sums a percpu counters map over all CPUs. All counters come
// in one BPF_MAP_LOOKUP_BATCH: a node with many traces reads every hop's
// counters each second, and a lookup per counter was most of the idle
// agent's time there. Where the kernel has no batch operations on arrays
// (before 5.6), one lookup per counter.
func ReadCounters(m *ebpf.Map) (record.Counters, error) {
	var out record.Counters
	if m == nil {
		return out, nil
	}
	all, err := readPerCPU(m, uint32(record.CMax))
	if err != nil {
		return out, fmt.Errorf("read counters: %w", err)
	}
	copy(out[:], all)
	return out, nil
}

// variables returns the const volatile values of a hop, by name.
func (c *HopConfig) variables() []struct {
	name string
	val  any
	zero bool
} {
	tag := uint8(0)
	if c.TagUDP {
		tag = 1
	}
	f := c.Filter
	isZero16 := func(b [16]byte) bool { return b == [16]byte{} }
	return []struct {
		name string
		val  any
		zero bool
	}{
		{"hop_index", c.HopIndex, c.HopIndex == 0},
		{"trace_slot", c.TraceSlot, c.TraceSlot == 0},
		{"hop_ifindex", c.Ifindex, c.Ifindex == 0},
		{"hop_netns_ino", c.NetnsIno, c.NetnsIno == 0},
		{"hop_tag_udp", tag, tag == 0},
		{"id_origin", c.IDOrigin, c.IDOrigin == 0},
		{"follow_origin", c.FollowOrigin, c.FollowOrigin == 0},
		{"sample_every", c.SampleEvery, c.SampleEvery <= 1},
		{"filter_proto", f.Proto, f.Proto == 0},
		{"filter_family", f.Family, f.Family == 0},
		{"filter_src", f.Src, isZero16(f.Src)},
		{"filter_src_mask", f.SrcMask, isZero16(f.SrcMask)},
		{"filter_dst", f.Dst, isZero16(f.Dst)},
		{"filter_dst_mask", f.DstMask, isZero16(f.DstMask)},
		{"filter_sport", f.Sport, f.Sport == 0},
		{"filter_dport", f.Dport, f.Dport == 0},
		{"tag_netns_cookie", c.TagNetnsCookie, c.TagNetnsCookie == 0},
		{"act_count", boolU8(c.Actions.Count), !c.Actions.Count},
		{"act_count_by", uint8(c.Actions.CountBy), c.Actions.CountBy == record.FieldNone},
		{"act_hist", uint8(c.Actions.Histogram), c.Actions.Histogram == record.FieldNone},
		{"act_prev_ts", boolU8(c.Actions.PrevTS), !c.Actions.PrevTS},
		{"act_record", recordFields(c.Actions.Record), c.Actions.Record == [record.ValuesMax]record.ActionField{}},
		{"act_capture", c.Actions.Capture, c.Actions.Capture == 0},
	}
}

func recordFields(fields [record.ValuesMax]record.ActionField) [record.ValuesMax]uint8 {
	var out [record.ValuesMax]uint8
	for i, f := range fields {
		out[i] = uint8(f)
	}
	return out
}

func boolU8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// Options are the agent-wide inputs of every load.
type Options struct {
	// Records is the agent's one ring buffer (MapReplacements "records").
	Records *ebpf.Map
	// IDState is the trace's ID sequence, shared by its taggers.
	IDState *ebpf.Map
	// PrevTS is the agent's one map of traced packets' last timestamps (the
	// latency field); nil = the object's own (tests of a single load).
	PrevTS *ebpf.Map
	// SockReadLast is the agent's one sock_read_last map (socket-read hops
	// write it, uprobe hops read it); nil = the object's own.
	SockReadLast *ebpf.Map
	// EventMarks is the trace's event_marks map (event latencies); nil =
	// the object's own.
	EventMarks *ebpf.Map
	// Cache shares decoded kernel BTF between loads.
	Cache *btf.Cache
	// LogLevel for the verifier; on failure the log tail is in the error anyway.
	LogLevel ebpf.LogLevel
}

// LoadHop loads one hop: spec.Copy(), drop every program but cfg.Program,
// set its variables, and load it with the shared maps.
//
// A kernel whose verifier gives up on the full variant (E2BIG: a million
// instructions processed, as 6.1's does on the socket-read programs, whose
// states 6.18 prunes) gets the program's _floor variant, which every kernel
// from 5.10 verifies.
//
// A hop the verifier refuses only with its actions fails with an
// *ActionsRefusedError naming them, so the dispatcher can name the spec's
// actions[j] rather than the whole hop.
func LoadHop(spec *ebpf.CollectionSpec, cfg HopConfig, opts Options) (*Hop, error) {
	h, err := loadVariant(spec, cfg, opts)
	if err != nil && cfg.Actions != (Actions{}) && errors.As(err, new(*verifierRefusal)) {
		if refused := refusedActions(spec, cfg, opts); refused != (Actions{}) {
			err = &ActionsRefusedError{Refused: refused, Err: err}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("hop %s: %w", cfg.Name, err)
	}
	return h, nil
}

// loadVariant loads cfg.Program, or its _floor variant when the verifier
// gives up on the full one (E2BIG).
func loadVariant(spec *ebpf.CollectionSpec, cfg HopConfig, opts Options) (*Hop, error) {
	h, err := loadHop(spec, cfg, opts)
	if err != nil && errors.Is(err, unix.E2BIG) && !strings.HasSuffix(cfg.Program, FloorSuffix) {
		if _, ok := spec.Programs[cfg.Program+FloorSuffix]; ok {
			floor := cfg
			floor.Program = cfg.Program + FloorSuffix
			if cfg.Companion != "" {
				if _, ok := spec.Programs[cfg.Companion+FloorSuffix]; ok {
					floor.Companion = cfg.Companion + FloorSuffix
				}
			}
			if fh, ferr := loadHop(spec, floor, opts); ferr == nil {
				return fh, nil
			}
		}
	}
	return h, err
}

// ActionsRefusedError is a hop the verifier refuses with its actions and
// accepts without: Refused holds the ones it refuses (all of them when only
// their combination fails).
type ActionsRefusedError struct {
	Refused Actions
	Err     error
}

func (e *ActionsRefusedError) Error() string {
	return fmt.Sprintf("the kernel's verifier refuses its %s (the hop loads without): %v",
		strings.Join(e.Refused.Names(), ", "), e.Err)
}

func (e *ActionsRefusedError) Unwrap() error { return e.Err }

// Reads says whether the count, histogram or record action reads field f.
func (a Actions) Reads(f record.ActionField) bool {
	if (a.Count && a.CountBy == f) || a.Histogram == f {
		return true
	}
	for _, r := range a.Record {
		if r == f {
			return true
		}
	}
	return false
}

// Names are the actions set in a, as the spec spells them; prev_ts is the
// timestamp a later hop's latency histogram needs from this one.
func (a Actions) Names() []string {
	var names []string
	for _, p := range a.parts() {
		switch {
		case p.Count:
			names = append(names, "count action")
		case p.Histogram != record.FieldNone:
			names = append(names, "histogram action")
		case p.Record != [record.ValuesMax]record.ActionField{}:
			names = append(names, "record action")
		case p.Capture != 0:
			names = append(names, "capture action")
		case p.PrevTS:
			names = append(names, "timestamp kept for a later hop's latency histogram")
		}
	}
	return names
}

// parts splits a into one Actions per action it runs.
func (a Actions) parts() []Actions {
	var out []Actions
	if a.Count {
		out = append(out, Actions{Count: true, CountBy: a.CountBy})
	}
	if a.Histogram != record.FieldNone {
		out = append(out, Actions{Histogram: a.Histogram})
	}
	if a.Record != [record.ValuesMax]record.ActionField{} {
		out = append(out, Actions{Record: a.Record})
	}
	if a.Capture != 0 {
		out = append(out, Actions{Capture: a.Capture})
	}
	if a.PrevTS {
		out = append(out, Actions{PrevTS: true})
	}
	return out
}

// refusedActions finds which of a refused hop's actions the verifier
// refuses by loading the hop without actions, then with each one alone
// (only on a refusal, never on the way to an attach that works). None when
// the hop is refused without actions too: then they are not the cause.
func refusedActions(spec *ebpf.CollectionSpec, cfg HopConfig, opts Options) Actions {
	try := func(a Actions) bool {
		c := cfg
		c.Actions = a
		h, err := loadVariant(spec, c, opts)
		if err != nil {
			return false
		}
		h.Close()
		return true
	}
	if !try(Actions{}) {
		return Actions{}
	}
	var refused Actions
	for _, p := range cfg.Actions.parts() {
		if !try(p) {
			refused = refused.merge(p)
		}
	}
	if refused == (Actions{}) { // each loads alone: their combination is refused
		return cfg.Actions
	}
	return refused
}

func (a Actions) merge(b Actions) Actions {
	a.Count, a.PrevTS = a.Count || b.Count, a.PrevTS || b.PrevTS
	if b.Count {
		a.CountBy = b.CountBy
	}
	if b.Histogram != record.FieldNone {
		a.Histogram = b.Histogram
	}
	if b.Record != [record.ValuesMax]record.ActionField{} {
		a.Record = b.Record
	}
	if b.Capture != 0 {
		a.Capture = b.Capture
	}
	return a
}

// Proto is a as the HopActions message.
func (a Actions) Proto() *pb.HopActions {
	out := &pb.HopActions{Count: a.Count, CountBy: pb.Field(a.CountBy), Histogram: pb.Field(a.Histogram), PrevTs: a.PrevTS,
		Capture: uint32(a.Capture)}
	for _, f := range a.Record {
		if f != record.FieldNone {
			out.Record = append(out.Record, pb.Field(f))
		}
	}
	return out
}

func loadHop(spec *ebpf.CollectionSpec, cfg HopConfig, opts Options) (*Hop, error) {
	s := spec.Copy()
	program := ProgramFor(spec, cfg.Program)
	ps, ok := s.Programs[program]
	if !ok {
		return nil, fmt.Errorf("object has no program %s (has %s)", cfg.Program, strings.Join(programNames(spec), ", "))
	}
	companion := ""
	if cfg.Companion != "" {
		companion = ProgramFor(spec, cfg.Companion)
		if _, ok := s.Programs[companion]; !ok {
			return nil, fmt.Errorf("object has no program %s (has %s)", cfg.Companion, strings.Join(programNames(spec), ", "))
		}
	}
	for name := range s.Programs {
		if name != program && name != companion {
			delete(s.Programs, name)
		}
	}
	dropUnreferencedMaps(s, MapSockReadQueues, MapSockReadLast, MapKretSkbs)
	if cfg.AttachTo != "" {
		ps.AttachTo = cfg.AttachTo
	}
	if cfg.AttachType != 0 {
		ps.AttachType = cfg.AttachType
	}
	if cfg.ProgType != 0 {
		ps.Type = cfg.ProgType
	}

	for _, v := range cfg.variables() {
		vs, ok := s.Variables[v.name]
		if !ok {
			if v.zero {
				// A per-node object may leave out variables it does not use.
				continue
			}
			return nil, fmt.Errorf("set %s: object has no such variable", v.name)
		}
		if err := vs.Set(v.val); err != nil {
			return nil, fmt.Errorf("set %s: %w", v.name, err)
		}
	}

	if _, ok := s.Maps[MapRecords]; !ok && opts.Records != nil {
		return nil, fmt.Errorf("object has no %s map", MapRecords)
	}
	coll, err := loadCollection(s, cfg.Program, opts)
	if err != nil {
		return nil, err
	}
	h := &Hop{Collection: coll, Program: coll.Programs[program], ProgramName: program, Companion: coll.Programs[companion], Counters: coll.Maps[MapCounters],
		Actions: cfg.Actions, CountKeys: coll.Maps[MapCountKeys], Hist: coll.Maps[MapHistBuckets]}
	return h, nil
}

// loadCollection loads s with the agent's maps of opts (its ring buffer, resized to it; the trace's
// ID state; prev_ts, sock_read_last, event marks) in place of the object's maps of those names that s
// has; errors name `program`.
func loadCollection(s *ebpf.CollectionSpec, program string, opts Options) (*ebpf.Collection, error) {
	repl := map[string]*ebpf.Map{}
	for name, m := range map[string]*ebpf.Map{MapRecords: opts.Records, MapIDState: opts.IDState,
		MapPrevTS: opts.PrevTS, MapSockReadLast: opts.SockReadLast, MapEventMarks: opts.EventMarks} {
		ms, ok := s.Maps[name]
		if m == nil || !ok {
			continue
		}
		if name == MapRecords {
			ms.MaxEntries = m.MaxEntries() // the agent's ring may be sized differently from the object's
		}
		repl[name] = m
	}
	coll, err := ebpf.NewCollectionWithOptions(s, ebpf.CollectionOptions{
		MapReplacements: repl,
		Programs:        ProgramOptions(opts.LogLevel),
		Cache:           opts.Cache,
	})
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", program, verifierTail(err))
	}
	return coll, nil
}

// NewRecords creates the agent's ring buffer from the object's records map
// spec; size (bytes, power of two multiple of the page size) 0 keeps the object's.
func NewRecords(spec *ebpf.CollectionSpec, size uint32) (*ebpf.Map, error) {
	ms, ok := spec.Maps[MapRecords]
	if !ok {
		return nil, fmt.Errorf("object has no %s map", MapRecords)
	}
	ms = ms.Copy()
	if size != 0 {
		ms.MaxEntries = size
	}
	ms.Name = "ht_records"
	m, err := ebpf.NewMap(ms)
	if err != nil {
		return nil, fmt.Errorf("create %s ring buffer: %w", MapRecords, err)
	}
	return m, nil
}

// NewPrevTS creates the agent's prev_ts map (the latency field) from the
// object's map spec; nil when the object has none.
func NewPrevTS(spec *ebpf.CollectionSpec) (*ebpf.Map, error) {
	ms, ok := spec.Maps[MapPrevTS]
	if !ok {
		return nil, nil
	}
	ms = ms.Copy()
	ms.Name = "ht_prev_ts"
	m, err := ebpf.NewMap(ms)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", MapPrevTS, err)
	}
	return m, nil
}

// NewSharedMap creates one of the agent's shared maps (one per agent, passed
// to every load) from the object's map spec; nil when the object has none.
func NewSharedMap(spec *ebpf.CollectionSpec, name string) (*ebpf.Map, error) {
	ms, ok := spec.Maps[name]
	if !ok {
		return nil, nil
	}
	ms = ms.Copy()
	m, err := ebpf.NewMap(ms)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", name, err)
	}
	return m, nil
}

// NewIDState creates one trace's id_state from the object's map spec.
func NewIDState(spec *ebpf.CollectionSpec) (*ebpf.Map, error) {
	ms, ok := spec.Maps[MapIDState]
	if !ok {
		return nil, nil
	}
	ms = ms.Copy()
	m, err := ebpf.NewMap(ms)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", MapIDState, err)
	}
	return m, nil
}

func programNames(spec *ebpf.CollectionSpec) []string {
	var n []string
	for k := range spec.Programs {
		n = append(n, k)
	}
	return n
}

// verifierTail keeps the end of a verifier log: the reason is in the last lines.
// The cause (e.g. EPERM) stays wrapped for errors.Is.
func verifierTail(err error) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		lines := ve.Log
		if len(lines) > 8 {
			lines = lines[len(lines)-8:]
		}
		return &verifierRefusal{cause: ve.Cause, tail: strings.Join(lines, " | ")}
	}
	return err
}

// verifierRefusal is a program the kernel's verifier refused: its cause
// (errno) and the tail of its log.
type verifierRefusal struct {
	cause error
	tail  string
}

func (e *verifierRefusal) Error() string {
	if e.tail == "" {
		return e.cause.Error()
	}
	return fmt.Sprintf("%v: %s", e.cause, e.tail)
}

func (e *verifierRefusal) Unwrap() error { return e.cause }
