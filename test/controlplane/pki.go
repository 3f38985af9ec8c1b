package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the set of files a control plane needs, generated fresh per start.
type pki struct {
	caCert, caKey         string
	servingCert, servKey  string
	adminCert, adminKey   string
	saPublic, saPrivate   string
	caPEM                 []byte
	adminCertPEM, adminKP []byte
}

// generatePKI writes a throwaway CA, a serving certificate for 127.0.0.1 and
// localhost, an admin client certificate (group system:masters) and the
// ServiceAccount signing key pair into dir.
func generatePKI(dir string) (*pki, error) {
	p := &pki{
		caCert: filepath.Join(dir, "ca.crt"), caKey: filepath.Join(dir, "ca.key"),
		servingCert: filepath.Join(dir, "apiserver.crt"), servKey: filepath.Join(dir, "apiserver.key"),
		adminCert: filepath.Join(dir, "admin.crt"), adminKey: filepath.Join(dir, "admin.key"),
		saPublic: filepath.Join(dir, "sa.pub"), saPrivate: filepath.Join(dir, "sa.key"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "informerd-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	if err := writeKeyPair(p.caCert, p.caKey, p.caPEM, caKey); err != nil {
		return nil, err
	}

	issue := func(serial int64, subject pkix.Name, usage x509.ExtKeyUsage, ips []net.IP, dns []string, certPath, keyPath string) ([]byte, []byte, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      subject,
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(7 * 24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  ips,
			DNSNames:     dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		if err := writeKeyPair(certPath, keyPath, certPEM, key); err != nil {
			return nil, nil, err
		}
		keyPEM, err := os.ReadFile(keyPath)
		return certPEM, keyPEM, err
	}
	if _, _, err := issue(2, pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"}, p.servingCert, p.servKey); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	if p.adminCertPEM, p.adminKP, err = issue(3, pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		x509.ExtKeyUsageClientAuth, nil, nil, p.adminCert, p.adminKey); err != nil {
		return nil, fmt.Errorf("admin certificate: %w", err)
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.saPublic, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		return nil, err
	}
	privPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)})
	if err := os.WriteFile(p.saPrivate, privPEM, 0o600); err != nil {
		return nil, err
	}
	return p, nil
}

func writeKeyPair(certPath, keyPath string, certPEM []byte, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(certPath, certPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}
