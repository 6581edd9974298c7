package signing

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/testutil"
	"github.com/hoptrace/hoptrace/agent/internal/tlsconf"
)

// clock is the verifier's time in these tests: the dispatcher signs at it
// (within the test certificates' validity).
var clock = time.Now().UTC().Truncate(time.Second)

// fresh gives c sequence seq, signed now (clock) and valid for a minute.
func fresh(seq uint64, c *pb.Command) *pb.Command {
	c.Sequence = seq
	c.SignedAt, c.ExpiresAt = timestamppb.New(clock), timestamppb.New(clock.Add(time.Minute))
	return c
}

func applyCmd(seq uint64, trace string, generation uint64) *pb.Command {
	p := testPlan()
	p.Trace, p.Generation = trace, generation
	return fresh(seq, &pb.Command{Action: &pb.Command_Apply{Apply: p}})
}

func removeCmd(seq uint64, trace string, generation uint64) *pb.Command {
	return fresh(seq, &pb.Command{Action: &pb.Command_Remove{Remove: &pb.RemoveTrace{Trace: trace, Generation: generation}}})
}

func signCommand(t *testing.T, by leaf, node string, c *pb.Command) *pb.SignedMessage {
	t.Helper()
	m, err := SignCommand(by.Key, by.DER, node, c)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// verifierAt is a verifier of ca whose clock reads *now.
func verifierAt(t *testing.T, ca testutil.PKI, now *time.Time) *Verifier {
	t.Helper()
	v, err := NewVerifier(ca.PEM)
	if err != nil {
		t.Fatal(err)
	}
	v.Now = func() time.Time { return *now }
	return v
}

func counted(v *Verifier) map[string]uint64 {
	out := map[string]uint64{}
	for _, r := range v.Refusals() {
		if r.Count != 0 {
			out[r.Type+"/"+string(r.Reason)] = r.Count
		}
	}
	return out
}

func wantRefused(t *testing.T, err error, reason Reason, text string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want a refusal %q saying %q", reason, text)
	}
	if ReasonOf(err) != reason || !strings.Contains(err.Error(), text) {
		t.Fatalf("refusal %q %q; want %q saying %q", ReasonOf(err), err, reason, text)
	}
}

// TestCommandReplayRefused: a command already taken, or one whose sequence is
// not above the last taken from its signer for its trace, or whose
// generation is older than one taken for the trace, is refused as replayed
// and counted; sequences are per signer and per trace.
func TestCommandReplayRefused(t *testing.T) {
	ca := newPKI(t)
	now := clock
	v := verifierAt(t, ca, &now)
	dispatcher := ca.Issue(t, "dispatcher", "dispatcher", nil, nil)

	first := signCommand(t, dispatcher, "host-a", applyCmd(100, "t", 5))
	if _, err := v.Command("host-a", first); err != nil {
		t.Fatalf("a fresh command was refused: %v", err)
	}
	_, err := v.Command("host-a", first)
	wantRefused(t, err, ReasonReplayed, `replayed plan command: sequence 100 is not above 100, the last this agent took from this signer for trace "t"`)
	_, err = v.Command("host-a", signCommand(t, dispatcher, "host-a", applyCmd(99, "t", 6)))
	wantRefused(t, err, ReasonReplayed, "sequence 99 is not above 100")
	// Another trace has a sequence of its own; a later command of the first
	// trace with an older generation is refused all the same.
	if _, err := v.Command("host-a", signCommand(t, dispatcher, "host-a", applyCmd(50, "u", 1))); err != nil {
		t.Fatalf("trace u's first command was refused: %v", err)
	}
	_, err = v.Command("host-a", signCommand(t, dispatcher, "host-a", applyCmd(101, "t", 4)))
	wantRefused(t, err, ReasonReplayed, `generation 4 of trace "t" is older than generation 5`)
	// The same generation again (the dispatcher pushes a plan again after a
	// reconnect) and a removal of it pass; the plan played after the removal
	// does not.
	if _, err := v.Command("host-a", signCommand(t, dispatcher, "host-a", applyCmd(102, "t", 5))); err != nil {
		t.Fatalf("the same generation under a new sequence was refused: %v", err)
	}
	if _, err := v.Command("host-a", signCommand(t, dispatcher, "host-a", removeCmd(103, "t", 7))); err != nil {
		t.Fatalf("the removal was refused: %v", err)
	}
	_, err = v.Command("host-a", first)
	wantRefused(t, err, ReasonReplayed, "sequence 100 is not above 103")
	// Another dispatcher certificate (re-issued) has its own sequence, but
	// the generations are the trace's.
	reissued := ca.Issue(t, "dispatcher", "dispatcher", nil, nil)
	_, err = v.Command("host-a", signCommand(t, reissued, "host-a", applyCmd(1, "t", 6)))
	wantRefused(t, err, ReasonReplayed, `generation 6 of trace "t" is older than generation 7`)
	if _, err := v.Command("host-a", signCommand(t, reissued, "host-a", applyCmd(2, "t", 8))); err != nil {
		t.Fatalf("the re-issued certificate's first command was refused: %v", err)
	}
	if got, want := counted(v), map[string]uint64{"plan/replayed": 5}; !mapsEqual(got, want) {
		t.Fatalf("counted %v, want %v", got, want)
	}
}

