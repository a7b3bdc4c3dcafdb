package tensorcheck

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// fakeServer is an in-process TensorCheck server that records what arrives
// and answers what the test says; it checks the client's plumbing without
// the real server.
type fakeServer struct {
	pb.UnimplementedTensorCheckServer
	mu       sync.Mutex
	lastReq  *pb.VerifyRequest
	lastAuth []string
	// The request size the client declared (tensorcheck-request-bytes).
	lastDeclared []string
	resp         *pb.VerifyResponse
	err          error
	block        bool

	// The first refusals calls (any method) fail with refusalCode and, when
	// pushback is not "", the grpc-retry-pushback-ms trailer. calls counts
	// every call; remaining is each call's time to its deadline as the
	// server saw it (-1: no deadline).
	refusals    int
	refusalCode codes.Code
	pushback    string
	calls       int
	remaining   []time.Duration

	store fakeStore

	// Every Compare request past the refusals, and the answer to each.
	compareReqs []*pb.CompareRequest
	compareResp *pb.CompareResponse
}

// fakeStore is the fake's tensor store (docs/api.md, "The store RPCs"),
// with counters and scripted failures for the tests. Guarded by
// fakeServer.mu.
type fakeStore struct {
	// The store RPCs answer UNIMPLEMENTED, as a server without a store.
	off bool
	// FindMissingTensors answers UNIMPLEMENTED although the store is there
	// (as a proxy, or a request the server could not read, could).
	findUnimplemented bool
	// StoreInfo.chunk_bytes in GetCapabilities; 0: MaxChunkBytes.
	chunkBytes int64
	blobs      map[string][]byte      // hash -> bytes
	partial    map[string]*fakeUpload // upload_id -> upload in progress

	// FindMissingTensors calls and the hashes each asked about; with
	// allMissing it answers every digest as missing.
	finds      int
	findHashes [][]string
	allMissing bool
	// Every UploadTensor message as received, the streams opened, and
	// the hashes stored (by completed uploads) or found already present.
	uploadMsgs     []fakeUploadMsg
	uploadStreams  int
	stored         []string
	alreadyPresent []string
	// The first upload stream whose bytes held reach breakUploadAt fails
	// with UNAVAILABLE, as a broken connection (the bytes stay resumable).
	breakUploadAt int64
	// The next refuseUploads upload streams fail after their first message
	// with RESOURCE_EXHAUSTED ("no room") and, when refusePushback is not
	// "", the retry hint.
	refuseUploads  int
	refusePushback string
	queries        int
	// ReadTensor calls; the first read that has sent breakReadAt bytes or
	// more fails with UNAVAILABLE.
	reads       int
	breakReadAt int64
	// The next evictOnVerify Verify calls first drop every stored tensor,
	// so the request names tensors the store lacks.
	evictOnVerify int
	verifies      int
	// Every Verify and Diagnose request past the refusals, in order.
	verifyReqs []*pb.VerifyRequest
	// Limits.max_message_bytes in GetCapabilities; 0: 64 MiB.
	maxMessageBytes int64
}

type fakeUpload struct {
	hash string
	data []byte
}

type fakeUploadMsg struct {
	stream   int
	uploadID string
	digest   string // set on the stream's first message
	offset   int64
	size     int
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// put stores b in the fake's store and returns its hash.
func (f *fakeServer) put(b []byte) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.store.blobs == nil {
		f.store.blobs = map[string][]byte{}
	}
	h := sha256Hex(b)
	f.store.blobs[h] = b
	return h
}

// storeSnapshot is a copy of the store's counters, read under the lock.
func (f *fakeServer) storeSnapshot() fakeStore {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.store
	s.uploadMsgs = append([]fakeUploadMsg(nil), s.uploadMsgs...)
	s.stored = append([]string(nil), s.stored...)
	s.alreadyPresent = append([]string(nil), s.alreadyPresent...)
	s.findHashes = append([][]string(nil), s.findHashes...)
	s.verifyReqs = append([]*pb.VerifyRequest(nil), s.verifyReqs...)
	return s
}

// namedField is a request's tensor and its field name.
type namedField struct {
	field string
	t     *pb.Tensor
}

