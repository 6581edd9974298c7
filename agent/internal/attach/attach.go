// Package attach loads and attaches one hop of a TracePlan where its `at`
// says: tcx, XDP, tp_btf, cgroup_skb, fentry, kprobe, and the sock_ops TCP
// tagger. Every attachment is an fd-based link and nothing is pinned, so a
// killed agent leaves nothing attached.
package attach

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// Kind is the parsed `at` of a hop.
type Kind struct {
	Name string // tc-ingress, tc-egress, xdp, tracepoint, cgroup-ingress, cgroup-egress, fentry, kprobe
	// Group and Event for tracepoint:GROUP:EVENT; Function for fentry/kprobe.
	Group, Event, Function string
}

// ParseAt parses HopSpec.at.
func ParseAt(at string) (Kind, error) {
	switch at {
	case "tc-ingress", "tc-egress", "xdp", "cgroup-ingress", "cgroup-egress":
		return Kind{Name: at}, nil
	}
	kind, rest, ok := strings.Cut(at, ":")
	if ok && rest != "" {
		switch kind {
		case "tracepoint":
			g, e, ok := strings.Cut(rest, ":")
			if !ok || g == "" || e == "" {
				return Kind{}, fmt.Errorf("at %q: want tracepoint:GROUP:EVENT", at)
			}
			return Kind{Name: kind, Group: g, Event: e}, nil
		case "fentry", "kprobe":
			return Kind{Name: kind, Function: rest}, nil
		}
	}
	return Kind{}, fmt.Errorf("at %q: want tc-ingress, tc-egress, xdp, cgroup-ingress, cgroup-egress, tracepoint:GROUP:EVENT, fentry:FUNCTION or kprobe:FUNCTION", at)
}

// Env is what every hop of an agent shares.
type Env struct {
	// Netns is the agent's --netns: hops without a netns run there.
	Netns string
	// Base is copied into every hop's HopConfig (trace slot, salt, filter...).
	Base loader.HopConfig
	Load loader.Options
}

// Hop is one attached hop.
type Hop struct {
	Name     string
	Index    uint32
	Loaded   *loader.Hop
	Link     link.Link
	Describe string // e.g. "tcx egress on eth0 in netns c1"
}

