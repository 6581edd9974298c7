package attach

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// fentry and fexit hops are tracing programs on the plan's kernel function,
// kept to the hop's netns where it can be read (and its dev, when given).
var (
	fentry = hopKind{prepare: prepareKernelFunction, attach: attachTracing, loadRefusal: lockdownRefusal}
	fexit  = hopKind{prepare: prepareKernelFunction, attach: attachTracing, loadRefusal: lockdownRefusal}
)

func prepareKernelFunction(p *pending) error {
	p.cfg.AttachTo = p.plan.GetFunction()
	p.cfg.Ifindex = uint32(p.ifindex)
	_ = p.netnsInode() // without it, every netns
	p.describe = kindName(p.plan.GetKind()) + " " + p.plan.GetFunction()
	return nil
}

// lockdownRefusal words EPERM at load: lockdown refuses tracing programs that
// read kernel memory (security_locked_down(LOCKDOWN_BPF_READ_KERNEL) -> EPERM),
// before any verifier runs. A refusal with the verifier's log (EACCES, EPERM) is
// the verifier's, and says itself why.
func lockdownRefusal(p *pending, err error) error {
	var verr *ebpf.VerifierError
	if errors.As(err, &verr) && len(verr.Log) > 0 {
		return err
	}
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("%s not permitted: %s (%w)", kindName(p.plan.GetKind()), LockdownReason(), os.ErrPermission)
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
