// Package preset holds ready-made traces that answer one question each
// without a trace spec: `mace` (the latency a container adds to its packets,
// Misa et al.) and `iron` (network softirq CPU charged to the wrong
// container, Khalid et al., NSDI'18). Each has its own CO-RE object in
// kernel-patch/ (mace.bpf.o, iron.bpf.o) and prints JSON lines.
package preset

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/netns"
)

// ObjectDirEnv overrides where the preset objects are looked up.
const ObjectDirEnv = "HOPTRACE_BPF_DIR"

// FindObject returns the path of a preset's object (e.g. "mace.bpf.o"):
// override if set, else $HOPTRACE_BPF_DIR, the repository's kernel-patch/build
// next to the agent binary (agent/bin/..), ./kernel-patch/build, and
// /usr/lib/hoptrace/bpf.
func FindObject(name, override string) (string, error) {
	if override != "" {
		return override, nil
	}
	var dirs []string
	if d := os.Getenv(ObjectDirEnv); d != "" {
		dirs = append(dirs, d)
	}
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Join(filepath.Dir(exe), "..", "..", "kernel-patch", "build"))
	}
	dirs = append(dirs, filepath.Join("kernel-patch", "build"), filepath.Join("..", "kernel-patch", "build"), "/usr/lib/hoptrace/bpf")
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return filepath.Clean(p), nil
		}
	}
	return "", fmt.Errorf("%s not found in %s (build it: make bpf, or pass --object)", name, strings.Join(dirs, ", "))
}

// keepPrograms drops every program of spec not in keep.
func keepPrograms(spec *ebpf.CollectionSpec, keep []string) error {
	want := map[string]bool{}
	for _, k := range keep {
		if _, ok := spec.Programs[k]; !ok {
			return fmt.Errorf("object has no program %s", k)
		}
		want[k] = true
	}
	for name := range spec.Programs {
		if !want[name] {
			delete(spec.Programs, name)
		}
	}
	return nil
}

// setVariables writes const volatile globals before load.
func setVariables(spec *ebpf.CollectionSpec, vars map[string]any) error {
	for name, v := range vars {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("set %s: object has no such variable", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return nil
}

// attachAll attaches every program of coll by its section: tp_btf through
// BPF tracing links, classic tracepoints ("tracepoint/GROUP/EVENT") through
// perf links. On error, what was attached is closed.
func attachAll(spec *ebpf.CollectionSpec, coll *ebpf.Collection) ([]link.Link, error) {
	var links []link.Link
	names := make([]string, 0, len(coll.Programs))
	for n := range coll.Programs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		prog := coll.Programs[name]
		ps := spec.Programs[name]
		var l link.Link
		var err error
		switch {
		case strings.HasPrefix(ps.SectionName, "tp_btf/"):
			l, err = link.AttachTracing(link.TracingOptions{Program: prog})
		case strings.HasPrefix(ps.SectionName, "tracepoint/"):
			parts := strings.Split(ps.SectionName, "/")
			if len(parts) != 3 {
				err = fmt.Errorf("section %q: want tracepoint/GROUP/EVENT", ps.SectionName)
				break
			}
			mountTracefs()
			l, err = link.Tracepoint(parts[1], parts[2], prog, nil)
		default:
			err = fmt.Errorf("section %q: not an event this preset attaches", ps.SectionName)
		}
		if err != nil {
			closeLinks(links)
			return nil, fmt.Errorf("attach %s (%s): %w", name, ps.SectionName, err)
		}
		links = append(links, l)
	}
	return links, nil
}

func closeLinks(links []link.Link) {
	for _, l := range links {
		l.Close()
	}
}

// mountTracefs mounts tracefs where cilium/ebpf looks for tracepoint IDs;
// it is not always mounted at boot, and mounting it twice is harmless.
func mountTracefs() {
	if _, err := os.Stat("/sys/kernel/tracing/events"); err == nil {
		return
	}
	_ = unix.Mount("tracefs", "/sys/kernel/tracing", "tracefs", 0, "")
}

// NetnsPath resolves a container given as a /run/netns name, a path, or a PID.
func NetnsPath(container string) string {
	if _, err := strconv.Atoi(container); err == nil && container != "" {
		return filepath.Join("/proc", container, "ns", "net")
	}
	return netns.Path(container, "")
}

// readPercpuCounters sums a percpu array's entries over CPUs.
func readPercpuCounters(m *ebpf.Map, n int) ([]uint64, error) {
	out := make([]uint64, n)
	var per []uint64
	for i := 0; i < n; i++ {
		if err := m.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("read counter %d: %w", i, err)
		}
		for _, v := range per {
			out[i] += v
		}
	}
	return out, nil
}

// Stats summarises durations in ns.
type Stats struct {
	Count  int     `json:"count"`
	MeanNs float64 `json:"mean_ns"`
	P50Ns  float64 `json:"p50_ns"`
	P99Ns  float64 `json:"p99_ns"`
	MinNs  float64 `json:"min_ns"`
	MaxNs  float64 `json:"max_ns"`
}

// Summarize computes mean, p50, p99 (nearest rank), min and max.
func Summarize(values []float64) Stats {
	if len(values) == 0 {
		return Stats{}
	}
	v := append([]float64(nil), values...)
	sort.Float64s(v)
	var sum float64
	for _, x := range v {
		sum += x
	}
	return Stats{Count: len(v), MeanNs: sum / float64(len(v)), P50Ns: Percentile(v, 50), P99Ns: Percentile(v, 99), MinNs: v[0], MaxNs: v[len(v)-1]}
}

// Percentile is the nearest-rank percentile of sorted values.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	if rank > len(sorted) {
		rank = len(sorted)
	}
	return sorted[rank-1]
}

// lineWriter writes one JSON object per line; safe for concurrent use.
type lineWriter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func newLineWriter(w io.Writer) *lineWriter { return &lineWriter{w: bufio.NewWriter(w)} }

func (l *lineWriter) write(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.w.Write(b)
	l.w.WriteByte('\n')
	return l.w.Flush()
}

// errUsage marks a bad flag combination.
var errUsage = errors.New("usage")
