package tracer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/cilium/ebpf"
	"google.golang.org/protobuf/proto"

	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/clock"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// pinGeneration makes t's directory in the node's pins and pins its ID
// sequence beside it, for the trace (a newer generation shares it).
func (m *Manager) pinGeneration(t *Trace) error {
	dir := m.pins.traceDir(t.Name)
	t.pinDir = filepath.Join(dir, slotPin(t.Slot))
	_ = os.RemoveAll(t.pinDir) // a slot's left-over (none: generations are removed with their slot)
	if err := os.MkdirAll(t.pinDir, 0o700); err != nil {
		t.pinDir = ""
		return fmt.Errorf("pin trace: %w", err)
	}
	if err := pinMap(t.idState, filepath.Join(dir, pinIDState)); err != nil {
		_ = os.RemoveAll(t.pinDir)
		t.pinDir = ""
		return err
	}
	return nil
}

// pinHop pins a hop of t in t's directory under name; the reason it is not
// kept when it is not ("" when pinned).
func (m *Manager) pinHop(t *Trace, h *attach.Hop, name string) string {
	if t.pinDir == "" {
		return ""
	}
	notKept, err := h.Pin(filepath.Join(t.pinDir, name))
	if err != nil {
		notKept = fmt.Sprintf("%s: not pinned (%v): it goes with its agent", h.Describe, err)
	}
	if notKept != "" {
		m.log.Warn("hop not kept across an agent restart", "trace", t.Name, "hop", h.Name, "why", notKept)
	}
	return notKept
}

// pinEvent pins an event probe of t as pinHop pins a hop.
func (m *Manager) pinEvent(t *Trace, e *Event) string {
	if t.pinDir == "" {
		return ""
	}
	notKept, err := e.Pin(filepath.Join(t.pinDir, eventPin(e.Index)))
	if err != nil {
		notKept = fmt.Sprintf("event %s: not pinned (%v): it goes with its agent", e.Name, err)
	}
	if notKept != "" {
		m.log.Warn("event probe not kept across an agent restart", "trace", t.Name, "event", e.Name, "why", notKept)
	}
	return notKept
}

// commit pins t's meta: from now on a restarted agent takes t over, and
// drops any older generation of it. Without it (a meta it cannot pin) the
// generation is not taken over: the trace says so.
func (m *Manager) commit(t *Trace) {
	if t.pinDir == "" {
		return
	}
	t.committed = clock.Monotonic()
	if err := writeMeta(t.pinDir, m.meta(t)); err != nil {
		m.log.Warn("trace not kept across an agent restart", "trace", t.Name, "err", err)
		t.Status.NotKept = "its state could not be pinned: " + err.Error()
	}
}

// meta is what a restarted agent needs to take t over.
func (m *Manager) meta(t *Trace) *traceMeta {
	match, _ := proto.Marshal(t.match)
	status, _ := proto.Marshal(t.Status)
	meta := &traceMeta{Layout: recordLayout, Trace: t.Name, Generation: t.Generation, Slot: t.Slot, Digest: t.digest, Match: match,
		Status: status, Committed: t.committed, HopNames: m.hopNames[t.Name], AttachedNs: t.attachedNs,
		EventMarks: t.eventMarks != nil}
	for _, h := range t.Hops {
		if !h.InHook() { // not pinned: its status says so, and a restarted agent attaches it again
			meta.Hops = append(meta.Hops, h.Pinned())
		}
	}
	if t.Tagger != nil && !t.Tagger.InHook() {
		p := t.Tagger.Pinned()
		meta.Tagger = &p
	}
	for _, e := range t.Events {
		meta.Events = append(meta.Events, pinnedEvent{Index: e.Index, Name: e.Name, Config: e.Loaded.Config,
			CountBy: e.CountBy, Hist: e.Hist, RecordArgs: e.RecordArgs})
	}
	return meta
}

// complete attaches again what a trace taken over lost (the hops and event
// probes its predecessor could not keep) from its plan, and pins the trace's
// meta anew.
func (m *Manager) complete(t *Trace, plan *pb.TracePlan) *pb.TraceStatus {
	spec, err := m.planSpec(plan)
	if err != nil {
		st := cloneStatus(t.Status)
		st.Error = err.Error()
		return st
	}
	t.Status.Error = ""
	m.attachPlan(t, nil, plan, spec)
	t.waiting = false
	t.Status.Active = len(t.Hops) > 0 || len(t.Events) > 0 || t.Tagger != nil
	if !t.Status.Active && t.Status.Error == "" {
		t.Status.Error = "no hop attached"
	}
	m.commit(t)
	m.log.Info("trace taken over completed from its plan", "trace", t.Name, "generation", t.Generation,
		"hops", len(t.Hops), "events", len(t.Events))
	return cloneStatus(t.Status)
}

