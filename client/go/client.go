package tensorcheck

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"math/rand"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// DefaultMaxMessageBytes bounds request and response messages unless
// WithMaxMessageBytes says otherwise. It is larger than gRPC's 4 MiB
// receive default so that returned outputs of mid-sized layers fit.
const DefaultMaxMessageBytes = 64 << 20

// DefaultServer is the server address Dial connects to when given "" and
// the environment variable TENSORCHECK_SERVER is unset or empty.
const DefaultServer = "localhost:50051"

// DefaultTarget is DefaultServer.
//
// Deprecated: use DefaultServer; the address is called the server
// everywhere (Dial, TENSORCHECK_SERVER, the CLI's --server).
const DefaultTarget = DefaultServer

// The environment variables Dial reads: the server address when Dial is
// given "", the bearer token when no WithToken option is given (empty
// counts as unset). The CLI and the Python client read the same ones.
const (
	serverEnv = "TENSORCHECK_SERVER"
	tokenEnv  = "TENSORCHECK_TOKEN"
)

// DefaultMaxRetries is how many times a call refused with a retry hint is
// sent again unless WithMaxRetries says otherwise.
const DefaultMaxRetries = 3

// maxRetryWait bounds the wait on one retry hint: a server (or a proxy) that
// asks for minutes gets its error back instead of a silently hung call.
const maxRetryWait = 30 * time.Second

// retryJitter is the most, as a fraction of the wait, added to each wait so
// that clients refused together do not all come back at the same instant.
const retryJitter = 0.1

// Client calls a tensorcheck server. It is safe for concurrent use; make one
// per server and Close it when done. Calls refused with the server's retry
// hint are retried (WithMaxRetries).
type Client struct {
	conn *grpc.ClientConn
	stub pb.TensorCheckClient
	// The server's address as dialled, and where it came from (a phrase
	// for errors that name it).
	server, serverFrom string
	maxRetries         int
	// WithMaxMessageBytes: the largest request this client sends.
	maxMessageBytes int

	storeMu sync.Mutex
	chunk   int // upload chunk size once known; 0 before
}

type options struct {
	creds           credentials.TransportCredentials
	err             error // from an option (WithTLSFiles), returned by Dial
	token           string
	tokenSet        bool
	maxMessageBytes int
	maxRetries      int
	block           bool
	dialOptions     []grpc.DialOption
}

// Option configures Dial.
type Option func(*options)

// WithInsecure uses a plaintext connection (the default).
func WithInsecure() Option {
	return func(o *options) { o.creds = nil }
}

// WithTLS uses TLS with the given configuration (nil: system roots).
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) {
		if cfg == nil {
			cfg = &tls.Config{}
		}
		o.creds = credentials.NewTLS(cfg)
	}
}

// WithTLSFiles uses TLS with the PEM files given: caFile holds the root
// certificates the server's certificate must chain to ("": the system's
// roots); certFile and keyFile, both or neither, the client certificate
// (chain) and its private key for a server that requires mutual TLS. The
// files are read when the option is applied; Dial returns a
// codes.InvalidArgument *Error naming the file it cannot use (see
// TLSConfigFromFiles).
func WithTLSFiles(caFile, certFile, keyFile string) Option {
	return func(o *options) {
		cfg, err := TLSConfigFromFiles(caFile, certFile, keyFile)
		if err != nil {
			o.err = err
			return
		}
		o.creds = credentials.NewTLS(cfg)
	}
}

