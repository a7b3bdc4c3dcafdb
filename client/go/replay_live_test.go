package tensorcheck

import (
	"errors"
	"math"
	"math/bits"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

// LinearRequest.Gpu against a live server (docs/numerics.md, "Kernel K
// order"): a diagnosis that names the GPU also ranks the CPU replays of
// its default kernels, and finds the one an H100's output came from bit
// for bit. The observed output is computed here by sm90BF16Linear, the
// sm_90 tensor-core model redone from its description (never from the
// server): a bf16 layer with float32 output, each element the tensor
// cores' blocked, truncating inner product, the bias added in fp32. A few
// inputs are x4096, so that the truncation shows against fp32
// accumulation.

// floorLog2 is floor(log2 |v|) of a nonzero finite v.
func floorLog2(v float64) int {
	_, e := math.Frexp(v) // |v| = f * 2^e, 0.5 <= f < 1
	return e - 1
}

// sm90BF16Dot is sum a[i] * b[i] as an H100's bf16 tensor cores compute
// it from a zero accumulator C, K walked in blocks of 16 products from
// k = 0. In each block the nonzero products and a nonzero C are aligned to
// the largest nominal exponent E among them (a product's: the sum of its
// inputs' floorLog2; C's its own), every term truncated toward zero to a
// multiple of 2^(E-25), the terms summed exactly, and the sum truncated
// toward zero to 24 significant bits: the next C. Normal values only. The
// arithmetic is exact: a product of two bf16 values has at most 16
// significant bits and C 24, so each term is an integer count of
// 2^(E-25) below 2^27, and 17 of them sum in an int64.
func sm90BF16Dot(a, b []float32) float32 {
	type term struct {
		v float64
		e int
	}
	var c float64 // an fp32 value
	for start := 0; start < len(a); start += 16 {
		end := start + 16
		if end > len(a) {
			end = len(a)
		}
		var terms []term
		for i := start; i < end; i++ {
			if a[i] == 0 || b[i] == 0 {
				continue
			}
			x, y := float64(a[i]), float64(b[i])
			terms = append(terms, term{x * y, floorLog2(x) + floorLog2(y)})
		}
		if c != 0 {
			terms = append(terms, term{c, floorLog2(c)})
		}
		if len(terms) == 0 {
			c = 0
			continue
		}
		e := terms[0].e
		for _, t := range terms {
			if t.e > e {
				e = t.e
			}
		}
		scale := e - 25
		var sum int64
		for _, t := range terms {
			sum += int64(math.Trunc(math.Ldexp(t.v, -scale)))
		}
		mag := sum
		if mag < 0 {
			mag = -mag
		}
		shift := 0
		if n := bits.Len64(uint64(mag)); n > 24 {
			shift = n - 24
		}
		c = math.Ldexp(float64(mag>>shift), scale+shift)
		if sum < 0 {
			c = -c
		}
	}
	return float32(c)
}

// sm90BF16Linear is the float32 [m, n] output of x [m, k] and w [n, k]
// (out_in) as an H100's default kernel computes it, the bias added with
// one IEEE fp32 addition.
func sm90BF16Linear(x, w, b []float32, m, k, n int) []float32 {
	y := make([]float32, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			acc := sm90BF16Dot(x[i*k:(i+1)*k], w[j*k:(j+1)*k])
			y[i*n+j] = acc + b[j]
		}
	}
	return y
}

// bf16Values rounds vals to bfloat16: their bits and their values.
func bf16Values(vals []float32) ([]uint16, []float32) {
	bs, vs := make([]uint16, len(vals)), make([]float32, len(vals))
	for i, v := range vals {
		bs[i] = BFloat16FromFloat32(v)
		vs[i] = Float32FromBFloat16(bs[i])
	}
	return bs, vs
}

