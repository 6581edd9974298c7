// Package tracer runs the agent's traces: it applies TracePlans (loading and
// attaching their hops), replaces a trace by a newer generation without a
// gap (attach the new, then detach the old), removes traces, and reads
// their counters. Standalone and daemon modes both drive a Manager.
package tracer

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/hoptrace/hoptrace/agent/internal/allowlist"
	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/clock"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
)

// Config of a Manager.
type Config struct {
	Node  string
	Netns string // --netns: the emulated host's namespace
	// BaseDir resolves relative object_path values (the plan file's folder).
	BaseDir string
	// RingBytes sizes the records ring buffer (power of two, page multiple).
	RingBytes uint32
	// Out receives the record batches: a Queue, or a Fanout to several
	// (nil: a Queue of its own). Close closes it.
	Out          stream.Sink
	BatchRecords int
	FlushEvery   time.Duration
}

// Trace is one running generation of a trace.
type Trace struct {
	Name       string
	Generation uint64
	Slot       uint16
	Hops       []*attach.Hop
	Tagger     *attach.Hop
	Events     []*Event
	Status     *pb.TraceStatus
	idState    *ebpf.Map
	match      *pb.FlowMatch
	// attachedNs: since when each hop (by index) has watched its place,
	// CLOCK_MONOTONIC (HopCounters.attached_ns).
	attachedNs map[uint32]int64
	// eventMarks: the times its marking events leave for later events'
	// latencies (nil when no event of the trace pairs with another).
	eventMarks *ebpf.Map
}

// Manager owns the agent's ring buffer and its traces.
type Manager struct {
	cfg     Config
	records *ebpf.Map
	reader  *stream.Reader
	// prevTS: traced packets' last timestamps on this node (the latency
	// field), created with the first object that has the map.
	prevTS *ebpf.Map
	// sockReadLast: the packet each thread read last at a socket-read hop
	// (uprobe hops join to it), created like prevTS.
	sockReadLast *ebpf.Map

	mu       sync.Mutex
	traces   map[string]*Trace
	slots    map[uint16]bool
	nextSlot uint16
	// hopNames survive removal so late records can still be named.
	hopNames map[string]map[uint16]string
}

// DefaultRingBytes is the records ring buffer size.
const DefaultRingBytes = 16 << 20

// New creates the records ring buffer and starts reading it.
func New(cfg Config) (*Manager, error) {
	if cfg.RingBytes == 0 {
		cfg.RingBytes = DefaultRingBytes
	}
	if cfg.Out == nil {
		cfg.Out = stream.NewQueue(0)
	}
	records, err := ebpf.NewMap(&ebpf.MapSpec{Name: "ht_records", Type: ebpf.RingBuf, MaxEntries: cfg.RingBytes})
	if err != nil {
		return nil, fmt.Errorf("create records ring buffer (%d bytes): %w", cfg.RingBytes, err)
	}
	rd, err := stream.NewReader(records, cfg.Out, cfg.BatchRecords, cfg.FlushEvery)
	if err != nil {
		records.Close()
		return nil, err
	}
	rd.Start()
	return &Manager{cfg: cfg, records: records, reader: rd,
		traces: map[string]*Trace{}, slots: map[uint16]bool{}, nextSlot: 1,
		hopNames: map[string]map[uint16]string{}}, nil
}

// Records is the agent's ring buffer.
func (m *Manager) Records() *ebpf.Map { return m.records }

func (m *Manager) allocSlot() (uint16, error) {
	for i := 0; i < 0xffff; i++ {
		s := m.nextSlot
		m.nextSlot++
		if m.nextSlot == 0 {
			m.nextSlot = 1
		}
		if s != 0 && !m.slots[s] {
			m.slots[s] = true
			return s, nil
		}
	}
	return 0, errors.New("no free trace slot")
}

