package tensorcheck

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// testCerts are PEM files made by openssl for one test, as
// tests/testing/certs.py makes them for the Python suites: a CA, a server
// certificate for IP:127.0.0.1 and DNS:localhost and a client certificate
// signed by it, and an unrelated CA.
type testCerts struct {
	ca, serverCert, serverKey, clientCert, clientKey, otherCA string
}

const opensslConfig = `[req]
distinguished_name = dn
prompt = no

[dn]
CN = tensorcheck test

[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, IP:::1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
`

func makeTestCerts(t *testing.T) testCerts {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("the openssl command is not installed")
	}
	d := t.TempDir()
	p := func(name string) string { return filepath.Join(d, name) }
	cnf := p("openssl.cnf")
	if err := os.WriteFile(cnf, []byte(opensslConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	key := []string{"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"}
	selfSigned := func(name, cn string) {
		run(append(append([]string{"req", "-x509", "-new"}, key...), "-keyout", p(name+".key"),
			"-out", p(name+".pem"), "-days", "30", "-subj", "/CN="+cn, "-config", cnf, "-extensions", "ca")...)
	}
	signed := func(name, cn, ext, serial string) {
		run(append(append([]string{"req", "-new"}, key...), "-keyout", p(name+".key"),
			"-out", p(name+".csr"), "-subj", "/CN="+cn, "-config", cnf)...)
		run("x509", "-req", "-in", p(name+".csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"),
			"-set_serial", serial, "-days", "30", "-out", p(name+".pem"), "-extfile", cnf, "-extensions", ext)
	}
	selfSigned("ca", "tensorcheck test CA")
	selfSigned("other_ca", "tensorcheck other test CA")
	signed("server", "localhost", "server", "0x5e5e01")
	signed("client", "tensorcheck-test-client", "client", "0x5e5e02")
	return testCerts{
		ca: p("ca.pem"), serverCert: p("server.pem"), serverKey: p("server.key"),
		clientCert: p("client.pem"), clientKey: p("client.key"), otherCA: p("other_ca.pem"),
	}
}

// authServer answers GetCapabilities and records each call's authorization
// metadata and the client certificate's common name ("" without one).
type authServer struct {
	pb.UnimplementedTensorCheckServer
	mu       sync.Mutex
	auth     []string
	clientCN []string
}

func (s *authServer) GetCapabilities(ctx context.Context, _ *pb.GetCapabilitiesRequest) (*pb.GetCapabilitiesResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	auth := strings.Join(md.Get("authorization"), ",")
	cn := ""
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.PeerCertificates) > 0 {
			cn = info.State.PeerCertificates[0].Subject.CommonName
		}
	}
	s.mu.Lock()
	s.auth = append(s.auth, auth)
	s.clientCN = append(s.clientCN, cn)
	s.mu.Unlock()
	return &pb.GetCapabilitiesResponse{ServerVersion: "fake-tls"}, nil
}

func (s *authServer) calls() ([]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.auth...), append([]string(nil), s.clientCN...)
}

// startTLSServer serves an authServer over TLS on a free loopback port
// (requiring a client certificate signed by the CA when mutual) and
// returns it and its port.
func startTLSServer(t *testing.T, c testCerts, mutual bool) (*authServer, string) {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(c.serverCert, c.serverKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	if mutual {
		pem, err := os.ReadFile(c.ca)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ClientCAs = x509.NewCertPool()
		cfg.ClientCAs.AppendCertsFromPEM(pem)
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &authServer{}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	pb.RegisterTensorCheckServer(srv, s)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	_, port, _ := net.SplitHostPort(lis.Addr().String())
	return s, port
}

// clearConnectionEnv unsets TENSORCHECK_SERVER and TENSORCHECK_TOKEN for the test.
func clearConnectionEnv(t *testing.T) {
	t.Helper()
	t.Setenv("TENSORCHECK_SERVER", "")
	t.Setenv("TENSORCHECK_TOKEN", "")
}

// tlsCapabilities dials target with opts and asks for the capabilities; the
// error is Dial's or the call's.
func tlsCapabilities(t *testing.T, target string, opts ...Option) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, target, opts...)
	if err != nil {
		return "", err
	}
	defer c.Close()
	caps, err := c.Capabilities(ctx)
	if err != nil {
		return "", err
	}
	return caps.ServerVersion, nil
}

func wantTLSCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Code != code {
		t.Errorf("%s: error = %v, want %s", what, err, code)
	}
}

