package tensorcheck

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// The tensor store through the fake server (fake_server_test.go): which
// tensors are uploaded, how, and what VerifyLinear sends.

func storeCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// float32s is a tensor of n distinct float32 values from seed.
func float32s(seed uint64, n int, shape ...int64) *Tensor {
	g := lcg(seed)
	return Float32Tensor(g.float32s(n, -1, 1), shape...)
}

// largeRequest has an input and a weight over StoreThreshold (1.5 MiB and
// 2 MiB) and a small bias and observed output.
func largeRequest() *LinearRequest {
	const m, k, n = 384, 1024, 512
	return &LinearRequest{
		Input:    float32s(1, m*k, m, k),
		Weight:   float32s(2, n*k, n, k),
		Bias:     float32s(3, n, n),
		Observed: float32s(4, 4*n, 4, n),
		Configs:  []string{"cpu:fp32"},
	}
}

func TestStoreDigestOfTheWorkedExample(t *testing.T) {
	// docs/api.md, "Worked example": bf16 [[1, -2], [0.5, 3]].
	x := BFloat16Tensor([]uint16{0x3f80, 0xc000, 0x3f00, 0x4040}, 2, 2)
	d := digestOf(x.Data)
	if want := "sha256:f3ae939bfe8dd5d00cb5acc191fd33b1a8c456d6af1341923d47b08db0719406"; d.Hash != want || d.SizeBytes != 8 {
		t.Errorf("digest = %s %d, want %s 8", d.Hash, d.SizeBytes, want)
	}
	if id := newUploadID(); len(id) != 36 || id == newUploadID() || id[14] != '4' {
		t.Errorf("upload id %q is not a fresh version 4 UUID", id)
	}
}

