package workload

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeCRIO answers as CRI-O does without an infra container
// (drop_infra_ctr): a hostNetwork sandbox's verbose info is its runtime
// spec only (no pid, no network namespace path).
type fakeCRIO struct {
	cri.UnimplementedRuntimeServiceServer
	containerPid int
}

func (f *fakeCRIO) Version(context.Context, *cri.VersionRequest) (*cri.VersionResponse, error) {
	return &cri.VersionResponse{RuntimeName: "cri-o", RuntimeVersion: "1.31.0"}, nil
}

func (f *fakeCRIO) ListPodSandbox(context.Context, *cri.ListPodSandboxRequest) (*cri.ListPodSandboxResponse, error) {
	return &cri.ListPodSandboxResponse{Items: []*cri.PodSandbox{{Id: "sb1", State: cri.PodSandboxState_SANDBOX_READY,
		Metadata: &cri.PodSandboxMetadata{Name: "node-exporter-x", Namespace: "monitoring", Uid: "u1"}}}}, nil
}

func (f *fakeCRIO) PodSandboxStatus(context.Context, *cri.PodSandboxStatusRequest) (*cri.PodSandboxStatusResponse, error) {
	return &cri.PodSandboxStatusResponse{Info: map[string]string{"info": `{"runtimeSpec": {"linux": {"namespaces": [{"type": "pid"}]}}}`}}, nil
}

func (f *fakeCRIO) ListContainers(context.Context, *cri.ListContainersRequest) (*cri.ListContainersResponse, error) {
	return &cri.ListContainersResponse{Containers: []*cri.Container{{Id: "c1", PodSandboxId: "sb1",
		Metadata: &cri.ContainerMetadata{Name: "exporter"}, State: cri.ContainerState_CONTAINER_RUNNING,
		Image: &cri.ImageSpec{Image: "sha256:0123", UserSpecifiedImage: "quay.io/prometheus/node-exporter:v1.8.2"}}}}, nil
}

func (f *fakeCRIO) ContainerStatus(context.Context, *cri.ContainerStatusRequest) (*cri.ContainerStatusResponse, error) {
	return &cri.ContainerStatusResponse{Info: map[string]string{"info": fmt.Sprintf(`{"pid": %d}`, f.containerPid)}}, nil
}

func serveCRI(t *testing.T, srv cri.RuntimeServiceServer) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "crio.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	if srv != nil {
		cri.RegisterRuntimeServiceServer(g, srv)
	}
	go g.Serve(l)
	t.Cleanup(g.Stop)
	return sock
}

// A sandbox the runtime gives no place still names its containers' pod;
// the container is found by its own process.
func TestCRIContainerOfASandboxWithoutPathOrPidIsFoundByItsProcess(t *testing.T) {
	sock := serveCRI(t, &fakeCRIO{containerPid: os.Getpid()})
	inv := &Inventory{Runtimes: []Runtime{NewCRI("unix://" + sock)}}
	defer inv.Close()
	found, state := inv.Collect(context.Background())
	if state.GetVersion() != "cri-o 1.31.0" || state.GetEndpoint() != sock || state.GetError() != "" {
		t.Fatalf("state %v", state)
	}
	own, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 {
		t.Fatalf("found %v", found)
	}
	w := found[0].Workload
	if w.GetContainerName() != "exporter" || w.GetContainerId() != "c1" || w.GetImage() != "quay.io/prometheus/node-exporter:v1.8.2" ||
		w.GetPodNamespace() != "monitoring" || w.GetPodName() != "node-exporter-x" ||
		found[0].NetnsPath != fmt.Sprintf("/proc/%d/ns/net", os.Getpid()) || found[0].NetnsInode != inodeOf(own) {
		t.Fatalf("found %v in %s", w, found[0].NetnsPath)
	}
}

// A socket that serves no RuntimeService (containerd with its cri plugin
// disabled) and one nobody listens on each say so; no socket says nothing.
func TestCRIErrorsSayWhatIsWrong(t *testing.T) {
	ctx := context.Background()
	unserved := NewCRI(serveCRI(t, nil))
	defer unserved.Close()
	if _, err := unserved.Version(ctx); err == nil || !strings.Contains(err.Error(), "serves no CRI v1 RuntimeService") {
		t.Fatalf("no RuntimeService: %v", err)
	}
	dead := filepath.Join(t.TempDir(), "dead.sock")
	l, err := net.Listen("unix", dead)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	refused := NewCRI(dead)
	defer refused.Close()
	if _, err := refused.Version(ctx); err == nil || !strings.Contains(err.Error(), "nothing answers on "+dead) {
		t.Fatalf("dead socket: %v", err)
	}
	found, state := (&Inventory{Runtimes: []Runtime{NewCRI(filepath.Join(t.TempDir(), "none.sock"))}}).Collect(ctx)
	if len(found) != 0 || state.GetEndpoint() != "" || state.GetError() != "" {
		t.Fatalf("no socket: %v %v", found, state)
	}
}

// CRI-O 1.34.0's verbose status of a pod sandbox without an infra container
// (drop_infra_ctr, its default for a pod that shares no PID namespace),
// recorded from the CRI lab's CRI-O: the runtime spec only, no pid and no
// "image". The pod lives in the network namespace pinns pinned; the sandbox
// image is the pause image of the spec's annotations.
func TestCRIOSandboxWithoutInfraContainerIsPlacedByItsSpec(t *testing.T) {
	info, err := os.ReadFile("testdata/crio-1.34.0-sandbox-info.json")
	if err != nil {
		t.Fatal(err)
	}
	meta := &cri.PodSandboxMetadata{Name: "web-0", Namespace: "shop", Uid: "00000000-0000-4000-8000-000000000001"}
	sb := sandboxOf(meta, map[string]string{"info": string(info)})
	want := sandboxStatus{
		pod:   Pod{Namespace: "shop", Name: "web-0"},
		uid:   "00000000-0000-4000-8000-000000000001",
		image: "localhost/hoptrace-pause:lab",
		netns: "/tmp/crilab-crio-try/ns/netns/dc770c27-9607-467c-a27d-2c57726556c6",
	}
	if sb != want {
		t.Fatalf("sandboxOf = %+v, want %+v", sb, want)
	}
}
