// Package signing checks the dispatcher's signatures on what it sends
// (docs/security.md, "Signed plans and presets"): an agent with a CA loads a
// plan, or runs a preset, only when it arrives as a SignedMessage whose
// signer certificate chains to that CA, carries the role dispatcher, and
// signed exactly the payload's bytes for this node. So neither a transport
// that terminates TLS somewhere nor a file on the node can add programs, and
// an agent's, the collector's or a user's certificate of the same CA cannot
// sign for the dispatcher.
//
// The signature covers the payload's bytes as received: the agent verifies
// them and only then parses them, because protobuf has no canonical encoding
// to re-create and check.
package signing

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/tlsconf"
)

// Context starts every signed byte string: it keeps hoptrace's signatures
// apart from anything else the dispatcher's key signs (TLS handshakes).
const Context = "hoptrace-signed-message-v1"

// The payload types a signature names (their full protobuf message names).
var (
	TypePlan   = string((&pb.TracePlan{}).ProtoReflect().Descriptor().FullName())
	TypePreset = string((&pb.RunPreset{}).ProtoReflect().Descriptor().FullName())
)

// SignedBytes is what a signature covers:
// Context 0x00 type 0x00 node 0x00 payload. Neither the type nor a node name
// holds a NUL (node names are letters, digits, '.', '_', '-'), so the
// encoding is unambiguous.
func SignedBytes(typ, node string, payload []byte) []byte {
	var b bytes.Buffer
	b.Grow(len(Context) + len(typ) + len(node) + 3 + len(payload))
	for _, s := range []string{Context, typ, node} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	b.Write(payload)
	return b.Bytes()
}

// Reason says why a message was refused; it is the label of the agent's
// hoptrace_agent_signature_refusals_total counter.
type Reason string

// The reasons, each a check of Verify in the order it runs.
const (
	ReasonUnsigned    Reason = "unsigned"    // no signature or no signer certificate
	ReasonNode        Reason = "node"        // signed for another node
	ReasonCertificate Reason = "certificate" // unparsable, expired, or not of the trusted CA
	ReasonRole        Reason = "role"        // a certificate of the CA, but not a dispatcher's
	ReasonSignature   Reason = "signature"   // does not match the bytes
	ReasonPayload     Reason = "payload"     // signed, but not a valid plan or preset
)

// Reasons lists every Reason, for metrics that show zeros too.
var Reasons = []Reason{ReasonUnsigned, ReasonNode, ReasonCertificate, ReasonRole, ReasonSignature, ReasonPayload}

// Error is a refusal: Reason for metrics, the message for the user.
type Error struct {
	Reason Reason
	msg    string
}

func (e *Error) Error() string { return e.msg }

func refuse(r Reason, format string, args ...any) *Error {
	return &Error{Reason: r, msg: fmt.Sprintf(format, args...)}
}

// ReasonOf is the Reason of a refusal error ("" if err is not one).
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// Verifier checks signed messages against one CA and counts what it refused.
type Verifier struct {
	roots *x509.CertPool
	// Now is the time certificates must be valid at (nil = time.Now).
	Now func() time.Time

	mu      sync.Mutex
	refused map[string]map[Reason]uint64 // by payload type
}

// NewVerifier trusts the certificates in caPEM.
func NewVerifier(caPEM []byte) (*Verifier, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no PEM certificate")
	}
	return &Verifier{roots: roots, refused: map[string]map[Reason]uint64{}}, nil
}

// LoadVerifier trusts the CA file at path (the agent's --ca).
func LoadVerifier(path string) (*Verifier, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA for signed plans: %w", err)
	}
	v, err := NewVerifier(b)
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", path, err)
	}
	return v, nil
}

// Verify returns m's payload if m is a message of type typ for node, signed
// by a dispatcher certificate of the trusted CA; a refusal (*Error) otherwise.
// Every refusal is counted.
func (v *Verifier) Verify(typ, node string, m *pb.SignedMessage) ([]byte, error) {
	payload, err := v.verify(typ, node, m)
	if err != nil {
		v.Count(typ, ReasonOf(err))
		return nil, err
	}
	return payload, nil
}

