package clock

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// Authenticated clock rounds. The exchange stays what it is (UDP, kernel
// timestamps at both ends); each request and reply carries a trailer after
// the 48-byte NTP header (collector/clockauth.py is the other side, and
// TestAuthWireFormat pins the bytes for both):
//
//	request: header(48) "HTC1" key_id(4) nonce(16) len(1) node tag(16)
//	reply:   header(48) "HTC1" key_id(4) nonce(16) tag(16)
//
// tag = HMAC-SHA256(K, label ‖ every byte before the tag)[:16], the labels
// telling a request from a reply. K is the node's key of key_id:
// HMAC-SHA256(master, "hoptrace clock key v1" 0 node 0 key_id). The nonce is
// random per probe and the reply must echo it, so a reply to another probe
// (a late one, or a reply recorded and played again) is refused, as is one
// whose header (T2, T3) or nonce an on-path party changed.

const (
	authMagic   = "HTC1"
	nonceSize   = 16
	tagSize     = 16
	keySize     = sha256.Size
	replyAuthAt = PacketSize + len(authMagic) + 4 + nonceSize // where a reply's tag starts
	replySize   = replyAuthAt + tagSize
)

var (
	requestLabel = []byte("hoptrace clock request v1\x00")
	replyLabel   = []byte("hoptrace clock reply v1\x00")
	keyLabel     = []byte("hoptrace clock key v1\x00")
)

// Key authenticates one node's clock rounds.
type Key struct {
	ID     uint32 // key_id: 0 for a key file's, the collector's epoch otherwise
	Secret []byte // K, 32 bytes
	Node   string
}

// DeriveKey is the node's key of keyID under master (the collector's secret,
// or a --clock-key-file).
func DeriveKey(master []byte, node string, keyID uint32) Key {
	mac := hmac.New(sha256.New, master)
	mac.Write(keyLabel)
	mac.Write([]byte(node))
	var id [5]byte
	binary.BigEndian.PutUint32(id[1:], keyID)
	mac.Write(id[:])
	return Key{ID: keyID, Secret: mac.Sum(nil), Node: node}
}

// ReadKeyFile reads a --clock-key-file: at least 32 bytes of secret, as
// written (hex or raw); surrounding whitespace of a hex file is ignored.
func ReadKeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("clock key file: %w", err)
	}
	if h, err := hex.DecodeString(strings.TrimSpace(string(b))); err == nil {
		b = h
	}
	if len(b) < 32 {
		return nil, fmt.Errorf("clock key file %s: %d bytes of secret, want at least 32 (e.g. head -c 32 /dev/urandom > FILE)", path, len(b))
	}
	return b, nil
}

func tag(key []byte, label, msg []byte) []byte {
	mac := hmac.New(sha256.New, key)
	mac.Write(label)
	mac.Write(msg)
	return mac.Sum(nil)[:tagSize]
}

// AuthRequest is a client request carrying t1 (as Request) and the trailer
// authenticating it with k and nonce.
func AuthRequest(t1UnixNs int64, k Key, nonce [nonceSize]byte) ([]byte, error) {
	if len(k.Node) == 0 || len(k.Node) > 255 {
		return nil, fmt.Errorf("clock key: node name of %d bytes (1..255)", len(k.Node))
	}
	b := Request(t1UnixNs)
	b = append(b, authMagic...)
	b = binary.BigEndian.AppendUint32(b, k.ID)
	b = append(b, nonce[:]...)
	b = append(b, byte(len(k.Node)))
	b = append(b, k.Node...)
	return append(b, tag(k.Secret, requestLabel, b)...), nil
}

// SignReply appends the reply trailer to a 48-byte reply header (the test
// server's side; the collector's is clockauth.py).
func SignReply(header []byte, k Key, nonce []byte) []byte {
	b := append(header[:PacketSize:PacketSize], authMagic...)
	b = binary.BigEndian.AppendUint32(b, k.ID)
	b = append(b, nonce...)
	return append(b, tag(k.Secret, replyLabel, b)...)
}

// ParseAuthRequest checks a request's trailer with keyOf (the key of a node
// and key_id, nil when there is none) and returns its key and nonce.
func ParseAuthRequest(b []byte, keyOf func(node string, id uint32) []byte) (Key, []byte, error) {
	if len(b) < PacketSize+len(authMagic)+4+nonceSize+1+tagSize || string(b[PacketSize:PacketSize+4]) != authMagic {
		return Key{}, nil, errors.New("unauthenticated request")
	}
	id := binary.BigEndian.Uint32(b[PacketSize+4:])
	nonce := b[PacketSize+8 : PacketSize+8+nonceSize]
	n := int(b[PacketSize+8+nonceSize])
	end := PacketSize + 8 + nonceSize + 1 + n
	if len(b) != end+tagSize {
		return Key{}, nil, errors.New("malformed request trailer")
	}
	node := string(b[end-n : end])
	secret := keyOf(node, id)
	if secret == nil {
		return Key{}, nil, fmt.Errorf("no key %d for node %q", id, node)
	}
	if !hmac.Equal(tag(secret, requestLabel, b[:end]), b[end:]) {
		return Key{}, nil, errors.New("request MAC does not verify")
	}
	return Key{ID: id, Secret: secret, Node: node}, nonce, nil
}