// Apply attaches a plan. A newer generation of a running trace replaces
// it: the new hops are attached before the old are detached. The returned
// status names every hop's outcome.
func (m *Manager) Apply(plan *pb.TracePlan) *pb.TraceStatus {
	// A load's garbage (the ELF, the kernel's types, verifier logs: 10+ MB)
	// would stay mapped long after it is collected; an agent applies plans
	// rarely and then runs for days, so it is given back at once.
	defer debug.FreeOSMemory()
	m.mu.Lock()
	defer m.mu.Unlock()

	st := &pb.TraceStatus{Trace: plan.GetTrace(), Generation: plan.GetGeneration()}
	if plan.GetTrace() == "" {
		st.Error = "plan has no trace name"
		return st
	}
	old := m.traces[plan.GetTrace()]
	if old != nil && plan.GetGeneration() <= old.Generation {
		if plan.GetGeneration() == old.Generation {
			return cloneStatus(old.Status)
		}
		st.Error = fmt.Sprintf("generation %d is older than the running %d", plan.GetGeneration(), old.Generation)
		return st
	}

	spec, err := loader.LoadSpec(plan, m.cfg.BaseDir)
	if err != nil {
		st.Error = err.Error()
		return st
	}
	// Nothing of an object is loaded unless all its programs are allowed.
	if err := allowlist.Check(spec, allowlist.Hops); err != nil {
		st.Error = err.Error()
		return st
	}
	filter, err := loader.FilterFromMatch(plan.GetMatch())
	if err != nil {
		st.Error = err.Error()
		return st
	}
	idOrigin, followOrigin, err := traceOrigins(plan, m.cfg.Node)
	if err != nil {
		st.Error = err.Error()
		return st
	}
	if m.prevTS == nil {
		if m.prevTS, err = loader.NewPrevTS(spec); err != nil {
			st.Error = err.Error()
			return st
		}
	}
	if m.sockReadLast == nil {
		if m.sockReadLast, err = loader.NewSharedMap(spec, loader.MapSockReadLast); err != nil {
			st.Error = err.Error()
			return st
		}
	}
	slot, err := m.allocSlot()
	if err != nil {
		st.Error = err.Error()
		return st
	}

	t := &Trace{Name: plan.GetTrace(), Generation: plan.GetGeneration(), Slot: slot, Status: st,
		match: plan.GetMatch(), attachedNs: map[uint32]int64{}}
	// Generations of one trace share one ID sequence, so IDs do not repeat.
	if old != nil && old.idState != nil {
		t.idState, err = old.idState.Clone()
	} else {
		t.idState, err = loader.NewIDState(spec)
	}
	if err != nil {
		delete(m.slots, slot)
		st.Error = err.Error()
		return st
	}

	names := map[uint16]string{}
	for _, h := range plan.GetHops() {
		names[uint16(h.GetHopIndex())] = h.GetName()
	}
	m.hopNames[plan.GetTrace()] = names
	m.reader.AddRoute(slot, plan.GetTrace(), plan.GetGeneration())

	// The kernel's types, decoded for CO-RE, are shared by this plan's loads
	// only: kept, they were most of an idle agent's heap (3.7 of 4.2 MB).
	kernelTypes := btf.NewCache()
	env := attach.Env{
		Netns: m.cfg.Netns,
		Base: loader.HopConfig{
			TraceSlot:    slot,
			IDOrigin:     idOrigin,
			FollowOrigin: followOrigin,
			SampleEvery:  plan.GetSample(),
			Filter:       filter,
		},
		Load: loader.Options{Records: m.records, IDState: t.idState, PrevTS: m.prevTS,
			SockReadLast: m.sockReadLast, Cache: kernelTypes},
	}
	attached := 0
	for _, ha := range plan.GetHops() {
		hs := &pb.HopStatus{HopIndex: ha.GetHopIndex(), Name: ha.GetName()}
		h, err := attach.AttachHop(spec, ha, env)
		if err != nil {
			hs.Error = err.Error()
			if refused := (*loader.ActionsRefusedError)(nil); errors.As(err, &refused) {
				hs.RefusedActions = refused.Refused.Proto()
			}
		} else {
			hs.Attached = true
			t.Hops = append(t.Hops, h)
			t.attachedNs[h.Index] = attachedSince(old, t, h)
			attached++
		}
		st.Hops = append(st.Hops, hs)
	}
	if plan.GetTcpTagging() != nil {
		h, err := attach.AttachTCPTagging(spec, plan.GetTcpTagging(), env)
		if err != nil {
			st.Error = err.Error()
		} else {
			t.Tagger = h
		}
	}
	for _, ea := range plan.GetEvents() {
		if (ea.GetMarkArg() != "" || ea.GetLatencyArg() != "") && t.eventMarks == nil {
			if t.eventMarks, err = loader.NewSharedMap(spec, loader.MapEventMarks); err != nil {
				st.Error = err.Error()
				break
			}
		}
		es := &pb.EventStatus{EventIndex: ea.GetEventIndex(), Name: ea.GetName()}
		e, err := AttachEvent(spec, ea, loader.Options{Records: m.records, Cache: kernelTypes, EventMarks: t.eventMarks})
		if err != nil {
			es.Error = err.Error()
		} else {
			es.Attached = true
			t.Events = append(t.Events, e)
			attached++
		}
		st.Events = append(st.Events, es)
	}
	if attached == 0 && t.Tagger == nil {
		if st.Error == "" {
			st.Error = "no hop attached"
		}
		m.closeTrace(t)
		if old != nil {
			// The running generation stays.
			return st
		}
		return st
	}
	st.Active = true
	m.traces[t.Name] = t
	if old != nil {
		m.closeTrace(old)
	}
	return cloneStatus(st)
}

