package attach

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// AttachTCPTagging attaches tag_tcp (sock_ops) to the plan's cgroup (root by
// default), restricted to sockets of the sender namespace; with Hooks, as a slot of the cgroup's
// sock_ops hook.
func AttachTCPTagging(spec *ebpf.CollectionSpec, tt *pb.TcpTagging, env Env) (*Hop, error) {
	p := &pending{nsPath: netns.Path(tt.GetNetns(), env.Netns), nsName: netns.Display(tt.GetNetns(), env.Netns), cfg: env.Base}
	p.cfg.Name = "tcp-tagging"
	p.cfg.Program = tt.GetProgram()
	prepare := prepareTagger(tt.GetCgroup())
	var h *Hop
	var err error
	if env.Hooks != nil && p.cfg.Program == loader.ProgTagTCP {
		if err = prepare(p); err == nil {
			h, err = env.Hooks.joinTagger(p, env)
		}
	} else {
		h, err = load(spec, hopKind{prepare: prepare, attach: attachTagger}, p, env.Load)
	}
	if err != nil {
		return nil, fmt.Errorf("tcp tagging: %w", err)
	}
	return h, nil
}

// prepareTagger keeps the tagger to the sockets of its netns (by its cookie)
// in the cgroup at rel.
func prepareTagger(rel string) func(*pending) error {
	return func(p *pending) error {
		scope := "for netns " + p.nsName
		cookie, err := netns.Cookie(p.nsPath)
		if floor, _ := loader.NeedsFloor(); floor {
			// The floor variant cannot read a socket's netns (bpf_get_netns_cookie in sock_ops is 5.15,
			// SO_NETNS_COOKIE 5.14): the flow filter alone picks the sockets, in every netns of the cgroup.
			cookie, err = 0, nil
			scope = "in every netns (this kernel's sock_ops cannot tell them apart)"
		}
		if err != nil {
			return fmt.Errorf("netns %s cookie: %w", p.nsName, err)
		}
		if p.target, err = CgroupPath(rel); err != nil {
			return err
		}
		if p.cfg.Program == "" {
			return errors.New("plan names no sock_ops program")
		}
		p.cfg.TagNetnsCookie = cookie
		p.describe = fmt.Sprintf("sock_ops on cgroup %s %s", p.target, scope)
		return nil
	}
}

func attachTagger(p *pending, l *loader.Hop) (detachers, error) {
	return single(link.AttachCgroup(link.CgroupOptions{Path: p.target, Attach: ebpf.AttachCGroupSockOps, Program: l.Program}))
}