// opFields are the tensors of op.
func opFields(op *pb.LinearOp) []namedField {
	return []namedField{{"op.input", op.GetInput()}, {"op.weight", op.GetWeight()},
		{"op.bias", op.GetBias()}, {"op.input_scale", op.GetInputScale()},
		{"op.weight_scale", op.GetWeightScale()}}
}

// missingIn is the MissingTensors detail for the tensors of req whose
// digest the store lacks, or nil.
func (f *fakeServer) missingIn(req *pb.VerifyRequest) *pb.MissingTensors {
	return f.missingInFields(append(opFields(req.GetOp()), namedField{"observed", req.GetObserved()}))
}

func (f *fakeServer) missingInFields(fields []namedField) *pb.MissingTensors {
	var m pb.MissingTensors
	for _, t := range fields {
		d := t.t.GetDigest()
		if d == "" {
			continue
		}
		if _, ok := f.store.blobs[d]; !ok {
			m.Digests = append(m.Digests, &pb.TensorDigest{Hash: d})
			m.Fields = append(m.Fields, t.field)
		}
	}
	if len(m.Digests) == 0 {
		return nil
	}
	return &m
}

func (f *fakeServer) FindMissingTensors(ctx context.Context, req *pb.FindMissingTensorsRequest) (*pb.FindMissingTensorsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.store.off || f.store.findUnimplemented {
		return nil, status.Error(codes.Unimplemented, "no tensor store")
	}
	f.store.finds++
	var asked []string
	resp := &pb.FindMissingTensorsResponse{}
	for _, d := range req.Digests {
		asked = append(asked, d.Hash)
		if _, ok := f.store.blobs[d.Hash]; !ok || f.store.allMissing {
			resp.MissingDigests = append(resp.MissingDigests, d)
		}
	}
	f.store.findHashes = append(f.store.findHashes, asked)
	return resp, nil
}