// Close detaches first, then releases the program and maps.
func (h *Hop) Close() error {
	if h == nil {
		return nil
	}
	var err error
	if h.Link != nil {
		err = h.Link.Close()
		h.Link = nil
	}
	h.Loaded.Close()
	return err
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
	k, err := ParseAt(ha.GetAt())
	if err != nil {
		return nil, err
	}
	nsPath := netns.Path(ha.GetNetns(), env.Netns)
	nsName := netns.Display(ha.GetNetns(), env.Netns)
	cfg := env.Base
	cfg.Name = ha.GetName()
	cfg.HopIndex = uint16(ha.GetHopIndex())
	cfg.TagUDP = ha.GetTagUdp()
	if ha.GetHopIndex() > 0xffff {
		return nil, fmt.Errorf("hop_index %d out of range", ha.GetHopIndex())
	}

	var ifindex int
	needDev := k.Name == "tc-ingress" || k.Name == "tc-egress" || k.Name == "xdp"
	if needDev && ha.GetDev() == "" {
		return nil, fmt.Errorf("%s needs a dev", ha.GetAt())
	}
	if ha.GetDev() != "" && k.Name != "cgroup-ingress" && k.Name != "cgroup-egress" {
		if _, err := os.Stat(nsPath); err != nil {
			return nil, fmt.Errorf("netns %s: %w", nsName, err)
		}
		ifindex, err = netns.Ifindex(nsPath, ha.GetDev())
		if err != nil {
			return nil, fmt.Errorf("device %s not found in netns %s", ha.GetDev(), nsName)
		}
	}

	h := &Hop{Name: ha.GetName(), Index: ha.GetHopIndex()}
	load := func() error {
		l, err := loader.LoadHop(spec, cfg, env.Load)
		if err != nil {
			return unwrapHopPrefix(err, cfg.Name)
		}
		h.Loaded = l
		return nil
	}

	switch k.Name {
	case "tc-ingress", "tc-egress", "xdp":
		cfg.Program = loader.ProgTC
		if k.Name == "xdp" {
			cfg.Program = loader.ProgXDP
		}
		if err := load(); err != nil {
			return nil, err
		}
		h.Describe = fmt.Sprintf("%s on %s in netns %s", k.Name, ha.GetDev(), nsName)
		err = netns.Do(nsPath, func() error {
			var err error
			switch k.Name {
			case "tc-ingress":
				h.Link, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: h.Loaded.Program, Attach: ebpf.AttachTCXIngress})
			case "tc-egress":
				h.Link, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: h.Loaded.Program, Attach: ebpf.AttachTCXEgress})
			default:
				h.Link, err = link.AttachXDP(link.XDPOptions{Interface: ifindex, Program: h.Loaded.Program})
			}
			return err
		})
	case "tracepoint":
		cfg.Program = loader.ProgTPBTF
		if k.Event == "net_dev_xmit" {
			// The skb already belongs to the peer device there; match on the event's dev argument.
			cfg.Program = loader.ProgTPBTFXmit
		}
		cfg.AttachTo = k.Event
		cfg.Ifindex = uint32(ifindex)
		ino, err := netns.Inode(nsPath)
		if err != nil {
			return nil, err
		}
		cfg.NetnsIno = uint32(ino)
		if err := load(); err != nil {
			return nil, err
		}
		h.Describe = fmt.Sprintf("tp_btf %s:%s in netns %s", k.Group, k.Event, nsName)
		h.Link, err = link.AttachTracing(link.TracingOptions{Program: h.Loaded.Program})
	case "cgroup-ingress", "cgroup-egress":
		cfg.Program = loader.ProgCgroupSKB
		at := ebpf.AttachCGroupInetIngress
		if k.Name == "cgroup-egress" {
			at = ebpf.AttachCGroupInetEgress
		}
		cfg.AttachType = at
		path, err := CgroupPath(ha.GetCgroup())
		if err != nil {
			return nil, err
		}
		if err := load(); err != nil {
			return nil, err
		}
		h.Describe = fmt.Sprintf("%s on cgroup %s", k.Name, path)
		h.Link, err = link.AttachCgroup(link.CgroupOptions{Path: path, Attach: at, Program: h.Loaded.Program})
	case "fentry":
		cfg.Program = loader.ProgFentry
		cfg.AttachTo = k.Function
		cfg.Ifindex = uint32(ifindex)
		if ino, err := netns.Inode(nsPath); err == nil {
			cfg.NetnsIno = uint32(ino)
		}
		if err := load(); err != nil {
			if errors.Is(err, os.ErrPermission) {
				// Lockdown refuses tracing programs that read kernel memory
				// (security_locked_down(LOCKDOWN_BPF_READ_KERNEL) -> EPERM).
				return nil, fmt.Errorf("fentry not permitted: %s (%w)", LockdownReason(), os.ErrPermission)
			}
			return nil, err
		}
		h.Describe = "fentry " + k.Function
		h.Link, err = link.AttachTracing(link.TracingOptions{Program: h.Loaded.Program})
	case "kprobe":
		if reason := KprobeUnsupported(); reason != "" {
			return nil, errors.New(reason)
		}
		cfg.Program = loader.ProgKprobe
		cfg.Ifindex = uint32(ifindex)
		if ino, err := netns.Inode(nsPath); err == nil {
			cfg.NetnsIno = uint32(ino)
		}
		if err := load(); err != nil {
			return nil, err
		}
		h.Describe = "kprobe " + k.Function
		h.Link, err = link.Kprobe(k.Function, h.Loaded.Program, nil)
	}
	if err != nil {
		h.Loaded.Close()
		return nil, fmt.Errorf("attach %s: %w", h.Describe, err)
	}
	return h, nil
}

