// Package attach loads and attaches one hop of a TracePlan where its `at`
// says: tcx, XDP, tp_btf, cgroup_skb, fentry, fexit, kprobe, kretprobe,
// socket-read, uprobe and uretprobe, and the sock_ops TCP tagger. Every attachment is an fd-based link and nothing is pinned, so a
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
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

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
	Name   string
	Index  uint32
	Loaded *loader.Hop
	Link   link.Link
	filter *clsactFilter // a tc hop on a kernel without tcx, instead of Link
	// companion is the link of Loaded.Companion (UDP socket-read's enqueue side).
	companion link.Link
	Describe  string // e.g. "tcx egress on eth0 in netns c1"
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
	if h.filter != nil {
		err = errors.Join(err, h.filter.Close())
		h.filter = nil
	}
	if h.companion != nil {
		err = errors.Join(err, h.companion.Close())
		h.companion = nil
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
	kind := ha.GetKind()
	if ha.GetProgram() == "" {
		return nil, fmt.Errorf("plan names no program for the %s hop", kindName(kind))
	}
	nsPath := netns.Path(ha.GetNetns(), env.Netns)
	nsName := netns.Display(ha.GetNetns(), env.Netns)
	cfg := env.Base
	cfg.Name = ha.GetName()
	cfg.Program = ha.GetProgram()
	cfg.HopIndex = uint16(ha.GetHopIndex())
	cfg.TagUDP = ha.GetTagUdp()
	actions, aerr := loader.ActionsFromPlan(ha.GetActions())
	if aerr != nil {
		return nil, aerr
	}
	cfg.Actions = actions
	if ha.GetHopIndex() > 0xffff {
		return nil, fmt.Errorf("hop_index %d out of range", ha.GetHopIndex())
	}

	var ifindex int
	var err error
	isCgroup := kind == pb.AttachKind_ATTACH_KIND_CGROUP_INGRESS || kind == pb.AttachKind_ATTACH_KIND_CGROUP_EGRESS
	needDev := kind == pb.AttachKind_ATTACH_KIND_TC_INGRESS || kind == pb.AttachKind_ATTACH_KIND_TC_EGRESS ||
		kind == pb.AttachKind_ATTACH_KIND_XDP
	if needDev && ha.GetDev() == "" {
		return nil, fmt.Errorf("%s needs a dev", kindName(kind))
	}
	if ha.GetDev() != "" && !isCgroup {
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

	switch kind {
	case pb.AttachKind_ATTACH_KIND_TC_INGRESS, pb.AttachKind_ATTACH_KIND_TC_EGRESS, pb.AttachKind_ATTACH_KIND_XDP:
		if err := load(); err != nil {
			return nil, err
		}
		h.Describe = fmt.Sprintf("%s on %s in netns %s", kindName(kind), ha.GetDev(), nsName)
		if kind == pb.AttachKind_ATTACH_KIND_XDP {
			err = netns.Do(nsPath, func() error {
				var err error
				h.Link, err = link.AttachXDP(link.XDPOptions{Interface: ifindex, Program: h.Loaded.Program})
				return err
			})
		} else {
			h.Link, h.filter, err = attachTC(nsPath, ifindex, h.Loaded.Program, kind == pb.AttachKind_ATTACH_KIND_TC_INGRESS)
		}
	case pb.AttachKind_ATTACH_KIND_TRACEPOINT:
		cfg.AttachTo = ha.GetTracepointEvent()
		cfg.Ifindex = uint32(ifindex)
		// err is the switch's (checked after it): an attach error must not go to a shadow.
		var ino uint64
		if ino, err = netns.Inode(nsPath); err != nil {
			return nil, err
		}
		cfg.NetnsIno = uint32(ino)
		if err := load(); err != nil {
			return nil, err
		}
		h.Describe = fmt.Sprintf("tp_btf %s:%s in netns %s", ha.GetTracepointGroup(), ha.GetTracepointEvent(), nsName)
		h.Link, err = link.AttachTracing(link.TracingOptions{Program: h.Loaded.Program})
	case pb.AttachKind_ATTACH_KIND_SOCKET_READ:
		// Scoped by the reader's netns (hop_sock_read reads current's); the
		// program's own section names its event (consume_skb for UDP,
		// skb_copy_datagram_iovec for TCP).
		if ha.GetDev() != "" {
			return nil, fmt.Errorf("socket-read takes no dev (got %q): it is scoped by the reader's netns", ha.GetDev())
		}
		if err := socketReadProgram(&cfg); err != nil {
			return nil, err
		}
		var ino uint64
		if ino, err = netns.Inode(nsPath); err != nil {
			return nil, err
		}
		cfg.NetnsIno = uint32(ino)
		if err := load(); err != nil {
			return nil, err
		}
		h.Describe = fmt.Sprintf("socket-read (%s) in netns %s", cfg.Program, nsName)
		if h.Loaded.Companion != nil {
			// The enqueue side first: a read must find the IDs of what was queued.
			h.companion, err = link.AttachTracing(link.TracingOptions{Program: h.Loaded.Companion})
			if err != nil {
				h.Loaded.Close()
				return nil, fmt.Errorf("attach %s (%s): %w", h.Describe, cfg.Companion, err)
			}
		}
		h.Link, err = link.AttachTracing(link.TracingOptions{Program: h.Loaded.Program})
		if err != nil && h.companion != nil {
			_ = h.companion.Close()
		}
	case pb.AttachKind_ATTACH_KIND_UPROBE, pb.AttachKind_ATTACH_KIND_URETPROBE:
		// err is the switch's: it is checked after it, so never shadow it here.
		var ex *link.Executable
		var path string
		if ex, path, err = openExecutable(ha.GetBinary(), ha.GetNetns()); err != nil {
			return nil, err
		}
		if err := load(); err != nil {
			return nil, err
		}
		h.Describe = fmt.Sprintf("%s %s:%s", kindName(kind), path, ha.GetFunction())
		if kind == pb.AttachKind_ATTACH_KIND_UPROBE {
			h.Link, err = ex.Uprobe(ha.GetFunction(), h.Loaded.Program, nil)
		} else {
			h.Link, err = ex.Uretprobe(ha.GetFunction(), h.Loaded.Program, nil)
		}
		if errors.Is(err, link.ErrNoSymbol) {
			err = fmt.Errorf("symbol %s is not in %s (%w)", ha.GetFunction(), path, err)
		}
	case pb.AttachKind_ATTACH_KIND_CGROUP_INGRESS, pb.AttachKind_ATTACH_KIND_CGROUP_EGRESS:
		at := ebpf.AttachCGroupInetIngress
		if kind == pb.AttachKind_ATTACH_KIND_CGROUP_EGRESS {
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
		h.Describe = fmt.Sprintf("%s on cgroup %s", kindName(kind), path)
		h.Link, err = link.AttachCgroup(link.CgroupOptions{Path: path, Attach: at, Program: h.Loaded.Program})
	case pb.AttachKind_ATTACH_KIND_FENTRY, pb.AttachKind_ATTACH_KIND_FEXIT:
		cfg.AttachTo = ha.GetFunction()
		cfg.Ifindex = uint32(ifindex)
		if ino, err := netns.Inode(nsPath); err == nil {
			cfg.NetnsIno = uint32(ino)
		}
		if err := load(); err != nil {
			if errors.Is(err, os.ErrPermission) {
				// Lockdown refuses tracing programs that read kernel memory
				// (security_locked_down(LOCKDOWN_BPF_READ_KERNEL) -> EPERM).
				return nil, fmt.Errorf("%s not permitted: %s (%w)", kindName(kind), LockdownReason(), os.ErrPermission)
			}
			return nil, err
		}
		h.Describe = kindName(kind) + " " + ha.GetFunction()
		h.Link, err = link.AttachTracing(link.TracingOptions{Program: h.Loaded.Program})
	case pb.AttachKind_ATTACH_KIND_KPROBE:
		if reason := KprobeUnsupported(); reason != "" {
			return nil, errors.New(reason)
		}
		cfg.Ifindex = uint32(ifindex)
		if ino, err := netns.Inode(nsPath); err == nil {
			cfg.NetnsIno = uint32(ino)
		}
		if err := load(); err != nil {
			return nil, err
		}
		h.Describe = "kprobe " + ha.GetFunction()
		h.Link, err = link.Kprobe(ha.GetFunction(), h.Loaded.Program, nil)
	case pb.AttachKind_ATTACH_KIND_KRETPROBE:
		// hop_kretprobe records at the return the skb its entry kprobe kept
		// (hop.bpf.h): the pair is one collection, sharing kret_skbs.
		if reason := KprobeUnsupported(); reason != "" {
			return nil, errors.New(strings.Replace(reason, "kprobe", "kretprobe", 1))
		}
		if cfg.Program != loader.ProgKretprobe {
			return nil, fmt.Errorf("kretprobe runs %s, not %q", loader.ProgKretprobe, cfg.Program)
		}
		cfg.Companion = loader.ProgKretprobeEntry
		cfg.Ifindex = uint32(ifindex)
		if ino, err := netns.Inode(nsPath); err == nil {
			cfg.NetnsIno = uint32(ino)
		}
		if err := load(); err != nil {
			return nil, err
		}
		h.Describe = "kretprobe " + ha.GetFunction()
		// The return first: an entry whose return is not attached yet would only fill kret_skbs.
		h.Link, err = link.Kretprobe(ha.GetFunction(), h.Loaded.Program, nil)
		if err == nil {
			h.companion, err = link.Kprobe(ha.GetFunction(), h.Loaded.Companion, nil)
			if err != nil {
				_ = h.Link.Close()
				h.Link = nil
			}
		}
	default:
		return nil, fmt.Errorf("unknown attach kind %d", int32(kind))
	}
	if err != nil {
		h.Loaded.Close()
		return nil, fmt.Errorf("attach %s: %w", h.Describe, err)
	}
	return h, nil
}

// socketReadProgram checks a socket-read hop's program and, for UDP, picks
// how this kernel lets it see the read: where the receive path frees the
// datagram after the read on another CPU (skb_attempt_defer_free, 6.18) no
// event has the skb at the read, so kernels with sock:sk_data_ready and
// sock:sock_recv_length pair the two (hop_sock_read_udp_queue); older ones
// (5.10 up) see the free in recvmsg itself (skb:consume_skb, hop_sock_read_udp).
func socketReadProgram(cfg *loader.HopConfig) error {
	switch cfg.Program {
	case loader.ProgSockReadTCP:
		return nil
	case loader.ProgSockReadUDP:
		if loader.HasTracepoint("sk_data_ready") && loader.HasTracepoint("sock_recv_length") {
			cfg.Program = loader.ProgSockReadUDPQueue
			cfg.Companion = loader.ProgSockReadUDPEnqueue
			return nil
		}
		// skb:consume_skb has the datagram and not its socket (a queued UDP skb has no skb->sk).
		for _, f := range []record.ActionField{record.FieldRmem, record.FieldBacklog} {
			if cfg.Actions.Reads(f) {
				return fmt.Errorf("field %s at a UDP socket-read hop needs the socket at the read: "+
					"sock:sk_data_ready and sock:sock_recv_length (Linux 6.6+); this kernel has not both",
					record.FieldKeys[f])
			}
		}
		return nil
	}
	return fmt.Errorf("socket-read runs %s or %s, not %q", loader.ProgSockReadUDP, loader.ProgSockReadTCP, cfg.Program)
}

// openExecutable opens a uprobe hop's binary in the target process's mount
// namespace: under /proc/PID/root when the hop's netns is /proc/PID/ns/net
// (a container's process), else as the agent sees it.
func openExecutable(binary, hopNetns string) (*link.Executable, string, error) {
	if !filepath.IsAbs(binary) {
		return nil, "", fmt.Errorf("uprobe binary %q: not an absolute path", binary)
	}
	path := binary
	if rest, ok := strings.CutPrefix(hopNetns, "/proc/"); ok {
		if pid, ok := strings.CutSuffix(rest, "/ns/net"); ok && pid != "" && !strings.Contains(pid, "/") {
			path = filepath.Join("/proc", pid, "root", binary)
		}
	}
	if _, err := os.Stat(path); err != nil {
		return nil, path, fmt.Errorf("uprobe binary %s: %w", path, err)
	}
	ex, err := link.OpenExecutable(path)
	if err != nil {
		return nil, path, fmt.Errorf("uprobe binary %s: %w", path, err)
	}
	return ex, path, nil
}

// kindName is the spec's spelling of an attach kind (ATTACH_KIND_TC_EGRESS: tc-egress), for messages.
func kindName(k pb.AttachKind) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(k.String(), "ATTACH_KIND_")), "_", "-")
}

