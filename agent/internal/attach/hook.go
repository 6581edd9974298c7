package attach

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/hoptrace/hoptrace/agent/internal/allowlist"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// HookNotKept is why a hop in a hook is not pinned: the hook is the node's traces' together, and
// a restarted agent attaches the hop again from its plan.
const HookNotKept = "in a hook the node's traces share, which is not pinned: a restarted agent attaches it again from its plan"

// countersMaxAge: one read of a hook's counters serves its hops' reads this long (the agent reads
// every hop's counters each second).
const countersMaxAge = 200 * time.Millisecond

// Hooks are an agent's hooks (docs/design.md, "Many traces on a device"): one program per device and direction
// for every trace's tc hops there, one per device and event for every trace's tracepoint hops there,
// and one per cgroup for every trace's TCP tagger there, each hop a slot of its maps, so that a
// device crossed by many traces runs one program a packet rather than one a hop, and a cgroup holds
// more taggers than the kernel's 64 programs. A hook is loaded and
// attached with its first hop, and detached with its last; a hop joins or leaves with a few map
// updates.
type Hooks struct {
	spec *ebpf.CollectionSpec
	mu   sync.Mutex
	at   map[hookPlace]*placedHook
	// overflowGone: the overflow counts of the hooks detached so far (Stats' total goes on
	// from them).
	overflowGone uint64
}

// hookPlace is where a hook is attached: a device and direction for a tc hook (its netns by inode,
// its ifindex there, ingress or egress), a device and event for a tracepoint hook (tracepoint: its
// program), a cgroup's path for a sock_ops hook.
type hookPlace struct {
	nsIno      uint64
	ifindex    int
	ingress    bool
	tracepoint string
	event      string
	cgroup     string
}

// program is the hook program that runs at the place.
func (at hookPlace) program() string {
	switch {
	case at.cgroup != "":
		return loader.HookSockOpsProgram
	case at.tracepoint != "":
		return at.tracepoint
	}
	return loader.HookTCProgram
}

// target is the event and device a tracepoint hook keeps to; none for the others, attached where
// they run.
func (at hookPlace) target() loader.HookTarget {
	if at.tracepoint == "" {
		return loader.HookTarget{}
	}
	return loader.HookTarget{Event: at.event, Ifindex: uint32(at.ifindex), NetnsIno: uint32(at.nsIno)}
}

// kind names the place's hook in messages.
func (at hookPlace) kind() string {
	switch {
	case at.cgroup != "":
		return "sock_ops hook"
	case at.tracepoint != "":
		return "tracepoint hook"
	}
	return "tc hook"
}

// placedHook is a hook attached at its place (its slots in use are the hook's).
type placedHook struct {
	hook   *loader.Hook
	detach io.Closer
	// freed: when each slot was freed last; one is taken again after slotRest only, while another
	// is free (a packet in flight may still run it).
	freed map[uint32]time.Time
}

// slotRest is how long a freed slot rests before it is taken again: far longer than a packet
// runs through a hook.
const slotRest = time.Second

// NewHooks reads the hook object at path (kernel-patch/build/hook.bpf.o), which must be what
// hoptrace's own hook is (allowlist).
func NewHooks(path string) (*Hooks, error) {
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		return nil, fmt.Errorf("hook object %s: %w", path, err)
	}
	if err := allowlist.Check(spec, allowlist.Hook); err != nil {
		return nil, fmt.Errorf("hook object %s: %w", path, err)
	}
	return &Hooks{spec: spec, at: map[hookPlace]*placedHook{}}, nil
}

// tracepointHooks: the hook program that runs the hops of each tracepoint hop program (hop_tp_btf
// runs at any event whose first argument is the skb, its device the skb's; hop_tp_btf_xmit at
// net:net_dev_xmit, its device the event's).
var tracepointHooks = map[string]string{
	loader.ProgTPBTF:     loader.HookTPProgram,
	loader.ProgTPBTFXmit: loader.HookTPXmitProgram,
}

// takes says whether a hop goes into a hook: a tc hop running hoptrace's tc program, or a
// tracepoint hop running its program of a device's packets (not skb:kfree_skb's, whose drop reason
// the hook does not read).
func (hs *Hooks) takes(p *pending) bool {
	if hs == nil || p.plan == nil {
		return false
	}
	switch p.plan.GetKind() {
	case pb.AttachKind_ATTACH_KIND_TC_INGRESS, pb.AttachKind_ATTACH_KIND_TC_EGRESS:
		return p.cfg.Program == loader.ProgTC
	case pb.AttachKind_ATTACH_KIND_TRACEPOINT:
		_, ok := tracepointHooks[p.cfg.Program]
		return ok
	}
	return false
}

