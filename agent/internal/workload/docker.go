// Package workload names the network namespaces of a node by the workloads
// users know: containers (name, id, image) and the Kubernetes pods they
// belong to, from the Docker Engine API (the kubelet's container labels, or
// the kubepods cgroup path of the container's process) and from the
// Kubernetes CRI API of containerd or CRI-O (cri.go).
//
// The Docker Engine API is asked over its unix socket with net/http: the
// agent needs two read-only endpoints (list, inspect), and the Engine's own
// client module (github.com/docker/docker/client) would pull dozens of
// modules into a static agent binary for them.
package workload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultSocket is where dockerd listens unless told otherwise.
const DefaultSocket = "/var/run/docker.sock"

// Engine API version asked for: 1.41 is Docker 20.10, the oldest engine in
// Debian 11 (bullseye); newer engines serve older API versions.
const apiVersion = "v1.41"

// Container is what the agent needs of one running container.
type Container struct {
	ID     string
	Name   string
	Image  string
	Labels map[string]string
	// Pid of the container's first process in the agent's PID namespace (0
	// when not running): its /proc/PID/ns/net is the container's netns
	// unless NetnsPath names it.
	Pid int
	// NetnsPath is the network namespace the runtime made for the container
	// (a CRI pod's /var/run/netns/cni-UUID; "" = /proc/PID/ns/net).
	NetnsPath string
}

// Docker asks one Docker Engine over its unix socket.
type Docker struct {
	Socket string
	client *http.Client

	// Inspected containers by id, while their first process lives: a
	// heartbeat then costs one list call, not one inspect per container.
	mu        sync.Mutex
	inspected map[string]inspectedContainer
}

type inspectedContainer struct {
	Container
	started string // the PID's start time (/proc/PID/stat): a restart gives a new process
}

// NewDocker is a client of the engine at socket (a path, or unix://PATH).
func NewDocker(socket string) *Docker {
	socket = strings.TrimPrefix(socket, "unix://")
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	return &Docker{
		Socket: socket,
		client: &http.Client{
			Timeout: 5 * time.Second,
			Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return dialer.DialContext(ctx, "unix", socket)
				},
				MaxIdleConns: 2,
			},
		},
	}
}

// ErrNoRuntime: no engine socket on this node (not an error to report).
var ErrNoRuntime = errors.New("no container runtime socket")

func (d *Docker) get(ctx context.Context, path string, out any) error {
	// The host part is ignored: the transport always dials the socket.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/"+apiVersion+path, nil)
	if err != nil {
		return err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return classify(err, d.Socket)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return &statusError{Code: resp.StatusCode, Text: fmt.Sprintf("docker engine at %s: GET %s: %s: %s",
			d.Socket, path, resp.Status, strings.TrimSpace(string(body)))}
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("docker engine at %s: GET %s: decode: %w", d.Socket, path, err)
	}
	return nil
}

// Endpoint is the socket asked.
func (d *Docker) Endpoint() string { return d.Socket }

// Version is the engine's version string.
func (d *Docker) Version(ctx context.Context) (string, error) {
	var v struct{ Version string }
	if err := d.get(ctx, "/version", &v); err != nil {
		return "", err
	}
	return v.Version, nil
}

// Running lists the running containers with their first process's PID.
func (d *Docker) Running(ctx context.Context) ([]Container, error) {
	var list []struct{ Id string }
	if err := d.get(ctx, "/containers/json", &list); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	seen := make(map[string]inspectedContainer, len(list))
	out := make([]Container, 0, len(list))
	for _, c := range list {
		if cached, ok := d.inspected[c.Id]; ok && pidStartTime(cached.Pid) == cached.started {
			seen[c.Id] = cached
			out = append(out, cached.Container)
			continue
		}
		var inspect struct {
			Id     string
			Name   string
			Config struct {
				Image  string
				Labels map[string]string
			}
			State struct{ Pid int }
		}
		if err := d.get(ctx, "/containers/"+url.PathEscape(c.Id)+"/json", &inspect); err != nil {
			var status *statusError
			if errors.As(err, &status) && status.Code == http.StatusNotFound {
				continue // removed between list and inspect
			}
			return nil, err
		}
		if inspect.State.Pid <= 0 {
			continue
		}
		found := Container{
			ID:     inspect.Id,
			Name:   strings.TrimPrefix(inspect.Name, "/"),
			Image:  inspect.Config.Image,
			Labels: inspect.Config.Labels,
			Pid:    inspect.State.Pid,
		}
		if started := pidStartTime(found.Pid); started != "" {
			seen[c.Id] = inspectedContainer{found, started}
		}
		out = append(out, found)
	}
	d.inspected = seen // containers gone from the list are forgotten
	return out, nil
}

// pidStartTime is field 22 of /proc/PID/stat ("" when the process is gone):
// with the PID it names one process, a reused PID has another.
func pidStartTime(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The command (field 2) is in parentheses and may hold spaces.
	_, rest, ok := strings.Cut(string(b), ") ")
	if !ok {
		return ""
	}
	fields := strings.Fields(rest)
	if len(fields) < 20 {
		return ""
	}
	return fields[19]
}

// statusError is an answer of the engine other than 200 OK.
type statusError struct {
	Code int
	Text string
}

func (e *statusError) Error() string { return e.Text }

// classify turns a failed request into ErrNoRuntime (no socket: the node
// runs no engine) or an error that says what to do.
func classify(err error, socket string) error {
	switch {
	case errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOENT):
		return ErrNoRuntime
	case errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EACCES):
		return fmt.Errorf("permission denied on %s: run the agent as root or in the docker group: %w", socket, err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("nothing answers on %s (is dockerd running?): %w", socket, err)
	}
	return fmt.Errorf("docker engine at %s: %w", socket, err)
}
