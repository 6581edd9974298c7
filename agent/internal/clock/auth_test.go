package clock

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// The bytes of an authenticated request and reply, pinned: the collector's
// side (tests/collector/test_clockauth.py) checks the same vector.
func TestAuthWireFormat(t *testing.T) {
	master := bytes.Repeat([]byte{0x42}, 32)
	k := DeriveKey(master, "host-b", 7)
	if got := hex.EncodeToString(k.Secret); got != wireKey {
		t.Errorf("key %s, want %s", got, wireKey)
	}
	var nonce [nonceSize]byte
	for i := range nonce {
		nonce[i] = byte(i)
	}
	req, err := AuthRequest(1_800_000_000_123_456_789, k, nonce)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(req); got != wireRequest {
		t.Errorf("request %s\nwant    %s", got, wireRequest)
	}
	got, gotNonce, err := ParseAuthRequest(req, func(node string, id uint32) []byte {
		return DeriveKey(master, node, id).Secret
	})
	if err != nil || got.Node != "host-b" || got.ID != 7 || !bytes.Equal(gotNonce, nonce[:]) {
		t.Fatalf("parse request: %+v %x %v", got, gotNonce, err)
	}
	header := (&Packet{Version: 4, Mode: modeServer, Stratum: 1, Origin: binary.BigEndian.Uint64(req[40:]),
		Receive: ToNTP(1_800_000_000_123_500_000), Transmit: ToNTP(1_800_000_000_123_510_000)}).Marshal()
	reply := SignReply(header, k, nonce[:])
	if got := hex.EncodeToString(reply); got != wireReply {
		t.Errorf("reply %s\nwant  %s", got, wireReply)
	}
	t2, t3, err := parseAuthReply(reply, k, nonce[:])
	if err != nil || t2 != 1_800_000_000_123_500_000 || t3 != 1_800_000_000_123_510_000 {
		t.Errorf("parse reply: %d %d %v", t2, t3, err)
	}
	// Every byte counts: a flipped bit anywhere is refused, with its reason.
	for i := range reply {
		bad := bytes.Clone(reply)
		bad[i] ^= 1
		_, _, err := parseAuthReply(bad, k, nonce[:])
		var refusal *RefusedError
		if !errors.As(err, &refusal) {
			t.Fatalf("byte %d flipped: taken (%v)", i, err)
		}
		want := RefusedMAC
		switch {
		case i == 0: // mode 4 -> 5
			want = RefusedMalformed
		case i >= PacketSize && i < PacketSize+4:
			want = RefusedUnauthenticated
		case i >= PacketSize+4 && i < PacketSize+8:
			want = RefusedKey
		}
		if refusal.Reason != want {
			t.Errorf("byte %d flipped: %s, want %s", i, refusal.Reason, want)
		}
	}
	// The authentic reply to another probe: refused as such.
	other := nonce
	other[0] ^= 0xff
	if _, _, err := parseAuthReply(reply, k, other[:]); !isRefusal(err, RefusedNonce) {
		t.Errorf("reply to another nonce: %v", err)
	}
	// Another node's key (or another key_id) does not verify.
	if _, _, err := parseAuthReply(reply, DeriveKey(master, "host-a", 7), nonce[:]); !isRefusal(err, RefusedMAC) {
		t.Errorf("another node's key: %v", err)
	}
}

const (
	wireKey     = "d152e8f1617b071f24a0deceeb49dd6101ffc02988223581826687b6b8e753c4"
	wireRequest = "23000000000000000000000000000000000000000000000000000000000000000000000000000000eef450801f9add37" +
		"4854433100000007000102030405060708090a0b0c0d0e0f06686f73742d62ef3f52b0e3197a104dc5132a2285a137"
	wireReply = "240100000000000000000000000000000000000000000000eef450801f9add37eef450801f9db22deef450801f9e59f3" +
		"4854433100000007000102030405060708090a0b0c0d0e0fa9e02f2ba37e3a9f8069178c55522237"
)

func isRefusal(err error, reason string) bool {
	var r *RefusedError
	return errors.As(err, &r) && r.Reason == reason
}