// TLSConfigFromFiles is the TLS configuration of WithTLSFiles, for
// WithTLS after changes (ServerName, MinVersion, ...). Its errors are
// codes.InvalidArgument *Error values naming the argument: caFile,
// certFile, keyFile.
func TLSConfigFromFiles(caFile, certFile, keyFile string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		if certFile == "" {
			return nil, invalidArgument("keyFile", "needs certFile (the client certificate)")
		}
		return nil, invalidArgument("certFile", "needs keyFile (the certificate's private key)")
	}
	cfg := &tls.Config{}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, invalidArgument("caFile", "%v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, invalidArgument("caFile", "%s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	if certFile != "" {
		for _, f := range [][2]string{{"certFile", certFile}, {"keyFile", keyFile}} {
			if _, err := os.Stat(f[1]); err != nil {
				return nil, invalidArgument(f[0], "%v", err)
			}
		}
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, invalidArgument("certFile", "with keyFile: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// WithToken sends "authorization: Bearer <token>" metadata on every call
// (without it: the TENSORCHECK_TOKEN environment variable's value, when
// set; WithToken("") sends none). Over a plaintext connection the token
// travels in the clear; use WithTLS outside a trusted network.
func WithToken(token string) Option {
	return func(o *options) { o.token, o.tokenSet = token, true }
}

// WithMaxMessageBytes bounds the size of each request and response message
// (default DefaultMaxMessageBytes). A larger message fails with
// codes.ResourceExhausted before it is sent or after it arrives.
func WithMaxMessageBytes(n int) Option {
	return func(o *options) { o.maxMessageBytes = n }
}

// WithMaxRetries sets how many times a call is sent again after a refusal
// that carries the server's retry hint (default DefaultMaxRetries; 0
// disables retrying). Only codes.Unavailable (queue full, draining) and
// codes.ResourceExhausted (bytes in flight over budget) refusals with the
// grpc-retry-pushback-ms trailer are retried. The client waits the hinted
// time (at most 30 s, plus up to 10% jitter) and never past the context's
// deadline: when the wait would end after it, or the context ends during
// it, the refusal is returned. The last refusal is returned when the
// retries are used up; its Error.RetryAfter is set.
func WithMaxRetries(n int) Option {
	return func(o *options) { o.maxRetries = n }
}

// WithBlock makes Dial wait, within its context, until the connection is
// up. Without it Dial returns at once and connects on the first call. It
// waits with the connection's GetState and WaitForStateChange, as gRPC's
// deprecated grpc.WithBlock dial option does.
func WithBlock() Option {
	return func(o *options) { o.block = true }
}

// WithDialOptions passes extra gRPC dial options (interceptors, keepalive,
// a load-balancing service config, ...). They are applied last.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOptions = append(o.dialOptions, opts...) }
}

// bearer is per-RPC bearer-token metadata.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false so that tokens also work over plaintext
// connections inside a cluster; WithToken's comment says what that means.
func (bearer) RequireTransportSecurity() bool { return false }

// Dial connects to the tensorcheck server at the address server
// ("host:port", or any gRPC target such as
// "dns:///tensorcheck.ns.svc:50051"; "": the TENSORCHECK_SERVER
// environment variable's value, else DefaultServer). Without WithToken the
// token, if any, comes from TENSORCHECK_TOKEN. ctx bounds the dial only
// when WithBlock is given; each call takes its deadline from its own
// context. A server that cannot be reached is a codes.Unavailable *Error
// (from the first call, or from Dial with WithBlock: codes.DeadlineExceeded)
// whose message names the address and TENSORCHECK_SERVER.
func Dial(ctx context.Context, server string, opts ...Option) (*Client, error) {
	o := options{maxMessageBytes: DefaultMaxMessageBytes, maxRetries: DefaultMaxRetries}
	for _, opt := range opts {
		opt(&o)
	}
	if o.err != nil {
		return nil, o.err
	}
	from := serverGiven
	if server == "" {
		server, from = os.Getenv(serverEnv), serverFromEnv
		if server == "" {
			server, from = DefaultServer, serverDefault
		}
	}
	if !o.tokenSet {
		o.token = os.Getenv(tokenEnv)
	}
	if o.maxMessageBytes <= 0 {
		return nil, invalidArgument("max_message_bytes", "is %d, expected > 0", o.maxMessageBytes)
	}
	if o.maxRetries < 0 {
		return nil, invalidArgument("max_retries", "is %d, expected >= 0", o.maxRetries)
	}
	dialOpts := []grpc.DialOption{
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(o.maxMessageBytes),
			grpc.MaxCallSendMsgSize(o.maxMessageBytes),
		),
	}
	if o.creds != nil {
		dialOpts = append(dialOpts, grpc.WithTransportCredentials(o.creds))
	} else {
		// Deprecated since grpc-go 1.43 for
		// WithTransportCredentials(insecure.NewCredentials()), but package
		// credentials/insecure arrived in 1.34, after Debian 12's 1.33.
		dialOpts = append(dialOpts, grpc.WithInsecure())
	}
	if o.token != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(bearer(o.token)))
	}
	dialOpts = append(dialOpts, o.dialOptions...)
	// Deprecated since grpc-go 1.63 for grpc.NewClient, which 1.33 lacks.
	// DialContext starts connecting at once and resolves "host:port" with
	// the passthrough resolver; NewClient would wait for the first call and
	// resolve with DNS.
	conn, err := grpc.DialContext(ctx, server, dialOpts...)
	if err != nil {
		return nil, unreachable(fromRPC(err, nil), server, from)
	}
	if o.block {
		if err := waitReady(ctx, conn); err != nil {
			conn.Close()
			return nil, unreachable(fromRPC(err, nil), server, from)
		}
	}
	return &Client{conn: conn, stub: pb.NewTensorCheckClient(conn), server: server, serverFrom: from,
		maxRetries: o.maxRetries, maxMessageBytes: o.maxMessageBytes}, nil
}