// attachedSince is since when hop h of trace t watches its place: now, or
// the running generation's time for the same hop at the same place with the
// same filter, which stays attached until t replaces it and records the
// same packets meanwhile. A packet that passed the hop before was not seen
// there: the collector does not count it lost at this hop.
func attachedSince(old, t *Trace, h *attach.Hop) int64 {
	if old != nil && proto.Equal(old.match, t.match) {
		for _, o := range old.Hops {
			if at, ok := old.attachedNs[o.Index]; ok && o.Index == h.Index && o.Name == h.Name && o.Describe == h.Describe {
				return at
			}
		}
	}
	return clock.Monotonic()
}

// closeTrace detaches a trace's hops, then flushes and forgets its slot.
func (m *Manager) closeTrace(t *Trace) {
	if t.Tagger != nil {
		t.Tagger.Close()
	}
	for _, h := range t.Hops {
		h.Close()
	}
	for _, e := range t.Events {
		e.Close()
	}
	m.reader.Drain()
	m.reader.RemoveRoute(t.Slot)
	delete(m.slots, t.Slot)
	if t.idState != nil {
		t.idState.Close()
	}
	if t.eventMarks != nil {
		t.eventMarks.Close()
	}
	t.Status.Active = false
	for _, hs := range t.Status.Hops {
		hs.Attached = false
	}
	for _, es := range t.Status.Events {
		es.Attached = false
	}
}

// Remove detaches a trace; the status says it is no longer active.
func (m *Manager) Remove(name string) *pb.TraceStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.traces[name]
	if !ok {
		return &pb.TraceStatus{Trace: name, Error: "trace not running"}
	}
	delete(m.traces, name)
	m.closeTrace(t)
	return cloneStatus(t.Status)
}

// Running lists the statuses of the running traces, by name.
func (m *Manager) Running() []*pb.TraceStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*pb.TraceStatus
	for _, t := range m.traces {
		out = append(out, cloneStatus(t.Status))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Trace < out[j].Trace })
	return out
}

// HopName names hop_index of a trace ("" if unknown).
func (m *Manager) HopName(trace string, hopIndex uint16) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hopNames[trace][hopIndex]
}

// TraceCounters are one trace's cumulative hop counters.
type TraceCounters struct {
	Trace      string
	Generation uint64
	Hops       []*pb.HopCounters
	Events     []*pb.EventValues
}

