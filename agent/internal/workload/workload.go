package workload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// Runtime is what the inventory asks of a container runtime (the Docker
// Engine, or a CRI runtime: containerd, CRI-O).
type Runtime interface {
	// Endpoint is where the runtime is asked (its socket).
	Endpoint() string
	Version(ctx context.Context) (string, error)
	Running(ctx context.Context) ([]Container, error)
}

// askTimeout bounds one inventory's questions to the runtimes (heartbeats
// come every 2 s); the runtimes are asked at the same time.
const askTimeout = 1500 * time.Millisecond

// Found is one running container placed in its network namespace.
type Found struct {
	Workload *pb.Workload // Netns is left for the caller (it names namespaces)
	// NetnsPath is the runtime's path of the namespace (a CRI pod's
	// /var/run/netns/cni-UUID) or /proc/PID/ns/net, and NetnsInode its nsfs
	// inode.
	NetnsPath  string
	NetnsInode uint64
}

// Inventory asks every configured runtime for its containers and merges
// their answers; it logs each runtime's error once per distinct message (a
// heartbeat asks every 2 s: no error spam).
type Inventory struct {
	Runtimes []Runtime
	// ProcRoot is /proc (tests point it elsewhere).
	ProcRoot string
	Log      *slog.Logger

	mu    sync.Mutex
	asked map[string]*runtimeState // by endpoint
}

// runtimeState is what the inventory remembers of one runtime between
// heartbeats.
type runtimeState struct {
	lastError string
	version   string // asked again after an error only
}

// NewInventory asks the Docker engine at dockerSocket and the CRI runtime at
// criSocket ("" = not that one; both "" = no workloads).
func NewInventory(dockerSocket, criSocket string, log *slog.Logger) *Inventory {
	inv := &Inventory{ProcRoot: "/proc", Log: log}
	if dockerSocket != "" {
		inv.Runtimes = append(inv.Runtimes, NewDocker(dockerSocket))
	}
	if criSocket != "" {
		inv.Runtimes = append(inv.Runtimes, NewCRI(criSocket))
	}
	return inv
}

// answer is one runtime's reply to one inventory.
type answer struct {
	runtime    Runtime
	version    string
	containers []Container
	err        error
}

// Collect lists the running containers with their namespaces, and the
// runtimes' state for the agent's registration: the first runtime that
// answered (in the order of Runtimes), else the first one's error. A
// container two runtimes report (Docker and cri-dockerd's CRI on one node)
// is listed once: same namespace, same id.
func (inv *Inventory) Collect(ctx context.Context) ([]Found, *pb.ContainerRuntime) {
	state := &pb.ContainerRuntime{}
	if inv == nil || len(inv.Runtimes) == 0 {
		return nil, state
	}
	// A stuck runtime must not hold up the heartbeat that asks.
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	answers := make([]answer, len(inv.Runtimes))
	var wg sync.WaitGroup
	for i, rt := range inv.Runtimes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = inv.ask(ctx, rt)
		}()
	}
	wg.Wait()

	var all []Container
	for _, a := range answers {
		switch {
		case errors.Is(a.err, ErrNoRuntime):
			// nothing on this node: nothing to say
		case a.err != nil:
			if state.Endpoint == "" {
				state.Endpoint, state.Error = a.runtime.Endpoint(), a.err.Error()
			}
		default:
			if state.Version == "" {
				state.Endpoint, state.Version, state.Error = a.runtime.Endpoint(), a.version, ""
			}
			all = append(all, a.containers...)
		}
	}
	byUID := podsByUID(all)
	type key struct {
		inode uint64
		id    string
	}
	seen := map[key]bool{}
	out := make([]Found, 0, len(all))
	for _, c := range all {
		path, ino, ok := inv.place(c)
		if !ok {
			continue // exited since the runtime answered, or another PID namespace
		}
		if seen[key{ino, c.ID}] {
			continue
		}
		seen[key{ino, c.ID}] = true
		cgroup, podCgroup := "", ""
		if c.Pid > 0 {
			cgroup, podCgroup = cgroupPaths(fmt.Sprintf("%s/%d/cgroup", inv.procRoot(), c.Pid))
		}
		pod := podOf(c, podCgroup, byUID)
		out = append(out, Found{
			Workload: &pb.Workload{
				ContainerId:   c.ID,
				ContainerName: c.Name,
				Image:         c.Image,
				PodNamespace:  pod.Namespace,
				PodName:       pod.Name,
				Cgroup:        cgroup,
			},
			NetnsPath:  path,
			NetnsInode: ino,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Workload.ContainerName < out[j].Workload.ContainerName })
	return out, state
}