func TestStoreOnlyMissingTensorsAreUploaded(t *testing.T) {
	fake, c := startFake(t)
	fake.resp = &pb.VerifyResponse{Verdict: pb.Verdict_VERDICT_PASS}
	req := largeRequest()
	weightHash := fake.put(req.Weight.Data) // verified before
	inputHash := sha256Hex(req.Input.Data)

	rep, err := c.VerifyLinear(storeCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	s := fake.storeSnapshot()
	if s.finds != 1 || len(s.findHashes[0]) != 2 {
		t.Errorf("FindMissingTensors: %d calls asking %v, want 1 call asking for input and weight", s.finds, s.findHashes)
	}
	if len(s.stored) != 1 || s.stored[0] != inputHash || len(s.alreadyPresent) != 0 {
		t.Errorf("stored %v (already present %v), want the input %s alone", s.stored, s.alreadyPresent, inputHash)
	}
	op := fake.lastReq.Op
	if op.Input.GetDigest() != inputHash || op.Weight.GetDigest() != weightHash {
		t.Errorf("input %q, weight %q by digest; want %s, %s", op.Input.GetDigest(), op.Weight.GetDigest(), inputHash, weightHash)
	}
	if !bytes.Equal(op.Bias.GetData(), req.Bias.Data) || !bytes.Equal(fake.lastReq.Observed.GetData(), req.Observed.Data) {
		t.Errorf("the small bias and observed output did not go inline")
	}
	if rep.UploadedBytes != int64(len(req.Input.Data)) || rep.ReusedBytes != int64(len(req.Weight.Data)) {
		t.Errorf("uploaded %d reused %d, want %d and %d", rep.UploadedBytes, rep.ReusedBytes, len(req.Input.Data), len(req.Weight.Data))
	}
	if !rep.Passed || req.Input.Digest != "" || len(req.Input.Data) == 0 {
		t.Errorf("report %+v; the caller's request must stay as it was", rep)
	}

	// Again: everything is there, nothing is uploaded.
	rep, err = c.DiagnoseLinear(storeCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	s = fake.storeSnapshot()
	if s.finds != 2 || len(s.stored) != 1 || s.uploadStreams != 1 {
		t.Errorf("second call: %d finds, stored %v in %d streams; want 2 finds and nothing new", s.finds, s.stored, s.uploadStreams)
	}
	if rep.UploadedBytes != 0 || rep.ReusedBytes != int64(len(req.Input.Data)+len(req.Weight.Data)) {
		t.Errorf("second call uploaded %d reused %d", rep.UploadedBytes, rep.ReusedBytes)
	}
}

func TestStoreSmallTensorsAndOneTensorTwiceGoOnce(t *testing.T) {
	fake, c := startFake(t)
	fake.resp = &pb.VerifyResponse{}
	// Exactly StoreThreshold bytes stays inline; the same large tensor in
	// two fields is one blob, asked about and uploaded once.
	w := float32s(5, 1024*512, 512, 1024)
	rep, err := c.VerifyLinear(storeCtx(t), &LinearRequest{
		Input: Float32Tensor(make([]float32, StoreThreshold/4), 256, 1024), Weight: w, Observed: w,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := fake.storeSnapshot()
	if s.finds != 1 || len(s.findHashes[0]) != 1 || len(s.stored) != 1 {
		t.Errorf("finds %v, stored %v; want the weight once", s.findHashes, s.stored)
	}
	if fake.lastReq.Op.Input.GetDigest() != "" || fake.lastReq.Op.Weight.GetDigest() != s.stored[0] ||
		fake.lastReq.Observed.GetDigest() != s.stored[0] {
		t.Errorf("request: input by digest %q, weight %q, observed %q", fake.lastReq.Op.Input.GetDigest(),
			fake.lastReq.Op.Weight.GetDigest(), fake.lastReq.Observed.GetDigest())
	}
	if rep.UploadedBytes != int64(len(w.Data)) || rep.ReusedBytes != 0 {
		t.Errorf("uploaded %d reused %d, want %d and 0", rep.UploadedBytes, rep.ReusedBytes, len(w.Data))
	}

	// Small tensors only: the store is not asked at all.
	if _, err := c.VerifyLinear(storeCtx(t), validRequest()); err != nil {
		t.Fatal(err)
	}
	if s := fake.storeSnapshot(); s.finds != 1 {
		t.Errorf("FindMissingTensors asked for a request of small tensors")
	}
}

func TestStoreRetryAfterFailedPreconditionWithDetail(t *testing.T) {
	fake, c := startFake(t)
	fake.resp = &pb.VerifyResponse{Verdict: pb.Verdict_VERDICT_PASS}
	req := largeRequest()
	fake.put(req.Weight.Data)
	fake.store.evictOnVerify = 1 // evicted between FindMissingTensors and Verify

	rep, err := c.VerifyLinear(storeCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	s := fake.storeSnapshot()
	if s.verifies != 2 || s.finds != 1 {
		t.Errorf("%d Verify calls and %d finds, want 2 and 1", s.verifies, s.finds)
	}
	// The input before the first Verify; then both again.
	if len(s.stored) != 3 {
		t.Errorf("stored %v, want the input, then input and weight again", s.stored)
	}
	if size := int64(len(req.Input.Data) + len(req.Weight.Data)); rep.UploadedBytes != size || rep.ReusedBytes != 0 {
		t.Errorf("uploaded %d reused %d, want %d and 0", rep.UploadedBytes, rep.ReusedBytes, size)
	}
}

// Behind round_robin over replicas, each with its own store, the re-upload
// and the resend can reach different replicas: the second miss sends the
// request again with the tensors inline, which any replica takes.
func TestStoreSecondMissResendsInline(t *testing.T) {
	for _, diagnose := range []bool{false, true} {
		fake, c := startFake(t)
		fake.resp = &pb.VerifyResponse{Verdict: pb.Verdict_VERDICT_PASS}
		req := largeRequest()
		fake.store.evictOnVerify = 2 // both requests by digest miss
		run := c.VerifyLinear
		if diagnose {
			run = c.DiagnoseLinear
		}
		rep, err := run(storeCtx(t), req)
		if err != nil {
			t.Fatalf("diagnose=%v: %v", diagnose, err)
		}
		s := fake.storeSnapshot()
		if s.verifies != 3 || len(s.verifyReqs) != 3 {
			t.Fatalf("diagnose=%v: %d requests, want 3 (by digest, again by digest, inline)", diagnose, s.verifies)
		}
		inputHash, weightHash := sha256Hex(req.Input.Data), sha256Hex(req.Weight.Data)
		for _, r := range s.verifyReqs[:2] {
			if r.Op.Input.GetDigest() != inputHash || r.Op.Weight.GetDigest() != weightHash {
				t.Errorf("diagnose=%v: a request before the inline one sent input %q, weight %q; want by digest",
					diagnose, r.Op.Input.GetDigest(), r.Op.Weight.GetDigest())
			}
		}
		last := s.verifyReqs[2]
		if last.Op.Input.GetDigest() != "" || !bytes.Equal(last.Op.Input.GetData(), req.Input.Data) ||
			last.Op.Weight.GetDigest() != "" || !bytes.Equal(last.Op.Weight.GetData(), req.Weight.Data) ||
			!bytes.Equal(last.Op.Bias.GetData(), req.Bias.Data) || !bytes.Equal(last.Observed.GetData(), req.Observed.Data) {
			t.Errorf("diagnose=%v: the third request did not carry every tensor as data", diagnose)
		}
		if !rep.Passed {
			t.Errorf("diagnose=%v: report %+v", diagnose, rep)
		}
		// Uploaded (twice, counted once), then inline: nothing reused.
		if size := int64(len(req.Input.Data) + len(req.Weight.Data)); rep.UploadedBytes != size || rep.ReusedBytes != 0 {
			t.Errorf("diagnose=%v: uploaded %d reused %d, want %d and 0", diagnose, rep.UploadedBytes, rep.ReusedBytes, size)
		}
		if len(s.stored) != 4 {
			t.Errorf("diagnose=%v: stored %v, want input and weight, twice", diagnose, s.stored)
		}
		if req.Input.Digest != "" || len(req.Input.Data) == 0 {
			t.Errorf("diagnose=%v: the caller's request must stay as it was", diagnose)
		}
	}
}

// A second miss whose inline request exceeds the server's max_message_bytes
// or the client's WithMaxMessageBytes is the FailedPrecondition, its
// MissingTensors detail readable through status; nothing is sent inline.
func TestStoreSecondMissOverTheMessageLimitIsFailedPrecondition(t *testing.T) {
	// The inline request carries 1.5 + 2 MiB and the small tensors.
	for _, tc := range []struct {
		name      string
		serverMax int64
		opts      []Option
	}{
		{"server", 2 << 20, nil},
		{"client", 0, []Option{WithMaxMessageBytes(3 << 20)}},
	} {
		fake, c := startFake(t, tc.opts...)
		fake.resp = &pb.VerifyResponse{Verdict: pb.Verdict_VERDICT_PASS}
		fake.store.maxMessageBytes = tc.serverMax
		fake.store.chunkBytes = 1 << 20 // uploads fit the client's 3 MiB
		fake.store.evictOnVerify = 2
		req := largeRequest()
		_, err := c.VerifyLinear(storeCtx(t), req)
		if Code(err) != codes.FailedPrecondition {
			t.Fatalf("%s limit: got %v, want FailedPrecondition", tc.name, err)
		}
		details := status.Convert(err).Details()
		if len(details) != 1 {
			t.Fatalf("%s limit: details %v", tc.name, details)
		}
		m, ok := details[0].(*pb.MissingTensors)
		if !ok || len(m.Digests) != 2 || m.Fields[0] != "op.input" || m.Digests[1].Hash != sha256Hex(req.Weight.Data) {
			t.Errorf("%s limit: detail %#v, want *tensorcheckpb.MissingTensors naming op.input and op.weight", tc.name, details[0])
		}
		if got := missingTensors(err); got == nil || len(got.Digests) != 2 {
			t.Errorf("%s limit: missingTensors(err) = %v", tc.name, got)
		}
		s := fake.storeSnapshot()
		if s.verifies != 2 {
			t.Errorf("%s limit: %d Verify calls, want 2 (none inline)", tc.name, s.verifies)
		}
		for _, r := range s.verifyReqs {
			if r.Op.Input.GetDigest() == "" || r.Op.Weight.GetDigest() == "" {
				t.Errorf("%s limit: a request sent input or weight inline", tc.name)
			}
		}
	}
}

func TestStoreMissingCallerReferenceIsNotRetried(t *testing.T) {
	fake, c := startFake(t)
	fake.resp = &pb.VerifyResponse{}
	w := float32s(6, 64, 8, 8)
	ref := &TensorRef{Digest: sha256Hex(w.Data), DType: Float32, Shape: []int64{8, 8}}
	_, err := c.VerifyLinear(storeCtx(t), &LinearRequest{Input: float32s(7, 16, 2, 8), Weight: ref.Tensor()})
	if Code(err) != codes.FailedPrecondition || missingTensors(err) == nil {
		t.Fatalf("got %v, want the FailedPrecondition with its detail", err)
	}
	if s := fake.storeSnapshot(); s.verifies != 1 || s.uploadStreams != 0 {
		t.Errorf("%d Verify calls, %d uploads; a caller's reference has no data to upload", s.verifies, s.uploadStreams)
	}
}

func TestStoreUnimplementedFallsBackToInline(t *testing.T) {
	fake, c := startFake(t)
	fake.resp = &pb.VerifyResponse{Verdict: pb.Verdict_VERDICT_PASS}
	fake.store.off = true
	req := largeRequest()
	rep, err := c.VerifyLinear(storeCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	op := fake.lastReq.Op
	if !bytes.Equal(op.Input.GetData(), req.Input.Data) || !bytes.Equal(op.Weight.GetData(), req.Weight.Data) {
		t.Errorf("input and weight not inline")
	}
	if rep.UploadedBytes != 0 || rep.ReusedBytes != 0 {
		t.Errorf("uploaded %d reused %d without a store", rep.UploadedBytes, rep.ReusedBytes)
	}
	if s := fake.storeSnapshot(); s.uploadStreams != 0 {
		t.Errorf("%d uploads to a server without a store", s.uploadStreams)
	}
	if _, err := c.Upload(storeCtx(t), req.Weight); Code(err) != codes.Unimplemented {
		t.Errorf("Upload without a store: got %v, want Unimplemented", err)
	}
}

func TestStoreUnimplementedFromAServerWithAStoreIsReturnedNotTakenForNoStore(t *testing.T) {
	fake, c := startFake(t)
	fake.resp = &pb.VerifyResponse{Verdict: pb.Verdict_VERDICT_PASS}
	fake.mu.Lock()
	fake.store.findUnimplemented = true
	fake.mu.Unlock()
	_, err := c.VerifyLinear(storeCtx(t), largeRequest())
	if Code(err) != codes.Unimplemented {
		t.Fatalf("got %v, want the Unimplemented of FindMissingTensors", err)
	}
	if fake.lastReq != nil {
		t.Errorf("the request was sent inline although the server has a store")
	}
}

// checkChunks checks that each stream's messages carry at most limit bytes
// at consecutive offsets, the first naming the digest, and returns the
// streams' first offsets.
func checkChunks(t *testing.T, msgs []fakeUploadMsg, limit int, hash string) map[int]int64 {
	t.Helper()
	firsts := map[int]int64{}
	next := map[int]int64{}
	for i, m := range msgs {
		if m.size > limit {
			t.Errorf("message %d: %d bytes, over %d", i, m.size, limit)
		}
		if _, ok := next[m.stream]; !ok {
			if m.digest != hash || m.uploadID == "" {
				t.Errorf("stream %d starts with digest %q, upload id %q", m.stream, m.digest, m.uploadID)
			}
			firsts[m.stream] = m.offset
		} else if m.offset != next[m.stream] {
			t.Errorf("message %d of stream %d at offset %d, want %d", i, m.stream, m.offset, next[m.stream])
		}
		next[m.stream] = m.offset + int64(m.size)
	}
	return firsts
}

func TestStoreUploadChunksInOrder(t *testing.T) {
	fake, c := startFake(t)
	x := float32s(8, (10<<20+12)/4) // 10 MiB and 12 bytes: 4, 4, 2 MiB + 12
	ref, err := c.Upload(storeCtx(t), x)
	if err != nil {
		t.Fatal(err)
	}
	if ref.Digest != sha256Hex(x.Data) || ref.SizeBytes != int64(len(x.Data)) || ref.DType != Float32 ||
		len(ref.Shape) != 1 || ref.Shape[0] != int64(len(x.Data)/4) {
		t.Errorf("ref = %+v", ref)
	}
	s := fake.storeSnapshot()
	checkChunks(t, s.uploadMsgs, MaxChunkBytes, ref.Digest)
	if len(s.uploadMsgs) != 3 || s.uploadMsgs[2].offset != 8<<20 || len(s.stored) != 1 {
		t.Errorf("messages %+v, stored %v; want 3 chunks at 0, 4 MiB, 8 MiB", s.uploadMsgs, s.stored)
	}
	if !bytes.Equal(fake.store.blobs[ref.Digest], x.Data) {
		t.Errorf("stored bytes differ")
	}

	// A server with smaller chunks gets smaller chunks.
	fake2, c2 := startFake(t)
	fake2.store.chunkBytes = 1 << 20
	if _, err := c2.Upload(storeCtx(t), x); err != nil {
		t.Fatal(err)
	}
	s = fake2.storeSnapshot()
	checkChunks(t, s.uploadMsgs, 1<<20, ref.Digest)
	if len(s.uploadMsgs) != 11 {
		t.Errorf("%d chunks of 1 MiB, want 11", len(s.uploadMsgs))
	}
}

func TestStoreUploadResumesAfterABrokenStream(t *testing.T) {
	fake, c := startFake(t)
	fake.store.breakUploadAt = 8 << 20
	x := float32s(9, (10<<20)/4)
	ref, err := c.Upload(storeCtx(t), x)
	if err != nil {
		t.Fatal(err)
	}
	s := fake.storeSnapshot()
	firsts := checkChunks(t, s.uploadMsgs, MaxChunkBytes, ref.Digest)
	if s.uploadStreams != 2 || s.queries != 1 || firsts[1] != 0 || firsts[2] != 8<<20 {
		t.Errorf("%d streams starting at %v, %d status queries; want 2 streams, the second from 8 MiB, 1 query",
			s.uploadStreams, firsts, s.queries)
	}
	if s.uploadMsgs[0].uploadID != s.uploadMsgs[len(s.uploadMsgs)-1].uploadID {
		t.Errorf("the resumed stream has another upload id")
	}
	if len(s.stored) != 1 || !bytes.Equal(fake.store.blobs[ref.Digest], x.Data) {
		t.Errorf("stored %v; bytes equal %v", s.stored, bytes.Equal(fake.store.blobs[ref.Digest], x.Data))
	}

	// A second upload gets a new id.
	if _, err := c.Upload(storeCtx(t), float32s(10, 16)); err != nil {
		t.Fatal(err)
	}
	s = fake.storeSnapshot()
	if last := s.uploadMsgs[len(s.uploadMsgs)-1]; last.uploadID == s.uploadMsgs[0].uploadID {
		t.Errorf("two uploads share the id %s", last.uploadID)
	}
}

func TestStoreUploadRetriesNoRoomOnTheHintOnly(t *testing.T) {
	fake, c := startFake(t)
	fake.store.refuseUploads, fake.store.refusePushback = 1, "20"
	x := float32s(17, (5<<20)/4)
	start := time.Now()
	ref, err := c.Upload(storeCtx(t), x)
	if err != nil {
		t.Fatal(err)
	}
	s := fake.storeSnapshot()
	if s.uploadStreams != 2 || len(s.stored) != 1 || s.stored[0] != ref.Digest || time.Since(start) < 20*time.Millisecond {
		t.Errorf("%d streams, stored %v in %v; want the refusal, the hinted wait, then the upload", s.uploadStreams, s.stored, time.Since(start))
	}

	// Without the hint the refusal is permanent.
	fake.mu.Lock()
	fake.store.refuseUploads, fake.store.refusePushback = 1, ""
	fake.mu.Unlock()
	_, err = c.Upload(storeCtx(t), float32s(18, 16))
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.ResourceExhausted || e.RetryAfter != 0 {
		t.Errorf("got %v, want ResourceExhausted without RetryAfter", err)
	}
	if s := fake.storeSnapshot(); s.uploadStreams != 3 {
		t.Errorf("%d streams, want 3: a refusal without a hint is not retried", s.uploadStreams)
	}
}

func TestStoreAlreadyPresentEndsTheUpload(t *testing.T) {
	fake, c := startFake(t)
	fake.resp = &pb.VerifyResponse{}
	x := float32s(11, (12<<20)/4)
	hash := fake.put(x.Data)
	ref, err := c.Upload(storeCtx(t), x)
	if err != nil {
		t.Fatal(err)
	}
	s := fake.storeSnapshot()
	if ref.Digest != hash || len(s.alreadyPresent) != 1 || len(s.stored) != 0 || s.uploadStreams != 1 {
		t.Errorf("ref %+v; already present %v, stored %v, %d streams", ref, s.alreadyPresent, s.stored, s.uploadStreams)
	}

	// FindMissingTensors says missing, the upload finds it there (another
	// client uploaded it meanwhile): reused, not uploaded.
	fake.mu.Lock()
	fake.store.allMissing = true
	fake.mu.Unlock()
	rep, err := c.VerifyLinear(storeCtx(t), &LinearRequest{Input: float32s(12, 3*1024, 3, 1024), Weight: x.reshaped(3072, 1024)})
	if err != nil {
		t.Fatal(err)
	}
	s = fake.storeSnapshot()
	if len(s.alreadyPresent) != 2 || len(s.stored) != 0 || rep.UploadedBytes != 0 || rep.ReusedBytes != int64(len(x.Data)) {
		t.Errorf("already present %v, stored %v, uploaded %d, reused %d", s.alreadyPresent, s.stored, rep.UploadedBytes, rep.ReusedBytes)
	}
	if fake.lastReq.Op.Weight.GetDigest() != hash {
		t.Errorf("weight not sent by digest")
	}
}

// reshaped is t's data under another shape.
func (t *Tensor) reshaped(shape ...int64) *Tensor {
	return &Tensor{DType: t.DType, Shape: shape, Data: t.Data}
}

func TestStoreReadTensorRoundTrip(t *testing.T) {
	fake, c := startFake(t)
	x := float32s(13, (9<<20)/4, 3, 768, 1024)
	ref, err := c.Upload(storeCtx(t), x)
	if err != nil {
		t.Fatal(err)
	}
	fake.store.breakReadAt = 4 << 20 // and the read resumes after a break
	got, err := c.ReadTensor(storeCtx(t), ref)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Data, x.Data) || got.DType != Float32 || len(got.Shape) != 3 || got.Shape[2] != 1024 || got.Digest != "" {
		t.Errorf("read back %v %v (%d bytes), want %v %v", got.DType, got.Shape, len(got.Data), x.DType, x.Shape)
	}
	if s := fake.storeSnapshot(); s.reads != 2 {
		t.Errorf("%d reads, want 2 (broken, resumed)", s.reads)
	}

	// The same bytes under another shape of the same size.
	other := &TensorRef{Digest: strings.TrimPrefix(ref.Digest, "sha256:"), DType: BFloat16, Shape: []int64{2 * 3 * 768 * 1024}}
	if got, err := c.ReadTensor(storeCtx(t), other); err != nil || !bytes.Equal(got.Data, x.Data) {
		t.Errorf("read as bf16: %v", err)
	}

	missing := &TensorRef{Digest: sha256Hex([]byte("nothing")), DType: Float32, Shape: []int64{2}}
	if _, err := c.ReadTensor(storeCtx(t), missing); Code(err) != codes.NotFound {
		t.Errorf("unknown digest: got %v, want NotFound", err)
	}
	bad := *ref
	bad.SizeBytes++
	if _, err := c.ReadTensor(storeCtx(t), &bad); Code(err) != codes.InvalidArgument {
		t.Errorf("size not matching the shape: got %v, want InvalidArgument", err)
	}
}

func TestStoreOutputsByDigestAreReadBack(t *testing.T) {
	fake, c := startFake(t)
	out := float32s(14, 6*131072, 6, 131072) // 3 MiB
	hash := fake.put(out.Data)
	fake.resp = &pb.VerifyResponse{
		Verdict: pb.Verdict_VERDICT_PASS,
		Results: []*pb.ConfigResult{{Config: "cpu:fp32:fused",
			Output: &pb.Tensor{Dtype: pb.DType_DTYPE_FLOAT32, Shape: out.Shape, Source: &pb.Tensor_Digest{Digest: hash}}}},
		Reference: &pb.ConfigResult{Config: "cpu:fp64:fused",
			Output: &pb.Tensor{Dtype: pb.DType_DTYPE_FLOAT32, Shape: []int64{1}, Source: &pb.Tensor_Data{Data: []byte{0, 0, 0x80, 0x3f}}}},
	}
	req := validRequest()
	req.ReturnOutputs, req.MaxInlineOutputBytes = true, 1024
	rep, err := c.VerifyLinear(storeCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if o := fake.lastReq.Output; !o.ReturnOutputs || o.MaxInlineOutputBytes != 1024 {
		t.Errorf("output options sent: %+v", o)
	}
	got := rep.Result("cpu:fp32").Output
	if got == nil || got.Digest != "" || !bytes.Equal(got.Data, out.Data) || got.Shape[1] != out.Shape[1] {
		t.Fatalf("output not read back: %+v", got)
	}
	if v, err := got.Float64s(); err != nil || len(v) != len(out.Data)/4 {
		t.Errorf("Float64s: %d values, %v", len(v), err)
	}
	if v, err := rep.Reference.Output.Float64s(); err != nil || v[0] != 1 {
		t.Errorf("inline reference output: %v, %v", v, err)
	}

	// Evicted before it was read: the error says whose output.
	fake.mu.Lock()
	fake.store.blobs = nil
	fake.mu.Unlock()
	_, err = c.VerifyLinear(storeCtx(t), req)
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.NotFound || !strings.Contains(e.Message, "cpu:fp32:fused") {
		t.Errorf("evicted output: got %v, want NotFound naming the configuration", err)
	}
}

func TestStoreCallerReferenceGoesByDigest(t *testing.T) {
	fake, c := startFake(t)
	fake.resp = &pb.VerifyResponse{}
	w := float32s(15, 64, 8, 8)
	ref, err := c.Upload(storeCtx(t), w)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.VerifyLinear(storeCtx(t), &LinearRequest{Input: float32s(16, 16, 2, 8), Weight: ref.Tensor()})
	if err != nil {
		t.Fatal(err)
	}
	wt := fake.lastReq.Op.Weight
	if wt.GetDigest() != ref.Digest || wt.Dtype != pb.DType_DTYPE_FLOAT32 || len(wt.Shape) != 2 {
		t.Errorf("weight sent as %+v", wt)
	}
	if s := fake.storeSnapshot(); s.finds != 0 || rep.ReusedBytes != 256 || rep.UploadedBytes != 0 {
		t.Errorf("%d finds; reused %d uploaded %d", s.finds, rep.ReusedBytes, rep.UploadedBytes)
	}
}

func TestStoreReferenceValidation(t *testing.T) {
	_, c := startFake(t)
	hash := sha256Hex([]byte("x"))
	for _, tc := range []struct {
		t    *Tensor
		frag string
	}{
		{&Tensor{DType: Float32, Shape: []int64{1}, Data: []byte{0, 0, 0, 0}, Digest: hash}, "both"},
		{&Tensor{DType: Float32, Shape: []int64{1}, Digest: "sha256:ABC"}, "64 lowercase hex"},
		{&Tensor{DType: Float32, Shape: []int64{1}, Digest: strings.ToUpper(hash[7:])}, "64 lowercase hex"},
	} {
		_, err := c.VerifyLinear(storeCtx(t), &LinearRequest{Input: validRequest().Input, Weight: tc.t})
		wantInvalid(t, err, "weight", tc.frag)
	}
	if _, err := c.Upload(storeCtx(t), &Tensor{DType: Float32, Shape: []int64{1}, Digest: hash}); Code(err) != codes.InvalidArgument {
		t.Errorf("Upload of a reference: got %v", err)
	}
	if _, err := (&Tensor{DType: Float32, Shape: []int64{1}, Digest: hash}).Float64s(); Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "ReadTensor") {
		t.Errorf("Float64s of a reference: got %v", err)
	}
}

func TestFakeCapabilitiesStore(t *testing.T) {
	fake, c := startFake(t)
	fake.store.chunkBytes = 1 << 20
	caps, err := c.Capabilities(storeCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !caps.Store.Present || caps.Store.ChunkBytes != 1<<20 {
		t.Errorf("store = %+v", caps.Store)
	}
}

func TestStoreFloat8WeightAndScaleReferenceGoByDigest(t *testing.T) {
	fake, c := startFake(t)
	fake.resp = &pb.VerifyResponse{}
	// 1536 x 1024 float8_e4m3fn is 1.5 MiB at one byte per element: over
	// StoreThreshold, so hashed and uploaded. As float32 it would be 6 MiB.
	const n, k = 1536, 1024
	bits := make([]uint8, n*k)
	g := lcg(17)
	for i, v := range g.float32s(n*k, -448, 448) {
		bits[i] = Float8E4M3FNFromFloat32(v)
	}
	w := Float8E4M3FNTensor(bits, n, k)
	scale := Float32Tensor(g.float32s(n, 0.5, 2)) // row-wise weight scale, [N]
	ref, err := c.Upload(storeCtx(t), scale)
	if err != nil {
		t.Fatal(err)
	}
	if ref.SizeBytes != 4*n || ref.DType != Float32 {
		t.Errorf("scale ref %+v", ref)
	}
	rep, err := c.VerifyLinear(storeCtx(t), &LinearRequest{
		Input:       Float8E4M3FNTensor(bits[:2*k], 2, k),
		Weight:      w,
		InputScale:  Float32Scalar(1),
		WeightScale: ref.Tensor(),
	})
	if err != nil {
		t.Fatal(err)
	}
	op := fake.lastReq.Op
	if op.Weight.GetDigest() != sha256Hex(bits) || op.Weight.Dtype != pb.DType_DTYPE_FLOAT8_E4M3FN {
		t.Errorf("weight sent as dtype %v digest %q", op.Weight.Dtype, op.Weight.GetDigest())
	}
	if op.WeightScale.GetDigest() != ref.Digest || len(op.InputScale.GetData()) != 4 || len(op.Input.GetData()) != 2*k {
		t.Errorf("scales sent as %v / %v", op.InputScale, op.WeightScale)
	}
	if rep.UploadedBytes != n*k || rep.ReusedBytes != 4*n {
		t.Errorf("uploaded %d reused %d, want %d and %d", rep.UploadedBytes, rep.ReusedBytes, n*k, 4*n)
	}
}
