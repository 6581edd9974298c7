package attach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf/link"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
)

// uprobe and uretprobe hops run at a function's entry or return in the plan's
// binary, as the hop's process sees it.
var (
	uprobe    = hopKind{prepare: prepareUprobe, attach: attachUprobeAt(false)}
	uretprobe = hopKind{prepare: prepareUprobe, attach: attachUprobeAt(true)}
)

func prepareUprobe(p *pending) error {
	ex, path, err := openExecutable(p.plan.GetBinary(), p.plan.GetNetns())
	if err != nil {
		return err
	}
	p.exe, p.target = ex, path
	p.describe = fmt.Sprintf("%s %s:%s", kindName(p.plan.GetKind()), path, p.plan.GetFunction())
	return nil
}

func attachUprobeAt(ret bool) func(*pending, *loader.Hop) (detachers, error) {
	return func(p *pending, l *loader.Hop) (detachers, error) {
		attach := p.exe.Uprobe
		if ret {
			attach = p.exe.Uretprobe
		}
		ul, err := attach(p.plan.GetFunction(), l.Program, nil)
		if errors.Is(err, link.ErrNoSymbol) {
			err = fmt.Errorf("symbol %s is not in %s (%w)", p.plan.GetFunction(), p.target, err)
		}
		return single(ul, err)
	}
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
