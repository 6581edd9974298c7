package attach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// A hop outlives its agent when its links are pinned in bpffs (a bpf_link pinned stays attached
// after its last file descriptor closes; kernel 5.7, 70ed506c3bbc): Pin pins them in a directory of
// the hop's with its program and the maps the agent reads, and PinnedHop says what a restarted
// agent needs to take the hop over (LoadPinnedHop). Which kinds can be pinned depends on the kernel:
//
//   - tcx (6.6), XDP (5.9), cgroup_skb and sock_ops (5.7), tp_btf, fentry, fexit and the socket-read
//     programs (tracing links, 5.7): bpf_links, pinned;
//   - kprobe, kretprobe, uprobe, uretprobe: a perf_event bpf_link from 5.15 (b89fbfbb854c), pinned;
//     before, the program is set on the perf event by ioctl, which is no link and cannot be pinned:
//     not kept, the hop goes with its agent (PinnedHop.NotKept says so);
//   - tc on a kernel without tcx: a clsact filter, which is no link but stays on its device until it
//     is deleted; its attributes are kept, and a restarted agent takes the filter over.

// linkPin is the name of a hop's i-th link in its directory (the program's first).
func linkPin(i int) string { return fmt.Sprintf("link%d", i) }

// PinnedHop is what a restarted agent needs to take a pinned hop over: the hop as it was attached,
// and where.
type PinnedHop struct {
	Name     string         `json:"name"`
	Index    uint32         `json:"index"`
	Kind     pb.AttachKind  `json:"kind"`
	Describe string         `json:"describe"`
	Program  string         `json:"program"` // the variant loaded (loader.Hop.ProgramName)
	Actions  loader.Actions `json:"actions"`
	Links    int            `json:"links"` // pinned as link0, link1, ...
	Clsact   *PinnedClsact  `json:"clsact,omitempty"`
	Place    *PinnedPlace   `json:"place,omitempty"`
}

// PinnedClsact is a tc hop's clsact filter (a kernel without tcx).
type PinnedClsact struct {
	NsPath   string `json:"ns_path"`
	Ifindex  int    `json:"ifindex"`
	Parent   uint32 `json:"parent"`
	Handle   uint32 `json:"handle"`
	Priority uint16 `json:"priority"`
}

// PinnedPlace is the hop's place (what Gone compares with now).
type PinnedPlace struct {
	NsPath  string `json:"ns_path"`
	NsName  string `json:"ns_name"`
	NsIno   uint64 `json:"ns_ino"`
	Dev     string `json:"dev,omitempty"`
	Ifindex int    `json:"ifindex,omitempty"`
}