func (f *fakeServer) UploadTensor(stream pb.TensorCheck_UploadTensorServer) error {
	f.mu.Lock()
	off := f.store.off
	f.mu.Unlock()
	if off {
		return status.Error(codes.Unimplemented, "no tensor store")
	}
	msg, err := stream.Recv()
	if err != nil {
		return err
	}
	d, id := msg.Digest, msg.UploadId
	if d == nil || id == "" {
		return status.Error(codes.InvalidArgument, "first message without digest or upload_id")
	}
	f.mu.Lock()
	f.store.uploadStreams++
	streamNo := f.store.uploadStreams
	if _, ok := f.store.blobs[d.Hash]; ok {
		f.store.uploadMsgs = append(f.store.uploadMsgs, fakeUploadMsg{streamNo, id, d.Hash, msg.Offset, len(msg.Data)})
		f.store.alreadyPresent = append(f.store.alreadyPresent, d.Hash)
		f.mu.Unlock()
		return stream.SendAndClose(&pb.UploadTensorResponse{Digest: d, CommittedSize: d.SizeBytes, AlreadyPresent: true})
	}
	if f.store.refuseUploads > 0 {
		f.store.refuseUploads--
		f.store.uploadMsgs = append(f.store.uploadMsgs, fakeUploadMsg{streamNo, id, d.Hash, msg.Offset, len(msg.Data)})
		pushback := f.store.refusePushback
		f.mu.Unlock()
		if pushback != "" {
			grpc.SetTrailer(stream.Context(), metadata.Pairs(RetryPushbackKey, pushback))
		}
		return status.Error(codes.ResourceExhausted, "no room: every stored tensor is in use")
	}
	if f.store.partial == nil {
		f.store.partial = map[string]*fakeUpload{}
	}
	up := f.store.partial[id]
	if up == nil {
		up = &fakeUpload{hash: d.Hash}
		f.store.partial[id] = up
	}
	f.mu.Unlock()
	for first := true; ; first = false {
		f.mu.Lock()
		rec := fakeUploadMsg{stream: streamNo, uploadID: id, offset: msg.Offset, size: len(msg.Data)}
		if first {
			rec.digest = d.Hash
		}
		f.store.uploadMsgs = append(f.store.uploadMsgs, rec)
		held := int64(len(up.data))
		switch {
		case msg.Offset != held:
			f.mu.Unlock()
			return status.Errorf(codes.InvalidArgument, "offset %d, the server holds %d bytes", msg.Offset, held)
		case len(msg.Data) > MaxChunkBytes:
			f.mu.Unlock()
			return status.Errorf(codes.InvalidArgument, "chunk of %d bytes", len(msg.Data))
		case held+int64(len(msg.Data)) > d.SizeBytes:
			f.mu.Unlock()
			return status.Error(codes.InvalidArgument, "past the declared size")
		}
		up.data = append(up.data, msg.Data...)
		if b := f.store.breakUploadAt; b > 0 && int64(len(up.data)) >= b {
			f.store.breakUploadAt = 0
			f.mu.Unlock()
			return status.Error(codes.Unavailable, "connection broken")
		}
		f.mu.Unlock()
		msg, err = stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if int64(len(up.data)) != d.SizeBytes {
		return status.Errorf(codes.InvalidArgument, "stream ended at %d of %d bytes", len(up.data), d.SizeBytes)
	}
	delete(f.store.partial, id)
	if h := sha256Hex(up.data); h != d.Hash {
		return status.Errorf(codes.InvalidArgument, "bytes hash to %s, not %s", h, d.Hash)
	}
	if f.store.blobs == nil {
		f.store.blobs = map[string][]byte{}
	}
	f.store.blobs[d.Hash] = up.data
	f.store.stored = append(f.store.stored, d.Hash)
	return stream.SendAndClose(&pb.UploadTensorResponse{Digest: d, CommittedSize: d.SizeBytes})
}

func (f *fakeServer) QueryUploadStatus(ctx context.Context, req *pb.QueryUploadStatusRequest) (*pb.QueryUploadStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.store.off {
		return nil, status.Error(codes.Unimplemented, "no tensor store")
	}
	f.store.queries++
	if _, ok := f.store.blobs[req.GetDigest().GetHash()]; ok {
		return &pb.QueryUploadStatusResponse{CommittedSize: req.Digest.SizeBytes, Complete: true}, nil
	}
	if up := f.store.partial[req.UploadId]; up != nil && up.hash == req.GetDigest().GetHash() {
		return &pb.QueryUploadStatusResponse{CommittedSize: int64(len(up.data))}, nil
	}
	return &pb.QueryUploadStatusResponse{}, nil
}

func (f *fakeServer) ReadTensor(req *pb.ReadTensorRequest, stream pb.TensorCheck_ReadTensorServer) error {
	f.mu.Lock()
	if f.store.off {
		f.mu.Unlock()
		return status.Error(codes.Unimplemented, "no tensor store")
	}
	f.store.reads++
	b, ok := f.store.blobs[req.GetDigest().GetHash()]
	breakAt := f.store.breakReadAt
	f.mu.Unlock()
	if !ok {
		return status.Errorf(codes.NotFound, "no tensor %s", req.GetDigest().GetHash())
	}
	end := int64(len(b))
	if req.Limit > 0 {
		end = req.Offset + req.Limit
	}
	if req.Offset < 0 || req.Offset > end || end > int64(len(b)) {
		return status.Error(codes.OutOfRange, "range outside the tensor")
	}
	for off := req.Offset; off < end; {
		n := end - off
		if n > MaxChunkBytes {
			n = MaxChunkBytes
		}
		if err := stream.Send(&pb.ReadTensorResponse{Offset: off, Data: b[off : off+n]}); err != nil {
			return err
		}
		off += n
		if breakAt > 0 && off-req.Offset >= breakAt && off < end {
			f.mu.Lock()
			f.store.breakReadAt = 0
			f.mu.Unlock()
			return status.Error(codes.Unavailable, "connection broken")
		}
	}
	return nil
}

// refuse counts the call and returns the scripted refusal, or nil once the
// refusals are used up.
func (f *fakeServer) refuse(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	left := time.Duration(-1)
	if d, ok := ctx.Deadline(); ok {
		left = time.Until(d)
	}
	f.remaining = append(f.remaining, left)
	if f.calls > f.refusals {
		return nil
	}
	if f.pushback == "" {
		return status.Error(f.refusalCode, "refused")
	}
	grpc.SetTrailer(ctx, metadata.Pairs(RetryPushbackKey, f.pushback))
	return status.Errorf(f.refusalCode, "server busy; retry after %s ms", f.pushback)
}

// counts is calls and remaining, read under the lock.
func (f *fakeServer) counts() (int, []time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, append([]time.Duration(nil), f.remaining...)
}

func (f *fakeServer) Verify(ctx context.Context, req *pb.VerifyRequest) (*pb.VerifyResponse, error) {
	if err := f.refuse(ctx); err != nil {
		return nil, err
	}
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	f.store.verifies++
	f.store.verifyReqs = append(f.store.verifyReqs, req)
	if f.store.evictOnVerify > 0 {
		f.store.evictOnVerify--
		f.store.blobs = nil
	}
	if m := f.missingIn(req); m != nil {
		f.mu.Unlock()
		st, err := status.New(codes.FailedPrecondition, "the store lacks "+m.Fields[0]+" "+m.Digests[0].Hash).WithDetails(m)
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	f.lastReq, f.lastAuth, f.lastDeclared = req, md.Get("authorization"), md.Get(requestBytesKey)
	resp, err, block := f.resp, f.err, f.block
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return resp, err
}

func (f *fakeServer) Diagnose(ctx context.Context, req *pb.VerifyRequest) (*pb.VerifyResponse, error) {
	return f.Verify(ctx, req)
}

// Compare records the request and answers compareResp; a request naming
// tensors the store lacks fails as Verify's does.
func (f *fakeServer) Compare(ctx context.Context, req *pb.CompareRequest) (*pb.CompareResponse, error) {
	if err := f.refuse(ctx); err != nil {
		return nil, err
	}
	fields := opFields(req.GetOp())
	for i, o := range req.GetObserved() {
		fields = append(fields, namedField{fmt.Sprintf("observed[%d].tensor", i), o.GetTensor()})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.compareReqs = append(f.compareReqs, req)
	if m := f.missingInFields(fields); m != nil {
		st, err := status.New(codes.FailedPrecondition, "the store lacks "+m.Fields[0]+" "+m.Digests[0].Hash).WithDetails(m)
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	return f.compareResp, f.err
}

func (f *fakeServer) GetCapabilities(ctx context.Context, _ *pb.GetCapabilitiesRequest) (*pb.GetCapabilitiesResponse, error) {
	if err := f.refuse(ctx); err != nil {
		return nil, err
	}
	return &pb.GetCapabilitiesResponse{
		ServerVersion:    "fake",
		DefaultReference: "cpu:fp64",
		Backends: []*pb.BackendInfo{{
			Name: "cpu", Available: true, Configs: []string{"cpu:fp32:fused"},
			StorageDtypes: []pb.DType{pb.DType_DTYPE_FLOAT32},
			Device:        &pb.DeviceInfo{Name: "host"},
		}},
		Limits:      &pb.Limits{MaxConfigs: 16, MaxMessageBytes: f.maxMessageBytes()},
		Store:       f.storeInfo(),
		TensorStore: f.storeInfo() != nil,
	}, nil
}

func (f *fakeServer) maxMessageBytes() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.store.maxMessageBytes == 0 {
		return 64 << 20
	}
	return f.store.maxMessageBytes
}

func (f *fakeServer) storeInfo() *pb.StoreInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.store.off {
		return nil
	}
	info := &pb.StoreInfo{Present: true, ChunkBytes: f.store.chunkBytes, Uploads: int64(len(f.store.stored))}
	if info.ChunkBytes == 0 {
		info.ChunkBytes = MaxChunkBytes
	}
	return info
}

func startFake(t *testing.T, opts ...Option) (*fakeServer, *Client) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeServer{}
	// 4 MiB chunks and their headers exceed gRPC's default 4 MiB.
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(16 << 20))
	pb.RegisterTensorCheckServer(srv, fake)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	c, err := Dial(context.Background(), lis.Addr().String(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return fake, c
}

func TestFakeReportMirrorsTheResponse(t *testing.T) {
	fake, c := startFake(t, WithToken("s3cret"))
	fake.resp = &pb.VerifyResponse{
		Verdict:     pb.Verdict_VERDICT_PASS,
		Tolerance:   &pb.Tolerance{Preset: pb.Tolerance_PRESET_TORCH, Atol: &wrapperspb.DoubleValue{Value: 1e-5}},
		OutputShape: []int64{2, 2},
		Results: []*pb.ConfigResult{
			{Config: "cpu:fp32:fused", VsReference: &pb.Stats{MaxAbs: 0.25, MaxAbsIndex: []int64{1, 0},
				BoundRatio: &wrapperspb.DoubleValue{Value: 0.9}, ComparedDtype: pb.DType_DTYPE_FLOAT32,
				Worst:        []*pb.Element{{Index: []int64{1, 0}, ActualBits: "0x3f800000", Ulp: 3}},
				UlpHistogram: []*pb.UlpBucket{{Lo: 3, Hi: 4, Count: 1}}}},
			{Config: "cpu:tf32:unfused", Output: &pb.Tensor{Dtype: pb.DType_DTYPE_FLOAT32, Shape: []int64{1},
				Source: &pb.Tensor_Data{Data: []byte{0, 0, 0x80, 0x3f}}}, SharedComputation: "cpu:tf32:fused"},
		},
		Diagnosis: &pb.Diagnosis{Best: "cpu:tf32:unfused", Ranking: []*pb.RankedCandidate{
			{Config: "cpu:tf32:unfused", BitwiseEqualFraction: 0.99996831, Disagreements: 3, ExpectedDisagreements: 2.5,
				PlausibilityP: 0.46, Plausible: true, ConsistentFraction: 1, ComparedElements: 94674,
				SharedComputation: "cpu:tf32:fused"},
			{Config: "cpu:fp32:fused", Disagreements: 94671, ExpectedDisagreements: 12.5, ConsistentFraction: 0.25,
				ComparedElements: 94674, RuledOut: "94671 of 94674 elements differ where 12.5 are expected."},
		},
			Localization: &pb.Localization{Columns: []*pb.Group{{Index: 7, Mismatched: 2, Share: 1}}}},
	}
	rep, err := c.DiagnoseLinear(context.Background(), &LinearRequest{
		Input: Float32Tensor([]float32{1, 2}, 1, 2), Weight: Float32Tensor([]float32{1, 2, 3, 4}, 2, 2),
		Observed: Float32Tensor([]float32{5, 11}, 1, 2),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(fake.lastAuth) != 1 || fake.lastAuth[0] != "Bearer s3cret" {
		t.Errorf("authorization metadata = %q", fake.lastAuth)
	}
	// Its size declared, so that the server admits it before receiving it.
	if want := strconv.Itoa(proto.Size(fake.lastReq)); len(fake.lastDeclared) != 1 || fake.lastDeclared[0] != want {
		t.Errorf("%s metadata = %q, the request has %s bytes", requestBytesKey, fake.lastDeclared, want)
	}
	if !rep.Passed || rep.Tolerance.Preset != "torch" || rep.Tolerance.Atol == nil || *rep.Tolerance.Atol != 1e-5 ||
		rep.Tolerance.Rtol != nil || len(rep.OutputShape) != 2 || rep.ObservedVsReference != nil || rep.Reference != nil {
		t.Errorf("report = %+v", rep)
	}
	s := rep.Result("cpu:fp32").VsReference
	if s.MaxAbs != 0.25 || s.MaxAbsIndex[0] != 1 || s.BoundRatio == nil || *s.BoundRatio != 0.9 ||
		s.ComparedDType != Float32 || s.Worst[0].ULP != 3 || s.ULPHistogram[0].Hi != 4 {
		t.Errorf("stats = %+v", s)
	}
	if r := rep.Result("cpu:tf32"); r == nil || r.VsObserved != nil || r.Output == nil ||
		r.SharedComputation != "cpu:tf32:fused" {
		t.Fatalf("tf32 result = %+v", r)
	}
	if r := rep.Result("cpu:fp32"); r.SharedComputation != "" {
		t.Errorf("fp32 result shares %q, want none", r.SharedComputation)
	}
	if out, err := rep.Result("cpu:tf32:unfused").Output.Float64s(); err != nil || out[0] != 1 {
		t.Errorf("output = %v, %v", out, err)
	}
	if rep.Result("cublas:fp32") != nil {
		t.Errorf("Result of an absent config is not nil")
	}
	d := rep.Diagnosis
	if d == nil || d.Best != "cpu:tf32:unfused" || len(d.Ranking) != 2 || d.Localization.Columns[0].Index != 7 {
		t.Fatalf("diagnosis = %+v", d)
	}
	want := RankedCandidate{Config: "cpu:tf32:unfused", BitwiseEqualFraction: 0.99996831, Disagreements: 3,
		ExpectedDisagreements: 2.5, PlausibilityP: 0.46, Plausible: true, ConsistentFraction: 1,
		ComparedElements: 94674, SharedComputation: "cpu:tf32:fused"}
	if got := d.Ranking[0]; !reflect.DeepEqual(got, want) {
		t.Errorf("ranking[0] = %+v, want %+v", got, want)
	}
	if got := FormatShare(d.Ranking[0].BitwiseEqualFraction); got != "99.997%" {
		t.Errorf("FormatShare(ranking[0].BitwiseEqualFraction) = %q, want 99.997%%", got)
	}
	if c := d.Ranking[1]; c.Plausible || c.Disagreements != 94671 || c.ConsistentFraction != 0.25 ||
		c.RuledOut != "94671 of 94674 elements differ where 12.5 are expected." || c.SharedComputation != "" {
		t.Errorf("ranking[1] = %+v", c)
	}
}

func TestFakeStatusBecomesError(t *testing.T) {
	fake, c := startFake(t)
	fake.err = status.Error(codes.NotFound, "unknown backend \"tpu\"")
	_, err := c.VerifyLinear(context.Background(), validRequest())
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.NotFound || e.Message != "unknown backend \"tpu\"" {
		t.Fatalf("got %#v", err)
	}
	if Code(err) != codes.NotFound || status.Code(err) != codes.NotFound {
		t.Errorf("Code(err) = %v, status.Code(err) = %v", Code(err), status.Code(err))
	}
}

func TestFakeContextDeadlineIsDeadlineExceeded(t *testing.T) {
	fake, c := startFake(t)
	fake.block = true
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.VerifyLinear(ctx, validRequest())
	if Code(err) != codes.DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestFakeOversizedRequestIsResourceExhausted(t *testing.T) {
	_, c := startFake(t, WithMaxMessageBytes(1024))
	r := validRequest()
	r.Input = Float32Tensor(make([]float32, 600), 200, 3)
	_, err := c.VerifyLinear(context.Background(), r)
	if Code(err) != codes.ResourceExhausted {
		t.Fatalf("got %v, want ResourceExhausted", err)
	}
}

func TestFakeCapabilities(t *testing.T) {
	_, c := startFake(t)
	caps, err := c.Capabilities(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if caps.ServerVersion != "fake" || len(caps.Backends) != 1 || caps.Backends[0].Device.Name != "host" ||
		caps.Backends[0].StorageDTypes[0] != Float32 || caps.Limits.MaxConfigs != 16 {
		t.Errorf("capabilities = %+v", caps)
	}
}

// A request without Reference leaves the field empty, so the server applies
// its own default (the fp64 configuration of its fastest backend); a named
// one is sent as given. Both RPCs build the request the same way.
func TestFakeReferenceIsSentOnlyWhenNamed(t *testing.T) {
	fake, c := startFake(t)
	fake.resp = &pb.VerifyResponse{Verdict: pb.Verdict_VERDICT_PASS}
	calls := []struct {
		name string
		run  func(*LinearRequest) (*Report, error)
	}{
		{"VerifyLinear", func(r *LinearRequest) (*Report, error) { return c.VerifyLinear(context.Background(), r) }},
		{"DiagnoseLinear", func(r *LinearRequest) (*Report, error) { return c.DiagnoseLinear(context.Background(), r) }},
	}
	for _, call := range calls {
		for _, reference := range []string{"", "cpu:fp32"} {
			r := validRequest()
			r.Observed = Float32Tensor([]float32{1, 2, 4, 5}, 2, 2)
			r.Reference = reference
			if _, err := call.run(r); err != nil {
				t.Fatalf("%s with Reference %q: %v", call.name, reference, err)
			}
			fake.mu.Lock()
			got := fake.lastReq.GetReference()
			fake.mu.Unlock()
			if got != reference {
				t.Errorf("%s with Reference %q sent reference %q", call.name, reference, got)
			}
		}
	}
}
