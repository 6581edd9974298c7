// Package signing checks the dispatcher's signatures on what it sends
// (docs/security.md, "Signed commands"): an agent with a CA applies a plan,
// removes a trace or runs a preset only when the command arrives as a
// SignedMessage whose signer certificate chains to that CA, carries the role
// dispatcher, is not revoked, and signed exactly the payload's bytes for
// this node; and only when the command is fresh: not past its expiry, its
// sequence above the last this agent took from that signer for that trace,
// its generation not older than one it took for the trace. So neither a
// transport that terminates TLS somewhere nor a file on the node can add
// programs or remove them, an agent's, the collector's or a user's
// certificate of the same CA cannot sign for the dispatcher, and a command
// the dispatcher once signed cannot be played again.
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

// The payload types a signature names (their full protobuf message names):
// the dispatcher's commands, and plan files (hoptrace plan sign).
var (
	TypeCommand = string((&pb.Command{}).ProtoReflect().Descriptor().FullName())
	TypePlan    = string((&pb.TracePlan{}).ProtoReflect().Descriptor().FullName())
)

// The kinds of refused message, the type label of the refusals counter.
const (
	KindPlan   = "plan"
	KindRemove = "remove"
	KindPreset = "preset"
	// A signed command whose payload does not parse.
	KindCommand = "command"
)

// Kinds lists every kind, for metrics that show zeros too.
var Kinds = []string{KindPlan, KindRemove, KindPreset, KindCommand}

// Freshness bounds.
const (
	// DefaultMaxClockSkew is how far the dispatcher's clock may be from the
	// agent's (--max-clock-skew): a command counts as expired only this long
	// after its expires_at, and as signed in the future only this far ahead.
	DefaultMaxClockSkew = 30 * time.Second
	// MaxCommandLifetime is the longest a command may be valid after it was
	// signed (expires_at - signed_at). It bounds how long the agent must
	// remember a sequence: past it, every command signed before is expired.
	MaxCommandLifetime = 10 * time.Minute
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

// The reasons, each a check of Verify and Command in the order it runs.
const (
	ReasonUnsigned    Reason = "unsigned"    // no signature or no signer certificate
	ReasonNode        Reason = "node"        // signed for another node
	ReasonCertificate Reason = "certificate" // unparsable, expired, or not of the trusted CA
	ReasonRevoked     Reason = "revoked"     // the signer certificate is on the CA's CRL (--crl)
	ReasonRole        Reason = "role"        // a certificate of the CA, but not a dispatcher's
	ReasonSignature   Reason = "signature"   // does not match the bytes
	ReasonPayload     Reason = "payload"     // signed, but not a valid command or plan
	ReasonExpired     Reason = "expired"     // past its expiry, or signed in the future
	ReasonReplayed    Reason = "replayed"    // its sequence or generation is not newer than one taken
)

// Reasons lists every Reason, for metrics that show zeros too.
var Reasons = []Reason{ReasonUnsigned, ReasonNode, ReasonCertificate, ReasonRevoked, ReasonRole, ReasonSignature,
	ReasonPayload, ReasonExpired, ReasonReplayed}

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

// Verifier checks signed messages against one CA, remembers the commands it
// took, and counts what it refused.
type Verifier struct {
	roots *x509.CertPool
	// Now is the time certificates and commands must be valid at (nil =
	// time.Now).
	Now func() time.Time
	// CRL refuses revoked signer certificates (nil = none).
	CRL *tlsconf.RevocationList
	// MaxClockSkew is the difference between the dispatcher's clock and
	// this agent's that expiry allows for (set by NewVerifier to
	// DefaultMaxClockSkew).
	MaxClockSkew time.Duration

	mu      sync.Mutex
	refused map[string]map[Reason]uint64 // by kind
	// What the agent took; kept in statePath too when set (Persist), so
	// that a restarted agent still refuses it (docs/security.md).
	sequences   map[sequenceKey]taken // the last sequence per signer and trace
	generations map[string]taken      // the newest generation per trace
	statePath   string
}

// sequenceKey is one signer (its certificate's SHA-256) and one trace ("" for
// presets).
type sequenceKey struct {
	signer [sha256.Size]byte
	trace  string
}

// taken is a sequence or generation and when the agent took it.
type taken struct {
	value uint64
	at    time.Time
}

// NewVerifier trusts the certificates in caPEM.
func NewVerifier(caPEM []byte) (*Verifier, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no PEM certificate")
	}
	return &Verifier{roots: roots, MaxClockSkew: DefaultMaxClockSkew, refused: map[string]map[Reason]uint64{},
		sequences: map[sequenceKey]taken{}, generations: map[string]taken{}}, nil
}

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
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

