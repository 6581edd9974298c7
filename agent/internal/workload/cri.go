package workload

// The Kubernetes CRI (Container Runtime Interface) source: containerd's and
// CRI-O's RuntimeService over their unix socket, the API the kubelet itself
// uses, so a node without Docker names its pods too.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRISockets are where the CRI runtimes listen unless told otherwise, in the
// order the agent looks for one (the first that exists).
var CRISockets = []string{
	"/run/containerd/containerd.sock", // containerd (its cri plugin)
	"/var/run/crio/crio.sock",         // CRI-O
}

// DefaultCRISocket is the first of CRISockets that exists ("" = none).
func DefaultCRISocket() string {
	for _, s := range CRISockets {
		if st, err := os.Stat(s); err == nil && st.Mode()&os.ModeSocket != 0 {
			return s
		}
	}
	return ""
}

// CRI asks one CRI runtime (containerd, CRI-O) for its pod sandboxes and
// containers.
type CRI struct {
	Socket string

	mu   sync.Mutex
	conn *grpc.ClientConn
	// Sandboxes and containers already asked for their status, by id: a
	// sandbox's network namespace and a container's process never change
	// for the same id (a restarted container gets a new id), so a heartbeat
	// costs two list calls.
	sandboxes  map[string]sandboxStatus
	containers map[string]int
}

// sandboxStatus is what the agent keeps of one ready pod sandbox.
type sandboxStatus struct {
	pod   Pod
	uid   string
	image string
	// netns is the sandbox's network namespace path from its OCI runtime
	// spec ("" for a hostNetwork pod, or a runtime that does not say);
	// pid its first process (the pause process), the fallback.
	netns string
	pid   int
}

// NewCRI is a client of the CRI runtime at socket (a path, or unix://PATH).
func NewCRI(socket string) *CRI {
	return &CRI{Socket: strings.TrimPrefix(socket, "unix://")}
}

// Endpoint is the socket asked.
func (c *CRI) Endpoint() string { return c.Socket }

// Close ends the connection to the runtime.
func (c *CRI) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

func (c *CRI) client() (cri.RuntimeServiceClient, error) {
	// No socket: the node runs no CRI runtime (gRPC would only say
	// "Unavailable" after a dial).
	if _, err := os.Stat(c.Socket); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ErrNoRuntime
		}
		return nil, fmt.Errorf("CRI runtime at %s: %w", c.Socket, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		conn, err := grpc.NewClient("unix://"+c.Socket,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			// A restarted runtime answers at the next heartbeat, not after
			// gRPC's default backoff of up to two minutes.
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
				BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second,
			}, MinConnectTimeout: time.Second}),
			// The kubelet's limit: a node's full container list fits.
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
		if err != nil {
			return nil, fmt.Errorf("CRI runtime at %s: %w", c.Socket, err)
		}
		c.conn = conn
	}
	return cri.NewRuntimeServiceClient(c.conn), nil
}

// Version is the runtime's name and version, e.g. "containerd 1.6.20~ds1".
func (c *CRI) Version(ctx context.Context) (string, error) {
	rs, err := c.client()
	if err != nil {
		return "", err
	}
	v, err := rs.Version(ctx, &cri.VersionRequest{})
	if err != nil {
		return "", c.classify(err)
	}
	return strings.TrimSpace(v.GetRuntimeName() + " " + v.GetRuntimeVersion()), nil
}

// Running lists every ready pod sandbox and every running container, each
// with its pod's labels and the network namespace to find it in.
func (c *CRI) Running(ctx context.Context) ([]Container, error) {
	rs, err := c.client()
	if err != nil {
		return nil, err
	}
	pods, err := rs.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{
		State: &cri.PodSandboxStateValue{State: cri.PodSandboxState_SANDBOX_READY}}})
	if err != nil {
		return nil, c.classify(err)
	}
	ctrs, err := rs.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{
		State: &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_RUNNING}}})
	if err != nil {
		return nil, c.classify(err)
	}
	c.mu.Lock()
	known, knownPids := c.sandboxes, c.containers
	c.mu.Unlock()
	sandboxes := make(map[string]sandboxStatus, len(pods.GetItems()))
	pids := make(map[string]int, len(ctrs.GetContainers()))
	out := make([]Container, 0, len(pods.GetItems())+len(ctrs.GetContainers()))
	for _, p := range pods.GetItems() {
		sb, ok := known[p.GetId()]
		if !ok {
			st, err := rs.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: p.GetId(), Verbose: true})
			if status.Code(err) == codes.NotFound {
				continue // removed between list and status
			} else if err != nil {
				return nil, c.classify(err)
			}
			sb = sandboxOf(p.GetMetadata(), st.GetInfo())
		}
		sandboxes[p.GetId()] = sb
		if sb.netns == "" && sb.pid <= 0 {
			// CRI-O without an infra container (drop_infra_ctr) and host
			// network: no path, no process; its containers have theirs.
			continue
		}
		out = append(out, Container{
			ID: p.GetId(),
			// The name the kubelet gives a pod's sandbox on Docker (dockershim,
			// cri-dockerd): the pod looks the same on every runtime.
			Name:      fmt.Sprintf("k8s_POD_%s_%s_%s_%d", sb.pod.Name, sb.pod.Namespace, sb.uid, p.GetMetadata().GetAttempt()),
			Image:     sb.image,
			Labels:    podLabels(sb),
			Pid:       sb.pid,
			NetnsPath: sb.netns,
		})
	}
	for _, ct := range ctrs.GetContainers() {
		sb, ok := sandboxes[ct.GetPodSandboxId()]
		if !ok {
			continue // its sandbox is not ready (stopping): the pod goes away
		}
		pid, ok := knownPids[ct.GetId()]
		if !ok {
			st, err := rs.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ct.GetId(), Verbose: true})
			if status.Code(err) == codes.NotFound {
				continue
			} else if err != nil {
				return nil, c.classify(err)
			}
			pid = verboseInfo(st.GetInfo()).Pid
		}
		pids[ct.GetId()] = pid
		image := ct.GetImage().GetUserSpecifiedImage()
		if image == "" {
			image = ct.GetImage().GetImage()
		}
		out = append(out, Container{
			ID:     ct.GetId(),
			Name:   ct.GetMetadata().GetName(),
			Image:  image,
			Labels: podLabels(sb),
			Pid:    pid,
			// Containers of a pod share its sandbox's network namespace (CRI
			// has no per-container network namespace); the container's own
			// process is the fallback.
			NetnsPath: sb.netns,
		})
	}
	c.mu.Lock()
	c.sandboxes, c.containers = sandboxes, pids // gone ones are forgotten
	c.mu.Unlock()
	return out, nil
}