// Pin pins the hop in dir (made here): its links, its program and the maps the agent reads. The hop
// then outlives its agent, until Close (which unpins it) or the removal of dir. notKept says why the
// hop cannot be kept on this kernel, with nothing of it left pinned (its link kind cannot be
// pinned); err is anything else that failed.
func (h *Hop) Pin(dir string) (notKept string, err error) {
	if h.inHook != nil {
		return h.Describe + ": " + HookNotKept, nil
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	h.pinDir = dir
	if err := h.Loaded.Pin(dir); err != nil {
		h.unpin()
		return "", err
	}
	for i, l := range h.Links() {
		if err := l.Pin(filepath.Join(dir, linkPin(i))); err != nil {
			h.unpin()
			if errors.Is(err, link.ErrNotSupported) {
				return fmt.Sprintf("%s: its link cannot be pinned on this kernel (%v): it goes with its agent, "+
					"and a restarted agent attaches it again", h.Describe, err), nil
			}
			return "", fmt.Errorf("pin %s link %d: %w", h.Describe, i, err)
		}
	}
	return "", nil
}

// unpin removes the hop's directory; the links stay attached while the agent holds them.
func (h *Hop) unpin() {
	if h.pinDir == "" {
		return
	}
	for _, l := range h.Links() {
		_ = l.Unpin() // what it knows as its pin path is gone with the directory anyway
	}
	_ = os.RemoveAll(h.pinDir)
	h.pinDir = ""
}

// Pinned is what PinnedHop keeps of h.
func (h *Hop) Pinned() PinnedHop {
	p := PinnedHop{Name: h.Name, Index: h.Index, Kind: h.kind, Describe: h.Describe, Program: h.Loaded.ProgramName,
		Actions: h.Loaded.Actions, Links: len(h.Links())}
	for _, d := range h.detach {
		if f, ok := d.(*clsactFilter); ok {
			a := f.filter.Attrs()
			p.Clsact = &PinnedClsact{NsPath: f.nsPath, Ifindex: a.LinkIndex, Parent: a.Parent, Handle: a.Handle,
				Priority: a.Priority}
		}
	}
	if w := h.place; w != nil {
		p.Place = &PinnedPlace{NsPath: w.nsPath, NsName: w.nsName, NsIno: w.nsIno, Dev: w.dev, Ifindex: w.ifindex}
	}
	return p
}

// LoadPinnedHop takes over the hop p that an agent pinned in dir: its links, program and maps, and
// its clsact filter, which must still be on its device running the pinned program.
func LoadPinnedHop(dir string, p PinnedHop) (*Hop, error) {
	loaded, err := loader.LoadPinnedHop(dir, p.Program, p.Actions)
	if err != nil {
		return nil, err
	}
	h := &Hop{Name: p.Name, Index: p.Index, kind: p.Kind, Loaded: loaded, Describe: p.Describe, pinDir: dir}
	for i := 0; i < p.Links; i++ {
		l, err := link.LoadPinnedLink(filepath.Join(dir, linkPin(i)), nil)
		if err != nil {
			h.Release()
			return nil, fmt.Errorf("load pinned link %d: %w", i, err)
		}
		h.detach = append(h.detach, l)
	}
	if c := p.Clsact; c != nil {
		f, err := findClsact(c, loaded)
		if err != nil {
			h.Release()
			return nil, err
		}
		h.detach = append(h.detach, f)
	}
	if w := p.Place; w != nil {
		h.place = &place{nsPath: w.NsPath, nsName: w.NsName, nsIno: w.NsIno, dev: w.Dev, ifindex: w.Ifindex}
	}
	return h, nil
}

// findClsact finds the clsact filter c on its device, running the hop's program.
func findClsact(c *PinnedClsact, loaded *loader.Hop) (*clsactFilter, error) {
	info, err := loaded.Program.Info()
	if err != nil {
		return nil, fmt.Errorf("program info: %w", err)
	}
	id, _ := info.ID()
	f, err := pinnedClsact(c, uint32(id))
	if err != nil {
		return nil, err
	}
	if f == nil {
		return nil, errors.New("its clsact filter is gone")
	}
	return f, nil
}

// pinnedClsact is the clsact filter c on its device running the program prog, or nil.
func pinnedClsact(c *PinnedClsact, prog uint32) (*clsactFilter, error) {
	var found *netlink.BpfFilter
	err := netns.Do(c.NsPath, func() error {
		filters, err := clsactFilters(c.Ifindex, c.Parent)
		if err != nil {
			return err
		}
		for _, bf := range filters {
			if bf.Handle == c.Handle && bf.Priority == c.Priority && bf.Id == int(prog) {
				found = bf
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("its clsact filter: %w", err)
	}
	if found == nil {
		return nil, nil
	}
	found.LinkIndex, found.Parent = c.Ifindex, c.Parent
	return &clsactFilter{nsPath: c.NsPath, filter: found}, nil
}

// DropPinned detaches what of the pinned hop p outlives its pins when it is not taken over: its
// clsact filter. A pinned link goes with its pins and last file descriptor; a filter stays on its
// device, running the hop's program, until it is deleted. The filter's handle is the ID of the
// program it was added with, so a filter still running that program is the hop's.
func DropPinned(p PinnedHop) error {
	if p.Clsact == nil {
		return nil
	}
	f, err := pinnedClsact(p.Clsact, p.Clsact.Handle)
	if err != nil || f == nil {
		return err
	}
	return f.Close()
}

// Release closes what the agent holds of the hop and leaves a pinned hop attached, for the next
// agent; one that is not pinned is detached (Close), as it would go with the agent anyway.
func (h *Hop) Release() {
	if h == nil {
		return
	}
	if h.pinDir == "" {
		_ = h.Close()
		return
	}
	for _, d := range h.detach {
		if l, ok := d.(link.Link); ok {
			_ = l.Close()
		}
	}
	h.detach = nil
	h.Loaded.Close()
}
