package testutil

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"sync/atomic"
	"testing"
	"time"
)

// PKI is a CA and the certificates `hoptrace certs` issues under it (subject
// O=hoptrace, OU=role, CN=name; ECDSA P-256), made with crypto/x509 the way
// common/certs.py makes them.
type PKI struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	PEM  []byte // the CA certificate, as an agent's --ca file holds it
}

// Leaf is an issued certificate (DER) and its key.
type Leaf struct {
	DER []byte
	Key crypto.Signer
}

var serial atomic.Int64

// NewPKI makes a CA.
func NewPKI(t testing.TB) PKI {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)),
		Subject:   pkix.Name{Organization: []string{"hoptrace"}, OrganizationalUnit: []string{"ca"}, CommonName: "hoptrace CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return PKI{cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Issue a certificate of role (OU) and name (CN) for key (nil = a new P-256
// key); mod, if set, may change the template first.
func (p PKI) Issue(t testing.TB, role, name string, key crypto.Signer, mod func(*x509.Certificate)) Leaf {
	t.Helper()
	if key == nil {
		key, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)),
		Subject:   pkix.Name{Organization: []string{"hoptrace"}, OrganizationalUnit: []string{role}, CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if mod != nil {
		mod(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.Cert, key.Public(), p.Key)
	if err != nil {
		t.Fatal(err)
	}
	return Leaf{der, key}
}
