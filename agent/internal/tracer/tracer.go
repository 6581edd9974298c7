// Package tracer runs the agent's traces: it applies TracePlans (loading and
// attaching their hops), replaces a trace by a newer generation without a
// gap (attach the new, then detach the old), removes traces, and reads
// their counters. Standalone and daemon modes both drive a Manager. With a
// PinDir its traces outlive the agent, pinned in bpffs, and the next agent of
// the node takes them over (pins.go, adopt.go).
package tracer

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
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
	// PinDir is where traces are pinned in bpffs (a directory per node below
	// it) so that they outlive the agent; "" pins nothing, and the traces go
	// with the agent's process.
	PinDir string
	// Hooks, when set, run the traces' tc hops in one program per device
	// and direction (attach.Hooks) instead of a program each; nil: each
	// hop its own program.
	Hooks *attach.Hooks
	Log   *slog.Logger
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
	// pinDir is the generation's directory in bpffs ("" = not pinned);
	// digest identifies its plan; adopted: taken over from a previous agent;
	// waiting: adopted with hops it could not keep, which its plan attaches
	// again (complete).
	pinDir           string
	digest           string
	adopted, waiting bool
	committed        int64
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
	// specs: recent plans' objects, parsed (specs.go).
	specs specCache

	// pins is the node's directory in bpffs (nil: nothing pinned, notKept
	// says why).
	pins    *pinRoot
	notKept string
	log     *slog.Logger

	stopped sync.Once
	stopErr error
}

// DefaultRingBytes is the records ring buffer size.
const DefaultRingBytes = 16 << 20

