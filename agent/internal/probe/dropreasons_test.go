package probe

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
	"github.com/hoptrace/hoptrace/agent/internal/tracefs"
)

// The table from BTF names every reason as the kernel's own skb:kfree_skb format does: its print fmt
// lists __print_symbolic(REC->reason, { 2, "NOT_SPECIFIED" }, { 3, "NO_SOCKET" }, ...), the kernel's
// value -> name pairs by another route than BTF. A kernel before 5.17 has neither.
func TestDropReasonsAreTheKernelsNames(t *testing.T) {
	tu.RequireRoot(t)
	names, err := DropReasons()
	if err != nil {
		t.Fatal(err)
	}
	if KfreeSkbReasonMissing() != "" {
		if len(names) != 0 {
			t.Errorf("no reason argument, but %d reason names", len(names))
		}
		return
	}
	root, err := tracefs.Root()
	if err != nil {
		t.Fatal(err)
	}
	format, err := os.ReadFile(filepath.Join(root, "events/skb/kfree_skb/format"))
	if err != nil {
		t.Fatal(err)
	}
	pairs := regexp.MustCompile(`\{ (\d+), "([A-Z0-9_]+)" \}`).FindAllStringSubmatch(string(format), -1)
	if len(pairs) < 10 {
		t.Fatalf("skb:kfree_skb's format names %d reasons:\n%s", len(pairs), format)
	}
	for _, p := range pairs {
		if p[2] == "MAX" { // a bound the format lists, not a reason
			continue
		}
		value, _ := strconv.ParseUint(p[1], 10, 32)
		if got := names[uint32(value)]; got != p[2] {
			t.Errorf("reason %d: BTF names it %q, the tracepoint's format %q", value, got, p[2])
		}
	}
	for _, want := range []string{"NO_SOCKET", "NETFILTER_DROP"} { // both from 5.17
		found := false
		for _, name := range names {
			found = found || name == want
		}
		if !found {
			t.Errorf("no reason %s in %v", want, names)
		}
	}
	if c := Capabilities(); len(c.GetDropReasons()) != len(names) {
		t.Errorf("capabilities report %d reasons, BTF has %d", len(c.GetDropReasons()), len(names))
	}
	t.Logf("%d reasons, %d in the tracepoint's format", len(names), len(pairs))
}
