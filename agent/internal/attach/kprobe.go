package attach

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf/link"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
)

// kprobe hops run at the plan's kernel function's entry; kretprobe hops at
// its return, with an entry kprobe (the companion) that keeps the skb:
// hop_kretprobe records at the return the skb its entry kept (hop.bpf.h), the
// pair one collection sharing kret_skbs.
var (
	kprobe    = hopKind{prepare: prepareKprobe, attach: attachKprobe}
	kretprobe = hopKind{prepare: prepareKretprobe, attach: attachKretprobe}
)

func prepareKprobe(p *pending) error {
	if reason := KprobeUnsupported(); reason != "" {
		return errors.New(reason)
	}
	p.cfg.Ifindex = uint32(p.ifindex)
	_ = p.netnsInode() // without it, every netns
	p.describe = "kprobe " + p.plan.GetFunction()
	return nil
}

func attachKprobe(p *pending, l *loader.Hop) (detachers, error) {
	return single(link.Kprobe(p.plan.GetFunction(), l.Program, nil))
}

func prepareKretprobe(p *pending) error {
	if reason := KprobeUnsupported(); reason != "" {
		return errors.New(strings.Replace(reason, "kprobe", "kretprobe", 1))
	}
	if p.cfg.Program != loader.ProgKretprobe {
		return fmt.Errorf("kretprobe runs %s, not %q", loader.ProgKretprobe, p.cfg.Program)
	}
	p.cfg.Companion = loader.ProgKretprobeEntry
	p.cfg.Ifindex = uint32(p.ifindex)
	_ = p.netnsInode() // without it, every netns
	p.describe = "kretprobe " + p.plan.GetFunction()
	return nil
}

// attachKretprobe attaches the return first: an entry whose return is not
// attached yet would only fill kret_skbs.
func attachKretprobe(p *pending, l *loader.Hop) (detachers, error) {
	ret, err := link.Kretprobe(p.plan.GetFunction(), l.Program, nil)
	if err != nil {
		return nil, err
	}
	entry, err := link.Kprobe(p.plan.GetFunction(), l.Companion, nil)
	if err != nil {
		_ = ret.Close()
		return nil, err
	}
	return detachers{ret, entry}, nil
}

// KprobeUnsupported returns why kprobes cannot be used here, or "".
// cilium/ebpf creates kprobes through the perf "kprobe" PMU or, failing
// that, tracefs kprobe_events; a kernel without CONFIG_KPROBE_EVENTS has neither.
func KprobeUnsupported() string {
	if _, err := os.Stat("/sys/bus/event_source/devices/kprobe/type"); err == nil {
		return ""
	}
	for _, p := range []string{"/sys/kernel/tracing/kprobe_events", "/sys/kernel/debug/tracing/kprobe_events"} {
		if _, err := os.Stat(p); err == nil {
			return ""
		}
	}
	return "kprobe not supported: kernel has no kprobe_events"
}