// New creates the records ring buffer and starts reading it. With a PinDir,
// it takes over what the node's previous agent left pinned there: the ring
// buffer (and the records it holds) and every complete trace (adopt.go).
func New(cfg Config) (*Manager, error) {
	if cfg.RingBytes == 0 {
		cfg.RingBytes = DefaultRingBytes
	}
	if cfg.Out == nil {
		cfg.Out = stream.NewQueue(0)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	m := &Manager{cfg: cfg, traces: map[string]*Trace{}, slots: map[uint16]bool{}, nextSlot: 1,
		hopNames: map[string]map[uint16]string{}, log: cfg.Log,
		notKept: `the agent pins nothing (--pin-dir ""): the trace goes with its agent's process`}
	if cfg.PinDir != "" {
		pins, err := openPinRoot(cfg.PinDir, cfg.Node)
		switch {
		case errors.Is(err, errNodeLocked):
			return nil, err
		case err != nil:
			// Tracing matters more than outliving the agent (a container without bpffs).
			m.notKept = fmt.Sprintf("nothing pinned (%v): the trace goes with its agent's process", err)
			m.log.Warn("WARNING: the traces will not outlive this agent", "err", err)
		default:
			m.pins, m.notKept = pins, ""
		}
	}
	oldest, err := m.takeOver()
	if err != nil {
		m.closeMaps()
		if m.pins != nil {
			m.pins.unlock()
		}
		return nil, err
	}
	if m.records == nil {
		if m.records, err = ebpf.NewMap(&ebpf.MapSpec{Name: "ht_records", Type: ebpf.RingBuf, MaxEntries: cfg.RingBytes}); err != nil {
			m.pins.unlock()
			return nil, fmt.Errorf("create records ring buffer (%d bytes): %w", cfg.RingBytes, err)
		}
		if m.pins != nil {
			if err := pinMap(m.records, m.pins.path(pinRecords)); err != nil {
				m.records.Close()
				m.pins.unlock()
				return nil, err
			}
		}
	}
	rd, err := stream.NewReader(m.records, cfg.Out, cfg.BatchRecords, cfg.FlushEvery)
	if err != nil {
		m.closeTraces(false)
		m.closeMaps()
		m.pins.unlock()
		return nil, err
	}
	m.reader = rd
	for _, t := range m.traces {
		rd.AddRoute(t.Slot, t.Name, t.Generation)
	}
	if oldest != 0 {
		// The ring holds what the hops wrote while no agent read it.
		rd.Behind(oldest)
	}
	rd.Start()
	return m, nil
}

// Records is the agent's ring buffer.
func (m *Manager) Records() *ebpf.Map { return m.records }

// Hooks are the agent's hooks (nil: each hop its own program).
func (m *Manager) Hooks() *attach.Hooks { return m.cfg.Hooks }

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
	digest := planDigest(plan)
	if old != nil && plan.GetGeneration() <= old.Generation {
		if plan.GetGeneration() < old.Generation {
			st.Error = fmt.Sprintf("generation %d is older than the running %d", plan.GetGeneration(), old.Generation)
			return st
		}
		switch {
		case old.waiting && old.digest == digest:
			return m.complete(old, plan)
		case !old.adopted || old.digest == digest:
			return cloneStatus(old.Status)
		}
		// A plan file changed under the same generation while no agent ran: it replaces the
		// trace taken over, as a newer generation would.
		m.log.Warn("trace taken over from bpffs differs from its plan of the same generation: replaced",
			"trace", old.Name, "generation", old.Generation)
	}

	spec, err := m.planSpec(plan)
	if err != nil {
		st.Error = err.Error()
		return st
	}
	slot, err := m.allocSlot()
	if err != nil {
		st.Error = err.Error()
		return st
	}

	t := &Trace{Name: plan.GetTrace(), Generation: plan.GetGeneration(), Slot: slot, Status: st,
		match: plan.GetMatch(), attachedNs: map[uint32]int64{}, digest: digest}
	// Generations of one trace share one ID sequence, so IDs do not repeat.
	if old != nil && old.idState != nil {
		t.idState, err = old.idState.Clone()
	} else {
		t.idState, err = loader.NewIDState(spec)
	}
	if err == nil && m.pins != nil {
		err = m.pinGeneration(t)
	}
	if err != nil {
		if t.idState != nil {
			t.idState.Close()
		}
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

	attached := m.attachPlan(t, old, plan, spec)
	if attached == 0 && t.Tagger == nil {
		if st.Error == "" {
			st.Error = "no hop attached"
		}
		m.closeTrace(t)
		if old == nil {
			m.unpinTrace(t.Name)
		}
		// A running generation stays.
		return st
	}
	st.Active = true
	m.commit(t)
	m.traces[t.Name] = t
	if old != nil {
		m.closeTrace(old)
	}
	return cloneStatus(st)
}

// planSpec loads and checks a plan's object, and makes the agent's shared
// maps from it when they are not there yet.
func (m *Manager) planSpec(plan *pb.TracePlan) (*ebpf.CollectionSpec, error) {
	spec, err := m.specs.load(plan, m.cfg.BaseDir)
	if err != nil {
		return nil, err
	}
	// Nothing of an object is loaded unless all its programs are allowed.
	if err := allowlist.Check(spec, allowlist.Hops); err != nil {
		return nil, err
	}
	if _, err := loader.FilterFromMatch(plan.GetMatch()); err != nil {
		return nil, err
	}
	if _, _, err := traceOrigins(plan, m.cfg.Node); err != nil {
		return nil, err
	}
	if m.prevTS == nil {
		if m.prevTS, err = loader.NewPrevTS(spec); err != nil {
			return nil, err
		}
	}
	if m.sockReadLast == nil {
		if m.sockReadLast, err = loader.NewSharedMap(spec, loader.MapSockReadLast); err != nil {
			return nil, err
		}
	}
	if m.pins != nil {
		if err := pinMap(m.prevTS, m.pins.path(loader.MapPrevTS)); err != nil {
			return nil, err
		}
		if err := pinMap(m.sockReadLast, m.pins.path(loader.MapSockReadLast)); err != nil {
			return nil, err
		}
	}
	return spec, nil
}

// attachPlan attaches the plan's hops, TCP tagger and events to t, each one
// t does not have yet (all of them for a new generation; those a trace taken
// over lost, for complete), pinning each in t's directory; it returns how
// many hops and events it attached. old is the generation t replaces, if any.
func (m *Manager) attachPlan(t *Trace, old *Trace, plan *pb.TracePlan, spec *ebpf.CollectionSpec) int {
	st := t.Status
	filter, _ := loader.FilterFromMatch(plan.GetMatch())
	idOrigin, followOrigin, _ := traceOrigins(plan, m.cfg.Node)
	// The kernel's types, decoded for CO-RE, are shared by this plan's loads
	// only: kept, they were most of an idle agent's heap (3.7 of 4.2 MB).
	kernelTypes := btf.NewCache()
	env := attach.Env{
		Netns: m.cfg.Netns,
		Base: loader.HopConfig{
			TraceSlot:    t.Slot,
			IDOrigin:     idOrigin,
			FollowOrigin: followOrigin,
			SampleEvery:  plan.GetSample(),
			Filter:       filter,
		},
		Load: loader.Options{Records: m.records, IDState: t.idState, PrevTS: m.prevTS,
			SockReadLast: m.sockReadLast, Cache: kernelTypes},
		Hooks:     m.cfg.Hooks,
		SharedIDs: plan.GetTcpTagging() != nil,
	}
	attached := 0
	for _, ha := range plan.GetHops() {
		hs := hopStatus(st, ha.GetHopIndex())
		if hs == nil {
			hs = &pb.HopStatus{HopIndex: ha.GetHopIndex(), Name: ha.GetName()}
			st.Hops = append(st.Hops, hs)
		} else if hs.Attached {
			continue
		}
		h, err := attach.AttachHop(spec, ha, env)
		if err != nil {
			hs.Error = err.Error()
			if refused := (*loader.ActionsRefusedError)(nil); errors.As(err, &refused) {
				hs.RefusedActions = refused.Refused.Proto()
			}
			continue
		}
		hs.Attached, hs.Error, hs.NotKept = true, "", m.pinHop(t, h, hopPin(h.Index))
		t.Hops = append(t.Hops, h)
		t.attachedNs[h.Index] = attachedSince(old, t, h)
		attached++
	}
	if plan.GetTcpTagging() != nil && t.Tagger == nil {
		h, err := attach.AttachTCPTagging(spec, plan.GetTcpTagging(), env)
		if err != nil {
			st.Error = err.Error()
		} else {
			t.Tagger = h
			if why := m.pinHop(t, h, pinTagger); why != "" {
				st.NotKept = "tcp tagging: " + why
			}
		}
	}
	for _, ea := range plan.GetEvents() {
		es := eventStatus(st, ea.GetEventIndex())
		if es == nil {
			es = &pb.EventStatus{EventIndex: ea.GetEventIndex(), Name: ea.GetName()}
			st.Events = append(st.Events, es)
		} else if es.Attached {
			continue
		}
		if (ea.GetMarkArg() != "" || ea.GetLatencyArg() != "") && t.eventMarks == nil {
			var err error
			if t.eventMarks, err = loader.NewSharedMap(spec, loader.MapEventMarks); err == nil && t.pinDir != "" {
				err = pinMap(t.eventMarks, filepath.Join(t.pinDir, pinMarks))
			}
			if err != nil {
				es.Error = err.Error()
				continue
			}
		}
		e, err := AttachEvent(spec, ea, loader.Options{Records: m.records, Cache: kernelTypes, EventMarks: t.eventMarks})
		if err != nil {
			es.Error = err.Error()
			continue
		}
		es.Attached, es.Error, es.NotKept = true, "", m.pinEvent(t, e)
		t.Events = append(t.Events, e)
		attached++
	}
	if m.pins == nil {
		st.NotKept = m.notKept
	}
	return attached
}

func hopStatus(st *pb.TraceStatus, index uint32) *pb.HopStatus {
	for _, hs := range st.Hops {
		if hs.GetHopIndex() == index {
			return hs
		}
	}
	return nil
}

func eventStatus(st *pb.TraceStatus, index uint32) *pb.EventStatus {
	for _, es := range st.Events {
		if es.GetEventIndex() == index {
			return es
		}
	}
	return nil
}

// planDigest identifies a plan (its deterministic encoding): a restarted
// agent tells the plan of a trace it took over from another of the same
// generation by it.
func planDigest(plan *pb.TracePlan) string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(plan)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
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

// closeTrace detaches a trace's hops and unpins its generation, then flushes
// and forgets its slot.
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
	if t.pinDir != "" {
		if err := os.RemoveAll(t.pinDir); err != nil {
			m.log.Warn("unpin trace", "trace", t.Name, "generation", t.Generation, "err", err)
		}
	}
	if m.reader != nil {
		m.reader.Drain()
		m.reader.RemoveRoute(t.Slot)
	}
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
	m.unpinTrace(name)
	return cloneStatus(t.Status)
}