// replayLayer is a bf16 layer 4x64 -> 8 with bias and float32 output,
// Observed the H100's output; Gpu unset.
func replayLayer() *LinearRequest {
	const m, k, n = 4, 64, 8
	g := lcg(90)
	xs := g.float32s(m*k, -2, 2)
	for i := 0; i < len(xs); i += 7 {
		xs[i] *= 4096
	}
	xb, xv := bf16Values(xs)
	wb, wv := bf16Values(g.float32s(n*k, -0.1, 0.1))
	bb, bv := bf16Values(g.float32s(n, -1, 1))
	return &LinearRequest{
		Input:       BFloat16Tensor(xb, m, k),
		Weight:      BFloat16Tensor(wb, n, k),
		Bias:        BFloat16Tensor(bb, n),
		OutputDType: Float32,
		Observed:    Float32Tensor(sm90BF16Linear(xv, wv, bv, m, k, n), m, n),
	}
}

func TestLiveGpuFindsTheH100KernelBitForBit(t *testing.T) {
	c := liveClient(t)
	req := replayLayer()
	// Without the GPU no candidate reproduces the output.
	plain, err := c.DiagnoseLinear(callCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if plain.Diagnosis == nil || len(plain.Diagnosis.Ranking) == 0 {
		t.Fatalf("no diagnosis: %v", plain)
	}
	if top := plain.Diagnosis.Ranking[0]; top.Exact {
		t.Fatalf("without Gpu %s is bitwise exact: the layer does not tell the replay from fp32 accumulation", top.Config)
	}

	req.Gpu = "h100"
	r, err := c.DiagnoseLinear(callCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	d := r.Diagnosis
	if d == nil || len(d.Ranking) == 0 {
		t.Fatalf("no diagnosis: %v", r)
	}
	const want = "cpu:bf16:fused@mma=sm90"
	if d.Best != want || d.Ranking[0].Config != want {
		t.Fatalf("best %q, first ranked %q, want %q:\n%v", d.Best, d.Ranking[0].Config, want, r)
	}
	if !d.Ranking[0].Exact {
		t.Errorf("%s is not bitwise exact: %+v", want, d.Ranking[0])
	}
	noted := false
	for _, note := range r.Notes {
		noted = noted || strings.Contains(note, "h100")
	}
	if !noted {
		t.Errorf("no note mentions h100: %q", r.Notes)
	}
}

func TestLiveUnknownGpuIsInvalidArgumentNamingTheField(t *testing.T) {
	c := liveClient(t)
	req := replayLayer()
	req.Gpu = "tpu"
	_, err := c.DiagnoseLinear(callCtx(t), req)
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.InvalidArgument {
		t.Fatalf("error %v, want InvalidArgument", err)
	}
	if !strings.Contains(e.Message, "gpu: unknown GPU 'tpu'") {
		t.Errorf("message %q does not name the field and the value", e.Message)
	}
}

// Gpu is sent as given (the server judges the name); "" leaves it empty.
func TestGpuReachesTheRequest(t *testing.T) {
	r := validRequest()
	if p, err := r.toProto(false); err != nil || p.Gpu != "" {
		t.Fatalf("without Gpu: %v, %v; want an empty field", p, err)
	}
	r.Gpu = "H100"
	p, err := r.toProto(false)
	if err != nil {
		t.Fatal(err)
	}
	if p.Gpu != "H100" {
		t.Errorf("Gpu = %q, want H100", p.Gpu)
	}
}

// The model itself: with small integers nothing is truncated, and the
// result is the exact sum.
func TestSm90ModelIsExactWhereNothingIsTruncated(t *testing.T) {
	const k = 64
	x, w := make([]float32, k), make([]float32, 2*k)
	for i := range x {
		x[i] = float32(i + 1)
	}
	for i := range w {
		w[i] = 1
	}
	got := sm90BF16Linear(x, w, []float32{0.5, -3}, 1, k, 2)
	if got[0] != 2080.5 || got[1] != 2077 {
		t.Errorf("got %v, want [2080.5 2077]", got)
	}
}
