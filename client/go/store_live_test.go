package tensorcheck

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// The tensor store against the live server (see server_test.go for how it
// is found). Each test uses data seeded from the clock, so a server that
// outlives one run (TENSORCHECK_SERVER) has not seen it before.

// liveStoreClient is liveClient for a server with a store, and its store's
// counters now.
func liveStoreClient(t *testing.T) (*Client, StoreInfo) {
	t.Helper()
	c := liveClient(t)
	caps, err := c.Capabilities(callCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !caps.Store.Present {
		t.Skip("the server has no tensor store (--store-bytes 0, or it predates the store)")
	}
	if caps.Store.ChunkBytes <= 0 || caps.Store.ChunkBytes > MaxChunkBytes {
		t.Errorf("store chunk_bytes %d, want 1..%d", caps.Store.ChunkBytes, MaxChunkBytes)
	}
	return c, caps.Store
}

func liveStore(t *testing.T, c *Client) StoreInfo {
	t.Helper()
	caps, err := c.Capabilities(callCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return caps.Store
}

// checkReference checks the reference output (fp64, rounded to float32)
// against y = x·Wᵀ computed here: the server used the bytes sent.
func checkReference(t *testing.T, rep *Report, x, w []float32, m, k, n int) {
	t.Helper()
	if rep.Reference == nil {
		t.Fatal("no reference result")
	}
	y, _ := linear64(widen(x), widen(w), nil, m, k, n)
	ref := decode(t, "reference", rep.Reference.Output, m*n)
	for i := range ref {
		if d := math.Abs(ref[i] - y[i]); d > math.Ldexp(math.Abs(y[i]), -24)*(1+1e-9) {
			t.Fatalf("reference[%d] = %v, float64 computation %v: the server computed with other bytes", i, ref[i], y[i])
		}
	}
}

// sameWeightTwice is a request with a fresh 1.5 MiB weight (through the
// store) and its data.
func sameWeightTwice() (req *LinearRequest, x, w []float32, m, k, n int) {
	m, k, n = 2, 768, 512
	g := lcg(time.Now().UnixNano())
	x, w = g.float32s(m*k, -1, 1), g.float32s(n*k, -0.1, 0.1)
	req = &LinearRequest{
		Input:         Float32Tensor(x, int64(m), int64(k)),
		Weight:        Float32Tensor(w, int64(n), int64(k)),
		Configs:       []string{"cpu:fp32"},
		ReturnOutputs: true,
	}
	return req, x, w, m, k, n
}

func TestLiveStoreLargeTensorsInlineWithoutAStore(t *testing.T) {
	c := liveClient(t)
	caps, err := c.Capabilities(callCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if caps.Store.Present {
		t.Skip("the server has a tensor store")
	}
	// FindMissingTensors is UNIMPLEMENTED: the weight goes inline.
	req, x, w, m, k, n := sameWeightTwice()
	rep, err := c.VerifyLinear(callCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	checkReference(t, rep, x, w, m, k, n)
	if rep.UploadedBytes != 0 || rep.ReusedBytes != 0 {
		t.Errorf("uploaded %d reused %d without a store", rep.UploadedBytes, rep.ReusedBytes)
	}
}

func TestLiveStoreSameWeightTwiceIsUploadedOnce(t *testing.T) {
	c, before := liveStoreClient(t)
	req, x, w, m, k, n := sameWeightTwice()
	size := int64(4 * n * k)

	rep1, err := c.VerifyLinear(callCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	checkReference(t, rep1, x, w, m, k, n)
	after1 := liveStore(t, c)
	if rep1.UploadedBytes != size || rep1.ReusedBytes != 0 {
		t.Errorf("first call: uploaded %d, reused %d; want %d and 0", rep1.UploadedBytes, rep1.ReusedBytes, size)
	}
	if after1.Uploads < before.Uploads+1 || after1.UploadedBytes < before.UploadedBytes+size {
		t.Errorf("store after the first call: %d uploads, %d bytes; before: %d, %d; want the weight's %d bytes more",
			after1.Uploads, after1.UploadedBytes, before.Uploads, before.UploadedBytes, size)
	}

	rep2, err := c.VerifyLinear(callCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	checkReference(t, rep2, x, w, m, k, n)
	after2 := liveStore(t, c)
	if after2.Uploads != after1.Uploads || after2.UploadedBytes != after1.UploadedBytes {
		t.Errorf("the second call uploaded: %d uploads and %d bytes, were %d and %d",
			after2.Uploads, after2.UploadedBytes, after1.Uploads, after1.UploadedBytes)
	}
	if rep2.UploadedBytes != 0 || rep2.ReusedBytes != size {
		t.Errorf("second call: uploaded %d, reused %d; want 0 and %d", rep2.UploadedBytes, rep2.ReusedBytes, size)
	}
	if a, b := rep1.Result("cpu:fp32"), rep2.Result("cpu:fp32"); a == nil || b == nil ||
		!bytes.Equal(a.Output.Data, b.Output.Data) || a.VsReference.MaxAbs != b.VsReference.MaxAbs {
		t.Errorf("the two calls disagree: %+v, %+v", a, b)
	}
	t.Logf("weight %d bytes: uploaded once (store: %d uploads, %d bytes), reused on the second call",
		size, after2.Uploads, after2.UploadedBytes)
}

func TestLiveStoreUploadReadTensorRoundTrip(t *testing.T) {
	c, before := liveStoreClient(t)
	const m, k, n = 2, 1024, 2304 // weight 9 MiB: three chunks
	g := lcg(time.Now().UnixNano() ^ 0x5eed)
	x, w := g.float32s(m*k, -1, 1), g.float32s(n*k, -0.1, 0.1)
	weight := Float32Tensor(w, n, k)
	ref, err := c.Upload(callCtx(t), weight)
	if err != nil {
		t.Fatal(err)
	}
	size := int64(4 * n * k)
	if ref.SizeBytes != size || ref.Digest != digestOf(weight.Data).Hash {
		t.Errorf("ref = %+v", ref)
	}
	after := liveStore(t, c)
	if after.Uploads < before.Uploads+1 || after.UploadedBytes < before.UploadedBytes+size {
		t.Errorf("store after Upload: %d uploads, %d bytes; before %d, %d", after.Uploads, after.UploadedBytes,
			before.Uploads, before.UploadedBytes)
	}

	got, err := c.ReadTensor(callCtx(t), ref)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Data, weight.Data) || got.DType != Float32 || len(got.Shape) != 2 || got.Shape[0] != n {
		t.Fatalf("read back %v %v, %d bytes: not what was uploaded", got.DType, got.Shape, len(got.Data))
	}

	// Uploading it again sends nothing (already present).
	if _, err := c.Upload(callCtx(t), weight); err != nil {
		t.Fatal(err)
	}
	if again := liveStore(t, c); again.Uploads != after.Uploads || again.UploadedBytes != after.UploadedBytes {
		t.Errorf("a second Upload stored again: %d uploads, %d bytes; were %d, %d", again.Uploads, again.UploadedBytes,
			after.Uploads, after.UploadedBytes)
	}

	// The reference in a request, and outputs above 1 KiB returned by
	// digest and read back.
	rep, err := c.VerifyLinear(callCtx(t), &LinearRequest{
		Input:                Float32Tensor(x, m, k),
		Weight:               ref.Tensor(),
		Configs:              []string{"cpu:fp32"},
		ReturnOutputs:        true,
		MaxInlineOutputBytes: 1024,
	})
	if err != nil {
		t.Fatal(err)
	}
	checkReference(t, rep, x, w, m, k, n)
	if rep.ReusedBytes != size || rep.UploadedBytes != 0 {
		t.Errorf("uploaded %d reused %d, want 0 and %d", rep.UploadedBytes, rep.ReusedBytes, size)
	}
	if r := rep.Result("cpu:fp32"); r == nil || r.Output == nil || r.Output.Digest != "" || len(r.Output.Data) != 4*m*n {
		t.Errorf("fp32 output not read back: %+v", r)
	}

	missing := &TensorRef{Digest: "sha256:" + strings.Repeat("0123456789abcdef", 4), DType: Float32, Shape: []int64{1}}
	if _, err := c.ReadTensor(callCtx(t), missing); Code(err) != codes.NotFound {
		t.Errorf("ReadTensor of a digest never uploaded: got %v, want NotFound", err)
	}
}