func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	raw := bytes.Repeat([]byte{0xa5}, 32)
	for name, content := range map[string][]byte{
		"raw": raw, "hex": []byte(hex.EncodeToString(raw) + "\n"),
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadKeyFile(p)
		if err != nil || !bytes.Equal(got, raw) {
			t.Errorf("%s: %x %v", name, got, err)
		}
	}
	short := filepath.Join(dir, "short")
	_ = os.WriteFile(short, []byte("0123456789abcdef"), 0o600)
	if _, err := ReadKeyFile(short); err == nil {
		t.Error("a 16-byte key was taken")
	}
}

// relay is an on-path party between a node and the time service: it
// passes requests on and hands the node what rewrite makes of each reply
// (nil: drop it); inject, when set, sends extra datagrams before the real
// reply.
type relay struct {
	conn    *net.UDPConn
	server  *net.UDPAddr
	rewrite func(reply []byte) []byte
	inject  func(reply []byte, earlier [][]byte) [][]byte
	wg      sync.WaitGroup
	replies [][]byte // authentic replies seen, for replays (the relay's goroutine only)
}

func startRelay(t *testing.T, server string, rewrite func([]byte) []byte, inject func([]byte, [][]byte) [][]byte) *relay {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := net.ResolveUDPAddr("udp4", server)
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{conn: conn, server: srv, rewrite: rewrite, inject: inject}
	r.wg.Add(1)
	go r.run()
	t.Cleanup(func() { conn.Close(); r.wg.Wait() })
	return r
}

func (r *relay) addr() string { return r.conn.LocalAddr().String() }

func (r *relay) run() {
	defer r.wg.Done()
	up, err := net.DialUDP("udp4", nil, r.server)
	if err != nil {
		return
	}
	defer up.Close()
	buf := make([]byte, 512)
	for {
		n, client, err := r.conn.ReadFromUDP(buf)
		if err != nil {
			return
		}
		if _, err := up.Write(buf[:n]); err != nil {
			return
		}
		_ = up.SetReadDeadline(time.Now().Add(time.Second))
		m, err := up.Read(buf)
		if err != nil {
			continue
		}
		reply := bytes.Clone(buf[:m])
		if r.inject != nil {
			for _, extra := range r.inject(reply, r.replies) {
				_, _ = r.conn.WriteToUDP(extra, client)
			}
		}
		r.replies = append(r.replies, bytes.Clone(reply))
		if out := r.rewrite(reply); out != nil {
			_, _ = r.conn.WriteToUDP(out, client)
		}
	}
}

// shiftTimes moves a reply's T2 and T3 by d, as a man in the middle that
// wants the node to think the master's clock is d later.
func shiftTimes(d time.Duration) func([]byte) []byte {
	return func(b []byte) []byte {
		for _, at := range []int{32, 40} {
			binary.BigEndian.PutUint64(b[at:], ToNTP(FromNTP(binary.BigEndian.Uint64(b[at:]))+int64(d)))
		}
		return b
	}
}

