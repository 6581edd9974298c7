package loader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/cilium/ebpf"

	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// HookObject is the hooks' object (kernel-patch/hook.bpf.c): one tc program per device and direction
// and one tp_btf program per device and event that run every trace's hop there from their maps, and
// one sock_ops program per cgroup that tags for every trace there (docs/design.md, "The tc hook",
// "The tracepoint hook", "The sock_ops hook").
const HookObject = "hook.bpf.o"

// The hooks' programs (each with its _floor twin where the kernel needs it).
const (
	HookTCProgram      = "hook_tc"
	HookSockOpsProgram = "hook_sock_ops"
	HookTPProgram      = "hook_tp_btf"      // any event whose first argument is the skb (HookTarget.Event)
	HookTPXmitProgram  = "hook_tp_btf_xmit" // net:net_dev_xmit, whose device is its own argument
)

// The hook's limits and maps (kernel-patch/include/hook.h, hook.bpf.h).
const (
	HookSlots = 256 // HOPTRACE_HOOK_SLOTS: traces' hops a hook holds
	// HookMatched is HOPTRACE_HOOK_MATCHED: the bodies one packet runs at most, the rest counted
	// at hook_counters' HookCounterOverflow.
	HookMatched         = 8
	HookCounterOverflow = int(record.CMax) // HOPTRACE_HOOK_C_OVERFLOW

	mapHookCounters = "hook_counters"
	mapHookFilters  = "filters"
	mapHookSettings = "settings"
	mapByProto      = "by_proto"
	mapBySport      = "by_sport"
	mapByDport      = "by_dport"
	mapWildcards    = "wildcards"
	mapOriginSlots  = "origin_slots"
)

// HookFilter is struct hoptrace_hook_filter: a trace's filter in the hook's filters map.
type HookFilter struct {
	Src, SrcMask, Dst, DstMask [16]byte
	Sport, Dport               uint16
	Proto, Family              uint8
	_                          [2]uint8
	NetnsCookie                uint64 // the sock_ops hook's: the sender's netns, 0 for any
}

// HookFilterOf is f as the hook holds it.
func HookFilterOf(f FilterConstants) HookFilter {
	return HookFilter{Src: f.Src, SrcMask: f.SrcMask, Dst: f.Dst, DstMask: f.DstMask, Sport: f.Sport, Dport: f.Dport,
		Proto: f.Proto, Family: f.Family}
}

// HookSettings is struct hoptrace_hook_settings: a hop's load-time constants, read by the hook at
// run time from its settings map. Slot is set by Hook.Set.
type HookSettings struct {
	Slot, HopIndex, TraceSlot                            uint16
	TagUDP, IDOrigin, FollowOrigin, Count, CountBy, Hist uint8
	Record                                               [record.ValuesMax]uint8
	PrevTS, Capture                                      uint8
	_                                                    [2]uint8
	SampleEvery                                          uint32
}

// HookSettingsOf is a hop's configuration as the hook's settings (the constants a hop program
// would be loaded with).
func HookSettingsOf(cfg HopConfig) HookSettings {
	return HookSettings{HopIndex: cfg.HopIndex, TraceSlot: cfg.TraceSlot, TagUDP: boolU8(cfg.TagUDP),
		IDOrigin: cfg.IDOrigin, FollowOrigin: cfg.FollowOrigin, SampleEvery: cfg.SampleEvery,
		Count: boolU8(cfg.Actions.Count), CountBy: uint8(cfg.Actions.CountBy), Hist: uint8(cfg.Actions.Histogram),
		Record: recordFields(cfg.Actions.Record), PrevTS: boolU8(cfg.Actions.PrevTS), Capture: cfg.Actions.Capture}
}

// TraceSet is struct hoptrace_trace_set: slots, bit s%64 of word s/64.
type TraceSet [HookSlots / 64]uint64

func (s *TraceSet) add(slot uint32)    { s[slot/64] |= 1 << (slot % 64) }
func (s *TraceSet) remove(slot uint32) { s[slot/64] &^= 1 << (slot % 64) }

// hookWildcards is struct hoptrace_hook_wildcards.
type hookWildcards struct{ Sport, Dport, Follow TraceSet }

// hookCountKey is struct hoptrace_hook_count_key: count_keys' key at the hook.
type hookCountKey struct {
	Value uint64
	Slot  uint32
	_     uint32
}

// hookSlot is what the hook holds at a slot, and its own counters when it was set (a slot's
// seen and parse counters are the hook's since then).
type hookSlot struct {
	filter   HookFilter
	settings HookSettings
	actions  Actions
	hookAt   []uint64
}

