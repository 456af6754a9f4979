// flexvol-pki makes the test cluster's PKI with the Go standard library only
// (the test guest has no openssl): a CA, the API server's serving certificate,
// the service-account key pair, and one client certificate per identity. It is
// built by tests/kubelet/setup in the same go build as the Kubernetes binaries.
//
// Usage: flexvol-pki DIR CLIENT...
//
//	CLIENT is NAME=CN[/O[/O...]], e.g. admin=flexvol-admin/system:masters or
//	node-a=system:node:node-a/system:nodes. Writes DIR/ca.{crt,key},
//	DIR/apiserver.{crt,key} (SANs 127.0.0.1, ::1, localhost, kubernetes,
//	kubernetes.default, kubernetes.default.svc), DIR/sa.{key,pub} and
//	DIR/NAME.{crt,key} per client. Keys are ECDSA P-256 (the SA key is RSA
//	2048, as the API server's token signer expects), mode 0600.
package main

import (
	"crypto"
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
	"strings"
	"time"
)

func die(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "flexvol-pki: "+format+"\n", args...)
	os.Exit(1)
}

func writePEM(path, kind string, der []byte, mode os.FileMode) {
	data := pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
	if err := os.WriteFile(path, data, mode); err != nil {
		die("write %s: %v", path, err)
	}
}

func ecKey() *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		die("generate key: %v", err)
	}
	return k
}

func writeKey(path string, k crypto.Signer) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		die("marshal key: %v", err)
	}
	writePEM(path, "PRIVATE KEY", der, 0o600)
}

var serial int64 = 1

func sign(tmpl *x509.Certificate, pub crypto.PublicKey, ca *x509.Certificate, caKey crypto.Signer) *x509.Certificate {
	serial++
	tmpl.SerialNumber = big.NewInt(serial)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(365 * 24 * time.Hour)
	if ca == nil {
		ca = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
	if err != nil {
		die("sign %s: %v", tmpl.Subject.CommonName, err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		die("parse %s: %v", tmpl.Subject.CommonName, err)
	}
	return c
}

func main() {
	if len(os.Args) < 2 {
		die("usage: flexvol-pki DIR NAME=CN[/O...]...")
	}
	dir := os.Args[1]
	if err := os.MkdirAll(dir, 0o700); err != nil {
		die("mkdir %s: %v", dir, err)
	}

	caKey := ecKey()
	ca := sign(&x509.Certificate{
		Subject:               pkix.Name{CommonName: "flexvol-test-ca"},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}, caKey.Public(), nil, caKey)
	writePEM(filepath.Join(dir, "ca.crt"), "CERTIFICATE", ca.Raw, 0o644)
	writeKey(filepath.Join(dir, "ca.key"), caKey)

	srvKey := ecKey()
	srv := sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
	}, srvKey.Public(), ca, caKey)
	writePEM(filepath.Join(dir, "apiserver.crt"), "CERTIFICATE", srv.Raw, 0o644)
	writeKey(filepath.Join(dir, "apiserver.key"), srvKey)

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		die("generate SA key: %v", err)
	}
	writeKey(filepath.Join(dir, "sa.key"), saKey)
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		die("marshal SA public key: %v", err)
	}
	writePEM(filepath.Join(dir, "sa.pub"), "PUBLIC KEY", pubDER, 0o644)

	for _, spec := range os.Args[2:] {
		eq := strings.IndexByte(spec, '=')
		if eq <= 0 || eq == len(spec)-1 || strings.ContainsAny(spec[:eq], "/.") {
			die("bad client spec %q (want NAME=CN[/O...])", spec)
		}
		name, parts := spec[:eq], strings.Split(spec[eq+1:], "/")
		k := ecKey()
		c := sign(&x509.Certificate{
			Subject:     pkix.Name{CommonName: parts[0], Organization: parts[1:]},
			KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}, k.Public(), ca, caKey)
		writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", c.Raw, 0o644)
		writeKey(filepath.Join(dir, name+".key"), k)
	}
}
