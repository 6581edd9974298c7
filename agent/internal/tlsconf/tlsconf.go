// Package tlsconf builds the agent's mutual-TLS client configuration from the
// files `hoptrace certs` writes (docs/security.md): the agent presents its
// own certificate (CN = its node name) and accepts a server only if that
// server's certificate chains to the hoptrace CA, names the dialed host, and
// carries the expected role in its subject OU ("dispatcher" for the session,
// "collector" for records), and is not revoked by the CA's CRL (--crl). So
// only the real dispatcher can push plans, and an agent certificate or the
// collector's cannot stand in for it.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"

	"google.golang.org/grpc/credentials"
)

// Roles of the servers the agent dials (subject OU of their certificates).
const (
	RoleDispatcher = "dispatcher"
	RoleCollector  = "collector"
	RoleAgent      = "agent"
)

// Files are the PEM files of the agent's TLS identity, and the CA's CRL
// ("" = none).
type Files struct {
	CA, Cert, Key string
	CRL           string
}

// Empty reports whether no file is set.
func (f Files) Empty() bool { return f.CA == "" && f.Cert == "" && f.Key == "" }

// Validate requires all three files together.
func (f Files) Validate() error {
	var missing []string
	for _, m := range []struct{ flag, val string }{{"--ca", f.CA}, {"--cert", f.Cert}, {"--key", f.Key}} {
		if m.val == "" {
			missing = append(missing, m.flag)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("TLS needs --ca, --cert and --key (missing %v; `hoptrace certs --agent NODE` makes them), or --insecure", missing)
	}
	return nil
}

// Identity is what a certificate's subject says.
type Identity struct {
	Role, Name string // OU, CN
}

// Client loads the files and returns the client configuration for a server
// of role (RoleDispatcher, RoleCollector).
func Client(f Files, role string) (*tls.Config, Identity, error) {
	var crl *RevocationList
	if f.CRL != "" {
		var err error
		if crl, err = LoadRevocationList(f.CRL, f.CA, nil); err != nil {
			return nil, Identity{}, err
		}
	}
	return client(f, role, crl)
}

func client(f Files, role string, crl *RevocationList) (*tls.Config, Identity, error) {
	if err := f.Validate(); err != nil {
		return nil, Identity{}, err
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, Identity{}, fmt.Errorf("read CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, Identity{}, fmt.Errorf("%s: no PEM certificate", f.CA)
	}
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, Identity{}, fmt.Errorf("load agent certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, Identity{}, fmt.Errorf("parse %s: %w", f.Cert, err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		RootCAs:      roots,
		Certificates: []tls.Certificate{pair},
		// Runs after crypto/tls verified the chain and the host name.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if err := checkRole(cs.PeerCertificates, role); err != nil {
				return err
			}
			return crl.Check(cs.PeerCertificates[0])
		},
	}
	return cfg, identityOf(leaf), nil
}

// Credentials is Client as gRPC transport credentials.
func Credentials(f Files, role string) (credentials.TransportCredentials, Identity, error) {
	cfg, id, err := Client(f, role)
	if err != nil {
		return nil, id, err
	}
	return credentials.NewTLS(cfg), id, nil
}

// SelfCheck says why the servers will refuse the agent's own certificate
// (another CA, not a client certificate, not an agent's, another node's), or
// nil. The servers decide; this only lets the agent say so early.
func SelfCheck(f Files, node string) error {
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return err
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return err
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("%s is not a client certificate of %s: %w", f.Cert, f.CA, err)
	}
	if id := identityOf(leaf); id.Role != RoleAgent || id.Name != node {
		return fmt.Errorf("%s is a %q certificate for %q, not an agent certificate for node %q", f.Cert, id.Role, id.Name, node)
	}
	return nil
}

func identityOf(c *x509.Certificate) Identity {
	id := Identity{Name: c.Subject.CommonName}
	if len(c.Subject.OrganizationalUnit) > 0 {
		id.Role = c.Subject.OrganizationalUnit[0]
	}
	return id
}

// checkRole refuses a server whose certificate is not of role.
func checkRole(chain []*x509.Certificate, role string) error {
	if len(chain) == 0 {
		return errors.New("server sent no certificate")
	}
	if !slices.Contains(chain[0].Subject.OrganizationalUnit, role) {
		return fmt.Errorf("server certificate %q has role %v, not %s", chain[0].Subject.CommonName, chain[0].Subject.OrganizationalUnit, role)
	}
	return nil
}