// Hook is one loaded hook program and the traces' hops in its slots. Set and Clear write one slot and
// the entries of the sets that find it, so a hop joins or leaves a running hook with a few map
// updates, and no load.
type Hook struct {
	Collection  *ebpf.Collection
	Program     *ebpf.Program
	ProgramName string

	mu      sync.Mutex
	slots   map[uint32]*hookSlot
	byProto [256]TraceSet
	bySport map[uint16]*TraceSet
	byDport map[uint16]*TraceSet
	wild    hookWildcards
	origins [256]TraceSet
	// counters: one read of every slot's counters and of the hook's own, shared by the slots'
	// reads for a while (the agent reads every hop's each second).
	counters    []uint64
	hookC       []uint64
	countersAt  time.Time
	countersBuf perCPUBuffers
}

// HookTarget is where a tracepoint hook runs: its event (its program's attach point, as a hop
// program's AttachTo; "" keeps the object's) and the device it keeps to (the hop programs'
// hop_ifindex and hop_netns_ino: the event fires for every device; 0 for every device of the netns,
// or of every netns). Zero for the other hooks, attached where they run.
type HookTarget struct {
	Event    string
	Ifindex  uint32
	NetnsIno uint32
}

// LoadHook loads the hook program hookProgram (HookTCProgram, HookSockOpsProgram, HookTPProgram,
// HookTPXmitProgram) of spec (hook.bpf.o) for target, with the agent's shared maps (records,
// prev_ts) from opts, and no trace in it; opts' ID state is not the hook's.
func LoadHook(spec *ebpf.CollectionSpec, hookProgram string, target HookTarget, opts Options) (*Hook, error) {
	s := spec.Copy()
	program := ProgramFor(spec, hookProgram)
	if _, ok := s.Programs[program]; !ok {
		return nil, fmt.Errorf("%s has no program %s (has %v)", HookObject, program, programNames(spec))
	}
	if target.Event != "" {
		s.Programs[program].AttachTo = target.Event
	}
	for name, v := range map[string]uint32{"hop_ifindex": target.Ifindex, "hop_netns_ino": target.NetnsIno} {
		vs, ok := s.Variables[name]
		if !ok {
			return nil, fmt.Errorf("%s has no variable %s: rebuild it with this agent", HookObject, name)
		}
		if err := vs.Set(v); err != nil {
			return nil, fmt.Errorf("%s: set %s: %w", HookObject, name, err)
		}
	}
	for name := range s.Programs {
		if name != program {
			delete(s.Programs, name)
		}
	}
	for name, want := range map[string]int{mapHookFilters: binary.Size(HookFilter{}), mapHookSettings: binary.Size(HookSettings{})} {
		ms, ok := s.Maps[name]
		if !ok || int(ms.ValueSize) != want {
			return nil, fmt.Errorf("%s: map %s is not the agent's (%d-byte values): rebuild it with this agent", HookObject, name, want)
		}
	}
	dropUnreferencedMaps(s, MapSockReadQueues, MapSockReadLast, MapKretSkbs)
	// The hook's ID sequences are its own, one a slot (Set starts each where its trace's is).
	opts.IDState = nil
	coll, err := loadCollection(s, program, opts)
	if err != nil {
		return nil, err
	}
	return &Hook{Collection: coll, Program: coll.Programs[program], ProgramName: program, slots: map[uint32]*hookSlot{},
		bySport: map[uint16]*TraceSet{}, byDport: map[uint16]*TraceSet{}}, nil
}

// Close releases the hook's program and maps (its link is closed by the caller first).
func (h *Hook) Close() {
	if h != nil && h.Collection != nil {
		h.Collection.Close()
	}
}

// Holds says whether slot holds a hop.
func (h *Hook) Holds(slot uint32) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.slots[slot]
	return ok
}