// verify returns the signer's certificate if m is a message of type typ for
// node, signed by a dispatcher certificate of the trusted CA that the CRL
// does not revoke; a refusal (*Error) otherwise.
func (v *Verifier) verify(typ, node string, m *pb.SignedMessage) (*x509.Certificate, error) {
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
	// Any extended key usage: the dispatcher's certificate is a TLS server's
	// (serverAuth); what makes it the dispatcher's is its role, checked below.
	if _, err := cert.Verify(x509.VerifyOptions{Roots: v.roots, CurrentTime: v.now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, refuse(ReasonCertificate, "signer certificate %q is not one of the trusted CA: %v", cert.Subject.CommonName, err)
	}
	if err := v.CRL.Check(cert); err != nil {
		return nil, refuse(ReasonRevoked, "signer %v", err)
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
	return cert, nil
}

// Plan verifies a signed plan file (hoptrace plan sign, hoptrace-agent run
// --plan) for node and parses it. A plan file is a bare TracePlan signed once:
// it carries no sequence and no expiry, so it is taken from a file only,
// never from the dispatcher's session (whose commands are Commands). A signed
// plan carries its object: one naming a file on the node (object_path) is
// refused, since the signature would cover the name, not the file.
func (v *Verifier) Plan(node string, m *pb.SignedMessage) (*pb.TracePlan, error) {
	plan, err := v.plan(node, m)
	if err != nil {
		v.Count(KindPlan, ReasonOf(err))
		return nil, err
	}
	return plan, nil
}

func (v *Verifier) plan(node string, m *pb.SignedMessage) (*pb.TracePlan, error) {
	if _, err := v.verify(TypePlan, node, m); err != nil {
		return nil, err
	}
	plan := &pb.TracePlan{}
	if err := proto.Unmarshal(m.GetPayload(), plan); err != nil {
		return nil, refuse(ReasonPayload, "signed plan does not parse: %v", err)
	}
	if err := objectInPlan(plan); err != nil {
		return nil, err
	}
	return plan, nil
}

func objectInPlan(plan *pb.TracePlan) error {
	if plan.GetObjectPath() != "" {
		return refuse(ReasonPayload, "signed plan names a file on the node (object_path %q): a signed plan carries its object bytes", plan.GetObjectPath())
	}
	return nil
}

// KindOf is the kind of command m carries, read from its bytes whether or not
// they are signed: for labels only.
func KindOf(m *pb.SignedMessage) string {
	c := &pb.Command{}
	if proto.Unmarshal(m.GetPayload(), c) != nil {
		return KindCommand
	}
	return KindOfCommand(c)
}

// KindOfCommand is the kind of command c.
func KindOfCommand(c *pb.Command) string {
	switch {
	case c.GetApply() != nil:
		return KindPlan
	case c.GetRemove() != nil:
		return KindRemove
	case c.GetRunPreset() != nil:
		return KindPreset
	}
	return KindCommand
}

// Command verifies a signed command for node, checks that it is fresh, and
// remembers it as taken: the next command of the same signer for the same
// trace must have a higher sequence. Refusals (*Error) are counted by the
// command's kind.
func (v *Verifier) Command(node string, m *pb.SignedMessage) (*pb.Command, error) {
	c, err := v.command(node, m)
	if err != nil {
		if r := ReasonOf(err); r != "" { // not a failure to write the state
			v.Count(KindOf(m), r)
		}
		return nil, err
	}
	return c, nil
}

func (v *Verifier) command(node string, m *pb.SignedMessage) (*pb.Command, error) {
	cert, err := v.verify(TypeCommand, node, m)
	if err != nil {
		return nil, err
	}
	c := &pb.Command{}
	if err := proto.Unmarshal(m.GetPayload(), c); err != nil {
		return nil, refuse(ReasonPayload, "signed command does not parse: %v", err)
	}
	var trace string
	var generation uint64
	switch {
	case c.GetApply() != nil:
		if err := objectInPlan(c.GetApply()); err != nil {
			return nil, err
		}
		trace, generation = c.GetApply().GetTrace(), c.GetApply().GetGeneration()
		if trace == "" {
			return nil, refuse(ReasonPayload, "signed plan names no trace")
		}
	case c.GetRemove() != nil:
		trace, generation = c.GetRemove().GetTrace(), c.GetRemove().GetGeneration()
		if trace == "" {
			return nil, refuse(ReasonPayload, "signed removal names no trace")
		}
	case c.GetRunPreset() != nil:
	default:
		return nil, refuse(ReasonPayload, "signed command orders nothing")
	}
	if err := v.fresh(c); err != nil {
		return nil, err
	}
	if err := v.take(sequenceKey{sha256.Sum256(cert.Raw), trace}, c.GetSequence(), trace, generation, KindOfCommand(c)); err != nil {
		return nil, err
	}
	return c, nil
}

// fresh refuses a command past its expiry, signed in the future, or valid
// for longer than MaxCommandLifetime; both ends allow MaxClockSkew.
func (v *Verifier) fresh(c *pb.Command) error {
	if c.GetSignedAt() == nil || c.GetExpiresAt() == nil {
		return refuse(ReasonPayload, "signed command has no signed_at or expires_at: an agent takes only commands that expire")
	}
	signed, expires := c.GetSignedAt().AsTime(), c.GetExpiresAt().AsTime()
	if life := expires.Sub(signed); life > MaxCommandLifetime {
		return refuse(ReasonPayload, "signed command is valid for %s, longer than the %s an agent takes (the dispatcher's --command-ttl)",
			life, MaxCommandLifetime)
	}
	now := v.now()
	if ahead := signed.Sub(now); ahead > v.MaxClockSkew {
		return refuse(ReasonExpired, "signed command is signed %s ahead of this agent's clock, more than --max-clock-skew %s: check both clocks",
			ahead.Round(time.Millisecond), v.MaxClockSkew)
	}
	if late := now.Sub(expires); late > v.MaxClockSkew {
		return refuse(ReasonExpired, "signed command expired at %s, %s ago (--max-clock-skew %s)",
			expires.UTC().Format(time.RFC3339Nano), late.Round(time.Millisecond), v.MaxClockSkew)
	}
	return nil
}

// take refuses a sequence not above the last taken for key, and a
// generation older than the newest taken for the trace; otherwise it
// remembers both, in the state file too when there is one: a command whose
// sequence cannot be written there is not taken. Entries older than a
// command can live are forgotten.
func (v *Verifier) take(key sequenceKey, sequence uint64, trace string, generation uint64, kind string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	v.forget(now)
	what := "presets"
	if trace != "" {
		what = fmt.Sprintf("trace %q", trace)
	}
	if last, ok := v.sequences[key]; ok && sequence <= last.value {
		return refuse(ReasonReplayed, "replayed %s command: sequence %d is not above %d, the last this agent took from this signer for %s",
			kind, sequence, last.value, what)
	}
	if trace != "" {
		if newest, ok := v.generations[trace]; ok && generation < newest.value {
			return refuse(ReasonReplayed, "replayed %s command: generation %d of trace %q is older than generation %d, which this agent already took",
				kind, generation, trace, newest.value)
		}
	}
	lastSequence, hadSequence := v.sequences[key]
	lastGeneration, hadGeneration := v.generations[trace]
	if trace != "" {
		v.generations[trace] = taken{generation, now}
	}
	v.sequences[key] = taken{sequence, now}
	if err := v.save(); err != nil {
		restore(v.sequences, key, lastSequence, hadSequence)
		if trace != "" {
			restore(v.generations, trace, lastGeneration, hadGeneration)
		}
		return fmt.Errorf("%s command not taken: %w", kind, err)
	}
	return nil
}

func restore[K comparable](m map[K]taken, k K, t taken, had bool) {
	if had {
		m[k] = t
	} else {
		delete(m, k)
	}
}

// forget drops what was taken longer ago than any command can live, clock
// skew on both sides included: every command signed before it has expired.
// The caller holds mu.
func (v *Verifier) forget(now time.Time) {
	horizon := now.Add(-(MaxCommandLifetime + 2*v.MaxClockSkew))
	for k, t := range v.sequences {
		if t.at.Before(horizon) {
			delete(v.sequences, k)
		}
	}
	for k, t := range v.generations {
		if t.at.Before(horizon) {
			delete(v.generations, k)
		}
	}
}

// Remembered is how many sequences and generations the verifier holds.
func (v *Verifier) Remembered() (sequences, generations int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.sequences), len(v.generations)
}

// Unsigned refuses (and counts) an unsigned command of kind (KindPlan,
// KindRemove, KindPreset).
func (v *Verifier) Unsigned(kind string) error {
	v.Count(kind, ReasonUnsigned)
	what := map[string]string{KindPlan: "plans", KindRemove: "removals", KindPreset: "presets"}[kind]
	return refuse(ReasonUnsigned, "not signed: this agent trusts a CA and takes only %s signed by a dispatcher certificate", what)
}

// Count records one refusal of a message of kind (KindPlan, ...) for reason.
func (v *Verifier) Count(kind string, reason Reason) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.refused[kind] == nil {
		v.refused[kind] = map[Reason]uint64{}
	}
	v.refused[kind][reason]++
}

// Refusal is one counter of Refusals.
type Refusal struct {
	Type   string // a kind: "plan", "remove", "preset", "command"
	Reason Reason
	Count  uint64
}

// Refusals are the counts by kind and reason, every combination listed.
func (v *Verifier) Refusals() []Refusal {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []Refusal
	for _, kind := range Kinds {
		for _, r := range Reasons {
			out = append(out, Refusal{Type: kind, Reason: r, Count: v.refused[kind][r]})
		}
	}
	return out
}

func shortType(typ string) string {
	switch typ {
	case TypePlan:
		return "plan"
	case TypeCommand:
		return "command"
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

// SignCommand signs command c for node, as the dispatcher does. For tests and
// tools: the agent never signs.
func SignCommand(key crypto.Signer, certDER []byte, node string, c *pb.Command) (*pb.SignedMessage, error) {
	b, err := proto.Marshal(c)
	if err != nil {
		return nil, err
	}
	return Sign(key, certDER, TypeCommand, node, b)
}
