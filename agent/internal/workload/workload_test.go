package workload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestPodUIDFromKubepodsCgroupPaths(t *testing.T) {
	cases := map[string]string{
		// cgroupfs driver, each QoS class
		"/kubepods/burstable/pod0d5b2a53-6f0c-4e9e-9d38-1c2b3a4d5e6f/3f1e": "0d5b2a53-6f0c-4e9e-9d38-1c2b3a4d5e6f",
		"/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555/ab":  "11111111-2222-3333-4444-555555555555",
		"/kubepods/pod0D5B2A53-6F0C-4E9E-9D38-1C2B3A4D5E6F/cid":            "0d5b2a53-6f0c-4e9e-9d38-1c2b3a4d5e6f",
		// systemd driver: '_' for '-' in the UID
		"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0d5b2a53_6f0c_4e9e_9d38_1c2b3a4d5e6f.slice/cri-containerd-3f1e.scope": "0d5b2a53-6f0c-4e9e-9d38-1c2b3a4d5e6f",
		"/kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice/docker-ab.scope":                                              "11111111-2222-3333-4444-555555555555",
		// not a pod
		"/system.slice/docker-3f1e.scope": "",
		"/docker/3f1e":                    "",
		"/user.slice/kubepods-notapod":    "",
		"":                                "",
	}
	for path, want := range cases {
		if got := PodUIDFromCgroup(path); got != want {
			t.Errorf("PodUIDFromCgroup(%q) = %q, want %q", path, got, want)
		}
	}
}

type fakeRuntime struct {
	endpoint   string
	containers []Container
	err        error
}

func (f fakeRuntime) Endpoint() string                        { return f.endpoint }
func (f fakeRuntime) Version(context.Context) (string, error) { return "24.0.0", f.err }
func (f fakeRuntime) Running(context.Context) ([]Container, error) {
	return f.containers, f.err
}

// fakeProc writes PID/ns/net (any file has an inode) and PID/cgroup.
func fakeProc(t *testing.T, root string, pid int, cgroup string) uint64 {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprint(pid))
	if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ns", "net"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "ns", "net"))
	if err != nil {
		t.Fatal(err)
	}
	return inodeOf(st)
}

func TestCollectNamesContainersAndPodsFromLabelsAndCgroups(t *testing.T) {
	root := t.TempDir()
	const uid = "0d5b2a53-6f0c-4e9e-9d38-1c2b3a4d5e6f"
	// The pod's sandbox carries the kubelet's labels; the app container in
	// the same pod has none (as with a runtime that drops them): it is named
	// from its kubepods cgroup path. A plain container is no pod's.
	sandboxIno := fakeProc(t, root, 100, "12:pids:/kubepods/burstable/pod"+uid+"/aaa\n0::/kubepods/burstable/pod"+uid+"/aaa\n")
	appIno := fakeProc(t, root, 200, "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+
		"0d5b2a53_6f0c_4e9e_9d38_1c2b3a4d5e6f.slice/docker-bbb.scope\n")
	// A pure cgroup v1 host: the pod comes from a v1 hierarchy's path.
	v1Ino := fakeProc(t, root, 300, "4:memory:/kubepods/pod"+uid+"/ccc\n1:name=systemd:/kubepods/pod"+uid+"/ccc\n")
	plainIno := fakeProc(t, root, 400, "0::/system.slice/docker-ddd.scope\n")
	inv := &Inventory{ProcRoot: root, Runtimes: []Runtime{fakeRuntime{endpoint: "/fake.sock", containers: []Container{
		{ID: "aaa", Name: "k8s_POD_web-0_shop_" + uid + "_0", Image: "pause:3.9", Pid: 100, Labels: map[string]string{
			LabelPodNamespace: "shop", LabelPodName: "web-0", LabelPodUID: uid}},
		{ID: "bbb", Name: "k8s_app_web-0", Image: "nginx:1.25", Pid: 200},
		{ID: "ccc", Name: "k8s_side_web-0", Image: "envoy:1", Pid: 300},
		{ID: "ddd", Name: "plain", Image: "debian:bookworm", Pid: 400},
		{ID: "eee", Name: "gone", Image: "x", Pid: 999}, // exited: no /proc entry
	}}}}
	found, state := inv.Collect(context.Background())
	if state.GetEndpoint() != "/fake.sock" || state.GetVersion() != "24.0.0" || state.GetError() != "" {
		t.Fatalf("runtime state = %v", state)
	}
	type want struct {
		ino                         uint64
		image, podNs, podName, path string
	}
	wants := map[string]want{
		"k8s_POD_web-0_shop_" + uid + "_0": {sandboxIno, "pause:3.9", "shop", "web-0", "/proc/100/ns/net"},
		"k8s_app_web-0":                    {appIno, "nginx:1.25", "shop", "web-0", "/proc/200/ns/net"},
		"k8s_side_web-0":                   {v1Ino, "envoy:1", "shop", "web-0", "/proc/300/ns/net"},
		"plain":                            {plainIno, "debian:bookworm", "", "", "/proc/400/ns/net"},
	}
	if len(found) != len(wants) {
		t.Fatalf("found %d containers, want %d: %v", len(found), len(wants), found)
	}
	for _, f := range found {
		w, ok := wants[f.Workload.GetContainerName()]
		if !ok {
			t.Fatalf("unexpected container %v", f.Workload)
		}
		if f.NetnsInode != w.ino || f.NetnsPath != w.path || f.Workload.GetImage() != w.image ||
			f.Workload.GetPodNamespace() != w.podNs || f.Workload.GetPodName() != w.podName {
			t.Errorf("%s: got %v ino %d path %s, want %+v", f.Workload.GetContainerName(), f.Workload, f.NetnsInode, f.NetnsPath, w)
		}
	}
}