// TestCommandExpiry: past expires_at plus the clock skew allowed, or signed
// further ahead than it, a command is refused as expired; within the skew
// it passes. A command without an expiry, or valid for longer than
// MaxCommandLifetime, is refused as malformed.
func TestCommandExpiry(t *testing.T) {
	ca := newPKI(t)
	dispatcher := ca.Issue(t, "dispatcher", "dispatcher", nil, nil)
	for _, tc := range []struct {
		name   string
		now    time.Time
		edit   func(c *pb.Command)
		reason Reason
		text   string
	}{
		{"within its minute", clock.Add(59 * time.Second), nil, "", ""},
		{"expired, within the skew", clock.Add(time.Minute + 29*time.Second), nil, "", ""},
		{"expired", clock.Add(time.Minute + 31*time.Second), nil, ReasonExpired,
			"signed command expired at " + clock.Add(time.Minute).Format(time.RFC3339Nano) + ", 31s ago (--max-clock-skew 30s)"},
		{"signed in the future, within the skew", clock.Add(-29 * time.Second), nil, "", ""},
		{"signed in the future", clock.Add(-time.Minute), nil, ReasonExpired,
			"signed 1m0s ahead of this agent's clock, more than --max-clock-skew 30s"},
		{"no expiry", clock, func(c *pb.Command) { c.ExpiresAt = nil }, ReasonPayload, "has no signed_at or expires_at"},
		{"valid too long", clock, func(c *pb.Command) { c.ExpiresAt = timestamppb.New(clock.Add(11 * time.Minute)) },
			ReasonPayload, "is valid for 11m0s, longer than the 10m0s an agent takes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := tc.now
			v := verifierAt(t, ca, &now)
			c := removeCmd(1, "t", 1)
			if tc.edit != nil {
				tc.edit(c)
			}
			_, err := v.Command("host-a", signCommand(t, dispatcher, "host-a", c))
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			wantRefused(t, err, tc.reason, tc.text)
			if got := counted(v); !mapsEqual(got, map[string]uint64{"remove/" + string(tc.reason): 1}) {
				t.Fatalf("counted %v", got)
			}
		})
	}
}

