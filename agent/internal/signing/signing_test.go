package signing

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/testutil"
)

type leaf = testutil.Leaf

func newPKI(t *testing.T) testutil.PKI { return testutil.NewPKI(t) }

func testPlan() *pb.TracePlan {
	return &pb.TracePlan{
		Trace: "udp-a-to-b", Generation: 7, Sample: 1,
		Object: []byte("\x7fELF pretend object bytes: the verifier checks bytes, the loader checks ELF"),
		Match:  &pb.FlowMatch{IpProto: 17, DstPort: 9000},
		Hops: []*pb.HopAttach{
			{HopIndex: 0, Name: "a-c1-out", Kind: pb.AttachKind_ATTACH_KIND_TC_EGRESS, Program: "hop_tc", Dev: "eth0", Netns: "c1", TagUdp: true},
			{HopIndex: 1, Name: "a-wire-out", Kind: pb.AttachKind_ATTACH_KIND_TC_EGRESS, Program: "hop_tc", Dev: "wire0"},
		},
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func signPlan(t *testing.T, by leaf, node string, plan *pb.TracePlan) *pb.SignedMessage {
	t.Helper()
	m, err := Sign(by.Key, by.DER, TypePlan, node, mustMarshal(t, plan))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestValidSignatureAccepted(t *testing.T) {
	ca := newPKI(t)
	v, err := NewVerifier(ca.PEM)
	if err != nil {
		t.Fatal(err)
	}
	dispatcher := ca.Issue(t, "dispatcher", "dispatcher", nil, nil)
	want := testPlan()
	got, err := v.Plan("host-a", signPlan(t, dispatcher, "host-a", want))
	if err != nil {
		t.Fatalf("a plan the dispatcher signed for this node was refused: %v", err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("verified plan differs from the signed one:\n got %v\nwant %v", got, want)
	}
	// Ed25519 certificates work as well (crypto/x509 PureEd25519).
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	ed := ca.Issue(t, "dispatcher", "dispatcher", edKey, nil)
	if _, err := v.Plan("host-a", signPlan(t, ed, "host-a", want)); err != nil {
		t.Fatalf("an Ed25519 dispatcher signature was refused: %v", err)
	}
	for _, r := range v.Refusals() {
		if r.Count != 0 {
			t.Fatalf("accepted messages counted as refused: %+v", v.Refusals())
		}
	}
	// A signed preset command too.
	req := &pb.RunPreset{Id: "42", Preset: "mace", Args: map[string]string{"container": "c1", "duration": "3000ms"}}
	c := fresh(1, &pb.Command{Action: &pb.Command_RunPreset{RunPreset: req}})
	got2, err := v.Command("host-a", signCommand(t, dispatcher, "host-a", c))
	if err != nil || !proto.Equal(got2.GetRunPreset(), req) {
		t.Fatalf("signed preset: got %v, %v; want %v", got2, err, req)
	}
}

func TestRefusals(t *testing.T) {
	ca, other := newPKI(t), newPKI(t)
	dispatcher := ca.Issue(t, "dispatcher", "dispatcher", nil, nil)
	signed := func(t *testing.T) *pb.SignedMessage { return signPlan(t, dispatcher, "host-a", testPlan()) }
	// The payload's bytes with one field changed after signing.
	tamper := func(t *testing.T, edit func(*pb.TracePlan)) *pb.SignedMessage {
		m := signed(t)
		p := &pb.TracePlan{}
		if err := proto.Unmarshal(m.Payload, p); err != nil {
			t.Fatal(err)
		}
		edit(p)
		m.Payload = mustMarshal(t, p)
		return m
	}
	cases := []struct {
		name   string
		msg    func(t *testing.T) *pb.SignedMessage
		reason Reason
		text   string
	}{
		{"object byte flipped", func(t *testing.T) *pb.SignedMessage {
			return tamper(t, func(p *pb.TracePlan) { p.Object[len(p.Object)-1] ^= 0x01 })
		}, ReasonSignature, `signature by "dispatcher" does not match the plan's bytes`},
		{"payload byte flipped (raw)", func(t *testing.T) *pb.SignedMessage {
			m := signed(t)
			m.Payload[len(m.Payload)/2] ^= 0x80
			return m
		}, ReasonSignature, "does not match the plan's bytes"},
		{"hop device changed", func(t *testing.T) *pb.SignedMessage {
			return tamper(t, func(p *pb.TracePlan) { p.Hops[1].Dev = "eth1" })
		}, ReasonSignature, "does not match the plan's bytes"},
		{"hop added", func(t *testing.T) *pb.SignedMessage {
			return tamper(t, func(p *pb.TracePlan) {
				p.Hops = append(p.Hops, &pb.HopAttach{HopIndex: 2, Name: "x", Kind: pb.AttachKind_ATTACH_KIND_XDP, Program: "hop_xdp", Dev: "eth0"})
			})
		}, ReasonSignature, "does not match the plan's bytes"},
		{"filter widened", func(t *testing.T) *pb.SignedMessage {
			return tamper(t, func(p *pb.TracePlan) { p.Match.DstPort = 0 })
		}, ReasonSignature, "does not match the plan's bytes"},
		{"signed by an agent certificate of the same CA", func(t *testing.T) *pb.SignedMessage {
			agent := ca.Issue(t, "agent", "host-a", nil, func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth} })
			return signPlan(t, agent, "host-a", testPlan())
		}, ReasonRole, `signer certificate "host-a" has role [agent], not dispatcher`},
		{"signed by the collector's certificate of the same CA", func(t *testing.T) *pb.SignedMessage {
			return signPlan(t, ca.Issue(t, "collector", "collector", nil, nil), "host-a", testPlan())
		}, ReasonRole, `signer certificate "collector" has role [collector], not dispatcher`},
		{"signed by a user's certificate of the same CA", func(t *testing.T) *pb.SignedMessage {
			return signPlan(t, ca.Issue(t, "client", "admin", nil, nil), "host-a", testPlan())
		}, ReasonRole, `has role [client], not dispatcher`},
		{"signed by the CA key itself", func(t *testing.T) *pb.SignedMessage {
			return signPlan(t, leaf{DER: ca.Cert.Raw, Key: ca.Key}, "host-a", testPlan())
		}, ReasonRole, `has role [ca], not dispatcher`},
		{"dispatcher certificate of another CA", func(t *testing.T) *pb.SignedMessage {
			return signPlan(t, other.Issue(t, "dispatcher", "dispatcher", nil, nil), "host-a", testPlan())
		}, ReasonCertificate, `signer certificate "dispatcher" is not one of the trusted CA`},
		{"expired dispatcher certificate", func(t *testing.T) *pb.SignedMessage {
			old := ca.Issue(t, "dispatcher", "dispatcher", nil, func(c *x509.Certificate) {
				c.NotBefore, c.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour)
			})
			return signPlan(t, old, "host-a", testPlan())
		}, ReasonCertificate, "is not one of the trusted CA"},
		{"dispatcher certificate without digitalSignature", func(t *testing.T) *pb.SignedMessage {
			return signPlan(t, ca.Issue(t, "dispatcher", "dispatcher", nil, func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageKeyAgreement }), "host-a", testPlan())
		}, ReasonRole, "may not sign"},
		{"real signer certificate, another key's signature", func(t *testing.T) *pb.SignedMessage {
			m := signPlan(t, ca.Issue(t, "agent", "host-a", nil, nil), "host-a", testPlan())
			m.SignerCert = dispatcher.DER // claims to be the dispatcher
			return m
		}, ReasonSignature, `signature by "dispatcher" does not match`},
		{"garbage certificate", func(t *testing.T) *pb.SignedMessage {
			m := signed(t)
			m.SignerCert = []byte("not DER")
			return m
		}, ReasonCertificate, "signer certificate: "},
		{"no signature", func(t *testing.T) *pb.SignedMessage {
			m := signed(t)
			m.Signature = nil
			return m
		}, ReasonUnsigned, "not signed"},
		{"no signer certificate", func(t *testing.T) *pb.SignedMessage {
			m := signed(t)
			m.SignerCert = nil
			return m
		}, ReasonUnsigned, "not signed"},
		{"signed for another node", func(t *testing.T) *pb.SignedMessage {
			return signPlan(t, dispatcher, "host-b", testPlan())
		}, ReasonNode, `signed for node "host-b", not for this node "host-a"`},
		{"another node's plan relabelled for this node", func(t *testing.T) *pb.SignedMessage {
			m := signPlan(t, dispatcher, "host-b", testPlan())
			m.Node = "host-a"
			return m
		}, ReasonSignature, "does not match the plan's bytes"},
		{"a signed command passed off as a plan file", func(t *testing.T) *pb.SignedMessage {
			m, err := Sign(dispatcher.Key, dispatcher.DER, TypeCommand, "host-a", mustMarshal(t, testPlan()))
			if err != nil {
				t.Fatal(err)
			}
			return m
		}, ReasonSignature, "does not match the plan's bytes"},
		{"signed plan naming a file on the node", func(t *testing.T) *pb.SignedMessage {
			p := testPlan()
			p.Object, p.ObjectPath = nil, "/tmp/evil.o"
			return signPlan(t, dispatcher, "host-a", p)
		}, ReasonPayload, `names a file on the node (object_path "/tmp/evil.o")`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewVerifier(ca.PEM)
			if err != nil {
				t.Fatal(err)
			}
			plan, err := v.Plan("host-a", tc.msg(t))
			if err == nil {
				t.Fatalf("accepted: %v", plan)
			}
			if plan != nil {
				t.Fatalf("a refusal returned a plan: %v", plan)
			}
			if got := ReasonOf(err); got != tc.reason {
				t.Fatalf("reason %q, want %q (error: %v)", got, tc.reason, err)
			}
			if !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("error %q does not say %q", err, tc.text)
			}
			counted := map[Reason]uint64{}
			for _, r := range v.Refusals() {
				if r.Type == "plan" {
					counted[r.Reason] = r.Count
				} else if r.Count != 0 {
					t.Fatalf("a plan refusal counted as a preset's: %+v", r)
				}
			}
			if counted[tc.reason] != 1 {
				t.Fatalf("refusal not counted once under %q: %v", tc.reason, counted)
			}
		})
	}
}