// takeOver takes what the node's previous agent left pinned: the ring buffer
// and the agent's shared maps, and every trace's newest complete generation;
// the rest (older generations, ones without meta: an agent killed while it
// attached them) is unpinned. With no trace to take over, everything pinned
// is removed and the agent starts afresh (a new ring of its own size). It
// returns the oldest attach time of the traces taken over (the ring may hold
// records from then on; 0: none).
func (m *Manager) takeOver() (int64, error) {
	if m.pins == nil {
		return 0, nil
	}
	entries, err := os.ReadDir(m.pins.dir)
	if err != nil {
		return 0, fmt.Errorf("pin directory: %w", err)
	}
	var metas []*traceMeta
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(m.pins.dir, e.Name())
		meta := newestGeneration(dir, m.log)
		if meta == nil {
			_ = os.RemoveAll(dir)
			continue
		}
		if meta.Layout != recordLayout {
			// Its programs write records this agent would misread: it goes, and its plan attaches it
			// again (the dispatcher's push, or the --plan).
			m.log.Warn("pinned trace of another record layout (an upgrade across a change of it): removed",
				"trace", meta.Trace, "its", meta.Layout, "ours", recordLayout)
			m.dropPinned(meta)
			_ = os.RemoveAll(dir)
			continue
		}
		metas = append(metas, meta)
	}
	if len(metas) == 0 {
		for _, e := range entries {
			_ = os.RemoveAll(filepath.Join(m.pins.dir, e.Name()))
		}
		return 0, nil
	}
	if m.records, err = loader.LoadPinnedMap(m.pins.path(pinRecords)); err != nil || m.records == nil ||
		m.records.Type() != ebpf.RingBuf {
		// The hops write a ring buffer of their own (held by their programs), which no agent can read.
		for _, meta := range metas {
			m.dropPinned(meta)
			_ = os.RemoveAll(m.pins.traceDir(meta.Trace))
		}
		if m.records != nil {
			m.records.Close()
			m.records = nil
		}
		m.log.Warn("pinned traces without their ring buffer: removed", "dir", m.pins.dir, "err", err)
		return 0, nil
	}
	if m.records.MaxEntries() != m.cfg.RingBytes {
		m.log.Info("records ring buffer taken over at its size", "bytes", m.records.MaxEntries(),
			"asked", m.cfg.RingBytes)
	}
	for _, name := range []string{loader.MapPrevTS, loader.MapSockReadLast} {
		mp, err := loader.LoadPinnedMap(m.pins.path(name))
		if err != nil {
			return 0, err
		}
		if name == loader.MapPrevTS {
			m.prevTS = mp
		} else {
			m.sockReadLast = mp
		}
	}
	oldest := int64(0)
	sort.Slice(metas, func(i, j int) bool { return metas[i].Trace < metas[j].Trace })
	for _, meta := range metas {
		t, err := m.adopt(meta)
		if err != nil {
			m.log.Warn("pinned trace not taken over: removed", "trace", meta.Trace, "generation", meta.Generation, "err", err)
			m.dropPinned(meta)
			_ = os.RemoveAll(m.pins.traceDir(meta.Trace))
			continue
		}
		m.traces[t.Name] = t
		m.slots[t.Slot] = true
		if t.Slot >= m.nextSlot {
			m.nextSlot = t.Slot + 1
		}
		for _, at := range t.attachedNs {
			if oldest == 0 || at < oldest {
				oldest = at
			}
		}
		m.log.Info("trace taken over from bpffs", "trace", t.Name, "generation", t.Generation,
			"hops", len(t.Hops), "events", len(t.Events), "waiting_for_plan", t.waiting)
	}
	if oldest == 0 && len(m.traces) > 0 {
		oldest = clock.Monotonic()
	}
	return oldest, nil
}

// dropPinned detaches the clsact filters of a pinned trace generation that is not taken over (a
// kernel without tcx): unlike its links, they would stay with its pins gone.
func (m *Manager) dropPinned(meta *traceMeta) {
	hops := meta.Hops
	if meta.Tagger != nil {
		hops = append(hops[:len(hops):len(hops)], *meta.Tagger)
	}
	for _, p := range hops {
		if err := attach.DropPinned(p); err != nil {
			m.log.Warn("clsact filter of a pinned hop not taken over", "trace", meta.Trace, "hop", p.Name, "err", err)
		}
	}
}

// newestGeneration reads a trace directory's generations: it keeps the newest
// complete one (the last committed), and unpins the others.
func newestGeneration(dir string, log interface{ Warn(string, ...any) }) *traceMeta {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var best *traceMeta
	var bestDir string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		gen := filepath.Join(dir, e.Name())
		meta, err := readMeta(gen)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				log.Warn("pinned trace generation unreadable: removed", "dir", gen, "err", err)
			}
			_ = os.RemoveAll(gen)
			continue
		}
		if best == nil || meta.Generation > best.Generation ||
			meta.Generation == best.Generation && meta.Committed > best.Committed {
			if best != nil {
				_ = os.RemoveAll(bestDir)
			}
			best, bestDir = meta, gen
			continue
		}
		_ = os.RemoveAll(gen)
	}
	return best
}