// TestCommandSignatures: what the plan checks refuse, commands refuse too,
// counted under the command's kind; a command signed for another node, a
// plan file offered as a command and a command that orders nothing are
// refused.
func TestCommandSignatures(t *testing.T) {
	ca, other := newPKI(t), newPKI(t)
	now := clock
	dispatcher := ca.Issue(t, "dispatcher", "dispatcher", nil, nil)
	for _, tc := range []struct {
		name   string
		msg    func() *pb.SignedMessage
		kind   string
		reason Reason
		text   string
	}{
		{"forged: the dispatcher's certificate, another key's signature", func() *pb.SignedMessage {
			m := signCommand(t, ca.Issue(t, "agent", "host-a", nil, nil), "host-a", removeCmd(1, "t", 1))
			m.SignerCert = dispatcher.DER
			return m
		}, KindRemove, ReasonSignature, `signature by "dispatcher" does not match the command's bytes`},
		{"sequence changed after signing", func() *pb.SignedMessage {
			m := signCommand(t, dispatcher, "host-a", applyCmd(1, "t", 1))
			c := &pb.Command{}
			if err := proto.Unmarshal(m.Payload, c); err != nil {
				t.Fatal(err)
			}
			c.Sequence = 1 << 62
			m.Payload = mustMarshal(t, c)
			return m
		}, KindPlan, ReasonSignature, "does not match the command's bytes"},
		{"expiry extended after signing", func() *pb.SignedMessage {
			m := signCommand(t, dispatcher, "host-a", removeCmd(1, "t", 1))
			c := &pb.Command{}
			_ = proto.Unmarshal(m.Payload, c)
			c.ExpiresAt = timestamppb.New(clock.Add(time.Hour))
			m.Payload = mustMarshal(t, c)
			return m
		}, KindRemove, ReasonSignature, "does not match the command's bytes"},
		{"another CA", func() *pb.SignedMessage {
			return signCommand(t, other.Issue(t, "dispatcher", "dispatcher", nil, nil), "host-a", removeCmd(1, "t", 1))
		}, KindRemove, ReasonCertificate, "is not one of the trusted CA"},
		{"signed for another node", func() *pb.SignedMessage {
			return signCommand(t, dispatcher, "host-b", applyCmd(1, "t", 1))
		}, KindPlan, ReasonNode, `signed for node "host-b"`},
		{"a plan file offered as a command", func() *pb.SignedMessage {
			return signPlan(t, dispatcher, "host-a", testPlan())
		}, KindCommand, ReasonSignature, "does not match the command's bytes"},
		{"orders nothing", func() *pb.SignedMessage {
			return signCommand(t, dispatcher, "host-a", fresh(1, &pb.Command{}))
		}, KindCommand, ReasonPayload, "orders nothing"},
		{"a plan naming a file on the node", func() *pb.SignedMessage {
			c := applyCmd(1, "t", 1)
			c.GetApply().Object, c.GetApply().ObjectPath = nil, "/tmp/evil.o"
			return signCommand(t, dispatcher, "host-a", c)
		}, KindPlan, ReasonPayload, "names a file on the node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := verifierAt(t, ca, &now)
			_, err := v.Command("host-a", tc.msg())
			wantRefused(t, err, tc.reason, tc.text)
			if got := counted(v); !mapsEqual(got, map[string]uint64{tc.kind + "/" + string(tc.reason): 1}) {
				t.Fatalf("counted %v", got)
			}
			if seqs, gens := v.Remembered(); seqs != 0 || gens != 0 {
				t.Fatalf("a refused command was remembered: %d sequences, %d generations", seqs, gens)
			}
		})
	}
}

