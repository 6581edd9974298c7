package attach

import (
	"fmt"
	"io"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
)

// tc hops attach at a device's ingress or egress: a tcx link where the kernel
// has tcx, else a clsact filter (clsact.go).
var (
	tcIngress = hopKind{device: deviceRequired, prepare: prepareOnDevice, attach: attachTCAt(true)}
	tcEgress  = hopKind{device: deviceRequired, prepare: prepareOnDevice, attach: attachTCAt(false)}
)

// prepareOnDevice names a hop that attaches to its device (tc, XDP); the
// device was resolved with the plan.
func prepareOnDevice(p *pending) error {
	p.describe = fmt.Sprintf("%s on %s in netns %s", kindName(p.plan.GetKind()), p.plan.GetDev(), p.nsName)
	return nil
}

func attachTCAt(ingress bool) func(*pending, *loader.Hop) (detachers, error) {
	return func(p *pending, l *loader.Hop) (detachers, error) {
		d, err := attachTC(p.nsPath, p.ifindex, l.Program, ingress)
		if err != nil {
			return nil, err
		}
		return detachers{d}, nil
	}
}

// attachTC attaches prog at a device's tc ingress or egress: tcx where the kernel has it, else a
// clsact filter in direct-action mode (the program's verdict is TC_ACT_UNSPEC: it never decides).
func attachTC(nsPath string, ifindex int, prog *ebpf.Program, ingress bool) (io.Closer, error) {
	if TCXUnsupported() == "" {
		at := ebpf.AttachTCXEgress
		if ingress {
			at = ebpf.AttachTCXIngress
		}
		var l link.Link
		err := netns.Do(nsPath, func() error {
			var err error
			l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at})
			return err
		})
		if err != nil {
			return nil, err
		}
		return l, nil
	}
	f, err := attachClsact(nsPath, ifindex, prog, ingress)
	if err != nil {
		return nil, err
	}
	return f, nil
}