func TestCollectWithoutRuntimeSaysNothingAndPermissionDeniedSaysWhy(t *testing.T) {
	found, state := (&Inventory{Runtimes: []Runtime{fakeRuntime{endpoint: "/x.sock", err: ErrNoRuntime}}}).Collect(context.Background())
	if len(found) != 0 || state.GetEndpoint() != "" || state.GetError() != "" {
		t.Fatalf("no runtime: found %v, state %v", found, state)
	}

	// A real dial of a socket path that does not exist: no runtime.
	dir := t.TempDir()
	d := NewDocker("unix://" + filepath.Join(dir, "missing.sock"))
	if _, err := d.Version(context.Background()); !errors.Is(err, ErrNoRuntime) {
		t.Fatalf("missing socket: %v, want ErrNoRuntime", err)
	}
	// A socket file nobody listens on: a clear error naming the socket.
	sock := filepath.Join(dir, "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.Close() // the file stays, nothing accepts
	_ = os.WriteFile(sock, nil, 0o600)
	if _, err := NewDocker(sock).Version(context.Background()); err == nil || !strings.Contains(err.Error(), sock) {
		t.Fatalf("dead socket: %v, want an error naming %s", err, sock)
	}
	// The error net.Dial returns for a socket this user may not open (the
	// tests run as root, whom EACCES never stops): one message that says what to do.
	denied := &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.EACCES)}
	msg := classify(denied, DefaultSocket).Error()
	if !strings.Contains(msg, "permission denied on "+DefaultSocket) || !strings.Contains(msg, "docker group") {
		t.Fatalf("permission denied: %q", msg)
	}
	// Logged once, however many heartbeats ask.
	var logged bytes.Buffer
	inv := &Inventory{Runtimes: []Runtime{fakeRuntime{endpoint: DefaultSocket, err: classify(denied, DefaultSocket)}},
		Log: slog.New(slog.NewTextHandler(&logged, nil))}
	for range 5 {
		if _, state := inv.Collect(context.Background()); !strings.Contains(state.GetError(), "permission denied") {
			t.Fatalf("state %v", state)
		}
	}
	if n := strings.Count(logged.String(), "level=WARN"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, logged.String())
	}
}

func inodeOf(st os.FileInfo) uint64 { return st.Sys().(*syscall.Stat_t).Ino }

// The inspect cache keeps a container while its first process is the same
// process: same PID and start time.
func TestPidStartTimeNamesOneProcess(t *testing.T) {
	self := pidStartTime(os.Getpid())
	if self == "" || self != pidStartTime(os.Getpid()) {
		t.Fatalf("own start time %q", self)
	}
	if got := pidStartTime(1 << 30); got != "" {
		t.Fatalf("a PID that cannot exist: %q", got)
	}
}