// Slots are the hook's slots in use, in order.
func (h *Hook) Slots() []uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]uint32, 0, len(h.slots))
	for s := range h.slots {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Set puts a hop at slot: its filter (cfg.Filter) and settings, its counters, count and histogram zeroed, its
// ID sequence at idNext (the trace's, so that a tagger at the hook goes on with its IDs), and then
// its bits in the sets that find it, so no packet runs the slot before it is whole.
func (h *Hook) Set(slot uint32, cfg HopConfig, idNext uint64) error {
	if slot >= HookSlots {
		return fmt.Errorf("hook slot %d out of range (%d)", slot, HookSlots)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, used := h.slots[slot]; used {
		return fmt.Errorf("hook slot %d in use", slot)
	}
	s := &hookSlot{filter: HookFilterOf(cfg.Filter), settings: HookSettingsOf(cfg), actions: cfg.Actions}
	s.filter.NetnsCookie = cfg.TagNetnsCookie
	s.settings.Slot = uint16(slot)
	if err := h.zeroSlot(slot); err != nil {
		return err
	}
	seq := make([]byte, h.Collection.Maps[MapIDState].ValueSize())
	binary.NativeEndian.PutUint64(seq, idNext)
	hookC, err := h.HookCounters()
	if err != nil {
		return err
	}
	s.hookAt = hookC
	for _, w := range []struct {
		m          string
		key, value any
	}{{mapHookFilters, slot, s.filter}, {mapHookSettings, slot, s.settings}, {MapIDState, slot, seq}} {
		if err := h.Collection.Maps[w.m].Put(w.key, w.value); err != nil {
			return fmt.Errorf("hook %s[%d]: %w", w.m, slot, err)
		}
	}
	h.slots[slot] = s
	h.countersAt = time.Time{} // the next read reads the new slot's zeroed counters
	if err := h.index(slot, s, true); err != nil {
		delete(h.slots, slot)
		return err
	}
	return nil
}

// Clear takes the hop at slot out of the sets that find it; the slot is free again.
func (h *Hook) Clear(slot uint32) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.slots[slot]
	if !ok {
		return nil
	}
	err := h.index(slot, s, false)
	delete(h.slots, slot)
	return err
}

// index adds slot to (or removes it from) the sets that find its filter, and writes the entries it
// changed.
func (h *Hook) index(slot uint32, s *hookSlot, add bool) error {
	change := (*TraceSet).remove
	if add {
		change = (*TraceSet).add
	}
	maps := h.Collection.Maps
	put := func(m string, key uint32, value any) error {
		if err := maps[m].Put(key, value); err != nil {
			return fmt.Errorf("hook %s[%d]: %w", m, key, err)
		}
		return nil
	}
	f := s.filter
	for p := range h.byProto {
		if f.Proto == 0 || int(f.Proto) == p {
			change(&h.byProto[p], slot)
			if err := put(mapByProto, uint32(p), h.byProto[p]); err != nil {
				return err
			}
		}
	}
	for _, side := range []struct {
		m    string
		port uint16
		sets map[uint16]*TraceSet
		any  *TraceSet
	}{{mapBySport, f.Sport, h.bySport, &h.wild.Sport}, {mapByDport, f.Dport, h.byDport, &h.wild.Dport}} {
		if side.port == 0 {
			change(side.any, slot)
			continue
		}
		set := side.sets[side.port]
		if set == nil {
			set = new(TraceSet)
			side.sets[side.port] = set
		}
		change(set, slot)
		if err := put(side.m, uint32(side.port), *set); err != nil {
			return err
		}
		if *set == (TraceSet{}) {
			delete(side.sets, side.port)
		}
	}
	if o := s.settings.FollowOrigin; o != 0 {
		change(&h.origins[o], slot)
		if err := put(mapOriginSlots, uint32(o), h.origins[o]); err != nil {
			return err
		}
		h.wild.Follow = TraceSet{}
		for _, other := range h.origins {
			for i := range other {
				h.wild.Follow[i] |= other[i]
			}
		}
	}
	return put(mapWildcards, 0, h.wild)
}

// zeroSlot clears what an earlier hop at slot counted: its counters, histogram and count keys.
func (h *Hook) zeroSlot(slot uint32) error {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return err
	}
	zero := make([]uint64, cpus)
	maps := h.Collection.Maps
	for _, r := range []struct {
		m    string
		n    uint32
		base uint32
	}{{MapCounters, uint32(record.CMax), slot * uint32(record.CMax)}, {MapHistBuckets, record.HistBuckets, slot * record.HistBuckets}} {
		for i := range r.n {
			if err := maps[r.m].Put(r.base+i, zero); err != nil {
				return fmt.Errorf("hook %s[%d]: %w", r.m, r.base+i, err)
			}
		}
	}
	var k hookCountKey
	var v uint64
	var stale []hookCountKey
	it := maps[MapCountKeys].Iterate()
	for it.Next(&k, &v) {
		if k.Slot == slot {
			stale = append(stale, k)
		}
	}
	for _, k := range stale {
		_ = maps[MapCountKeys].Delete(k)
	}
	return it.Err()
}

