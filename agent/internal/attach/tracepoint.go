package attach

import (
	"fmt"

	"github.com/cilium/ebpf/link"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
)

// tracepoint hops are tp_btf programs on the plan's event, kept to the hop's
// netns (and its dev, when given).
var tracepoint = hopKind{prepare: prepareTracepoint, attach: attachTracing}

func prepareTracepoint(p *pending) error {
	p.cfg.AttachTo = p.plan.GetTracepointEvent()
	p.cfg.Ifindex = uint32(p.ifindex)
	if err := p.netnsInode(); err != nil {
		return err
	}
	p.describe = fmt.Sprintf("tp_btf %s:%s in netns %s", p.plan.GetTracepointGroup(), p.plan.GetTracepointEvent(), p.nsName)
	return nil
}

// attachTracing attaches a tracing program (tp_btf, fentry, fexit) where its
// ProgramSpec's AttachTo said at load.
func attachTracing(_ *pending, l *loader.Hop) (detachers, error) {
	return single(link.AttachTracing(link.TracingOptions{Program: l.Program}))
}
