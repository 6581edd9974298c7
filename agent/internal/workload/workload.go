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

// Runtime is what the inventory asks of a container runtime (Docker).
type Runtime interface {
	Version(ctx context.Context) (string, error)
	Running(ctx context.Context) ([]Container, error)
}

// askTimeout bounds one inventory's questions to the runtime (heartbeats
// come every 2 s).
const askTimeout = 1500 * time.Millisecond

// Found is one running container placed in its network namespace.
type Found struct {
	Workload *pb.Workload // Netns is left for the caller (it names namespaces)
	// NetnsPath is /proc/PID/ns/net and NetnsInode its nsfs inode.
	NetnsPath  string
	NetnsInode uint64
}

// Inventory asks a runtime for its containers; it logs a runtime error once
// per distinct message (a heartbeat asks every 2 s: no error spam).
type Inventory struct {
	Runtime  Runtime
	Endpoint string
	// ProcRoot is /proc (tests point it elsewhere).
	ProcRoot string
	Log      *slog.Logger

	mu        sync.Mutex
	lastError string
	version   string // asked again after an error only
}

// NewInventory asks the Docker engine at socket ("" = none: no workloads).
func NewInventory(socket string, log *slog.Logger) *Inventory {
	inv := &Inventory{ProcRoot: "/proc", Log: log}
	if socket != "" {
		d := NewDocker(socket)
		inv.Runtime, inv.Endpoint = d, d.Socket
	}
	return inv
}

// Collect lists the running containers with their namespaces, and the
// runtime's state for the agent's registration.
func (inv *Inventory) Collect(ctx context.Context) ([]Found, *pb.ContainerRuntime) {
	state := &pb.ContainerRuntime{}
	if inv == nil || inv.Runtime == nil {
		return nil, state
	}
	// A stuck engine must not hold up the heartbeat that asks.
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	inv.mu.Lock()
	version := inv.version
	inv.mu.Unlock()
	var err error
	if version == "" {
		version, err = inv.Runtime.Version(ctx)
	}
	var containers []Container
	if err == nil {
		containers, err = inv.Runtime.Running(ctx)
	}
	if errors.Is(err, ErrNoRuntime) {
		return nil, state // nothing on this node: nothing to say
	}
	state.Endpoint = inv.Endpoint
	if err != nil {
		state.Error = err.Error()
		inv.logOnce(state.Error, "")
		return nil, state
	}
	inv.logOnce("", version)
	state.Version = version
	byUID := podsByUID(containers)
	out := make([]Found, 0, len(containers))
	for _, c := range containers {
		path := fmt.Sprintf("%s/%d/ns/net", inv.procRoot(), c.Pid)
		ino, err := netns.Inode(path)
		if err != nil {
			continue // exited since the engine answered, or another PID namespace
		}
		cgroup, podCgroup := cgroupPaths(fmt.Sprintf("%s/%d/cgroup", inv.procRoot(), c.Pid))
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
			NetnsPath:  fmt.Sprintf("/proc/%d/ns/net", c.Pid),
			NetnsInode: ino,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Workload.ContainerName < out[j].Workload.ContainerName })
	return out, state
}

func (inv *Inventory) procRoot() string {
	if inv.ProcRoot == "" {
		return "/proc"
	}
	return inv.ProcRoot
}

// logOnce logs an error once per distinct message ("" = the engine answers
// again). The engine's version is kept while it answers and asked again
// after an error (an upgrade restarts the engine: an error in between).
func (inv *Inventory) logOnce(msg, version string) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.version = version
	if msg == inv.lastError {
		return
	}
	if msg != "" && inv.Log != nil {
		inv.Log.Warn("container runtime: no container names until this is fixed", "err", msg)
	} else if inv.Log != nil {
		inv.Log.Info("container runtime answers again", "endpoint", inv.Endpoint)
	}
	inv.lastError = msg
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
