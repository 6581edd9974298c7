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

	"github.com/hoptrace/hoptrace/agent/internal/loader"
)

// cgroup_skb hops see the packets of the plan's cgroup's sockets, on their
// way in or out; they take no device.
var (
	cgroupIngress = hopKind{device: deviceIgnored, prepare: prepareCgroupSKB(ebpf.AttachCGroupInetIngress), attach: attachCgroup}
	cgroupEgress  = hopKind{device: deviceIgnored, prepare: prepareCgroupSKB(ebpf.AttachCGroupInetEgress), attach: attachCgroup}
)

func prepareCgroupSKB(at ebpf.AttachType) func(*pending) error {
	return func(p *pending) error {
		p.cfg.AttachType = at
		path, err := CgroupPath(p.plan.GetCgroup())
		if err != nil {
			return err
		}
		p.target = path
		p.describe = fmt.Sprintf("%s on cgroup %s", kindName(p.plan.GetKind()), path)
		return nil
	}
}

// attachCgroup attaches to the cgroup prepare found, as the attach type it
// gave the program (cgroup_skb ingress or egress, sock_ops).
func attachCgroup(p *pending, l *loader.Hop) (detachers, error) {
	return single(link.AttachCgroup(link.CgroupOptions{Path: p.target, Attach: p.cfg.AttachType, Program: l.Program}))
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