// adopt takes one trace generation over from its pins: its ID sequence and
// event marks, and each hop, tagger and event probe it kept. One that cannot
// be taken over (never kept on this kernel, or its pins unusable: a clsact
// filter deleted meanwhile) is unpinned and said so in the trace's status;
// the trace then waits for its plan to attach it again (complete).
func (m *Manager) adopt(meta *traceMeta) (*Trace, error) {
	dir := m.pins.traceDir(meta.Trace)
	gen := filepath.Join(dir, slotPin(meta.Slot))
	st := &pb.TraceStatus{}
	if err := proto.Unmarshal(meta.Status, st); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	match := &pb.FlowMatch{}
	if err := proto.Unmarshal(meta.Match, match); err != nil {
		return nil, fmt.Errorf("match: %w", err)
	}
	t := &Trace{Name: meta.Trace, Generation: meta.Generation, Slot: meta.Slot, Status: st, match: match,
		attachedNs: map[uint32]int64{}, pinDir: gen, digest: meta.Digest, adopted: true, committed: meta.Committed}
	var err error
	if t.idState, err = loader.LoadPinnedMap(filepath.Join(dir, pinIDState)); err != nil {
		return nil, err
	}
	if meta.EventMarks {
		if t.eventMarks, err = loader.LoadPinnedMap(filepath.Join(gen, pinMarks)); err != nil {
			t.release()
			return nil, err
		}
	}
	lost := func(what, why string) string {
		t.waiting = true
		return what + " not kept across the agent's restart: " + why
	}
	pinned := map[uint32]attach.PinnedHop{}
	for _, p := range meta.Hops {
		pinned[p.Index] = p
	}
	for _, hs := range st.Hops {
		if !hs.Attached {
			continue
		}
		p, ok := pinned[hs.HopIndex]
		switch {
		case hs.NotKept != "":
			hs.Attached, hs.Error = false, lost("hop "+hs.Name, hs.NotKept)
			continue
		case !ok:
			hs.Attached, hs.Error = false, lost("hop "+hs.Name, "nothing of it pinned")
			continue
		}
		hopDir := filepath.Join(gen, hopPin(p.Index))
		h, err := attach.LoadPinnedHop(hopDir, p)
		if err != nil {
			if err := attach.DropPinned(p); err != nil {
				m.log.Warn("clsact filter of a pinned hop not taken over", "trace", meta.Trace, "hop", p.Name, "err", err)
			}
			_ = os.RemoveAll(hopDir)
			hs.Attached, hs.Error = false, lost("hop "+hs.Name, err.Error())
			continue
		}
		t.Hops = append(t.Hops, h)
		if at, ok := meta.AttachedNs[p.Index]; ok {
			t.attachedNs[p.Index] = at
		}
	}
	if p := meta.Tagger; p != nil {
		if h, err := attach.LoadPinnedHop(filepath.Join(gen, pinTagger), *p); err != nil {
			_ = os.RemoveAll(filepath.Join(gen, pinTagger))
			st.Error = lost("tcp tagging", err.Error())
		} else {
			t.Tagger = h
		}
	} else if st.NotKept != "" && st.Error == "" {
		t.waiting = true // the tagger was not pinned: the plan attaches it again
	}
	events := map[uint32]pinnedEvent{}
	for _, p := range meta.Events {
		events[p.Index] = p
	}
	for _, es := range st.Events {
		if !es.Attached {
			continue
		}
		p, ok := events[es.EventIndex]
		switch {
		case es.NotKept != "":
			es.Attached, es.Error = false, lost("event "+es.Name, es.NotKept)
			continue
		case !ok:
			es.Attached, es.Error = false, lost("event "+es.Name, "nothing of it pinned")
			continue
		}
		e, err := loadPinnedEvent(filepath.Join(gen, eventPin(p.Index)), p)
		if err != nil {
			_ = os.RemoveAll(filepath.Join(gen, eventPin(p.Index)))
			es.Attached, es.Error = false, lost("event "+es.Name, err.Error())
			continue
		}
		t.Events = append(t.Events, e)
	}
	if len(t.Hops) == 0 && len(t.Events) == 0 && t.Tagger == nil && !t.waiting {
		t.release()
		return nil, errors.New("nothing of it is attached")
	}
	m.hopNames[t.Name] = meta.HopNames
	if t.waiting {
		// Not active until its plan attached again what it lost: the dispatcher, told so in
		// Register.running, sends the plan (the standalone agent has it already).
		st.Active = false
		st.Error = "taken over by a restarted agent without some of its hops: waiting for its plan to attach them again"
	}
	return t, nil
}
