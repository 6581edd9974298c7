package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"strings"
	"testing"
)

// Ip runs `ip ARGS...` and fails the test on error.
func Ip(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Name returns "htgo-<random>" (short enough for a device name).
func Name() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "htgo-" + hex.EncodeToString(b[:])
}

// VethPair makes two namespaces joined by a veth pair, 198.18.X.1/24 on
// "a" side and .2 on "b", and removes them when the test ends.
type VethPair struct {
	NsA, NsB   string
	DevA, DevB string
	AddrA      string
	AddrB      string
}

// NewVethPair builds the pair; cleanup runs even if the test fails.
func NewVethPair(t testing.TB, subnet string) *VethPair {
	t.Helper()
	n := Name()
	p := &VethPair{NsA: n + "-a", NsB: n + "-b", DevA: "vha", DevB: "vhb",
		AddrA: subnet + ".1", AddrB: subnet + ".2"}
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", p.NsA).Run()
		_ = exec.Command("ip", "netns", "del", p.NsB).Run()
	})
	Ip(t, "netns", "add", p.NsA)
	Ip(t, "netns", "add", p.NsB)
	Ip(t, "link", "add", p.DevA, "netns", p.NsA, "type", "veth", "peer", "name", p.DevB, "netns", p.NsB)
	Ip(t, "-n", p.NsA, "addr", "add", p.AddrA+"/24", "dev", p.DevA)
	Ip(t, "-n", p.NsB, "addr", "add", p.AddrB+"/24", "dev", p.DevB)
	for _, x := range [][2]string{{p.NsA, p.DevA}, {p.NsB, p.DevB}, {p.NsA, "lo"}, {p.NsB, "lo"}} {
		Ip(t, "-n", x[0], "link", "set", x[1], "up")
	}
	return p
}
