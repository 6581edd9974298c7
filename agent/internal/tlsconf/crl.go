package tlsconf

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"sync"
	"time"
)

// RevocationList is the CA's certificate revocation list (--crl, RFC 5280
// section 5), read again when the file changes: its modification time or
// size, looked at no more than once per PollInterval. A file that no longer
// reads or is not signed by the CA keeps the list read before (and says so
// once), so a half-written file never lets a revoked certificate back in.
type RevocationList struct {
	path string
	cas  []*x509.Certificate
	log  *slog.Logger

	mu      sync.Mutex
	stamp   fileStamp
	polled  time.Time
	revoked map[string]time.Time // serial number (hex) -> revocation time
	number  *big.Int
	failed  string // the last reload error said, so it is said once
}

type fileStamp struct {
	mtime time.Time
	size  int64
}

// PollInterval bounds how often the file's stamp is looked at.
const PollInterval = time.Second

// RevokedError refuses a revoked certificate.
type RevokedError struct {
	Subject, Role string
	Serial        string
	At            time.Time
	CRL           string
}

func (e *RevokedError) Error() string {
	return fmt.Sprintf("certificate %q (role %s, serial %s) is revoked by %s since %s", e.Subject, e.Role, e.Serial,
		e.CRL, e.At.UTC().Format(time.RFC3339))
}

// LoadRevocationList reads the CRL at path (PEM "X509 CRL" or DER), which
// must be signed by a certificate of the CA file caPath.
func LoadRevocationList(path, caPath string, log *slog.Logger) (*RevocationList, error) {
	caPEM, err := os.ReadFile(caPath)
	if err != nil {
		return nil, fmt.Errorf("read CA for the CRL: %w", err)
	}
	var cas []*x509.Certificate
	for rest := caPEM; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil && block.Type == "CERTIFICATE" {
			cas = append(cas, c)
		}
	}
	if len(cas) == 0 {
		return nil, fmt.Errorf("%s: no PEM certificate", caPath)
	}
	if log == nil {
		log = slog.Default()
	}
	r := &RevocationList{path: path, cas: cas, log: log}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("CRL: %w", err)
	}
	if err := r.load(fileStamp{st.ModTime(), st.Size()}); err != nil {
		return nil, err
	}
	r.polled = time.Now()
	return r, nil
}

// load reads the file and replaces the list (the caller holds mu, or owns r).
func (r *RevocationList) load(stamp fileStamp) error {
	b, err := os.ReadFile(r.path)
	if err != nil {
		return fmt.Errorf("CRL: %w", err)
	}
	der := b
	if block, _ := pem.Decode(b); block != nil {
		if block.Type != "X509 CRL" {
			return fmt.Errorf("CRL %s: a PEM %q block, not X509 CRL", r.path, block.Type)
		}
		der = block.Bytes
	}
	crl, err := x509.ParseRevocationList(der)
	if err != nil {
		return fmt.Errorf("CRL %s: %w", r.path, err)
	}
	var signedBy error = errors.New("no CA certificate")
	for _, ca := range r.cas {
		if signedBy = crl.CheckSignatureFrom(ca); signedBy == nil {
			break
		}
	}
	if signedBy != nil {
		return fmt.Errorf("CRL %s is not signed by the CA: %w", r.path, signedBy)
	}
	revoked := make(map[string]time.Time, len(crl.RevokedCertificateEntries))
	for _, e := range crl.RevokedCertificateEntries {
		revoked[e.SerialNumber.Text(16)] = e.RevocationTime
	}
	if !crl.NextUpdate.IsZero() && time.Now().After(crl.NextUpdate) {
		r.log.Warn("the CRL's next update is past: issue a new one (hoptrace revoke)", "crl", r.path, "next_update", crl.NextUpdate)
	}
	if r.number != nil && crl.Number != nil && crl.Number.Cmp(r.number) < 0 {
		// RFC 5280 5.2.3: CRL numbers only grow; an older list would unrevoke.
		return fmt.Errorf("CRL %s has number %s, older than the %s read before", r.path, crl.Number, r.number)
	}
	r.revoked, r.number, r.stamp = revoked, crl.Number, stamp
	return nil
}

// refresh reloads the file if its stamp changed (at most once per
// PollInterval); a failed reload keeps the list read before.
func (r *RevocationList) refresh(now time.Time) {
	if now.Sub(r.polled) < PollInterval {
		return
	}
	r.polled = now
	st, err := os.Stat(r.path)
	var stamp fileStamp
	if err == nil {
		stamp = fileStamp{st.ModTime(), st.Size()}
		if stamp == r.stamp {
			return
		}
		if err = r.load(stamp); err == nil {
			r.failed = ""
			r.log.Info("CRL reloaded", "crl", r.path, "revoked", len(r.revoked), "number", r.number)
			return
		}
	}
	if err.Error() != r.failed {
		r.failed = err.Error()
		r.log.Error("CRL not reloaded, keeping the one read before", "crl", r.path, "err", err)
	}
}

// Check refuses (*RevokedError) a certificate the list revokes.
func (r *RevocationList) Check(c *x509.Certificate) error {
	if r == nil || c == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refresh(time.Now())
	at, ok := r.revoked[c.SerialNumber.Text(16)]
	if !ok {
		return nil
	}
	id := identityOf(c)
	return &RevokedError{Subject: id.Name, Role: id.Role, Serial: c.SerialNumber.Text(16), At: at, CRL: r.path}
}

// Path is the CRL file's path.
func (r *RevocationList) Path() string { return r.path }