// waitReady returns nil once conn is connected, or ctx's error when ctx
// ends first: WithBlock. It is the loop grpc.WithBlock runs inside
// grpc.DialContext, written with calls every grpc-go release this package
// builds with has and none deprecates (grpc.WithBlock is deprecated since
// grpc-go 1.64).
func waitReady(ctx context.Context, conn *grpc.ClientConn) error {
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return nil
		}
		if s == connectivity.Idle {
			// An idle connection connects on ClientConn.Connect (grpc-go
			// 1.41 and later) or on the first call; 1.33 has no Connect.
			if c, ok := interface{}(conn).(interface{ Connect() }); ok {
				c.Connect()
			}
		}
		if !conn.WaitForStateChange(ctx, s) {
			return ctx.Err()
		}
	}
}

// invoke runs one RPC, sending it again while the server refuses it with a
// retry hint (see WithMaxRetries). rpc makes one attempt with the given call
// options, which carry the trailer capture.
func (c *Client) invoke(ctx context.Context, rpc func(context.Context, ...grpc.CallOption) error) error {
	for retries := 0; ; retries++ {
		var trailer metadata.MD
		err := rpc(ctx, grpc.Trailer(&trailer))
		if err == nil {
			return nil
		}
		e := fromRPC(err, trailer)
		wait, ok := c.retryWait(ctx, e, retries)
		if !ok {
			return e
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return e
		}
	}
}

// retryWait is how long to wait before sending a refused call again; false
// when e is to be returned: no hint, a code that is never retried, retries
// used up, or a wait that would end past ctx's deadline (the server would
// only see an expired call).
func (c *Client) retryWait(ctx context.Context, e *Error, retries int) (time.Duration, bool) {
	if e.RetryAfter <= 0 || (e.Code != codes.Unavailable && e.Code != codes.ResourceExhausted) {
		return 0, false
	}
	if retries >= c.maxRetries {
		return 0, false
	}
	wait := e.RetryAfter
	if wait > maxRetryWait {
		wait = maxRetryWait
	}
	wait += time.Duration(rand.Float64() * retryJitter * float64(wait))
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= wait {
		return 0, false
	}
	return wait, true
}