// HookIDs is where a UDP tagger in a hook starts its sequence: where the trace's is (next), or,
// when another tagger of the trace takes IDs from the trace's sequence meanwhile (shared), half
// the ID space further, so that the two do not hand out the same IDs until one of them has
// sampled 8 M packets more than the other (IDs repeat after 16 M anyway).
func HookIDs(next uint64, shared bool, sampleEvery uint32) uint64 {
	if !shared {
		return next
	}
	return next + uint64(max(sampleEvery, 1))<<(record.IDSeqBits-1)
}

// join puts the tc or tracepoint hop p into the hook of its place.
func (hs *Hooks) join(p *pending, env Env) (*Hop, error) {
	if p.plan.GetKind() == pb.AttachKind_ATTACH_KIND_TRACEPOINT {
		return hs.joinTracepoint(p, env)
	}
	if err := prepareOnDevice(p); err != nil {
		return nil, err
	}
	ino, err := netns.Inode(p.nsPath)
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", p.nsName, err)
	}
	at := hookPlace{nsIno: ino, ifindex: p.ifindex, ingress: p.plan.GetKind() == pb.AttachKind_ATTACH_KIND_TC_INGRESS}
	next, err := idNext(env.Load.IDState)
	if err != nil {
		return nil, err
	}
	return hs.put(p, at, HookIDs(next, env.SharedIDs, p.cfg.SampleEvery), env,
		func(prog *ebpf.Program) (io.Closer, error) { return attachTC(p.nsPath, p.ifindex, prog, at.ingress) })
}

// joinTracepoint puts the tracepoint hop p into the hook of its device (or of every device of its
// netns) and event. It tags nothing: its slot's ID sequence is not used.
func (hs *Hooks) joinTracepoint(p *pending, env Env) (*Hop, error) {
	if err := prepareTracepoint(p); err != nil {
		return nil, err
	}
	at := hookPlace{nsIno: uint64(p.cfg.NetnsIno), ifindex: p.ifindex, tracepoint: tracepointHooks[p.cfg.Program],
		event: p.cfg.AttachTo}
	return hs.put(p, at, 0, env, func(prog *ebpf.Program) (io.Closer, error) {
		return link.AttachTracing(link.TracingOptions{Program: prog})
	})
}

// joinTagger puts the TCP tagger p (prepared) into the sock_ops hook of its cgroup, which tags each
// socket's segments for the lowest slot whose trace takes it. Its IDs go on from the trace's
// sequence: a UDP tagger of the same trace in a tc hook starts half the space away (HookIDs).
func (hs *Hooks) joinTagger(p *pending, env Env) (*Hop, error) {
	next, err := idNext(env.Load.IDState)
	if err != nil {
		return nil, err
	}
	return hs.put(p, hookPlace{cgroup: p.target}, next, env, func(prog *ebpf.Program) (io.Closer, error) {
		return link.AttachCgroup(link.CgroupOptions{Path: p.target, Attach: ebpf.AttachCGroupSockOps, Program: prog})
	})
}

// put puts the hop p into the hook at `at`, its ID sequence at next, loading the hook and attaching
// it (attachHook) first if it holds no hop yet.
func (hs *Hooks) put(p *pending, at hookPlace, next uint64, env Env,
	attachHook func(*ebpf.Program) (io.Closer, error)) (*Hop, error) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	ph := hs.at[at]
	if ph == nil {
		hook, err := loader.LoadHook(hs.spec, at.program(), at.target(), env.Load)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", at.kind(), err)
		}
		d, err := attachHook(hook.Program)
		if err != nil {
			hook.Close()
			return nil, fmt.Errorf("attach the %s on %s: %w", at.kind(), p.describe, err)
		}
		ph = &placedHook{hook: hook, detach: d, freed: map[uint32]time.Time{}}
		hs.at[at] = ph
	}
	slot, ok := ph.free()
	if !ok {
		return nil, fmt.Errorf("the %s on %s holds %d hops already", at.kind(), p.describe, loader.HookSlots)
	}
	if err := ph.hook.Set(slot, p.cfg, next); err != nil {
		_ = hs.releaseIfEmpty(at, ph) // a hook loaded for this hop alone
		return nil, fmt.Errorf("%s on %s: %w", at.kind(), p.describe, err)
	}
	return &Hop{Name: p.cfg.Name, Index: uint32(p.cfg.HopIndex), Describe: p.describe, kind: p.plan.GetKind(),
		place: placeOf(p), inHook: &hookHop{hooks: hs, at: at, slot: slot, actions: p.cfg.Actions}}, nil
}

// idNext is the next number of a trace's ID sequence (id_state's first 8 bytes), where a tagger in
// a hook goes on from.
func idNext(idState *ebpf.Map) (uint64, error) {
	if idState == nil {
		return 0, nil
	}
	seq := make([]byte, idState.ValueSize())
	if err := idState.Lookup(uint32(0), seq); err != nil {
		return 0, fmt.Errorf("read the trace's %s: %w", loader.MapIDState, err)
	}
	return binary.NativeEndian.Uint64(seq), nil
}

