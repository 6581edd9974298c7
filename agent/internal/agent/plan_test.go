package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/signing"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// A plan file is either signed by a dispatcher certificate of --ca, or bare
// and run only with --allow-unsigned-plan.
func TestReadPlanFile(t *testing.T) {
	ca := tu.NewPKI(t)
	dispatcher := ca.Issue(t, "dispatcher", "dispatcher", nil, nil)
	agentCert := ca.Issue(t, "agent", "host-a", nil, nil)
	v, err := signing.NewVerifier(ca.PEM)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	plan := &pb.TracePlan{Trace: "t", Generation: 2, Object: []byte("object bytes"),
		Hops: []*pb.HopAttach{{Name: "h", Kind: pb.AttachKind_ATTACH_KIND_TC_EGRESS, Program: "hop_tc", Dev: "lo"}}}
	payload, _ := proto.Marshal(plan)
	write := func(name string, m proto.Message) string {
		b, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	sign := func(by tu.Leaf, node string) *pb.SignedMessage {
		m, err := signing.Sign(by.Key, by.DER, signing.TypePlan, node, payload)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	good := write("signed.json", sign(dispatcher, "host-a"))
	got, err := ReadPlan(good, "host-a", v, false, log)
	if err != nil || !proto.Equal(got, plan) {
		t.Fatalf("signed plan file: %v, %v", got, err)
	}
	byAgent := write("by-agent.json", sign(agentCert, "host-a"))
	tampered := sign(dispatcher, "host-a")
	tampered.Payload[len(tampered.Payload)-1] ^= 1
	bare := write("bare.json", plan)
	for _, tc := range []struct {
		path, node    string
		v             *signing.Verifier
		allowUnsigned bool
		want          string
	}{
		{byAgent, "host-a", v, false, `refused, nothing attached: signer certificate "host-a" has role [agent], not dispatcher`},
		{write("tampered.json", tampered), "host-a", v, false, "does not match the plan's bytes"},
		{good, "host-b", v, false, `signed for node "host-a", not for this node "host-b"`},
		{good, "host-a", nil, false, "is signed: pass --ca"},
		{good, "host-a", nil, true, "is signed: pass --ca"},
		{bare, "host-a", v, false, "is not signed: sign it (`hoptrace plan sign`) and pass --ca, or pass --allow-unsigned-plan"},
		{bare, "host-a", nil, false, "is not signed"},
	} {
		got, err := ReadPlan(tc.path, tc.node, tc.v, tc.allowUnsigned, log)
		if err == nil || got != nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s as %s: got %v, %v; want an error saying %q", filepath.Base(tc.path), tc.node, got, err, tc.want)
		}
	}
	// A bare plan runs when root asks for it explicitly.
	if got, err := ReadPlan(bare, "host-a", v, true, log); err != nil || !proto.Equal(got, plan) {
		t.Fatalf("bare plan with --allow-unsigned-plan: %v, %v", got, err)
	}
}