// Close releases the connection. Calls in flight fail with codes.Canceled.
func (c *Client) Close() error {
	return c.conn.Close()
}

// Conn is the underlying connection, for the standard health service or
// for calling the generated stubs in tensorcheckpb directly.
func (c *Client) Conn() *grpc.ClientConn {
	return c.conn
}

// VerifyLinear runs the layer under each of req.Configs and compares each
// output with the reference and, when req.Observed is set, with it.
// Report.Verdict (VerdictPass or VerdictFail; Report.Passed) is the
// verdict: the tolerance's or, with req.Accept, whether the diagnosis
// (Report.Diagnosis, set then too) calls the observed output rounding of an
// accepted configuration. A request the server cannot run is an *Error
// (codes.InvalidArgument, codes.NotFound for an unknown backend, ...); a
// server that cannot be reached, a codes.Unavailable naming its address.
//
// Tensors with more than StoreThreshold (1 MiB) bytes of Data go through
// the server's tensor store without being asked: the client hashes them
// (SHA-256), asks the store once which of them it lacks
// (FindMissingTensors), uploads only those, several at once, in chunks of
// at most MaxChunkBytes, and sends the request naming them by digest, so a
// weight verified again is not sent again. When the server answers
// codes.FailedPrecondition naming tensors its store lacks (evicted in the
// meantime), the client uploads them again and resends the request, once.
// Behind a load balancer (round_robin over replicas, each with its own
// store) the upload and the resend can reach different replicas: a second
// such answer is met by sending the request once more with every tensor the
// call has the Data of inline (tensors the caller named by Digest stay so),
// when that request fits in both the server's Limits.MaxMessageBytes
// (asked with GetCapabilities) and WithMaxMessageBytes; otherwise, or when
// a missing tensor is one the caller named by Digest, the
// codes.FailedPrecondition is returned.
// A server without a store (codes.Unimplemented) gets every tensor inline.
// Report.UploadedBytes and Report.ReusedBytes say what the store saved.
// Outputs the server returns by digest (ReturnOutputs, larger than
// MaxInlineOutputBytes) are read back with ReadTensor, so
// ConfigResult.Output always carries Data.
func (c *Client) VerifyLinear(ctx context.Context, req *LinearRequest) (*Report, error) {
	rep, err := c.run(ctx, req, false)
	return rep, c.callError(err)
}

// DiagnoseLinear ranks req.Configs (none: every configuration this host
// supports) by how well each explains req.Observed, which is required, and
// sets Report.Diagnosis. Large tensors go through the store as in
// VerifyLinear.
func (c *Client) DiagnoseLinear(ctx context.Context, req *LinearRequest) (*Report, error) {
	rep, err := c.run(ctx, req, true)
	return rep, c.callError(err)
}

// Capabilities describes what the server can run, its devices and limits.
type Capabilities struct {
	ServerVersion    string
	Backends         []BackendInfo
	Limits           Limits
	DefaultReference string
	TolerancePresets []string
	// Whether the server has the content-addressed tensor store.
	TensorStore bool
	// The store's limits and counters; all zero when it has none.
	Store StoreInfo
}

// StoreInfo describes the server's tensor store (docs/api.md).
type StoreInfo struct {
	Present bool
	// Bytes all stored tensors and uploads in progress may hold together,
	// and those they hold now.
	BudgetBytes        int64
	BytesUsed          int64
	TensorCount        int64
	LargestTensorBytes int64
	// The most bytes one UploadTensor or ReadTensor message carries.
	ChunkBytes int64
	// The largest tensor the store takes.
	MaxTensorBytes int64
	// Whether stored tensors survive a restart.
	Persistent bool
	// How long an interrupted upload keeps its bytes for resuming.
	PartialUploadSeconds int64
	// Returned outputs above this size come back by digest.
	InlineOutputBytes int64
	// Since the server started: tensors stored by uploads and their bytes
	// (uploads of a tensor already present count in neither), and tensors
	// evicted to make room.
	Uploads       int64
	UploadedBytes int64
	Evictions     int64
	// Uploads in progress or kept for resuming, and the bytes they hold.
	PartialUploads int64
	PartialBytes   int64
}