// unpinTrace removes what is left pinned of a trace that no longer runs (its ID sequence).
func (m *Manager) unpinTrace(name string) {
	if m.pins == nil {
		return
	}
	if err := os.RemoveAll(m.pins.traceDir(name)); err != nil {
		m.log.Warn("unpin trace", "trace", name, "err", err)
	}
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
			c, err := h.ReadCounters()
			if err != nil {
				continue
			}
			hc := HopCounters(h.Index, h.Name, now, c)
			hc.AttachedNs = t.attachedNs[h.Index]
			if a := h.Actions(); a.Count || a.Histogram != record.FieldNone {
				v, err := h.ReadActions()
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

// RingLetGo counts the batches the ring buffer stopped keeping before they
// were handed off (stream.Reader.LetGo).
func (m *Manager) RingLetGo() uint64 { return m.reader.LetGo() }

// RecordsRead is the number of records read from the ring buffer, and
// how many of them belonged to no running trace.
func (m *Manager) RecordsRead() (read, unrouted uint64) {
	return m.reader.Read(), m.reader.Unrouted()
}

// Close detaches every trace, stops reading, and unpins everything the agent
// pinned: nothing of it is left for a next agent.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closeTraces(true)
	m.mu.Unlock()
	err := errors.Join(m.Stop(), m.reader.Unmap())
	m.closeMaps()
	if m.pins != nil {
		if rerr := m.pins.remove(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("unpin: %w", rerr))
		}
	}
	return err
}

