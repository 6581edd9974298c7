// Package netns runs code inside a network namespace: the calling goroutine
// is locked to its OS thread, setns(2) moves that thread, and the original
// namespace is restored before the thread is released. Devices (ifindex),
// tcx/XDP links and sockets are resolved in the namespace the thread is in.
package netns

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// RunDir is where `ip netns add` keeps named namespaces.
const RunDir = "/run/netns"

// Path resolves a hop's netns: "" = def (the agent's --netns, or its own
// namespace when that is empty too); a bare name is under /run/netns;
// anything with a slash is a path (e.g. /proc/PID/ns/net).
func Path(ns, def string) string {
	if ns == "" {
		ns = def
	}
	if ns == "" {
		return "/proc/self/ns/net"
	}
	if strings.Contains(ns, "/") {
		return ns
	}
	return filepath.Join(RunDir, ns)
}

// Display names a namespace for error messages.
func Display(ns, def string) string {
	if ns == "" {
		ns = def
	}
	if ns == "" {
		return "(agent)"
	}
	return ns
}

// Inode is the nsfs inode of a namespace file: what the kernel reports as
// net->ns.inum, so hop_netns_ino compares against it.
func Inode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat netns %s: %w", path, err)
	}
	return st.Ino, nil
}

// Do runs fn with the calling thread in the namespace at path.
func Do(path string, fn func() error) error {
	target, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()

	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own netns: %w", err)
	}
	defer orig.Close()

	same, err := sameFile(orig, target)
	if err == nil && same {
		runtime.UnlockOSThread()
		return fn()
	}
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", path, err)
	}
	fnErr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: the runtime discards it when this
		// goroutine exits, so no other goroutine runs in the wrong netns.
		return errors.Join(fnErr, fmt.Errorf("restore netns: %w", err))
	}
	runtime.UnlockOSThread()
	return fnErr
}

func sameFile(a, b *os.File) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Fstat(int(a.Fd()), &sa); err != nil {
		return false, err
	}
	if err := unix.Fstat(int(b.Fd()), &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

// Device is one network device of a namespace.
type Device struct {
	Name    string
	Ifindex uint32
	MTU     uint32
	Kind    string
}

// Devices lists the devices of the namespace at path.
func Devices(path string) ([]Device, error) {
	var out []Device
	err := Do(path, func() error {
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		for _, i := range ifs {
			out = append(out, Device{Name: i.Name, Ifindex: uint32(i.Index), MTU: uint32(i.MTU), Kind: kindOf(i.Name)})
		}
		return nil
	})
	return out, err
}

// kindOf reads the link kind from sysfs of the current netns where it can;
// sysfs is per mount namespace, so inside another netns this falls back.
func kindOf(name string) string {
	if b, err := os.ReadFile(filepath.Join("/sys/class/net", name, "uevent")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "DEVTYPE="); ok {
				return v
			}
		}
	}
	return "device"
}

// Ifindex resolves dev in the namespace at path.
func Ifindex(path, dev string) (int, error) {
	idx, err := Ifindexes(path)
	if err != nil {
		return 0, err
	}
	i, ok := idx[dev]
	if !ok {
		return 0, fmt.Errorf("no such device")
	}
	return i, nil
}

// Ifindexes maps each device of the namespace at path to its ifindex, from
// one listing (what resolving a single name costs as well: the kernel is
// asked for every link either way).
func Ifindexes(path string) (map[string]int, error) {
	idx := map[string]int{}
	err := Do(path, func() error {
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		for _, i := range ifs {
			idx[i.Name] = i.Index
		}
		return nil
	})
	return idx, err
}

// Named lists the /run/netns entries.
func Named() ([]string, error) {
	ents, err := os.ReadDir(RunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out, nil
}

// Cookie is SO_NETNS_COOKIE (getsockopt SOL_SOCKET 71) of a socket made in
// the namespace at path: the value bpf_get_netns_cookie() returns there.
func Cookie(path string) (uint64, error) {
	const soNetnsCookie = 71
	var cookie uint64
	err := Do(path, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, soNetnsCookie)
		if err != nil {
			return fmt.Errorf("getsockopt SO_NETNS_COOKIE: %w", err)
		}
		cookie = v
		return nil
	})
	return cookie, err
}
