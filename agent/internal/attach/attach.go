// Package attach loads and attaches one hop of a TracePlan where its `at`
// says. Each attach kind is a pair of steps in a file of its own (tc.go,
// xdp.go, tracepoint.go, cgroup.go, fentry.go, kprobe.go, socketread.go,
// uprobe.go, and the sock_ops TCP tagger in tagger.go): prepare specialises
// the hop before load, attach attaches the loaded program and returns what
// detaches it. The table kinds maps each kind to its pair. Every attachment is
// an fd-based link, or, for a tc hop on a kernel without tcx (before 6.6), a
// clsact filter, which only Close removes. A hop that Pin pinned in bpffs
// outlives its agent (pin.go); one that is not goes with its agent's process.
package attach

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// kinds is every attach kind's pair of steps.
var kinds = map[pb.AttachKind]hopKind{
	pb.AttachKind_ATTACH_KIND_TC_INGRESS:     tcIngress,
	pb.AttachKind_ATTACH_KIND_TC_EGRESS:      tcEgress,
	pb.AttachKind_ATTACH_KIND_XDP:            xdp,
	pb.AttachKind_ATTACH_KIND_CGROUP_INGRESS: cgroupIngress,
	pb.AttachKind_ATTACH_KIND_CGROUP_EGRESS:  cgroupEgress,
	pb.AttachKind_ATTACH_KIND_TRACEPOINT:     tracepoint,
	pb.AttachKind_ATTACH_KIND_FENTRY:         fentry,
	pb.AttachKind_ATTACH_KIND_FEXIT:          fexit,
	pb.AttachKind_ATTACH_KIND_KPROBE:         kprobe,
	pb.AttachKind_ATTACH_KIND_KRETPROBE:      kretprobe,
	pb.AttachKind_ATTACH_KIND_SOCKET_READ:    socketRead,
	pb.AttachKind_ATTACH_KIND_UPROBE:         uprobe,
	pb.AttachKind_ATTACH_KIND_URETPROBE:      uretprobe,
}

// hopKind is one attach kind: what its hops do with a device, and its steps.
type hopKind struct {
	device deviceUse
	// prepare runs before load: it checks the plan's fields for this kind and
	// specialises p.cfg, which the loader applies to the hop's ProgramSpec
	// (program, companion, attach target and type) and its constants; it
	// resolves what attach needs and names the attachment (p.describe).
	prepare func(p *pending) error
	// attach runs after load and returns what detaches the hop; on an error
	// it has detached whatever it attached itself.
	attach func(p *pending, l *loader.Hop) (detachers, error)
	// loadRefusal, when set, words a load error this kind can explain.
	loadRefusal func(p *pending, err error) error
}

// deviceUse is what a kind does with the plan's dev.
type deviceUse int

const (
	deviceOptional deviceUse = iota // resolved in the hop's netns when given (a filter)
	deviceRequired                  // the kind attaches to it
	deviceIgnored                   // cgroup kinds: never resolved
)

// pending is one hop between its plan and its attachment: prepare fills it
// in, attach reads it.
type pending struct {
	plan           *pb.HopAttach // nil for the TCP tagger
	nsPath, nsName string
	cfg            loader.HopConfig
	describe       string // where the hop attaches, e.g. "tcx egress on eth0 in netns c1"
	ifindex        int    // the plan's dev in the hop's netns; 0 without one
	// target is what prepare resolved the hop's target to: a cgroup's
	// path, or a uprobe binary's path as the agent opens it (exe).
	target string
	exe    *link.Executable
}

// detachers undo one hop's attachment in order: its links (the program's
// first), or the clsact filter of a tc hop on a kernel without tcx.
type detachers []io.Closer

// Close detaches every one, in order.
func (d detachers) Close() error {
	var err error
	for _, c := range d {
		err = errors.Join(err, c.Close())
	}
	return err
}

// single is the result of an attach that makes one link.
func single(l link.Link, err error) (detachers, error) {
	if err != nil {
		return nil, err
	}
	return detachers{l}, nil
}

// Env is what every hop of an agent shares.
type Env struct {
	// Netns is the agent's --netns: hops without a netns run there.
	Netns string
	// Base is copied into every hop's HopConfig (trace slot, salt, filter...).
	Base loader.HopConfig
	Load loader.Options
	// Hooks, when set, take the tc hops (hook.go) instead of a program each.
	Hooks *Hooks
	// SharedIDs says the trace has another tagger on the node (its sock_ops TCP tagger) taking
	// IDs from the trace's sequence meanwhile: a UDP tagger in a hook, which counts in a sequence
	// of the hook's own, then starts half the ID space away from it (HookIDs).
	SharedIDs bool
}

// Hop is one attached hop.
type Hop struct {
	Name     string
	Index    uint32
	Loaded   *loader.Hop
	Describe string // e.g. "tcx egress on eth0 in netns c1"
	kind     pb.AttachKind
	detach   detachers
	place    *place   // what Gone checks (nil: nothing to lose)
	pinDir   string   // where Pin pinned it ("" = not pinned)
	inHook   *hookHop // its slot in a hook (Loaded is nil then)
}

// Close detaches first (unpinned, its links detach as they close), then
// releases the program and maps.
func (h *Hop) Close() error {
	if h == nil {
		return nil
	}
	if h.inHook != nil {
		return h.inHook.leave()
	}
	h.unpin()
	err := h.detach.Close()
	h.detach = nil
	h.Loaded.Close()
	return err
}