// Stop stops reading the ring buffer: what the reader holds goes to the
// queue, which is closed (its sinks send what it holds, then end). The
// traces stay attached; Release or Close follows.
func (m *Manager) Stop() error {
	m.stopped.Do(func() {
		m.stopErr = m.reader.Close()
		m.cfg.Out.Close()
	})
	return m.stopErr
}

// Release stops reading (Stop) and closes what the agent holds, leaving the
// pinned traces attached and recording into the pinned ring buffer for the
// next agent of the node, which takes them over in New and reads on from the
// first record not handed off. Without a PinDir it is Close.
func (m *Manager) Release() error {
	if m.pins == nil {
		return m.Close()
	}
	err := errors.Join(m.Stop(), m.reader.Unmap())
	m.mu.Lock()
	m.closeTraces(false)
	m.mu.Unlock()
	m.closeMaps()
	m.pins.unlock()
	return err
}

// closeTraces closes every trace: detached and unpinned (detach), or only
// the agent's handles on them (a pinned trace stays attached).
func (m *Manager) closeTraces(detach bool) {
	for name, t := range m.traces {
		if detach {
			m.closeTrace(t)
			m.unpinTrace(name)
		} else {
			t.release()
		}
		delete(m.traces, name)
	}
}

// release closes the agent's handles on t, leaving what is pinned of it.
func (t *Trace) release() {
	if t.Tagger != nil {
		t.Tagger.Release()
	}
	for _, h := range t.Hops {
		h.Release()
	}
	for _, e := range t.Events {
		e.Release()
	}
	for _, m := range []*ebpf.Map{t.idState, t.eventMarks} {
		if m != nil {
			m.Close()
		}
	}
}

// closeMaps closes the agent's ring buffer and shared maps (pinned, they stay).
func (m *Manager) closeMaps() {
	for _, mp := range []*ebpf.Map{m.records, m.prevTS, m.sockReadLast} {
		if mp != nil {
			mp.Close()
		}
	}
}

func cloneStatus(s *pb.TraceStatus) *pb.TraceStatus {
	c := &pb.TraceStatus{Trace: s.Trace, Generation: s.Generation, Active: s.Active, Error: s.Error, NotKept: s.NotKept}
	for _, h := range s.Hops {
		c.Hops = append(c.Hops, &pb.HopStatus{HopIndex: h.HopIndex, Name: h.Name, Attached: h.Attached, Error: h.Error,
			NotKept: h.NotKept})
	}
	for _, e := range s.Events {
		c.Events = append(c.Events, &pb.EventStatus{EventIndex: e.EventIndex, Name: e.Name, Attached: e.Attached, Error: e.Error,
			NotKept: e.NotKept})
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