// A node whose Docker engine also serves CRI (cri-dockerd): the same pod
// comes from both runtimes and is listed once; a runtime that fails does
// not hide the one that answers.
func TestCollectMergesRuntimesAndListsASharedContainerOnce(t *testing.T) {
	root := t.TempDir()
	const uid = "11111111-2222-3333-4444-555555555555"
	podIno := fakeProc(t, root, 100, "0::/kubepods/pod"+uid+"/aaa\n")
	plainIno := fakeProc(t, root, 200, "0::/system.slice/docker-bbb.scope\n")
	labels := map[string]string{LabelPodNamespace: "shop", LabelPodName: "web-0", LabelPodUID: uid}
	docker := fakeRuntime{endpoint: "/var/run/docker.sock", containers: []Container{
		{ID: "aaa", Name: "k8s_POD_web-0_shop_" + uid + "_0", Image: "pause:3.9", Pid: 100, Labels: labels},
		{ID: "bbb", Name: "plain", Image: "debian:bookworm", Pid: 200},
	}}
	criDockerd := fakeRuntime{endpoint: "/var/run/cri-dockerd.sock", containers: []Container{
		{ID: "aaa", Name: "k8s_POD_web-0_shop_" + uid + "_0", Image: "pause:3.9", Pid: 100, Labels: labels},
	}}
	broken := fakeRuntime{endpoint: "/run/containerd/containerd.sock", err: errors.New("nothing answers")}
	var logged bytes.Buffer
	inv := &Inventory{ProcRoot: root, Runtimes: []Runtime{broken, docker, criDockerd},
		Log: slog.New(slog.NewTextHandler(&logged, nil))}
	for range 3 {
		found, state := inv.Collect(context.Background())
		if state.GetEndpoint() != "/var/run/docker.sock" || state.GetVersion() != "24.0.0" || state.GetError() != "" {
			t.Fatalf("runtime state = %v", state)
		}
		if len(found) != 2 || found[0].Workload.GetContainerName() != "k8s_POD_web-0_shop_"+uid+"_0" ||
			found[0].NetnsInode != podIno || found[0].Workload.GetPodName() != "web-0" ||
			found[1].Workload.GetContainerName() != "plain" || found[1].NetnsInode != plainIno {
			t.Fatalf("found %v", found)
		}
	}
	if n := strings.Count(logged.String(), "level=WARN"); n != 1 || !strings.Contains(logged.String(), "containerd.sock") {
		t.Fatalf("the failing runtime logged %d times, want once naming it:\n%s", n, logged.String())
	}
	// Nothing answers: the first failing runtime's error is the state.
	found, state := (&Inventory{ProcRoot: root, Runtimes: []Runtime{fakeRuntime{endpoint: "/x.sock", err: ErrNoRuntime}, broken}}).Collect(context.Background())
	if len(found) != 0 || state.GetEndpoint() != "/run/containerd/containerd.sock" || state.GetError() != "nothing answers" {
		t.Fatalf("found %v, state %v", found, state)
	}
}

// The sandbox's network namespace is the path in its runtime spec; a
// hostNetwork pod has none and is found by its pause process.
func TestSandboxStatusInfoGivesTheNetnsPathElseThePid(t *testing.T) {
	meta := &cri.PodSandboxMetadata{Name: "web-0", Namespace: "shop", Uid: "u"}
	// containerd 1.6's and CRI-O's verbose info, cut to what is read
	pod := sandboxOf(meta, map[string]string{"info": `{"pid": 4242, "image": "registry.k8s.io/pause:3.9",
		"runtimeSpec": {"linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"},
		{"type": "network", "path": "/var/run/netns/cni-0f4c"}, {"type": "mount"}]}}}`})
	if pod.netns != "/var/run/netns/cni-0f4c" || pod.pid != 4242 || pod.image != "registry.k8s.io/pause:3.9" ||
		pod.pod != (Pod{"shop", "web-0"}) || pod.uid != "u" {
		t.Fatalf("pod network: %+v", pod)
	}
	host := sandboxOf(meta, map[string]string{"info": `{"pid": 77, "runtimeSpec": {"linux": {"namespaces": [{"type": "pid"}]}}}`})
	if host.netns != "" || host.pid != 77 {
		t.Fatalf("host network: %+v", host)
	}
	if none := sandboxOf(meta, nil); none.netns != "" || none.pid != 0 {
		t.Fatalf("no info: %+v", none)
	}
}

// A CRI pod's namespace is the runtime's path when this agent sees it, else
// its process's (an agent whose mount namespace lacks /var/run/netns).
func TestCollectPlacesAContainerByTheRuntimesPathElseItsProcess(t *testing.T) {
	root := t.TempDir()
	procIno := fakeProc(t, root, 300, "0::/kubepods/x\n")
	named := filepath.Join(root, "cni-0f4c")
	if err := os.WriteFile(named, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(named)
	if err != nil {
		t.Fatal(err)
	}
	inv := &Inventory{ProcRoot: root, Runtimes: []Runtime{fakeRuntime{endpoint: "/cri.sock", containers: []Container{
		{ID: "a", Name: "a", Pid: 300, NetnsPath: named},
		{ID: "b", Name: "b", Pid: 300, NetnsPath: filepath.Join(root, "missing")},
		{ID: "c", Name: "c", NetnsPath: filepath.Join(root, "missing")}, // and no process: not placed
	}}}}
	found, _ := inv.Collect(context.Background())
	if len(found) != 2 || found[0].NetnsPath != named || found[0].NetnsInode != inodeOf(st) ||
		found[1].NetnsPath != "/proc/300/ns/net" || found[1].NetnsInode != procIno {
		t.Fatalf("found %v", found)
	}
}
