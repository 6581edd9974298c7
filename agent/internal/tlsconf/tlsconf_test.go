package tlsconf

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T) issuer {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA", OrganizationalUnit: []string{"ca"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return issuer{cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf writes NAME.pem/.key signed by ca, for role (subject OU), as a server
// of 127.0.0.1 or a client; returns the file paths.
func (ca issuer) leaf(t *testing.T, dir, name, role string, server bool) (string, string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name, OrganizationalUnit: []string{role}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certPath, keyPath := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key")
	must(t, os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	must(t, os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return certPath, keyPath
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// serve accepts one TLS connection with the server certificate and
// requires a client certificate of clientCA.
func serve(t *testing.T, files [2]string, clientCA issuer) string {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(files[0], files[1])
	must(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(clientCA.cert)
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})
	must(t, err)
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	return lis.Addr().String()
}

func TestClientAcceptsOnlyTheRoleItDials(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	caPath := filepath.Join(dir, "ca.pem")
	must(t, os.WriteFile(caPath, ca.pem, 0o600))
	agentCert, agentKey := ca.leaf(t, dir, "host-a", RoleAgent, false)
	files := Files{CA: caPath, Cert: agentCert, Key: agentKey}
	dispatcherAddr := serve(t, pair(ca.leaf(t, dir, "dispatcher", RoleDispatcher, true)), ca)
	collectorAddr := serve(t, pair(ca.leaf(t, dir, "collector", RoleCollector, true)), ca)

	cfg, id, err := Client(files, RoleDispatcher)
	must(t, err)
	if id != (Identity{Role: RoleAgent, Name: "host-a"}) {
		t.Fatalf("identity %+v", id)
	}
	dial := func(addr string, cfg *tls.Config) error {
		c := cfg.Clone()
		c.ServerName = "127.0.0.1"
		conn, err := tls.Dial("tcp", addr, c)
		if err == nil {
			conn.Close()
		}
		return err
	}
	if err := dial(dispatcherAddr, cfg); err != nil {
		t.Fatalf("dispatcher refused: %v", err)
	}
	if err := dial(collectorAddr, cfg); err == nil || !strings.Contains(err.Error(), "has role [collector], not dispatcher") {
		t.Fatalf("a collector certificate passed for the dispatcher: %v", err)
	}

	// A dispatcher certificate of another CA is refused by chain verification.
	other := newCA(t)
	otherDir := t.TempDir()
	c, k := other.leaf(t, otherDir, "dispatcher", RoleDispatcher, true)
	if err := dial(serve(t, [2]string{c, k}, ca), cfg); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("a dispatcher of another CA was accepted: %v", err)
	}
}

func pair(certPath, keyPath string) [2]string { return [2]string{certPath, keyPath} }

func TestValidateNeedsAllFiles(t *testing.T) {
	err := Files{CA: "ca.pem"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "missing [--cert --key]") {
		t.Fatalf("got %v", err)
	}
	if !(Files{}).Empty() {
		t.Fatal("zero Files not empty")
	}
}

func TestSelfCheck(t *testing.T) {
	dir := t.TempDir()
	ca, other := newCA(t), newCA(t)
	caPath := filepath.Join(dir, "ca.pem")
	must(t, os.WriteFile(caPath, ca.pem, 0o600))
	good := pair(ca.leaf(t, dir, "host-a", RoleAgent, false))
	if err := SelfCheck(Files{CA: caPath, Cert: good[0], Key: good[1]}, "host-a"); err != nil {
		t.Fatalf("own certificate refused: %v", err)
	}
	if err := SelfCheck(Files{CA: caPath, Cert: good[0], Key: good[1]}, "host-b"); err == nil || !strings.Contains(err.Error(), `not an agent certificate for node "host-b"`) {
		t.Fatalf("another node's certificate passed: %v", err)
	}
	foreign := pair(other.leaf(t, t.TempDir(), "host-a", RoleAgent, false))
	if err := SelfCheck(Files{CA: caPath, Cert: foreign[0], Key: foreign[1]}, "host-a"); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("a certificate of another CA passed: %v", err)
	}
}
