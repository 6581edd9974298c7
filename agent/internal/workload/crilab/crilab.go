// Package crilab runs a private CRI runtime for tests: containerd (Debian's
// 1.6, its CRI plugin) or CRI-O (built by `make crio`), with its own root,
// state and socket under one directory, pods wired by the CNI bridge plugin
// on a bridge and subnet of the caller's (inside 198.18.0.0/15, no gateway,
// no masquerade: no route out), and a pause image built here (no image
// registry is reachable). Pods are created through the CRI API, as the
// kubelet does.
//
// Stop removes everything it made, also after a failed test: pods, leftover
// shim, monitor and container processes, mounts, network namespaces, the
// bridge and the directory.
package crilab

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Image is the name the pause image is imported as (sandbox_image).
const Image = "localhost/hoptrace-pause:lab"

// The runtimes the lab runs (Config.Runtime).
const (
	Containerd = "containerd"
	CRIO       = "cri-o"
)

// AptPackages install what the lab runs: containerd 1.6 (CRI v1 plugin built
// in), runc, and the CNI plugins (bridge, host-local, loopback).
const AptPackages = "apt-get install -y containerd runc containernetworking-plugins"

// shimDir holds containerd 1.6's shim sockets (s/): a fixed path.
const shimDir = "/run/containerd"

// cniBinDir is where Debian's containernetworking-plugins puts the plugins.
const cniBinDir = "/usr/lib/cni"

// Config says which runtime runs, where the lab lives and which network its
// pods get.
type Config struct {
	// Runtime is Containerd ("" too) or CRIO.
	Runtime string
	// CRIODir holds crio, pinns and importimage (make crio's
	// .tools/crio/VERSION); CRIO only.
	CRIODir string
	// Dir holds everything (config, root, state, socket, CNI state); Stop
	// removes it.
	Dir string
	// Bridge is the CNI bridge's name (at most 15 bytes) and Subnet its pods'
	// IPv4 subnet, inside 198.18.0.0/15.
	Bridge, Subnet string
	// Pause is a static pause binary; "" = built with `go build` (the
	// working directory must be inside the agent module).
	Pause string
}

// Lab is one running private CRI runtime.
type Lab struct {
	Config
	Socket string
	// Runtime is the client of its CRI RuntimeService (Config.Runtime names
	// the runtime).
	Runtime cri.RuntimeServiceClient

	cmd *exec.Cmd
	// exited is closed when the runtime's process has exited.
	exited <-chan struct{}
	conn   *grpc.ClientConn
	// shimDirMade: Start made shimDir, so Stop removes it (when empty).
	shimDirMade bool
	log         *os.File
	// netns paths of the pods made here, removed by Stop if still there.
	netns []string
}

