package attach

import (
	"fmt"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// Every attach kind of the proto has its pair of steps, and only those: a kind
// added to trace.proto without a file here fails this test, not a plan.
func TestEveryAttachKindHasItsSteps(t *testing.T) {
	for v, name := range pb.AttachKind_name {
		k, ok := kinds[pb.AttachKind(v)]
		if v == int32(pb.AttachKind_ATTACH_KIND_UNSPECIFIED) {
			if ok {
				t.Errorf("%s has steps", name)
			}
			continue
		}
		if !ok || k.prepare == nil || k.attach == nil {
			t.Errorf("%s has no prepare and attach steps", name)
		}
	}
	if len(kinds) != len(pb.AttachKind_name)-1 {
		t.Errorf("%d kinds have steps, the proto has %d", len(kinds), len(pb.AttachKind_name)-1)
	}
}

// The kinds that attach to a device refuse a hop without one; cgroup kinds
// never look the dev up, and fail on their cgroup.
func TestDeviceUse(t *testing.T) {
	for _, c := range []struct {
		kind      pb.AttachKind
		dev, want string
	}{
		{pb.AttachKind_ATTACH_KIND_TC_INGRESS, "", "hop h: tc-ingress needs a dev"},
		{pb.AttachKind_ATTACH_KIND_TC_EGRESS, "", "hop h: tc-egress needs a dev"},
		{pb.AttachKind_ATTACH_KIND_XDP, "", "hop h: xdp needs a dev"},
		{pb.AttachKind_ATTACH_KIND_CGROUP_INGRESS, "ht-no-such-dev", "hop h: cgroup "},
	} {
		ha := &pb.HopAttach{Name: "h", Kind: c.kind, Program: "p", Dev: c.dev, Cgroup: "ht-no-such-cgroup"}
		_, err := AttachHop(nil, ha, Env{})
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s with dev %q: error %v, want prefix %q", kindName(c.kind), c.dev, err, c.want)
		}
	}
}

// A tracing program the verifier refuses says the verifier's reason, not lockdown's: both come as
// a permission error, only the verifier's carries its log.
func TestVerifierRefusalIsNotWordedAsLockdown(t *testing.T) {
	p := &pending{plan: &pb.HopAttach{Kind: pb.AttachKind_ATTACH_KIND_FENTRY}}
	refused := &ebpf.VerifierError{Cause: unix.EACCES, Log: []string{"combined stack size of 2 calls is 544. Too large"}}
	if err := lockdownRefusal(p, fmt.Errorf("load hop_fentry: %w", refused)); !strings.Contains(err.Error(), "Too large") ||
		strings.Contains(err.Error(), "lockdown") {
		t.Errorf("verifier refusal worded as %q", err)
	}
	locked := &ebpf.VerifierError{Cause: unix.EPERM}
	if err := lockdownRefusal(p, fmt.Errorf("load hop_fentry: %w", locked)); !strings.HasPrefix(err.Error(), "fentry not permitted: ") {
		t.Errorf("lockdown refusal worded as %q", err)
	}
}

// A UDP tagger in a hook of a trace whose TCP tagger shares its sequence starts half the ID space
// away, and samples the same packets of its own count.
func TestHookIDsStartHalfTheSpaceAway(t *testing.T) {
	for _, sample := range []uint32{0, 1, 100} {
		every := uint64(max(sample, 1))
		for _, next := range []uint64{0, 7, 123456789} {
			if got := HookIDs(next, false, sample); got != next {
				t.Errorf("not shared: %d, want %d", got, next)
			}
			got := HookIDs(next, true, sample)
			if got%every != next%every || got/every-next/every != 1<<(record.IDSeqBits-1) {
				t.Errorf("sample %d, next %d: %d is not half the ID space away", sample, next, got)
			}
		}
	}
}