// Reasons a reply is refused (hoptrace_agent_clock_replies_refused_total).
const (
	RefusedUnauthenticated = "unauthenticated" // no trailer: an answer anyone could have sent
	RefusedKey             = "key"             // another key_id than the request's
	RefusedMAC             = "mac"             // the tag does not verify: forged, or T2/T3/nonce rewritten
	RefusedNonce           = "nonce"           // authentic, but answers another probe: late, or played again
	RefusedMalformed       = "malformed"       // not a server reply of this protocol
)

// RefusedError is a reply taken for nothing, and why.
type RefusedError struct{ Reason, Detail string }

func (e *RefusedError) Error() string { return "clock reply refused (" + e.Reason + "): " + e.Detail }

func refused(reason, detail string) error { return &RefusedError{Reason: reason, Detail: detail} }

// parseAuthReply checks b against the request sent with k and nonce and
// returns T2 and T3 only when it is the server's authentic answer to it.
func parseAuthReply(b []byte, k Key, nonce []byte) (t2, t3 int64, err error) {
	p, err := ParsePacket(b)
	if err != nil {
		return 0, 0, refused(RefusedMalformed, err.Error())
	}
	if p.Mode != modeServer {
		return 0, 0, refused(RefusedMalformed, fmt.Sprintf("mode %d", p.Mode))
	}
	if len(b) != replySize || string(b[PacketSize:PacketSize+4]) != authMagic {
		return 0, 0, refused(RefusedUnauthenticated, fmt.Sprintf("%d bytes without the HTC1 trailer", len(b)))
	}
	if id := binary.BigEndian.Uint32(b[PacketSize+4:]); id != k.ID {
		return 0, 0, refused(RefusedKey, fmt.Sprintf("key_id %d, the request's is %d", id, k.ID))
	}
	if !hmac.Equal(tag(k.Secret, replyLabel, b[:replyAuthAt]), b[replyAuthAt:]) {
		return 0, 0, refused(RefusedMAC, "the tag does not match the reply's bytes")
	}
	if !hmac.Equal(b[PacketSize+8:replyAuthAt], nonce) {
		return 0, 0, refused(RefusedNonce, "it answers another request")
	}
	if p.Receive == 0 || p.Transmit == 0 {
		return 0, 0, refused(RefusedMalformed, "no receive/transmit timestamps")
	}
	return FromNTP(p.Receive), FromNTP(p.Transmit), nil
}

func newNonce() [nonceSize]byte {
	var n [nonceSize]byte
	_, _ = rand.Read(n[:]) // crypto/rand never fails on Linux (getrandom)
	return n
}

// Keyring holds the node's current clock key: a key file's for good, or
// the collector's until it expires (refreshed by collector.ClockKeys).
type Keyring struct {
	mu      sync.Mutex
	key     Key
	has     bool
	until   time.Time // zero = no expiry
	ready   chan struct{}
	once    sync.Once
	refresh chan struct{}
}

// NewKeyring is an empty ring: rounds wait for Set.
func NewKeyring() *Keyring {
	return &Keyring{ready: make(chan struct{}), refresh: make(chan struct{}, 1)}
}

// StaticKeyring holds k for good (a --clock-key-file).
func StaticKeyring(k Key) *Keyring {
	r := NewKeyring()
	r.Set(k, 0)
	return r
}

// Set takes a new key, valid for validFor (0 = no expiry).
func (r *Keyring) Set(k Key, validFor time.Duration) {
	r.mu.Lock()
	r.key, r.has = k, true
	r.until = time.Time{}
	if validFor > 0 {
		r.until = time.Now().Add(validFor)
	}
	r.mu.Unlock()
	r.once.Do(func() { close(r.ready) })
}

// Current is the key to use now; false when there is none or it expired.
func (r *Keyring) Current() (Key, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.has || (!r.until.IsZero() && time.Now().After(r.until)) {
		return Key{}, false
	}
	return r.key, true
}

// Wait waits up to max for a first key.
func (r *Keyring) Wait(ctx context.Context, max time.Duration) {
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-r.ready:
	case <-ctx.Done():
	case <-t.C:
	}
}

// AskRefresh tells the key's source to fetch a new one now (a round with
// this key got no answer: the collector restarted, or rotated past it).
func (r *Keyring) AskRefresh() {
	select {
	case r.refresh <- struct{}{}:
	default:
	}
}

// Refresh delivers AskRefresh's requests.
func (r *Keyring) Refresh() <-chan struct{} { return r.refresh }