// TestCommandMemoryIsBounded: what was taken is forgotten once every command
// signed before it has expired, and not before.
func TestCommandMemoryIsBounded(t *testing.T) {
	ca := newPKI(t)
	now := clock
	v := verifierAt(t, ca, &now)
	dispatcher := ca.Issue(t, "dispatcher", "dispatcher", nil, nil)
	old := signCommand(t, dispatcher, "host-a", applyCmd(10, "t", 3))
	if _, err := v.Command("host-a", old); err != nil {
		t.Fatal(err)
	}
	horizon := MaxCommandLifetime + 2*DefaultMaxClockSkew
	now = clock.Add(horizon - time.Second)
	c := applyCmd(11, "u", 1)
	c.SignedAt, c.ExpiresAt = timestamppb.New(now), timestamppb.New(now.Add(time.Minute))
	if _, err := v.Command("host-a", signCommand(t, dispatcher, "host-a", c)); err != nil {
		t.Fatal(err)
	}
	if seqs, gens := v.Remembered(); seqs != 2 || gens != 2 {
		t.Fatalf("remembered %d sequences, %d generations; want 2, 2", seqs, gens)
	}
	now = clock.Add(horizon + time.Second)
	c = applyCmd(12, "u", 1)
	c.SignedAt, c.ExpiresAt = timestamppb.New(now), timestamppb.New(now.Add(time.Minute))
	if _, err := v.Command("host-a", signCommand(t, dispatcher, "host-a", c)); err != nil {
		t.Fatal(err)
	}
	if seqs, gens := v.Remembered(); seqs != 1 || gens != 1 {
		t.Fatalf("trace t's memory outlived every command signed before it: %d sequences, %d generations", seqs, gens)
	}
}

// TestRevokedSigner: a dispatcher certificate on the CA's CRL signs nothing
// the agent takes, from the moment the CRL file says so (no restart).
func TestRevokedSigner(t *testing.T) {
	dir := t.TempDir()
	ca := crlPKI(t)
	caPath := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caPath, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	dispatcher := ca.Issue(t, "dispatcher", "dispatcher", nil, nil)
	cert, _ := x509.ParseCertificate(dispatcher.DER)
	crlPath := filepath.Join(dir, "ca.crl")
	writeCRL(t, ca, crlPath, 1)
	crl, err := tlsconf.LoadRevocationList(crlPath, caPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := NewVerifier(ca.PEM)
	v.CRL = crl
	sign := func(seq uint64) *pb.SignedMessage {
		c := removeCmd(seq, "t", 1)
		c.SignedAt, c.ExpiresAt = timestamppb.Now(), timestamppb.New(time.Now().Add(time.Minute))
		return signCommand(t, dispatcher, "host-a", c)
	}
	if _, err := v.Command("host-a", sign(1)); err != nil {
		t.Fatalf("refused before the revocation: %v", err)
	}
	writeCRL(t, ca, crlPath, 2, cert.SerialNumber)
	deadline := time.Now().Add(5 * time.Second)
	for seq := uint64(2); ; seq++ {
		_, err := v.Command("host-a", sign(seq))
		if err != nil {
			wantRefused(t, err, ReasonRevoked, `signer certificate "dispatcher" (role dispatcher, serial `+cert.SerialNumber.Text(16)+") is revoked by "+crlPath)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the revoked signer is still taken 5 s after the CRL changed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A plan file of the revoked signer too.
	_, err = v.Plan("host-a", signPlan(t, dispatcher, "host-a", testPlan()))
	wantRefused(t, err, ReasonRevoked, "is revoked")
}

// crlPKI is a CA that may sign CRLs (RFC 5280 4.2.1.3: cRLSign), as
// `hoptrace certs` makes it.
func crlPKI(t *testing.T) testutil.PKI {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1),
		Subject:   pkix.Name{Organization: []string{"hoptrace"}, OrganizationalUnit: []string{"ca"}, CommonName: "hoptrace CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return testutil.PKI{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// writeCRL writes ca's CRL number n revoking serials, replacing the file
// (a new inode, as `hoptrace revoke` writes it).
func writeCRL(t *testing.T, ca testutil.PKI, path string, n int64, serials ...*big.Int) {
	t.Helper()
	var entries []x509.RevocationListEntry
	for _, s := range serials {
		entries = append(entries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: time.Now().Add(-time.Minute)})
	}
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(n), ThisUpdate: time.Now().Add(-time.Minute),
		NextUpdate: time.Now().Add(time.Hour), RevokedCertificateEntries: entries}, ca.Cert, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func mapsEqual(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