// free is the slot a hop takes (under hs.mu, so that no other join takes it before the hop's Set):
// the lowest free slot that has rested (the agent reads a hook's counters up to its highest slot in
// use), or the lowest free one if none has.
func (ph *placedHook) free() (uint32, bool) {
	resting := uint32(loader.HookSlots)
	for s := range uint32(loader.HookSlots) {
		if ph.hook.Holds(s) {
			continue
		}
		if at, ok := ph.freed[s]; !ok || time.Since(at) >= slotRest {
			return s, true
		}
		resting = min(resting, s)
	}
	return resting, resting < loader.HookSlots
}

// releaseIfEmpty detaches the hook at `at` when it holds no hop any more.
func (hs *Hooks) releaseIfEmpty(at hookPlace, ph *placedHook) error {
	if len(ph.hook.Slots()) > 0 {
		return nil
	}
	return hs.release(at, ph)
}

// release detaches and closes the hook at `at`.
func (hs *Hooks) release(at hookPlace, ph *placedHook) error {
	delete(hs.at, at)
	hs.overflowGone += ph.overflow()
	err := ph.detach.Close()
	ph.hook.Close()
	return err
}

// overflow is the hook's count of traces' bodies not run: a packet taken by more traces than one
// packet runs (loader.HookMatched).
func (ph *placedHook) overflow() uint64 {
	c, err := ph.hook.HookCounters()
	if err != nil {
		return 0
	}
	return c[loader.HookCounterOverflow]
}

// Stats are the hooks attached now, and the traces' hop bodies every hook of the agent has not run
// (a packet taken by more than loader.HookMatched traces at one hook: counted, never run); none
// without hooks.
func (hs *Hooks) Stats() (attached int, overflow uint64) {
	if hs == nil {
		return 0, 0
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	overflow = hs.overflowGone
	for _, ph := range hs.at {
		overflow += ph.overflow()
	}
	return len(hs.at), overflow
}

// Close detaches every hook (the agent's end).
func (hs *Hooks) Close() {
	if hs == nil {
		return
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for at, ph := range hs.at {
		_ = hs.release(at, ph)
	}
}

// hookHop is a hop's slot in a hook.
type hookHop struct {
	hooks   *Hooks
	at      hookPlace
	slot    uint32
	actions loader.Actions
}

// placed is the hook the hop is in (nil once it left).
func (hh *hookHop) placed() *placedHook {
	hh.hooks.mu.Lock()
	defer hh.hooks.mu.Unlock()
	ph := hh.hooks.at[hh.at]
	if ph == nil || !ph.hook.Holds(hh.slot) {
		return nil
	}
	return ph
}

// leave takes the hop out of its hook, and detaches the hook if it was its last hop.
func (hh *hookHop) leave() error {
	hs := hh.hooks
	hs.mu.Lock()
	defer hs.mu.Unlock()
	ph := hs.at[hh.at]
	if ph == nil || !ph.hook.Holds(hh.slot) {
		return nil
	}
	err := ph.hook.Clear(hh.slot)
	ph.freed[hh.slot] = time.Now()
	if rerr := hs.releaseIfEmpty(hh.at, ph); err == nil {
		err = rerr
	}
	return err
}

// InHook says whether the hop runs in a hook (not pinned: HookNotKept).
func (h *Hop) InHook() bool { return h.inHook != nil }

// Actions are the hop's count, histogram and record actions.
func (h *Hop) Actions() loader.Actions {
	if h.inHook != nil {
		return h.inHook.actions
	}
	return h.Loaded.Actions
}

// ReadCounters sums the hop's counters over all CPUs.
func (h *Hop) ReadCounters() (record.Counters, error) {
	if h.inHook == nil {
		return h.Loaded.ReadCounters()
	}
	ph := h.inHook.placed()
	if ph == nil {
		return record.Counters{}, fmt.Errorf("hop %s left its hook", h.Name)
	}
	return ph.hook.SlotCounters(h.inHook.slot, countersMaxAge)
}

// ReadActions reads the hop's count and histogram.
func (h *Hop) ReadActions() (loader.ActionValues, error) {
	if h.inHook == nil {
		return h.Loaded.ReadActions()
	}
	ph := h.inHook.placed()
	if ph == nil {
		return loader.ActionValues{}, fmt.Errorf("hop %s left its hook", h.Name)
	}
	return ph.hook.SlotActions(h.inHook.slot)
}

// hookLinks is the hook's link of a hop in a hook (none for a clsact filter).
func (hh *hookHop) hookLinks() []link.Link {
	ph := hh.placed()
	if ph == nil {
		return nil
	}
	if l, ok := ph.detach.(link.Link); ok {
		return []link.Link{l}
	}
	return nil
}