// unwrapHopPrefix avoids "hop x: hop x: ..." since LoadHop names the hop too.
func unwrapHopPrefix(err error, name string) error {
	if u := errors.Unwrap(err); u != nil && strings.HasPrefix(err.Error(), "hop "+name+": ") {
		return u
	}
	return err
}

// KernelFunctionRefusal is why this kernel refuses a kernel-function attach
// of `kind` before trying it (kprobe and kretprobe: no kprobe_events;
// fentry and fexit: a kernel lockdown), worded as the refusal says it; ""
// when nothing known stands in the way.
func KernelFunctionRefusal(kind pb.AttachKind) string {
	switch kind {
	case pb.AttachKind_ATTACH_KIND_KPROBE, pb.AttachKind_ATTACH_KIND_KRETPROBE:
		return strings.Replace(KprobeUnsupported(), "kprobe", kindName(kind), 1)
	case pb.AttachKind_ATTACH_KIND_FENTRY, pb.AttachKind_ATTACH_KIND_FEXIT:
		if lockdown := LockdownReason(); strings.HasPrefix(lockdown, "kernel lockdown (") {
			return kindName(kind) + " not permitted: " + lockdown
		}
	}
	return ""
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
	scope := "for netns " + netns.Display(tt.GetNetns(), env.Netns)
	cookie, err := netns.Cookie(nsPath)
	if floor, _ := loader.NeedsFloor(); floor {
		// The floor variant cannot read a socket's netns (bpf_get_netns_cookie in sock_ops is 5.15,
		// SO_NETNS_COOKIE 5.14): the flow filter alone picks the sockets, in every netns of the cgroup.
		cookie, err = 0, nil
		scope = "in every netns (this kernel's sock_ops cannot tell them apart)"
	}
	if err != nil {
		return nil, fmt.Errorf("netns %s cookie: %w", netns.Display(tt.GetNetns(), env.Netns), err)
	}
	path, err := CgroupPath(tt.GetCgroup())
	if err != nil {
		return nil, err
	}
	cfg := env.Base
	cfg.Name = "tcp-tagging"
	cfg.Program = tt.GetProgram()
	if cfg.Program == "" {
		return nil, errors.New("plan names no sock_ops program")
	}
	cfg.TagNetnsCookie = cookie
	l, err := loader.LoadHop(spec, cfg, env.Load)
	if err != nil {
		return nil, unwrapHopPrefix(err, cfg.Name)
	}
	h := &Hop{Name: cfg.Name, Index: uint32(cfg.HopIndex), Loaded: l,
		Describe: fmt.Sprintf("sock_ops on cgroup %s %s", path, scope)}
	h.Link, err = link.AttachCgroup(link.CgroupOptions{Path: path, Attach: ebpf.AttachCGroupSockOps, Program: l.Program})
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("attach %s: %w", h.Describe, err)
	}
	return h, nil
}
