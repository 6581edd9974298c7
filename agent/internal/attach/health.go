package attach

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf/link"

	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// place is where a hop was attached, as it was then: its netns (the file and
// its inode) and its device (name and ifindex). Gone compares it with now.
type place struct {
	nsPath, nsName string
	nsIno          uint64 // 0: not known at attach time (not compared)
	dev            string // "" when the hop has no device
	ifindex        int
}

// placeOf is what a hop's attachment depends on: its netns when the plan
// names one or the hop is on a device there, and the device. nil when it
// depends on neither (a kernel function seen in every netns, the tagger).
func placeOf(p *pending) *place {
	if p.plan == nil || (p.plan.GetNetns() == "" && p.ifindex == 0) {
		return nil
	}
	w := &place{nsPath: p.nsPath, nsName: p.nsName, ifindex: p.ifindex}
	if p.ifindex != 0 {
		w.dev = p.plan.GetDev()
	}
	if ino, err := netns.Inode(p.nsPath); err == nil {
		w.nsIno = ino
	}
	return w
}

// A Survey is one round of Gone checks. It reads each netns it meets once
// (its inode and its devices), so the hops of many traces on the same
// devices cost one visit of each namespace rather than one per hop: with
// 63 traces of three hops, a heartbeat's checks were a quarter of the idle
// agent's CPU. Use one per round: what it read is not read again.
type Survey struct {
	spaces map[string]*space
	links  map[link.Link]string // what detached said of each link
}

// space is what a Survey read of one netns path.
type space struct {
	missing error // the path cannot be read
	ino     uint64
	inoErr  error
	devices map[string]int // name -> ifindex; nil when the listing failed
}

// NewSurvey starts a round of checks.
func NewSurvey() *Survey {
	return &Survey{spaces: map[string]*space{}, links: map[link.Link]string{}}
}

func (s *Survey) space(path string) *space {
	if sp, ok := s.spaces[path]; ok {
		return sp
	}
	sp := &space{}
	if _, err := os.Stat(path); err != nil {
		sp.missing = err
	} else {
		sp.ino, sp.inoErr = netns.Inode(path)
	}
	s.spaces[path] = sp
	return sp
}

func (s *Survey) devices(path string, sp *space) map[string]int {
	if sp.devices == nil {
		if idx, err := netns.Ifindexes(path); err == nil {
			sp.devices = idx
		} else {
			sp.devices = map[string]int{}
		}
	}
	return sp.devices
}

// Gone says why the hop no longer sees its packets: its netns or its device
// went away (deleted, or deleted and made again under the same name, which
// the program is not on), or its tcx/XDP link was detached; "" while it is
// where it was attached. A tcx or XDP link is detached by the kernel when
// its device is unregistered (tcx_uninstall, dev_xdp_uninstall); a clsact
// filter goes with its device's qdisc.
func (s *Survey) Gone(h *Hop) string {
	if h == nil || h.place == nil {
		return ""
	}
	w := h.place
	sp := s.space(w.nsPath)
	if sp.missing != nil {
		if errors.Is(sp.missing, os.ErrNotExist) {
			return fmt.Sprintf("netns %s is gone", w.nsName)
		}
		return fmt.Sprintf("netns %s cannot be read: %v", w.nsName, sp.missing)
	}
	if sp.inoErr == nil && w.nsIno != 0 && sp.ino != w.nsIno {
		return fmt.Sprintf("netns %s is gone (another namespace has its name now)", w.nsName)
	}
	if w.dev == "" {
		return ""
	}
	ifindex, ok := s.devices(w.nsPath, sp)[w.dev]
	switch {
	case !ok:
		return fmt.Sprintf("device %s is gone from netns %s", w.dev, w.nsName)
	case ifindex != w.ifindex:
		return fmt.Sprintf("device %s is gone from netns %s (another device has its name now)", w.dev, w.nsName)
	}
	// Only a device's own links are detached with it (tcx, XDP); the hops in one hook share its link.
	switch h.kind {
	case pb.AttachKind_ATTACH_KIND_TC_INGRESS, pb.AttachKind_ATTACH_KIND_TC_EGRESS, pb.AttachKind_ATTACH_KIND_XDP:
	default:
		return ""
	}
	for _, l := range h.Links() {
		if why := s.detached(l, w.dev); why != "" {
			return why
		}
	}
	return ""
}

// detached says why a device's link no longer holds its program, "" while it does; asked once a round.
func (s *Survey) detached(l link.Link, dev string) string {
	if why, ok := s.links[l]; ok {
		return why
	}
	why := ""
	if info, err := l.Info(); err == nil {
		if tcx := info.TCX(); tcx != nil && tcx.Ifindex == 0 {
			why = fmt.Sprintf("its tcx link on %s was detached", dev)
		}
		if xdp := info.XDP(); xdp != nil && xdp.Ifindex == 0 {
			why = fmt.Sprintf("its XDP link on %s was detached", dev)
		}
	}
	s.links[l] = why
	return why
}