func authServer(t *testing.T, master []byte) *Server {
	t.Helper()
	s, err := StartAuthServer("127.0.0.1:0", 0, func(node string, id uint32) []byte {
		if id != 1 {
			return nil
		}
		return DeriveKey(master, node, id).Secret
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A man in the middle shifting the server's timestamps by 5 ms moves a
// plain-NTP node's offset by exactly that; an authenticated node refuses
// every such reply, counts it, and keeps no estimate (unknown, never
// shifted).
func TestForgedRepliesAreRefused(t *testing.T) {
	master := bytes.Repeat([]byte{7}, 32)
	srv := authServer(t, master)
	mitm := startRelay(t, srv.Addr(), shiftTimes(5*time.Millisecond), nil)

	plain := NewNode(Config{Server: mitm.addr(), Probes: 20})
	m, err := plain.Round(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	within(t, "plain NTP through the relay: offset", m.OffsetNs, -5_000_000, max(m.BoundNs, 100_000))

	keys := StaticKeyring(DeriveKey(master, "host-b", 1))
	n := NewNode(Config{Server: mitm.addr(), Probes: 20, Timeout: 100 * time.Millisecond, Keys: keys})
	if _, err := n.Round(context.Background()); !isRefusal(err, RefusedMAC) {
		t.Fatalf("authenticated round through the relay: %v", err)
	}
	st := n.Stats()
	if st.Refused[RefusedMAC] < 3 || st.Rounds != 0 || st.RoundFailures != 1 || !st.Authenticated || !st.KeyValid {
		t.Errorf("stats %+v", st)
	}
	if c := n.NodeClock(0); c.GetBoundNs() != 0 || c.GetOffsetNs() != 0 {
		t.Errorf("a refused round left an estimate: %v", c)
	}
	// Straight to the server, the same node's rounds are taken.
	direct := NewNode(Config{Server: srv.Addr(), Probes: 20, Keys: keys})
	m, err = direct.Round(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	within(t, "authenticated offset", m.OffsetNs, 0, max(m.BoundNs, 100_000))
	if len(direct.Stats().Refused) != 0 {
		t.Errorf("refusals without an attacker: %v", direct.Stats().Refused)
	}
}

// Replies played again, or forged ones sent ahead of the real answer, are
// refused and counted; the real answers still make the round.
func TestReplayedAndInjectedRepliesAreRefused(t *testing.T) {
	master := bytes.Repeat([]byte{9}, 32)
	srv := authServer(t, master)
	mitm := startRelay(t, srv.Addr(), func(b []byte) []byte { return b }, func(b []byte, earlier [][]byte) [][]byte {
		forged := shiftTimes(5 * time.Millisecond)(bytes.Clone(b))
		out := [][]byte{forged, b[:PacketSize]} // rewritten, and stripped of its trailer
		if len(earlier) > 0 {
			out = append(out, earlier[0]) // the authentic reply to the first probe, played again
		}
		return out
	})
	n := NewNode(Config{Server: mitm.addr(), Probes: 20, Keys: StaticKeyring(DeriveKey(master, "host-c", 1))})
	m, err := n.Round(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	within(t, "offset", m.OffsetNs, 0, max(m.BoundNs, 100_000))
	st := n.Stats()
	t.Logf("probes %d, refused %v", m.Probes, st.Refused)
	if m.Probes != 20 || st.Refused[RefusedMAC] != 20 || st.Refused[RefusedUnauthenticated] != 20 || st.Refused[RefusedNonce] != 19 {
		t.Errorf("probes %d refused %v", m.Probes, st.Refused)
	}
}

// A plain NTP server's answers are refused by an authenticated node; a node
// without a key runs no round at all.
func TestAuthenticatedNodeNeverFallsBack(t *testing.T) {
	srv := startNTPServer(t, 0)
	n := NewNode(Config{Server: srv.addr, Probes: 5, Timeout: 50 * time.Millisecond,
		Keys: StaticKeyring(DeriveKey([]byte("k"), "n", 0))})
	if _, err := n.Round(context.Background()); err == nil {
		t.Fatal("a plain server's answers were taken")
	}
	if st := n.Stats(); st.Refused[RefusedUnauthenticated] < maxMisses || st.Rounds != 0 || n.NodeClock(0).GetBoundNs() != 0 {
		t.Errorf("plain answers: stats %+v", st)
	}
	ring := NewKeyring()
	none := NewNode(Config{Server: srv.addr, Probes: 5, Keys: ring})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := none.Round(ctx); !errors.Is(err, errNoKey) {
		t.Errorf("round without a key: %v", err)
	}
	select {
	case <-ring.Refresh():
	default:
		t.Error("no refresh asked for")
	}
	if st := none.Stats(); st.KeyValid || st.RoundFailures != 1 || none.NodeClock(0).GetBoundNs() != 0 {
		t.Errorf("stats %+v", st)
	}
	// An expired key is no key.
	ring.Set(DeriveKey([]byte("k"), "n", 1), time.Nanosecond)
	time.Sleep(time.Millisecond)
	if _, ok := ring.Current(); ok {
		t.Error("expired key still current")
	}
}