func TestUnsignedCounted(t *testing.T) {
	ca := newPKI(t)
	v, _ := NewVerifier(ca.PEM)
	err := v.Unsigned(KindPreset)
	if ReasonOf(err) != ReasonUnsigned || !strings.Contains(err.Error(), "takes only presets signed by a dispatcher certificate") {
		t.Fatalf("unsigned preset: %v", err)
	}
	for _, r := range v.Refusals() {
		want := uint64(0)
		if r.Type == "preset" && r.Reason == ReasonUnsigned {
			want = 1
		}
		if r.Count != want {
			t.Fatalf("%+v: want count %d", r, want)
		}
	}
}

func TestSignedBytesSeparatesFields(t *testing.T) {
	// The same bytes under another type or node are another message.
	a := SignedBytes(TypePlan, "host-a", []byte("x"))
	for _, b := range [][]byte{SignedBytes(TypeCommand, "host-a", []byte("x")), SignedBytes(TypePlan, "host-ab", []byte("x")[1:]),
		SignedBytes(TypePlan, "host-", []byte("ax"))} {
		if string(a) == string(b) {
			t.Fatalf("%q collides", b)
		}
	}
	if TypePlan != "hoptrace.v1.TracePlan" || TypeCommand != "hoptrace.v1.Command" {
		t.Fatalf("types %q %q: the dispatcher signs with the full message names", TypePlan, TypeCommand)
	}
}
