package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard/switchyard/worker"
)

// clientTLS is the TLS configuration of a client of a node whose
// certificate caFile's CA signed; nil for "" (plaintext, or the system's
// roots for an https URL).
func clientTLS(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// clientDialOptions are a gRPC client's options for a node: TLS when caFile
// is set, plaintext otherwise, and the API key when there is one.
func clientDialOptions(caFile, key string) ([]grpc.DialOption, error) {
	tc, err := clientTLS(caFile)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if key != "" {
		opts = append(opts, worker.APIKey(key))
	}
	return opts, nil
}

// httpClient is an HTTP client for a node: the default one, or one that
// trusts caFile's CA.
func httpClient(caFile string) (*http.Client, error) {
	tc, err := clientTLS(caFile)
	if err != nil || tc == nil {
		return http.DefaultClient, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	return &http.Client{Transport: tr}, nil
}