// BackendInfo is one backend on the server's host.
type BackendInfo struct {
	Name      string
	Available bool
	// Why the backend cannot run here (no device, ...).
	UnavailableReason string
	Precisions        []string
	BiasModes         []string
	// Every canonical configuration this backend runs here.
	Configs       []string
	Device        *DeviceInfo
	StorageDTypes []DType
}

// DeviceInfo describes a backend's device.
type DeviceInfo struct {
	Name              string
	ComputeCapability string
	MemoryBytes       int64
	DriverVersion     string
	RuntimeVersion    string
	CublasVersion     string
}

// Limits are the server's bounds on a request.
type Limits struct {
	MaxMessageBytes int64
	MaxTensorBytes  int64
	MaxConfigs      int64
	MaxRank         int64
	MaxTopK         int64
	MaxRepeat       int64
}

// Capabilities asks the server what it can run.
func (c *Client) Capabilities(ctx context.Context) (*Capabilities, error) {
	var resp *pb.GetCapabilitiesResponse
	err := c.invoke(ctx, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = c.stub.GetCapabilities(ctx, &pb.GetCapabilitiesRequest{}, opts...)
		return err
	})
	if err != nil {
		return nil, c.callError(err)
	}
	caps := &Capabilities{
		ServerVersion:    resp.ServerVersion,
		DefaultReference: resp.DefaultReference,
		TolerancePresets: resp.TolerancePresets,
		TensorStore:      resp.TensorStore,
	}
	if st := resp.Store; st != nil {
		caps.Store = StoreInfo{
			Present:              st.Present,
			BudgetBytes:          st.BudgetBytes,
			BytesUsed:            st.BytesUsed,
			TensorCount:          st.TensorCount,
			LargestTensorBytes:   st.LargestTensorBytes,
			ChunkBytes:           st.ChunkBytes,
			MaxTensorBytes:       st.MaxTensorBytes,
			Persistent:           st.Persistent,
			PartialUploadSeconds: st.PartialUploadSeconds,
			InlineOutputBytes:    st.InlineOutputBytes,
			Uploads:              st.Uploads,
			UploadedBytes:        st.UploadedBytes,
			Evictions:            st.Evictions,
			PartialUploads:       st.PartialUploads,
			PartialBytes:         st.PartialBytes,
		}
	}
	if l := resp.Limits; l != nil {
		caps.Limits = Limits{
			MaxMessageBytes: l.MaxMessageBytes,
			MaxTensorBytes:  l.MaxTensorBytes,
			MaxConfigs:      l.MaxConfigs,
			MaxRank:         l.MaxRank,
			MaxTopK:         l.MaxTopK,
			MaxRepeat:       l.MaxRepeat,
		}
	}
	for _, b := range resp.Backends {
		info := BackendInfo{
			Name:              b.Name,
			Available:         b.Available,
			UnavailableReason: b.UnavailableReason,
			Precisions:        b.Precisions,
			BiasModes:         b.BiasModes,
			Configs:           b.Configs,
		}
		if d := b.Device; d != nil {
			info.Device = &DeviceInfo{
				Name:              d.Name,
				ComputeCapability: d.ComputeCapability,
				MemoryBytes:       d.MemoryBytes,
				DriverVersion:     d.DriverVersion,
				RuntimeVersion:    d.RuntimeVersion,
				CublasVersion:     d.CublasVersion,
			}
		}
		for _, dt := range b.StorageDtypes {
			info.StorageDTypes = append(info.StorageDTypes, DType(dt))
		}
		caps.Backends = append(caps.Backends, info)
	}
	return caps, nil
}