func TestTLSFilesWithTheRightCA(t *testing.T) {
	clearConnectionEnv(t)
	c := makeTestCerts(t)
	s, port := startTLSServer(t, c, false)
	for _, host := range []string{"127.0.0.1", "localhost"} {
		v, err := tlsCapabilities(t, host+":"+port, WithTLSFiles(c.ca, "", ""))
		if err != nil || v != "fake-tls" {
			t.Errorf("%s: version %q, error %v", host, v, err)
		}
	}
	cfg, err := TLSConfigFromFiles(c.ca, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := tlsCapabilities(t, "127.0.0.1:"+port, WithTLS(cfg)); err != nil || v != "fake-tls" {
		t.Errorf("WithTLS(TLSConfigFromFiles): version %q, error %v", v, err)
	}
	if auth, _ := s.calls(); len(auth) != 3 || auth[0] != "" {
		t.Errorf("authorization metadata = %q, want 3 calls without", auth)
	}
}

func TestTLSFilesWithAWrongCAFails(t *testing.T) {
	clearConnectionEnv(t)
	c := makeTestCerts(t)
	s, port := startTLSServer(t, c, false)
	_, err := tlsCapabilities(t, "127.0.0.1:"+port, WithTLSFiles(c.otherCA, "", ""))
	wantTLSCode(t, "other CA", err, codes.Unavailable)
	_, err = tlsCapabilities(t, "127.0.0.1:"+port)
	wantTLSCode(t, "plaintext", err, codes.Unavailable)
	if auth, _ := s.calls(); len(auth) != 0 {
		t.Errorf("calls arrived: %q", auth)
	}
}

func TestMutualTLS(t *testing.T) {
	clearConnectionEnv(t)
	c := makeTestCerts(t)
	s, port := startTLSServer(t, c, true)
	target := "127.0.0.1:" + port
	_, err := tlsCapabilities(t, target, WithTLSFiles(c.ca, "", ""))
	wantTLSCode(t, "without a client certificate", err, codes.Unavailable)
	if v, err := tlsCapabilities(t, target, WithTLSFiles(c.ca, c.clientCert, c.clientKey)); err != nil || v != "fake-tls" {
		t.Errorf("with the client certificate: version %q, error %v", v, err)
	}
	if _, cn := s.calls(); len(cn) != 1 || cn[0] != "tensorcheck-test-client" {
		t.Errorf("client certificate common names = %q", cn)
	}
}

func TestTokenAndServerFromTheEnvironment(t *testing.T) {
	clearConnectionEnv(t)
	c := makeTestCerts(t)
	s, port := startTLSServer(t, c, false)
	tlsOpt := WithTLSFiles(c.ca, "", "")
	t.Setenv("TENSORCHECK_SERVER", "localhost:"+port)
	t.Setenv("TENSORCHECK_TOKEN", "env-token")
	if _, err := tlsCapabilities(t, "", tlsOpt); err != nil {
		t.Fatal(err)
	}
	if _, err := tlsCapabilities(t, "", tlsOpt, WithToken("explicit-token")); err != nil {
		t.Fatal(err)
	}
	// WithToken("") sends none, whatever the environment says.
	if _, err := tlsCapabilities(t, "", tlsOpt, WithToken("")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TENSORCHECK_TOKEN", "")
	if _, err := tlsCapabilities(t, "127.0.0.1:"+port, tlsOpt); err != nil {
		t.Fatal(err)
	}
	auth, _ := s.calls()
	want := []string{"Bearer env-token", "Bearer explicit-token", "", ""}
	if strings.Join(auth, "|") != strings.Join(want, "|") {
		t.Errorf("authorization metadata = %q, want %q", auth, want)
	}
}

func TestDefaultTarget(t *testing.T) {
	clearConnectionEnv(t)
	c, err := Dial(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Conn().Target(); got != DefaultTarget {
		t.Errorf("target = %q, want %q", got, DefaultTarget)
	}
	t.Setenv("TENSORCHECK_SERVER", "elsewhere:1234")
	c2, err := Dial(context.Background(), "given:1")
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got := c2.Conn().Target(); got != "given:1" {
		t.Errorf("target = %q, want given:1", got)
	}
}

func TestTLSConfigFromFilesErrors(t *testing.T) {
	c := makeTestCerts(t)
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	absent := filepath.Join(t.TempDir(), "absent.pem")
	for _, tc := range []struct {
		ca, cert, key, field string
	}{
		{c.ca, c.clientCert, "", "certFile"},
		{"", "", c.clientKey, "keyFile"},
		{absent, "", "", "caFile"},
		{notPEM, "", "", "caFile"},
		{c.ca, absent, c.clientKey, "certFile"},
		{c.ca, c.clientCert, absent, "keyFile"},
		{c.ca, notPEM, c.clientKey, "certFile"},
	} {
		_, err := TLSConfigFromFiles(tc.ca, tc.cert, tc.key)
		var e *Error
		if !errors.As(err, &e) || e.Code != codes.InvalidArgument || !strings.HasPrefix(e.Message, tc.field+": ") {
			t.Errorf("TLSConfigFromFiles(%q, %q, %q) = %v, want InvalidArgument naming %s", tc.ca, tc.cert, tc.key, err, tc.field)
		}
		_, err = Dial(context.Background(), "localhost:1", WithTLSFiles(tc.ca, tc.cert, tc.key))
		if !errors.As(err, &e) || !strings.HasPrefix(e.Message, tc.field+": ") {
			t.Errorf("Dial(WithTLSFiles(%q, %q, %q)) = %v, want an error naming %s", tc.ca, tc.cert, tc.key, err, tc.field)
		}
	}
}
