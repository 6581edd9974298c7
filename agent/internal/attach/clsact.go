package attach

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/netns"
)

// clsactPriority places hoptrace's filters after those of a priority-1 user; filters of the same
// priority run in handle order.
const clsactPriority = 0xc000

// clsactFilter is a tc BPF filter on a clsact qdisc: how a tc hop attaches where the kernel has no
// tcx (before 6.6). Unlike a link, a filter is not tied to the agent's file descriptors, so Close
// removes it explicitly.
type clsactFilter struct {
	nsPath string
	filter *netlink.BpfFilter
}

// TCXUnsupported says why tc hops attach as clsact filters here, or "" when they attach as tcx
// links. HOPTRACE_TC=clsact asks for the filters on any kernel (the tests prove the fallback of a
// kernel without tcx on one with it, as HOPTRACE_FLOOR=1 does the floor programs).
func TCXUnsupported() string {
	if os.Getenv("HOPTRACE_TC") == "clsact" {
		return "HOPTRACE_TC=clsact"
	}
	return probeTCX()
}

// probeTCX probes once whether this kernel has tcx links (6.6, e420bed02507): by attaching a
// program that lets every packet through (TCX_NEXT) to the loopback device, and detaching it. Loading
// alone proves nothing: older kernels accept the attach type and ignore it. "" means supported.
var probeTCX = sync.OnceValue(func() string {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, AttachType: ebpf.AttachTCXIngress,
		License: "GPL", Instructions: asm.Instructions{asm.LoadImm(asm.R0, -1, asm.DWord), asm.Return()}})
	if err != nil {
		return fmt.Sprintf("tcx not supported: %v", err)
	}
	defer prog.Close()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return fmt.Sprintf("tcx not probed: %v", err)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: lo.Index, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return fmt.Sprintf("tcx not supported (Linux 6.6+): %v", err)
	}
	l.Close()
	return ""
})

// attachClsact adds prog as a direct-action filter at the device's clsact ingress or egress.
func attachClsact(nsPath string, ifindex int, prog *ebpf.Program, ingress bool) (*clsactFilter, error) {
	parent := uint32(netlink.HANDLE_MIN_EGRESS)
	if ingress {
		parent = netlink.HANDLE_MIN_INGRESS
	}
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("program info: %w", err)
	}
	// The program's ID is the filter's handle: unique while the program lives, across agents too.
	id, ok := info.ID()
	if !ok {
		return nil, errors.New("kernel reports no program ID")
	}
	f := &clsactFilter{nsPath: nsPath, filter: &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    parent,
			Handle:    uint32(id),
			Protocol:  unix.ETH_P_ALL,
			Priority:  clsactPriority,
		},
		Fd:           prog.FD(),
		Name:         info.Name,
		DirectAction: true,
	}}
	err = netns.Do(nsPath, func() error {
		qdisc := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT,
		}}
		// Another hop or tool may have made the qdisc already; it stays after us either way.
		if err := netlink.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add clsact qdisc: %w", err)
		}
		if err := netlink.FilterAdd(f.filter); err != nil {
			return fmt.Errorf("add tc filter: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return f, nil
}

// ClsactFilters are the BPF filters at the clsact ingress or egress of the device ifindex in the
// network namespace nsPath (none where the device has no clsact qdisc): what a kernel without tcx
// runs at its tc hooks.
func ClsactFilters(nsPath string, ifindex int, ingress bool) ([]*netlink.BpfFilter, error) {
	parent := uint32(netlink.HANDLE_MIN_EGRESS)
	if ingress {
		parent = netlink.HANDLE_MIN_INGRESS
	}
	var out []*netlink.BpfFilter
	err := netns.Do(nsPath, func() error {
		var err error
		out, err = clsactFilters(ifindex, parent)
		return err
	})
	return out, err
}

// clsactFilters are the BPF filters at parent of the device ifindex in the current namespace.
func clsactFilters(ifindex int, parent uint32) ([]*netlink.BpfFilter, error) {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return nil, err
	}
	qdiscs, err := netlink.QdiscList(l)
	if err != nil {
		return nil, fmt.Errorf("list qdiscs: %w", err)
	}
	if !slices.ContainsFunc(qdiscs, func(q netlink.Qdisc) bool { return q.Type() == "clsact" }) {
		return nil, nil // no filter list to ask for
	}
	filters, err := netlink.FilterList(l, parent)
	if err != nil {
		return nil, fmt.Errorf("list tc filters: %w", err)
	}
	var out []*netlink.BpfFilter
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok {
			out = append(out, bf)
		}
	}
	return out, nil
}

// Close removes the filter; a device that is gone took it along.
func (f *clsactFilter) Close() error {
	err := netns.Do(f.nsPath, func() error {
		return netlink.FilterDel(f.filter)
	})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) {
		return nil
	}
	return err
}