// unwrapHopPrefix avoids "hop x: hop x: ..." since LoadHop names the hop too.
func unwrapHopPrefix(err error, name string) error {
	if u := errors.Unwrap(err); u != nil && strings.HasPrefix(err.Error(), "hop "+name+": ") {
		return u
	}
	return err
}

// LockdownReason describes /sys/kernel/security/lockdown, e.g. "kernel lockdown (integrity)".
func LockdownReason() string {
	const path = "/sys/kernel/security/lockdown"
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		// securityfs is not always mounted at boot; mounting it again is harmless.
		_ = unix.Mount("securityfs", "/sys/kernel/security", "securityfs", 0, "")
	}
	b, err := os.ReadFile(path)
	if err == nil {
		// "none [integrity] confidentiality"
		s := string(b)
		if i := strings.Index(s, "["); i >= 0 {
			if j := strings.Index(s[i:], "]"); j > 0 {
				mode := s[i+1 : i+j]
				if mode != "none" {
					return "kernel lockdown (" + mode + ")"
				}
				return "permission denied (lockdown none)"
			}
		}
	}
	return "kernel lockdown"
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

// Cgroup2Mount finds the cgroup v2 mount point in /proc/self/mountinfo
// (/sys/fs/cgroup on pure v2 hosts, /sys/fs/cgroup/unified on hybrid ones).
func Cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(sc.Text())
		for i, fl := range fields {
			if fl == "-" && i+1 < len(fields) && i >= 5 {
				if fields[i+1] == "cgroup2" {
					return unescapeMount(fields[4]), nil
				}
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no cgroup2 mount in /proc/self/mountinfo")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// CgroupPath joins a plan's cgroup (relative to the cgroup2 mount) to the mount.
func CgroupPath(rel string) (string, error) {
	mnt, err := Cgroup2Mount()
	if err != nil {
		return "", err
	}
	p := filepath.Join(mnt, filepath.Clean("/"+rel))
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("cgroup %s: %w", p, err)
	}
	return p, nil
}

// AttachTCPTagging attaches tag_tcp (sock_ops) to the plan's cgroup (root by
// default), restricted to sockets of the sender namespace.
func AttachTCPTagging(spec *ebpf.CollectionSpec, tt *pb.TcpTagging, env Env) (*Hop, error) {
	h, err := attachTCPTagging(spec, tt, env)
	if err != nil {
		return nil, fmt.Errorf("tcp tagging: %w", err)
	}
	return h, nil
}

func attachTCPTagging(spec *ebpf.CollectionSpec, tt *pb.TcpTagging, env Env) (*Hop, error) {
	nsPath := netns.Path(tt.GetNetns(), env.Netns)
	cookie, err := netns.Cookie(nsPath)
	if err != nil {
		return nil, fmt.Errorf("netns %s cookie: %w", netns.Display(tt.GetNetns(), env.Netns), err)
	}
	path, err := CgroupPath(tt.GetCgroup())
	if err != nil {
		return nil, err
	}
	cfg := env.Base
	cfg.Name = "tcp-tagging"
	cfg.Program = loader.ProgTagTCP
	cfg.TagNetnsCookie = cookie
	l, err := loader.LoadHop(spec, cfg, env.Load)
	if err != nil {
		return nil, unwrapHopPrefix(err, cfg.Name)
	}
	h := &Hop{Name: cfg.Name, Index: uint32(cfg.HopIndex), Loaded: l,
		Describe: fmt.Sprintf("sock_ops on cgroup %s for netns %s", path, netns.Display(tt.GetNetns(), env.Netns))}
	h.Link, err = link.AttachCgroup(link.CgroupOptions{Path: path, Attach: ebpf.AttachCGroupSockOps, Program: l.Program})
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("attach %s: %w", h.Describe, err)
	}
	return h, nil
}