// SlotCounters are the counters of the hop at slot, as its own program would count them: what
// its body counted, and the packets the hook saw (and could not parse) since the hop joined it; the
// packets it saw and did not take are not matched.
// A read of every slot's counters younger than maxAge serves it.
func (h *Hook) SlotCounters(slot uint32, maxAge time.Duration) (record.Counters, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out record.Counters
	s, ok := h.slots[slot]
	if !ok {
		return out, fmt.Errorf("hook slot %d not in use", slot)
	}
	if h.counters == nil || time.Since(h.countersAt) > maxAge {
		// the slots up to the highest in use: the agent takes the lowest free slots first
		last := uint32(0)
		for used := range h.slots {
			last = max(last, used)
		}
		var err error
		if h.counters, err = h.countersBuf.read(h.Collection.Maps[MapCounters], (last+1)*uint32(record.CMax), h.counters); err != nil {
			return out, err
		}
		if h.hookC, err = h.HookCounters(); err != nil {
			return out, err
		}
		h.countersAt = time.Now()
	}
	copy(out[:], h.counters[slot*uint32(record.CMax):])
	since := func(c record.Counter) uint64 { return h.hookC[c] - s.hookAt[c] }
	out[record.CSeen] = since(record.CSeen)
	for _, c := range []record.Counter{record.CParseTruncated, record.CParseMalformed, record.CParseNonIP} {
		out[c] = since(c)
	}
	if took := out[record.CMatched]; out[record.CSeen] > took {
		out[record.CNotMatched] = out[record.CSeen] - took
	}
	return out, nil
}

// SlotActions are the count and histogram of the hop at slot.
func (h *Hook) SlotActions(slot uint32) (ActionValues, error) {
	h.mu.Lock()
	s, ok := h.slots[slot]
	h.mu.Unlock()
	var out ActionValues
	if !ok {
		return out, fmt.Errorf("hook slot %d not in use", slot)
	}
	maps := h.Collection.Maps
	if s.actions.Count {
		out.Counts = map[uint64]uint64{}
		var k hookCountKey
		var v uint64
		it := maps[MapCountKeys].Iterate()
		for it.Next(&k, &v) {
			if k.Slot == slot {
				out.Counts[k.Value] = v
			}
		}
		if err := it.Err(); err != nil {
			return out, fmt.Errorf("read %s: %w", MapCountKeys, err)
		}
	}
	if s.actions.Histogram != record.FieldNone {
		var per []uint64
		for i := range uint32(record.HistBuckets) {
			if err := maps[MapHistBuckets].Lookup(slot*record.HistBuckets+i, &per); err != nil {
				return out, fmt.Errorf("read %s[%d]: %w", MapHistBuckets, slot*record.HistBuckets+i, err)
			}
			for _, v := range per {
				out.Buckets[i] += v
			}
		}
	}
	return out, nil
}

// HookCounters are the hook's own counters: packets seen, taken by no trace, not parsed (at
// enum hoptrace_counter's indices), and the traces' bodies not run past HookMatched a packet (at
// HookCounterOverflow).
func (h *Hook) HookCounters() ([]uint64, error) {
	m := h.Collection.Maps[mapHookCounters]
	return readPerCPU(m, m.MaxEntries())
}

// readPerCPU sums the first n entries of a per-CPU array of u64 over the CPUs: one batch lookup, or
// a lookup an entry before 5.6.
func readPerCPU(m *ebpf.Map, n uint32) ([]uint64, error) {
	var b perCPUBuffers
	return b.read(m, n, nil)
}

// perCPUBuffers are what repeated reads of a per-CPU array take, kept between them: a hook's
// counters (256 slots of 18) are read every second, and allocating their buffers anew was most of
// what Go's garbage collector swept in an idle agent.
type perCPUBuffers struct {
	keys []uint32
	per  []uint64
}

// read is readPerCPU into out's memory where it is large enough.
func (b *perCPUBuffers) read(m *ebpf.Map, n uint32, out []uint64) ([]uint64, error) {
	n = min(n, m.MaxEntries())
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, err
	}
	out = resized(out, int(n))
	clear(out)
	b.keys = resized(b.keys, int(n))
	b.per = resized(b.per, int(n)*cpus)
	var cursor ebpf.MapBatchCursor
	got, err := m.BatchLookup(&cursor, b.keys, b.per, nil)
	switch {
	case errors.Is(err, ebpf.ErrNotSupported):
		return readPerCPUOneByOne(m, n)
	case err != nil && !errors.Is(err, ebpf.ErrKeyNotExist):
		return nil, fmt.Errorf("read %s: %w", m.String(), err)
	}
	for i := range got {
		for _, v := range b.per[i*cpus : (i+1)*cpus] {
			out[b.keys[i]] += v
		}
	}
	return out, nil
}

// resized is s with length n, in its own memory where it has the room.
func resized[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

func readPerCPUOneByOne(m *ebpf.Map, n uint32) ([]uint64, error) {
	out := make([]uint64, n)
	var per []uint64
	for k := range uint32(len(out)) {
		if err := m.Lookup(k, &per); err != nil {
			return nil, fmt.Errorf("read %s[%d]: %w", m.String(), k, err)
		}
		for _, v := range per {
			out[k] += v
		}
	}
	return out, nil
}