// missingPrograms names the programs (on PATH, or absolute paths) that do
// not exist.
func missingPrograms(programs ...string) []string {
	var missing []string
	for _, p := range programs {
		if strings.HasPrefix(p, "/") {
			if _, err := os.Stat(p); err != nil {
				missing = append(missing, p)
			}
		} else if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	return missing
}

// Missing names the programs the containerd lab needs that are not
// installed ("" = none), with the command that installs them.
func Missing() string {
	missing := missingPrograms("containerd", "containerd-shim-runc-v2", "runc", "ctr",
		cniBinDir+"/bridge", cniBinDir+"/host-local", cniBinDir+"/loopback")
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("%s missing: %s (or make setup)", strings.Join(missing, ", "), AptPackages)
}

// Start starts the runtime, imports the pause image and waits until the CRI
// API answers. On error everything made is removed.
func Start(ctx context.Context, cfg Config) (c *Lab, err error) {
	if cfg.Runtime == "" {
		cfg.Runtime = Containerd
	}
	missing := ""
	switch cfg.Runtime {
	case Containerd:
		missing = Missing()
	case CRIO:
		missing = MissingCRIO(cfg.CRIODir)
	default:
		return nil, fmt.Errorf("runtime %q: the lab runs %s or %s", cfg.Runtime, Containerd, CRIO)
	}
	if missing != "" {
		return nil, errors.New(missing)
	}
	if !strings.HasPrefix(cfg.Subnet, "198.18.") && !strings.HasPrefix(cfg.Subnet, "198.19.") {
		return nil, fmt.Errorf("subnet %s: the lab's pods live inside 198.18.0.0/15 only", cfg.Subnet)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	c = &Lab{Config: cfg}
	defer func() {
		if err != nil {
			c.Stop()
			c = nil
		}
	}()
	deleteLink(cfg.Bridge) // a killed earlier run's
	if err := c.writeCNIConfig(); err != nil {
		return c, err
	}
	var argv []string
	if cfg.Runtime == CRIO {
		// CRI-O reads images from its storage only: the image goes there
		// before it starts.
		c.Socket = filepath.Join(cfg.Dir, "crio.sock")
		if err := c.writeCRIOConfig(); err != nil {
			return c, err
		}
		if err := c.copyPauseIntoStorage(ctx); err != nil {
			return c, err
		}
		argv = c.crioCommand()
	} else {
		c.Socket = filepath.Join(cfg.Dir, "containerd.sock")
		if _, err := os.Stat(shimDir); errors.Is(err, os.ErrNotExist) {
			c.shimDirMade = true
		}
		if err := c.writeContainerdConfig(); err != nil {
			return c, err
		}
		argv = []string{"containerd", "--config", filepath.Join(cfg.Dir, "config.toml")}
	}
	if c.log, err = os.Create(c.logPath()); err != nil {
		return c, err
	}
	c.cmd = exec.Command(argv[0], argv[1:]...)
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		return c, fmt.Errorf("start %s: %w", cfg.Runtime, err)
	}
	exited := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(exited) }()
	c.exited = exited
	if c.conn, err = grpc.NewClient("unix://"+c.Socket, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return c, err
	}
	c.Runtime = cri.NewRuntimeServiceClient(c.conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Runtime.Status(actx, &cri.StatusRequest{})
		cancel()
		if err == nil {
			break
		}
		select {
		case <-exited:
			return c, fmt.Errorf("%s exited before its CRI answered on %s: %v\n%s", cfg.Runtime, c.Socket, err, c.Log())
		default:
		}
		if time.Now().After(deadline) {
			return c, fmt.Errorf("%s's CRI did not answer on %s: %v\n%s", cfg.Runtime, c.Socket, err, c.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if cfg.Runtime == Containerd {
		if err := c.importPause(ctx); err != nil {
			return c, err
		}
	}
	return c, nil
}

func (c *Lab) logPath() string { return filepath.Join(c.Dir, c.Config.Runtime+".log") }

// Log is the runtime's output so far (its last 4 KiB).
func (c *Lab) Log() string {
	b, _ := os.ReadFile(c.logPath())
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

func (c *Lab) writeContainerdConfig() error {
	d := c.Dir
	// restrict_oom_score_adj: a sandbox's default oom_score_adj (-998) needs
	// CAP_SYS_RESOURCE, which a VM's or container's bounding set may lack
	// (runc then fails with "can't get final child's PID from pipe: EOF").
	config := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      Root = %[9]q
`, filepath.Join(d, "root"), filepath.Join(d, "state"), c.Socket, c.Socket+".ttrpc",
		filepath.Join(d, "opt"), Image, cniBinDir, filepath.Join(d, "cni"), filepath.Join(d, "runc"))
	return os.WriteFile(filepath.Join(d, "config.toml"), []byte(config), 0o600)
}

// writeCNIConfig writes the pods' network: the bridge plugin on Bridge with
// Subnet.
func (c *Lab) writeCNIConfig() error {
	d := c.Dir
	// No gateway, no masquerade: the pods reach each other on the bridge and
	// nothing else. host-local keeps its leases under the lab's directory.
	cni := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "hoptrace-cri-lab",
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": c.Bridge, "isGateway": false, "ipMasq": false,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": c.Subnet}}},
				"dataDir": filepath.Join(d, "cni-ipam"),
			},
		}},
	}
	b, err := json.MarshalIndent(cni, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(d, "cni"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(d, "cni", "10-hoptrace-lab.conflist"), b, 0o644)
}

// writePauseArchive builds the pause image as an OCI image layout
// (oci-layout, index.json, blobs) in a tar under Dir and returns its path.
func (c *Lab) writePauseArchive(ctx context.Context) (string, error) {
	pause := c.Pause
	if pause == "" {
		pause = filepath.Join(c.Dir, "pause")
		build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", pause,
			"github.com/hoptrace/hoptrace/agent/internal/workload/crilab/pause")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build the pause binary: %v\n%s", err, out)
		}
	}
	bin, err := os.ReadFile(pause)
	if err != nil {
		return "", err
	}
	archive, err := ociArchive(bin)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.Dir, "pause-image.tar")
	return path, os.WriteFile(path, archive, 0o600)
}

// importPause imports the pause image into containerd's CRI namespace.
func (c *Lab) importPause(ctx context.Context) error {
	path, err := c.writePauseArchive(ctx)
	if err != nil {
		return err
	}
	imp := exec.CommandContext(ctx, "ctr", "--address", c.Socket, "-n", "k8s.io", "images", "import", path)
	if out, err := imp.CombinedOutput(); err != nil {
		return fmt.Errorf("ctr images import: %v\n%s", err, out)
	}
	return nil
}

// ociArchive is a tar of an OCI image layout holding one image: one layer
// with /pause, whose entrypoint it is.
func ociArchive(pause []byte) ([]byte, error) {
	layer, err := tarOf(map[string]file{"pause": {pause, 0o755}})
	if err != nil {
		return nil, err
	}
	blobs := map[string][]byte{}
	desc := func(mediaType string, b []byte) map[string]any {
		sum := sha256.Sum256(b)
		digest := "sha256:" + hex.EncodeToString(sum[:])
		blobs[digest] = b
		return map[string]any{"mediaType": mediaType, "digest": digest, "size": len(b)}
	}
	layerDesc := desc("application/vnd.oci.image.layer.v1.tar", layer)
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": []string{"/pause"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc["digest"].(string)}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        desc("application/vnd.oci.image.config.v1+json", config),
		"layers":        []any{layerDesc},
	})
	manifestDesc := desc("application/vnd.oci.image.manifest.v1+json", manifest)
	manifestDesc["annotations"] = map[string]string{
		"io.containerd.image.name":          Image,
		"org.opencontainers.image.ref.name": strings.SplitN(Image, ":", 2)[1],
	}
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{manifestDesc}})
	files := map[string]file{
		"oci-layout": {[]byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644},
		"index.json": {index, 0o644},
	}
	for digest, b := range blobs {
		files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")] = file{b, 0o644}
	}
	return tarOf(files)
}

type file struct {
	data []byte
	mode int64
}

func tarOf(files map[string]file) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	dirs := map[string]bool{}
	for _, name := range names {
		for dir := filepath.Dir(name); dir != "."; dir = filepath.Dir(dir) {
			if !dirs[dir] {
				dirs[dir] = true
				if err := tw.WriteHeader(&tar.Header{Name: dir + "/", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
					return nil, err
				}
			}
		}
		f := files[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: f.mode, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Pod is a pod sandbox made here.
type Pod struct {
	ID     string
	Config *cri.PodSandboxConfig
	// Netns is the network namespace path the runtime made for it.
	Netns string
}

// podNamespaces are the kubelet's for a pod without hostNetwork and
// shareProcessNamespace: the pod's network and IPC namespaces, a PID
// namespace per container. (CRI-O then runs no infra container.)
var podNamespaces = &cri.NamespaceOption{
	Network: cri.NamespaceMode_POD, Pid: cri.NamespaceMode_CONTAINER, Ipc: cri.NamespaceMode_POD,
}

// RunPod runs a pod sandbox as the kubelet would, with the kubelet's labels.
func (c *Lab) RunPod(ctx context.Context, namespace, name, uid string) (*Pod, error) {
	cfg := &cri.PodSandboxConfig{
		Metadata: &cri.PodSandboxMetadata{Name: name, Namespace: namespace, Uid: uid},
		Hostname: name,
		Labels: map[string]string{
			"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": name, "io.kubernetes.pod.uid": uid,
		},
		Linux: &cri.LinuxPodSandboxConfig{
			// The kubelet's is /kubepods/QOS/podUID (cgroupfs driver): one
			// parent per pod, the runtime's cgroups (its monitor's too)
			// under it.
			CgroupParent:    c.cgroupParent() + "/pod" + uid,
			SecurityContext: &cri.LinuxSandboxSecurityContext{NamespaceOptions: podNamespaces},
		},
	}
	r, err := c.Runtime.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return nil, fmt.Errorf("RunPodSandbox %s/%s: %w\n%s", namespace, name, err, c.Log())
	}
	pod := &Pod{ID: r.GetPodSandboxId(), Config: cfg}
	st, err := c.Runtime.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: pod.ID, Verbose: true})
	if err != nil {
		return pod, err
	}
	var info struct {
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct{ Type, Path string }
			}
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(st.GetInfo()["info"]), &info); err != nil {
		return pod, fmt.Errorf("pod %s/%s's status info: %w", namespace, name, err)
	}
	for _, ns := range info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			pod.Netns = ns.Path
		}
	}
	if pod.Netns == "" {
		return pod, fmt.Errorf("pod %s/%s: no network namespace path in its status", namespace, name)
	}
	c.netns = append(c.netns, pod.Netns)
	return pod, nil
}

// RunContainer creates and starts a container of the pause image in pod.
func (c *Lab) RunContainer(ctx context.Context, pod *Pod, name string) (string, error) {
	r, err := c.Runtime.CreateContainer(ctx, &cri.CreateContainerRequest{
		PodSandboxId: pod.ID,
		Config: &cri.ContainerConfig{
			Metadata: &cri.ContainerMetadata{Name: name},
			// The kubelet names the image twice: as resolved and as the
			// user wrote it (CRI-O checks signatures against the latter).
			Image: &cri.ImageSpec{Image: Image, UserSpecifiedImage: Image},
			Linux: &cri.LinuxContainerConfig{
				SecurityContext: &cri.LinuxContainerSecurityContext{NamespaceOptions: podNamespaces},
			},
		},
		SandboxConfig: pod.Config,
	})
	if err != nil {
		return "", fmt.Errorf("CreateContainer %s: %w\n%s", name, err, c.Log())
	}
	if _, err := c.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: r.GetContainerId()}); err != nil {
		return r.GetContainerId(), fmt.Errorf("StartContainer %s: %w\n%s", name, err, c.Log())
	}
	return r.GetContainerId(), nil
}

// RemovePod stops and removes a pod sandbox with its containers (the CNI
// teardown and the network namespace go with it).
func (c *Lab) RemovePod(ctx context.Context, id string) error {
	if _, err := c.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("StopPodSandbox: %w", err)
	}
	if _, err := c.Runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("RemovePodSandbox: %w", err)
	}
	return nil
}

// Stop removes every pod, stops the runtime and removes what it left: shim,
// conmon and container processes, mounts, network namespaces, the bridge and Dir.
// It returns what it could not remove.
func (c *Lab) Stop() error {
	var errs []error
	if c.Runtime != nil && c.running() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if pods, err := c.Runtime.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{}); err == nil {
			for _, p := range pods.GetItems() {
				if err := c.RemovePod(ctx, p.GetId()); err != nil {
					errs = append(errs, fmt.Errorf("pod %s: %w", p.GetMetadata().GetName(), err))
				}
			}
		}
		cancel()
	}
	if c.conn != nil {
		c.conn.Close()
	}
	if c.exited != nil {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	}
	if c.log != nil {
		c.log.Close()
	}
	// Shims and conmon outlive their runtime by design; a pod that could not
	// be removed keeps its processes. Both are found by the lab's directory.
	for _, pid := range processesUnder(c.Dir) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, m := range mountsUnder(c.Dir, c.netns) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	for _, ns := range c.netns {
		if err := os.Remove(ns); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, removeCgroups(c.cgroupParent())...)
	deleteLink(c.Bridge)
	if c.shimDirMade { // empty once every shim is gone; left alone otherwise
		_ = os.Remove(filepath.Join(shimDir, "s"))
		_ = os.Remove(shimDir)
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// cgroupParent is the cgroup the lab's pods are made under, the same for
// every hierarchy, named by the lab's directory.
func (c *Lab) cgroupParent() string {
	sum := sha256.Sum256([]byte(c.Dir))
	return "/hoptrace-crilab-" + hex.EncodeToString(sum[:6])
}

// removeCgroups removes the cgroup tree at parent in every mounted cgroup
// hierarchy (v1 controllers, v2), deepest first: runc removes a
// container's own cgroup, not the parents made for its pod, and CRI-O
// leaves the cgroups it made for conmon.
func removeCgroups(parent string) []error {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var dirs []string
	for _, line := range strings.Split(string(b), "\n") {
		_, after, ok := strings.Cut(line, " - ")
		fields := strings.Fields(line)
		if !ok || len(fields) < 5 {
			continue
		}
		if fstype := strings.Fields(after); len(fstype) == 0 || (fstype[0] != "cgroup" && fstype[0] != "cgroup2") {
			continue
		}
		_ = filepath.WalkDir(fields[4]+parent, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	var errs []error
	for _, dir := range dirs {
		if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
		}
	}
	return errs
}

// running says whether the runtime's process still runs.
func (c *Lab) running() bool {
	if c.exited == nil {
		return false
	}
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// processesUnder are the PIDs of the runtime's monitors for dir
// (containerd's shims, CRI-O's conmon: their command lines name paths under
// it) and of processes whose root directory is under dir (a container's
// rootfs in the runtime's state).
func processesUnder(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		root, _ := os.Readlink(fmt.Sprintf("/proc/%d/root", pid))
		monitor := bytes.Contains(cmdline, []byte("containerd-shim")) || bytes.Contains(cmdline, []byte("conmon"))
		shim := monitor && bytes.Contains(cmdline, []byte(dir))
		if shim || strings.HasPrefix(root, dir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mountsUnder are the mount points under dir and the given paths, deepest
// first.
func mountsUnder(dir string, paths []string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		point := fields[4]
		under := strings.HasPrefix(point, dir+"/")
		for _, p := range paths {
			under = under || point == p || point == strings.Replace(p, "/var/run/", "/run/", 1)
		}
		if under {
			out = append(out, point)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func deleteLink(name string) {
	if link, err := netlink.LinkByName(name); err == nil {
		_ = netlink.LinkDel(link)
	}
}
