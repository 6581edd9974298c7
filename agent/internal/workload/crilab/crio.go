package crilab

// CRI-O as a private instance: every path it would take from the host
// (storage, run and state files, its socket, CNI, hooks, CDI, policies,
// namespaces) is under the lab's directory, and what it would change on the
// host (irqbalance's banned CPUs, NRI's socket, seccomp's notifier) is off.
// Built by `make crio` (lab/crio): crio from the Go module proxy, pinns from
// the C sources in the same module, and importimage, which writes an image
// into CRI-O's storage (as CRI-O's own test/copyimg does, but keeping
// containers/image's caches in that storage).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// CRIOAptPackages install what CRI-O runs besides its own programs: conmon
// (its container monitor), runc, and the CNI plugins.
const CRIOAptPackages = "apt-get install -y conmon runc containernetworking-plugins"

// crioPrograms are what `make crio` puts in a CRIODir.
var crioPrograms = []string{"crio", "pinns", "importimage"}

// MissingCRIO names what the CRI-O lab needs that is not there ("" = none),
// with the commands that install it: crio, pinns and importimage in dir,
// conmon, runc and the CNI plugins.
func MissingCRIO(dir string) string {
	var progs []string
	if dir == "" {
		progs = append(progs, "the directory of make crio (CRIODir)")
	} else {
		for _, p := range crioPrograms {
			progs = append(progs, filepath.Join(dir, p))
		}
	}
	missing := missingPrograms(append(progs, "conmon", "runc",
		cniBinDir+"/bridge", cniBinDir+"/host-local", cniBinDir+"/loopback")...)
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("%s missing: make crio, %s", strings.Join(missing, ", "), CRIOAptPackages)
}

// crioCommand starts CRI-O on its own configuration only: --config-dir
// names an empty directory, so /etc/crio/crio.conf.d is not read.
func (c *Lab) crioCommand() []string {
	return []string{filepath.Join(c.CRIODir, "crio"),
		"--config", filepath.Join(c.Dir, "crio.conf"), "--config-dir", filepath.Join(c.Dir, "crio.conf.d")}
}

// writeCRIOConfig writes crio.conf, its empty drop-in directory and the
// image signature policy.
//
// cgroupfs: no systemd here to ask for scopes. runc is Debian's (CRI-O's
// default, crun, is not installed). drop_infra_ctr stays CRI-O's default
// (true): a pod that shares no PID namespace has no pause process, its
// namespaces are pinned by pinns, and its sandbox status has no pid.
func (c *Lab) writeCRIOConfig() error {
	d := c.Dir
	path := func(name string) string { return filepath.Join(d, name) }
	runc, err := exec.LookPath("runc")
	if err != nil {
		return err
	}
	conmon, err := exec.LookPath("conmon")
	if err != nil {
		return err
	}
	config := fmt.Sprintf(`[crio]
root = %q
runroot = %q
storage_driver = "vfs"
log_dir = %q
version_file = %q
version_file_persist = ""
clean_shutdown_file = %q

[crio.api]
listen = %q
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
default_runtime = "runc"
container_exits_dir = %q
container_attach_socket_dir = %q
namespaces_dir = %q
pinns_path = %q
hooks_dir = []
cdi_spec_dirs = []
irqbalance_config_file = %q
irqbalance_config_restore_file = "disable"
enable_criu_support = false

[crio.runtime.runtimes.runc]
runtime_path = %q
runtime_type = "oci"
runtime_root = %q
monitor_path = %q

[crio.image]
pause_image = %q
signature_policy = %q
signature_policy_dir = %q

[crio.network]
network_dir = %q
plugin_dirs = [%q]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
`, path("root"), path("runroot"), path("pods"), path("version"), path("clean.shutdown"),
		c.Socket,
		path("exits"), path("attach"), path("ns"), filepath.Join(c.CRIODir, "pinns"), path("irqbalance"),
		runc, path("runc"), conmon,
		Image, path("policy.json"), path("policies"),
		path("cni"), cniBinDir)
	if err := os.WriteFile(path("crio.conf"), []byte(config), 0o600); err != nil {
		return err
	}
	if err := os.MkdirAll(path("crio.conf.d"), 0o700); err != nil {
		return err
	}
	// Only the lab's own image is ever read: no signature to check.
	return os.WriteFile(path("policy.json"), []byte(`{"default": [{"type": "insecureAcceptAnything"}]}`), 0o600)
}

// copyPauseIntoStorage writes the pause image into CRI-O's storage (its
// root and runroot, the vfs driver) under Image.
func (c *Lab) copyPauseIntoStorage(ctx context.Context) error {
	archive, err := c.writePauseArchive(ctx)
	if err != nil {
		return err
	}
	imp := exec.CommandContext(ctx, filepath.Join(c.CRIODir, "importimage"),
		"--root", filepath.Join(c.Dir, "root"), "--runroot", filepath.Join(c.Dir, "runroot"),
		"--name", Image, "--archive", archive)
	if out, err := imp.CombinedOutput(); err != nil {
		return fmt.Errorf("importimage %s into CRI-O's storage: %v\n%s", Image, err, out)
	}
	return nil
}