func (v *Verifier) verify(typ, node string, m *pb.SignedMessage) ([]byte, error) {
	if len(m.GetSignature()) == 0 || len(m.GetSignerCert()) == 0 {
		return nil, refuse(ReasonUnsigned, "not signed (no signature or no signer certificate)")
	}
	if m.GetNode() != node {
		return nil, refuse(ReasonNode, "signed for node %q, not for this node %q", m.GetNode(), node)
	}
	cert, err := x509.ParseCertificate(m.GetSignerCert())
	if err != nil {
		return nil, refuse(ReasonCertificate, "signer certificate: %v", err)
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	// Any extended key usage: the dispatcher's certificate is a TLS server's
	// (serverAuth); what makes it the dispatcher's is its role, checked below.
	if _, err := cert.Verify(x509.VerifyOptions{Roots: v.roots, CurrentTime: now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, refuse(ReasonCertificate, "signer certificate %q is not one of the trusted CA: %v", cert.Subject.CommonName, err)
	}
	ou := cert.Subject.OrganizationalUnit
	if len(ou) != 1 || ou[0] != tlsconf.RoleDispatcher {
		return nil, refuse(ReasonRole, "signer certificate %q has role %v, not %s: only the dispatcher signs plans and presets",
			cert.Subject.CommonName, ou, tlsconf.RoleDispatcher)
	}
	// RFC 5280 4.2.1.3: a key that may sign data has digitalSignature set.
	if cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		return nil, refuse(ReasonRole, "signer certificate %q may not sign (no digitalSignature key usage)", cert.Subject.CommonName)
	}
	var algo x509.SignatureAlgorithm
	switch cert.PublicKey.(type) {
	case *ecdsa.PublicKey:
		algo = x509.ECDSAWithSHA256
	case ed25519.PublicKey:
		algo = x509.PureEd25519
	default:
		return nil, refuse(ReasonCertificate, "signer certificate %q has a %T key: want ECDSA or Ed25519", cert.Subject.CommonName, cert.PublicKey)
	}
	if err := cert.CheckSignature(algo, SignedBytes(typ, node, m.GetPayload()), m.GetSignature()); err != nil {
		return nil, refuse(ReasonSignature, "signature by %q does not match the %s's bytes: %v", cert.Subject.CommonName, shortType(typ), err)
	}
	return m.GetPayload(), nil
}

// Plan verifies a signed TracePlan for node and parses it. A signed plan
// carries its object: one naming a file on the node (object_path) is refused,
// since the signature would cover the name, not the file.
func (v *Verifier) Plan(node string, m *pb.SignedMessage) (*pb.TracePlan, error) {
	payload, err := v.Verify(TypePlan, node, m)
	if err != nil {
		return nil, err
	}
	plan := &pb.TracePlan{}
	if err := proto.Unmarshal(payload, plan); err != nil {
		v.Count(TypePlan, ReasonPayload)
		return nil, refuse(ReasonPayload, "signed plan does not parse: %v", err)
	}
	if plan.GetObjectPath() != "" {
		v.Count(TypePlan, ReasonPayload)
		return nil, refuse(ReasonPayload, "signed plan names a file on the node (object_path %q): a signed plan carries its object bytes", plan.GetObjectPath())
	}
	return plan, nil
}

// Preset verifies a signed RunPreset for node and parses it.
func (v *Verifier) Preset(node string, m *pb.SignedMessage) (*pb.RunPreset, error) {
	payload, err := v.Verify(TypePreset, node, m)
	if err != nil {
		return nil, err
	}
	req := &pb.RunPreset{}
	if err := proto.Unmarshal(payload, req); err != nil {
		v.Count(TypePreset, ReasonPayload)
		return nil, refuse(ReasonPayload, "signed preset does not parse: %v", err)
	}
	return req, nil
}

// Unsigned refuses (and counts) an unsigned plan or preset.
func (v *Verifier) Unsigned(typ string) error {
	v.Count(typ, ReasonUnsigned)
	return refuse(ReasonUnsigned, "not signed: this agent trusts a CA and takes only %ss signed by a dispatcher certificate", shortType(typ))
}

// Count records one refusal of a typ message for reason.
func (v *Verifier) Count(typ string, reason Reason) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.refused[typ] == nil {
		v.refused[typ] = map[Reason]uint64{}
	}
	v.refused[typ][reason]++
}

// Refusal is one counter of Refusals.
type Refusal struct {
	Type   string // "plan" or "preset"
	Reason Reason
	Count  uint64
}

// Refusals are the counts by payload type ("plan", "preset") and reason,
// every combination listed.
func (v *Verifier) Refusals() []Refusal {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []Refusal
	for _, typ := range []string{TypePlan, TypePreset} {
		for _, r := range Reasons {
			out = append(out, Refusal{Type: shortType(typ), Reason: r, Count: v.refused[typ][r]})
		}
	}
	return out
}

func shortType(typ string) string {
	switch typ {
	case TypePlan:
		return "plan"
	case TypePreset:
		return "preset"
	}
	return typ
}

// Sign makes a SignedMessage of payload (a serialized message of type typ)
// for node with key and its certificate (DER), as the dispatcher does
// (hoptrace.dispatcher.signing). For tests and tools: the agent never signs.
func Sign(key crypto.Signer, certDER []byte, typ, node string, payload []byte) (*pb.SignedMessage, error) {
	msg := SignedBytes(typ, node, payload)
	var sig []byte
	var err error
	switch key.Public().(type) {
	case *ecdsa.PublicKey:
		digest := sha256.Sum256(msg)
		sig, err = key.Sign(rand.Reader, digest[:], crypto.SHA256)
	case ed25519.PublicKey:
		sig, err = key.Sign(rand.Reader, msg, crypto.Hash(0))
	default:
		return nil, fmt.Errorf("cannot sign with a %T key", key.Public())
	}
	if err != nil {
		return nil, err
	}
	return &pb.SignedMessage{Payload: payload, Node: node, Signature: sig, SignerCert: certDER}, nil
}
