package workload

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// dialAsEnv makes the test binary, started again as nobody, ask the socket
// it names and print the error: a real EACCES from the kernel.
const dialAsEnv = "HOPTRACE_WORKLOAD_DIAL"

func TestPermissionDeniedOnTheSocketIsOneClearMessage(t *testing.T) {
	if sock := os.Getenv(dialAsEnv); sock != "" {
		_, err := NewDocker(sock).Version(context.Background())
		fmt.Printf("error: %v\n", err)
		return
	}
	if os.Geteuid() != 0 {
		t.Fatal("needs root: it starts itself again as nobody (the tests run as root)")
	}
	dir := t.TempDir()
	// t.TempDir's directories are 0700: nobody must reach the socket (and the binary) to be refused by it.
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(dir, "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, `{"Version":"x"}`)
	})}
	go srv.Serve(l)
	defer srv.Close()
	if err := os.Chmod(sock, 0o600); err != nil { // as dockerd's: root (and its group) only
		t.Fatal(err)
	}
	// root still gets in
	if v, err := NewDocker(sock).Version(context.Background()); err != nil || v != "x" {
		t.Fatalf("as root: %q, %v", v, err)
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	binary := filepath.Join(dir, "workload.test")
	if err := os.WriteFile(binary, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "-test.run=^TestPermissionDeniedOnTheSocketIsOneClearMessage$")
	cmd.Env = append(os.Environ(), dialAsEnv+"="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
	want := "error: permission denied on " + sock + ": run the agent as root or in the docker group"
	if !strings.Contains(string(out), want) {
		t.Fatalf("as nobody:\n%s\nwant %q", out, want)
	}
}
