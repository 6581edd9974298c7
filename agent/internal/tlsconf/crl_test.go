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
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// crlCA is a CA that may sign CRLs, as `hoptrace certs` makes it.
func crlCA(t *testing.T) issuer {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA", OrganizationalUnit: []string{"ca"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	cert, _ := x509.ParseCertificate(der)
	return issuer{cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// writeCRL replaces path with ca's CRL number n revoking the certificates
// of certPaths.
func (ca issuer) writeCRL(t *testing.T, path string, n int64, certPaths ...string) {
	t.Helper()
	var entries []x509.RevocationListEntry
	for _, p := range certPaths {
		b, err := os.ReadFile(p)
		must(t, err)
		block, _ := pem.Decode(b)
		c, err := x509.ParseCertificate(block.Bytes)
		must(t, err)
		entries = append(entries, x509.RevocationListEntry{SerialNumber: c.SerialNumber, RevocationTime: time.Now()})
	}
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(n), ThisUpdate: time.Now(),
		NextUpdate: time.Now().Add(time.Hour), RevokedCertificateEntries: entries}, ca.cert, ca.key)
	must(t, err)
	must(t, os.WriteFile(path+".tmp", pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der}), 0o600))
	must(t, os.Rename(path+".tmp", path))
}

// TestClientRefusesARevokedServer: with --crl, a dispatcher whose certificate
// the CA revoked fails the handshake, from the moment the file says so; a
// CRL that is not the CA's, or older than the one read, is not taken.
func TestClientRefusesARevokedServer(t *testing.T) {
	dir := t.TempDir()
	ca := crlCA(t)
	caPath := filepath.Join(dir, "ca.pem")
	must(t, os.WriteFile(caPath, ca.pem, 0o600))
	agentCert, agentKey := ca.leaf(t, dir, "host-a", RoleAgent, false)
	dispatcherCert, dispatcherKey := ca.leaf(t, dir, "dispatcher", RoleDispatcher, true)
	addr := serve(t, [2]string{dispatcherCert, dispatcherKey}, ca)
	crlPath := filepath.Join(dir, "ca.crl")
	ca.writeCRL(t, crlPath, 1)

	cfg, _, err := Client(Files{CA: caPath, Cert: agentCert, Key: agentKey, CRL: crlPath}, RoleDispatcher)
	must(t, err)
	cfg.ServerName = "127.0.0.1"
	dial := func() error {
		conn, err := tls.Dial("tcp", addr, cfg)
		if err == nil {
			conn.Close()
		}
		return err
	}
	must(t, dial())

	// Another CA's list is not taken: the dispatcher stays trusted.
	other := crlCA(t)
	other.writeCRL(t, crlPath, 5, dispatcherCert)
	time.Sleep(PollInterval + 100*time.Millisecond) // the next handshake looks at the file again
	if err := dial(); err != nil {
		t.Fatalf("a CRL of another CA revoked the dispatcher: %v", err)
	}

	ca.writeCRL(t, crlPath, 2, dispatcherCert)
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := dial()
		if err != nil {
			if !strings.Contains(err.Error(), `certificate "dispatcher" (role dispatcher, serial `) || !strings.Contains(err.Error(), "is revoked by "+crlPath) {
				t.Fatalf("refused, but not as revoked: %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the revoked dispatcher is still trusted 5 s after the CRL changed")
		}
		time.Sleep(100 * time.Millisecond)
	}

	// An older list (number 1) would un-revoke: it is not taken.
	ca.writeCRL(t, crlPath, 1)
	time.Sleep(PollInterval + 100*time.Millisecond)
	if err := dial(); err == nil {
		t.Fatal("an older CRL un-revoked the dispatcher")
	}

	// A CRL file that does not exist, or of another CA, fails at start.
	if _, _, err := Client(Files{CA: caPath, Cert: agentCert, Key: agentKey, CRL: filepath.Join(dir, "none.crl")}, RoleDispatcher); err == nil {
		t.Fatal("a missing CRL file was taken")
	}
	otherPath := filepath.Join(dir, "other.crl")
	other.writeCRL(t, otherPath, 1)
	if _, _, err := Client(Files{CA: caPath, Cert: agentCert, Key: agentKey, CRL: otherPath}, RoleDispatcher); err == nil ||
		!strings.Contains(err.Error(), "is not signed by the CA") {
		t.Fatalf("another CA's CRL at start: %v", err)
	}
}
