package attach

import (
	"github.com/cilium/ebpf/link"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
)

// xdp hops attach at a device's XDP hook, in the hop's netns.
var xdp = hopKind{device: deviceRequired, prepare: prepareOnDevice, attach: attachXDP}

func attachXDP(p *pending, l *loader.Hop) (detachers, error) {
	var xl link.Link
	err := netns.Do(p.nsPath, func() error {
		var err error
		xl, err = link.AttachXDP(link.XDPOptions{Interface: p.ifindex, Program: l.Program})
		return err
	})
	return single(xl, err)
}