// Counters reads every running hop's counters, summed over CPUs.
func (m *Manager) Counters() []TraceCounters {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := timestamppb.Now()
	var out []TraceCounters
	for _, t := range m.traces {
		tc := TraceCounters{Trace: t.Name, Generation: t.Generation}
		for _, h := range t.Hops {
			c, err := h.Loaded.ReadCounters()
			if err != nil {
				continue
			}
			hc := HopCounters(h.Index, h.Name, now, c)
			hc.AttachedNs = t.attachedNs[h.Index]
			if a := h.Loaded.Actions; a.Count || a.Histogram != record.FieldNone {
				v, err := h.Loaded.ReadActions()
				if err != nil {
					continue
				}
				hc.Actions = ActionValues(a, v)
			}
			tc.Hops = append(tc.Hops, hc)
		}
		for _, e := range t.Events {
			ev, err := EventValues(e, now)
			if err != nil {
				continue
			}
			tc.Events = append(tc.Events, ev)
		}
		out = append(out, tc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Trace < out[j].Trace })
	return out
}

// HopCounters converts summed counters to the wire message.
func HopCounters(idx uint32, name string, at *timestamppb.Timestamp, c record.Counters) *pb.HopCounters {
	return &pb.HopCounters{HopIndex: idx, Hop: name, At: at, Values: c[:]}
}

// ActionValues converts a hop's count and histogram to the wire message.
func ActionValues(a loader.Actions, v loader.ActionValues) *pb.HopActionValues {
	out := &pb.HopActionValues{Count: a.Count, CountBy: pb.Field(a.CountBy), Counts: v.Counts,
		Histogram: pb.Field(a.Histogram)}
	if a.Histogram != record.FieldNone {
		out.Buckets = append([]uint64(nil), v.Buckets[:]...)
	}
	return out
}

// Flush pushes every pending record batch to the queue.
func (m *Manager) Flush() { m.reader.Drain() }

// Unqueued is the earliest CLOCK_MONOTONIC time a record not queued yet may carry (stream.Reader.Unqueued).
func (m *Manager) Unqueued() int64 { return m.reader.Unqueued() }

// RecordsRead is the number of records read from the ring buffer, and
// how many of them belonged to no running trace.
func (m *Manager) RecordsRead() (read, unrouted uint64) {
	return m.reader.Read(), m.reader.Unrouted()
}

// Close detaches every trace and stops reading.
func (m *Manager) Close() error {
	m.mu.Lock()
	for name, t := range m.traces {
		m.closeTrace(t)
		delete(m.traces, name)
	}
	m.mu.Unlock()
	err := m.reader.Close()
	m.records.Close()
	if m.prevTS != nil {
		m.prevTS.Close()
	}
	if m.sockReadLast != nil {
		m.sockReadLast.Close()
	}
	m.cfg.Out.Close()
	return err
}

func cloneStatus(s *pb.TraceStatus) *pb.TraceStatus {
	c := &pb.TraceStatus{Trace: s.Trace, Generation: s.Generation, Active: s.Active, Error: s.Error}
	for _, h := range s.Hops {
		c.Hops = append(c.Hops, &pb.HopStatus{HopIndex: h.HopIndex, Name: h.Name, Attached: h.Attached, Error: h.Error})
	}
	for _, e := range s.Events {
		c.Events = append(c.Events, &pb.EventStatus{EventIndex: e.EventIndex, Name: e.Name, Attached: e.Attached, Error: e.Error})
	}
	return c
}

// traceOrigins gives the origin of the IDs a plan's trace writes on this node, and the origin its hops
// follow through address translations: the dispatcher's for the trace, or without one (a standalone
// plan) the node's own origin, and no following.
func traceOrigins(plan *pb.TracePlan, node string) (idOrigin, followOrigin uint8, err error) {
	o := plan.GetIdOrigin()
	switch {
	case o == 0:
		return loader.NodeOrigin(node), 0, nil
	case o > record.TraceOrigins:
		return 0, 0, fmt.Errorf("plan: id_origin %d is not a trace's origin (1..%d)", o, record.TraceOrigins)
	}
	return uint8(o), uint8(o), nil
}