// place finds a container's network namespace: the runtime's path for it,
// else (a path this agent's mount namespace does not have) its process's.
func (inv *Inventory) place(c Container) (path string, inode uint64, ok bool) {
	if c.NetnsPath != "" {
		if ino, err := netns.Inode(c.NetnsPath); err == nil {
			return c.NetnsPath, ino, true
		}
	}
	if c.Pid <= 0 {
		return "", 0, false
	}
	ino, err := netns.Inode(fmt.Sprintf("%s/%d/ns/net", inv.procRoot(), c.Pid))
	if err != nil {
		return "", 0, false
	}
	return fmt.Sprintf("/proc/%d/ns/net", c.Pid), ino, true
}

// ask asks one runtime for its version (once while it answers) and its
// running containers, and logs a change of its state.
func (inv *Inventory) ask(ctx context.Context, rt Runtime) answer {
	inv.mu.Lock()
	st := inv.asked[rt.Endpoint()]
	if st == nil {
		st = &runtimeState{}
		if inv.asked == nil {
			inv.asked = map[string]*runtimeState{}
		}
		inv.asked[rt.Endpoint()] = st
	}
	version := st.version
	inv.mu.Unlock()
	a := answer{runtime: rt}
	if version == "" {
		version, a.err = rt.Version(ctx)
	}
	if a.err == nil {
		a.containers, a.err = rt.Running(ctx)
	}
	switch {
	case errors.Is(a.err, ErrNoRuntime):
		// no socket: nothing to log
	case a.err != nil:
		inv.logOnce(rt, st, a.err.Error(), "")
	default:
		a.version = version
		inv.logOnce(rt, st, "", version)
	}
	return a
}

// Close ends the runtimes' connections (the CRI client's gRPC connection).
func (inv *Inventory) Close() {
	if inv == nil {
		return
	}
	for _, rt := range inv.Runtimes {
		if c, ok := rt.(interface{ Close() error }); ok {
			_ = c.Close()
		}
	}
}

func (inv *Inventory) procRoot() string {
	if inv.ProcRoot == "" {
		return "/proc"
	}
	return inv.ProcRoot
}

// logOnce logs a runtime's error once per distinct message ("" = it answers
// again). Its version is kept while it answers and asked again after an
// error (an upgrade restarts the runtime: an error in between).
func (inv *Inventory) logOnce(rt Runtime, st *runtimeState, msg, version string) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	st.version = version
	if msg == st.lastError {
		return
	}
	if msg != "" && inv.Log != nil {
		inv.Log.Warn("container runtime: no container names from it until this is fixed", "endpoint", rt.Endpoint(), "err", msg)
	} else if inv.Log != nil {
		inv.Log.Info("container runtime answers again", "endpoint", rt.Endpoint())
	}
	st.lastError = msg
}

// cgroupPaths reads a /proc/PID/cgroup file: the cgroup v2 ("0::") path
// ("" on a pure v1 host or when the process is gone), and the path to look
// for a kubepods pod in (the v2 one, else the first v1 hierarchy's that
// names kubepods).
func cgroupPaths(file string) (v2, pod string) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			v2 = p
		} else if _, p, ok := strings.Cut(line, ":"); ok && pod == "" && strings.Contains(p, "kubepods") {
			_, pod, _ = strings.Cut(p, ":")
		}
	}
	if PodUIDFromCgroup(v2) != "" || pod == "" {
		pod = v2
	}
	return v2, pod
}
