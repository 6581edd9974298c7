// Package probe measures what this kernel lets the agent do, by trying it:
// BTF, each attach kind (loading a trivial program where the program type
// alone says too little), the ring buffer and the TCP header-option helpers.
package probe

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"

	"github.com/hoptrace/hoptrace/agent/internal/attach"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// Capabilities probes the running kernel.
func Capabilities() *pb.Capabilities {
	c := &pb.Capabilities{Attach: map[string]*pb.AttachSupport{}}
	// The catalogue's fields this kernel can give: the hop programs read each
	// with CO-RE or from their ctx; a few need a helper or an event argument
	// that came later (FieldRefusal). Which attach kinds give which is the
	// dispatcher's table.
	c.UnavailableFields = map[string]string{}
	for f := record.ActionField(1); f < record.FieldMax; f++ {
		if why := FieldRefusal(f); why != "" {
			c.UnavailableFields[record.FieldKeys[f]] = why
			continue
		}
		c.ActionFields = append(c.ActionFields, pb.Field(f))
	}
	_, err := btf.LoadKernelSpec()
	c.Btf = err == nil
	// A kernel without the enum (or without BTF) has no names: drops: true is refused there anyway,
	// for the missing drop_reason field.
	c.DropReasons, _ = DropReasons()

	c.RingBuffer = features.HaveMapType(ebpf.RingBuf) == nil
	c.TcpHeaderOptions = features.HaveProgramType(ebpf.SockOps) == nil &&
		features.HaveProgramHelper(ebpf.SockOps, asm.FnStoreHdrOpt) == nil &&
		features.HaveProgramHelper(ebpf.SockOps, asm.FnReserveHdrOpt) == nil

	set := func(kind string, err error) {
		s := &pb.AttachSupport{Supported: err == nil}
		if err != nil {
			s.Reason = err.Error()
		}
		c.Attach[kind] = s
	}
	set("tc", typ(ebpf.SchedCLS, "tc"))
	set("tcx", tcx())
	set("xdp", typ(ebpf.XDP, "xdp"))
	set("cgroup_skb", typ(ebpf.CGroupSKB, "cgroup_skb"))
	set("sock_ops", typ(ebpf.SockOps, "sock_ops"))
	set("raw_tp", typ(ebpf.RawTracepoint, "raw_tp"))
	set("tp_btf", tracing(ebpf.AttachTraceRawTp, "netif_receive_skb", "tp_btf"))
	set("fentry", tracing(ebpf.AttachTraceFEntry, "netif_receive_skb", "fentry"))
	set("fexit", tracing(ebpf.AttachTraceFExit, "netif_receive_skb", "fexit"))
	// A kretprobe hop is a kprobe and a kretprobe (hop.bpf.h): both need kprobe_events.
	for _, kind := range []string{"kprobe", "kretprobe"} {
		if r := attach.KprobeUnsupported(); r != "" {
			set(kind, errors.New(strings.Replace(r, "kprobe", kind, 1)))
		} else {
			set(kind, typ(ebpf.Kprobe, kind))
		}
	}
	return c
}

func typ(pt ebpf.ProgramType, kind string) error {
	if err := features.HaveProgramType(pt); err != nil {
		return fmt.Errorf("%s not supported: %w", kind, err)
	}
	return nil
}

func tcx() error {
	if reason := attach.TCXUnsupported(); reason != "" {
		return errors.New(reason)
	}
	return nil
}

// tracing loads a trivial tracing program against a kernel function or
// event: this is where lockdown refuses fentry with EPERM.
func tracing(at ebpf.AttachType, target, kind string) error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.Tracing, AttachType: at, AttachTo: target,
		License: "GPL", Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		if errors.Is(err, os.ErrPermission) && os.Geteuid() == 0 {
			return fmt.Errorf("%s not permitted: %s", kind, attach.LockdownReason())
		}
		return fmt.Errorf("%s not supported: %w", kind, err)
	}
	prog.Close()
	return nil
}
