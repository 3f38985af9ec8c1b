package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// DefaultTokenFile is where Dial reads the caller's token unless it is
// given WithTokenFile or WithToken: the projected ServiceAccount token
// volume of deploy/examples/client, with audience "informerd".
const DefaultTokenFile = "/var/run/secrets/informerd/token"

// tokenOption marks a DialOption that attaches a token, so that Dial does
// not add the default one.
type tokenOption struct{ grpc.DialOption }

// WithTokenFile attaches the token in the file at path to every call. The
// file is read again whenever it changes (the kubelet rotates projected
// tokens by replacing the file); a call fails with UNAUTHENTICATED while
// it cannot be read.
func WithTokenFile(path string) grpc.DialOption {
	return tokenOption{grpc.WithPerRPCCredentials(&tokenFile{path: path})}
}

// WithToken attaches a fixed token to every call.
func WithToken(token string) grpc.DialOption {
	return tokenOption{grpc.WithPerRPCCredentials(fixedToken(token))}
}

// tlsOption marks a DialOption that sets TLS transport credentials.
type tlsOption struct {
	grpc.DialOption
	err error
}

// WithTLS connects over TLS, trusting the certificates in caFile (PEM)
// and checking the daemon's certificate for serverName (deploy/ issues
// it for "informerd"). It is required to reach a daemon at a TCP address
// that is not loopback; a token is never sent there in the clear.
func WithTLS(caFile, serverName string) grpc.DialOption {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return tlsOption{err: fmt.Errorf("reading the CA bundle: %w", err)}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return tlsOption{err: fmt.Errorf("the CA bundle %s holds no PEM certificate", caFile)}
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
	return tlsOption{DialOption: grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
}

// fixedToken is a token given once.
type fixedToken string

func (t fixedToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (fixedToken) RequireTransportSecurity() bool { return false } // Dial checks the transport

// tokenFile reads a token from a file, again whenever the file changes.
type tokenFile struct {
	path string
	// optional sends no token while the file does not exist (the default
	// file), instead of failing the call.
	optional bool

	mu    sync.Mutex // guards info and token
	info  os.FileInfo
	token string
}

func (f *tokenFile) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	token, err := f.read()
	if err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "informerd client: reading the token file: %v", err)
	}
	if token == "" {
		return nil, nil
	}
	return map[string]string{"authorization": "Bearer " + token}, nil
}

func (*tokenFile) RequireTransportSecurity() bool { return false } // Dial checks the transport

// read returns the token, reading the file again if it is another file
// (a rotation swaps a symlink) or was modified since the last read.
func (f *tokenFile) read() (string, error) {
	info, err := os.Stat(f.path)
	if err != nil {
		if f.optional && errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.info != nil && os.SameFile(f.info, info) && f.info.ModTime().Equal(info.ModTime()) && f.info.Size() == info.Size() {
		return f.token, nil
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return "", err
	}
	token := string(bytes.TrimSpace(b))
	if token == "" {
		return "", fmt.Errorf("%s is empty", f.path)
	}
	f.info, f.token = info, token
	return token, nil
}