func podLabels(sb sandboxStatus) map[string]string {
	return map[string]string{LabelPodNamespace: sb.pod.Namespace, LabelPodName: sb.pod.Name, LabelPodUID: sb.uid}
}

// runtimeInfo is the part of a status' verbose "info" JSON the agent reads.
// containerd (pkg/cri/server/sandbox_status.go, container_status.go) and
// CRI-O (server/sandbox_status.go, container_status.go) both put the
// process's pid, the sandbox image and the OCI runtime spec there. CRI-O's
// sandbox without an infra container (drop_infra_ctr, its default: every pod
// that shares no PID namespace) has the spec only, the pause image in its
// annotations.
type runtimeInfo struct {
	Pid         int    `json:"pid"`
	Image       string `json:"image"`
	RuntimeSpec struct {
		Annotations map[string]string `json:"annotations"`
		Linux       struct {
			Namespaces []struct {
				Type string `json:"type"`
				Path string `json:"path"`
			} `json:"namespaces"`
		} `json:"linux"`
	} `json:"runtimeSpec"`
}

func verboseInfo(info map[string]string) runtimeInfo {
	var ri runtimeInfo
	_ = json.Unmarshal([]byte(info["info"]), &ri) // a runtime that says nothing: no pid, no path
	return ri
}

// crioImageAnnotation is where CRI-O keeps the image a sandbox or container
// was asked for (pkg/annotations: UserRequestedImage); a sandbox's is the
// pause image.
const crioImageAnnotation = "io.kubernetes.cri-o.Image"

// sandboxOf reads a sandbox's pod and network namespace. The namespace is
// the runtime spec's network namespace path (containerd bind-mounts it at
// /var/run/netns/cni-UUID, CRI-O's pinns at NAMESPACES_DIR/netns/UUID,
// /var/run/netns/UUID by default): it names the namespace for the pod's
// whole life. A hostNetwork pod's spec has none; its pause process's
// /proc/PID/ns/net (the node's) is used then (CRI-O without an infra
// container: neither; its containers are found by their own processes).
func sandboxOf(meta *cri.PodSandboxMetadata, info map[string]string) sandboxStatus {
	ri := verboseInfo(info)
	sb := sandboxStatus{
		pod:   Pod{Namespace: meta.GetNamespace(), Name: meta.GetName()},
		uid:   meta.GetUid(),
		image: ri.Image,
		pid:   ri.Pid,
	}
	if sb.image == "" {
		sb.image = ri.RuntimeSpec.Annotations[crioImageAnnotation]
	}
	for _, ns := range ri.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			sb.netns = ns.Path
		}
	}
	return sb
}

// classify turns a failed call into an error that says what to do.
func (c *CRI) classify(err error) error {
	st, _ := status.FromError(err)
	msg := st.Message()
	switch {
	case st.Code() == codes.Unimplemented:
		return fmt.Errorf("%s serves no CRI v1 RuntimeService (containerd's cri plugin disabled?): %s", c.Socket, msg)
	case strings.Contains(msg, syscall.EACCES.Error()):
		return fmt.Errorf("permission denied on %s: run the agent as root: %s", c.Socket, msg)
	case strings.Contains(msg, syscall.ECONNREFUSED.Error()):
		return fmt.Errorf("nothing answers on %s (is containerd or CRI-O running?): %s", c.Socket, msg)
	case st.Code() == codes.DeadlineExceeded:
		return fmt.Errorf("CRI runtime at %s did not answer within %s", c.Socket, askTimeout)
	}
	return fmt.Errorf("CRI runtime at %s: %w", c.Socket, err)
}