// Links are the hop's links, its program's first; none for a tc hop
// attached as a clsact filter; its hook's for a hop in a hook.
func (h *Hop) Links() []link.Link {
	if h.inHook != nil {
		return h.inHook.hookLinks()
	}
	var out []link.Link
	for _, d := range h.detach {
		if l, ok := d.(link.Link); ok {
			out = append(out, l)
		}
	}
	return out
}

// AttachHop loads and attaches one hop. Errors name the hop and the reason.
func AttachHop(spec *ebpf.CollectionSpec, ha *pb.HopAttach, env Env) (*Hop, error) {
	h, err := attachHop(spec, ha, env)
	if err != nil {
		return nil, fmt.Errorf("hop %s: %w", ha.GetName(), err)
	}
	return h, nil
}

func attachHop(spec *ebpf.CollectionSpec, ha *pb.HopAttach, env Env) (*Hop, error) {
	kind := ha.GetKind()
	if ha.GetProgram() == "" {
		return nil, fmt.Errorf("plan names no program for the %s hop", kindName(kind))
	}
	p := &pending{plan: ha, nsPath: netns.Path(ha.GetNetns(), env.Netns), nsName: netns.Display(ha.GetNetns(), env.Netns),
		cfg: env.Base}
	p.cfg.Name = ha.GetName()
	p.cfg.Program = ha.GetProgram()
	p.cfg.HopIndex = uint16(ha.GetHopIndex())
	p.cfg.TagUDP = ha.GetTagUdp()
	actions, err := loader.ActionsFromPlan(ha.GetActions())
	if err != nil {
		return nil, err
	}
	p.cfg.Actions = actions
	if ha.GetHopIndex() > 0xffff {
		return nil, fmt.Errorf("hop_index %d out of range", ha.GetHopIndex())
	}
	k, known := kinds[kind]
	if k.device == deviceRequired && ha.GetDev() == "" {
		return nil, fmt.Errorf("%s needs a dev", kindName(kind))
	}
	if ha.GetDev() != "" && k.device != deviceIgnored {
		if _, err := os.Stat(p.nsPath); err != nil {
			return nil, fmt.Errorf("netns %s: %w", p.nsName, err)
		}
		if p.ifindex, err = netns.Ifindex(p.nsPath, ha.GetDev()); err != nil {
			return nil, fmt.Errorf("device %s not found in netns %s", ha.GetDev(), p.nsName)
		}
	}
	if !known {
		return nil, fmt.Errorf("unknown attach kind %d", int32(kind))
	}
	if env.Hooks.takes(p) {
		return env.Hooks.join(p, env)
	}
	return load(spec, k, p, env.Load)
}

// load runs a kind's steps around the hop's load: prepare, load, attach.
func load(spec *ebpf.CollectionSpec, k hopKind, p *pending, opts loader.Options) (*Hop, error) {
	if err := k.prepare(p); err != nil {
		return nil, err
	}
	l, err := loader.LoadHop(spec, p.cfg, opts)
	if err != nil {
		err = unwrapHopPrefix(err, p.cfg.Name)
		if k.loadRefusal != nil {
			err = k.loadRefusal(p, err)
		}
		return nil, err
	}
	d, err := k.attach(p, l)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("attach %s: %w", p.describe, err)
	}
	h := &Hop{Name: p.cfg.Name, Index: uint32(p.cfg.HopIndex), Loaded: l, Describe: p.describe, detach: d,
		place: placeOf(p)}
	if p.plan != nil {
		h.kind = p.plan.GetKind()
	}
	return h, nil
}

// netnsInode sets the hop's netns inode constant: the programs that see
// every netns (tracing, kprobes, socket-read) keep only the hop's.
func (p *pending) netnsInode() error {
	ino, err := netns.Inode(p.nsPath)
	if err != nil {
		return err
	}
	p.cfg.NetnsIno = uint32(ino)
	return nil
}

// kindName is the spec's spelling of an attach kind (ATTACH_KIND_TC_EGRESS: tc-egress), for messages.
func kindName(k pb.AttachKind) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(k.String(), "ATTACH_KIND_")), "_", "-")
}

// unwrapHopPrefix avoids "hop x: hop x: ..." since LoadHop names the hop too.
func unwrapHopPrefix(err error, name string) error {
	if u := errors.Unwrap(err); u != nil && strings.HasPrefix(err.Error(), "hop "+name+": ") {
		return u
	}
	return err
}

// KernelFunctionRefusal is why this kernel refuses a kernel-function attach
// of `kind` before trying it (kprobe and kretprobe: no kprobe_events;
// fentry and fexit: a kernel lockdown), worded as the refusal says it; ""
// when nothing known stands in the way.
func KernelFunctionRefusal(kind pb.AttachKind) string {
	switch kind {
	case pb.AttachKind_ATTACH_KIND_KPROBE, pb.AttachKind_ATTACH_KIND_KRETPROBE:
		return strings.Replace(KprobeUnsupported(), "kprobe", kindName(kind), 1)
	case pb.AttachKind_ATTACH_KIND_FENTRY, pb.AttachKind_ATTACH_KIND_FEXIT:
		if lockdown := LockdownReason(); strings.HasPrefix(lockdown, "kernel lockdown (") {
			return kindName(kind) + " not permitted: " + lockdown
		}
	}
	return ""
}
