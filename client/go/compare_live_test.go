package tensorcheck

import (
	"math"
	"strings"
	"testing"
)

// CompareOutputs and LinearRequest.Accept against a live server (see
// server_test.go for how one is found or started). The two outputs are
// computed here, as two frameworks would: "torch" accumulates float32
// products in float32, "flax" does the same on inputs rounded to TF32 first
// (what XLA's default matmul precision does on a GPU).

const liveM, liveK, liveN = 8, 768, 512 // the weight: 1.5 MiB, over StoreThreshold

// liveLayer is x [M, K], W [N, K] and b [N], float32, and the two outputs.
type liveLayer struct {
	x, w, b      []float32
	torch, flax  []float32
	torchVsFlax  float64 // max |torch - flax|, computed here
	weightTensor *Tensor
}

// roundTF32 rounds v to TF32's 10 mantissa bits, to nearest with ties to
// even (finite values of this test only).
func roundTF32(v float32) float32 {
	bits := math.Float32bits(v)
	bits += 0xfff + (bits>>13)&1
	return math.Float32frombits(bits &^ 0x1fff)
}

// linear32 is y = x·Wᵀ + b accumulated in float32, one fused multiply-add
// per product in k order, the bias added last, each input first passed
// through round.
func linear32(x, w, b []float32, m, k, n int, round func(float32) float32) []float32 {
	y := make([]float32, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var acc float32
			for p := 0; p < k; p++ {
				acc = float32(math.FMA(float64(round(x[i*k+p])), float64(round(w[j*k+p])), float64(acc)))
			}
			y[i*n+j] = acc + b[j]
		}
	}
	return y
}

func newLiveLayer() *liveLayer {
	g := lcg(29)
	l := &liveLayer{x: g.float32s(liveM*liveK, -1, 1), w: g.float32s(liveN*liveK, -0.05, 0.05),
		b: g.float32s(liveN, -0.1, 0.1)}
	same := func(v float32) float32 { return v }
	l.torch = linear32(l.x, l.w, l.b, liveM, liveK, liveN, same)
	l.flax = linear32(l.x, l.w, l.b, liveM, liveK, liveN, roundTF32)
	l.torchVsFlax, _ = maxAbsDiff(widen(l.torch), widen(l.flax))
	l.weightTensor = Float32Tensor(l.w, liveN, liveK)
	return l
}

func (l *liveLayer) compareRequest(accept ...string) *CompareRequest {
	return &CompareRequest{
		Input:  Float32Tensor(l.x, liveM, liveK),
		Weight: l.weightTensor,
		Bias:   Float32Tensor(l.b, liveN),
		Outputs: []NamedTensor{
			{Name: "torch", Tensor: Float32Tensor(l.torch, liveM, liveN)},
			{Name: "flax", Tensor: Float32Tensor(l.flax, liveM, liveN)},
		},
		Accept: accept,
	}
}

func TestLiveCompareOutputsNamesEachConfigurationAndTheirDifference(t *testing.T) {
	c := liveClient(t)
	l := newLiveLayer()
	if l.torchVsFlax == 0 {
		t.Fatal("the TF32 output equals the float32 one: the test's layer explains nothing")
	}
	caps, err := c.Capabilities(callCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	cmp, err := c.CompareOutputs(callCtx(t), l.compareRequest())
	if err != nil {
		t.Fatal(err)
	}
	if cmp.Headline == "" {
		t.Fatalf("no headline: %+v", cmp)
	}
	if first := strings.SplitN(cmp.String(), "\n", 2)[0]; first != cmp.Headline {
		t.Errorf("String() starts %q, want the headline %q", first, cmp.Headline)
	}
	if len(cmp.Outputs) != 2 || cmp.Outputs[0].Name != "torch" || cmp.Outputs[1].Name != "flax" {
		t.Fatalf("outputs %+v, want torch then flax", cmp.Outputs)
	}
	for _, want := range []struct{ name, config string }{{"torch", "cpu:fp32"}, {"flax", "cpu:tf32"}} {
		o := cmp.Output(want.name)
		d := o.Diagnosis
		if d == nil || d.Headline == "" || d.Verdict != VerdictRounding || !strings.HasPrefix(d.Best, want.config+":") {
			t.Errorf("%s: diagnosis %+v, want rounding of %s with a headline", want.name, d, want.config)
		}
		if o.VsReference == nil || o.VsReference.Total != liveM*liveN {
			t.Errorf("%s: vs reference %+v, want %d elements", want.name, o.VsReference, liveM*liveN)
		}
	}
	p := cmp.Pair
	if p == nil || p.A != "torch" || p.B != "flax" || p.Stats == nil {
		t.Fatalf("pair %+v", p)
	}
	// Both sides exact: float32 values subtracted in float64.
	if p.Stats.MaxAbs != l.torchVsFlax {
		t.Errorf("pair max_abs %g, computed here %g", p.Stats.MaxAbs, l.torchVsFlax)
	}
	if !p.Rounding || p.ExpectedMaxAbs < l.torchVsFlax {
		t.Errorf("pair rounding %v with expected_max_abs %g; want rounding, a bound >= the %g seen",
			p.Rounding, p.ExpectedMaxAbs, l.torchVsFlax)
	}
	if cmp.Verdict != "" || cmp.Passed {
		t.Errorf("verdict %q without Accept", cmp.Verdict)
	}
	if len(cmp.OutputShape) != 2 || cmp.OutputShape[0] != liveM || cmp.OutputShape[1] != liveN {
		t.Errorf("output shape %v", cmp.OutputShape)
	}
	// The 1.5 MiB weight went through the store (uploaded now, or found
	// there from an earlier run of a running server); the rest inline.
	want := int64(0)
	if caps.Store.Present {
		want = int64(len(l.weightTensor.Data))
	}
	if got := cmp.UploadedBytes + cmp.ReusedBytes; got != want {
		t.Errorf("uploaded %d + reused %d bytes, want %d (store present: %v)",
			cmp.UploadedBytes, cmp.ReusedBytes, want, caps.Store.Present)
	}
}

// With Accept the verdict is the server's acceptance of both outputs.
func TestLiveCompareOutputsWithAcceptPassesOnlyWhenBothAreAccepted(t *testing.T) {
	c := liveClient(t)
	l := newLiveLayer()
	for _, tc := range []struct {
		accept []string
		want   string
	}{
		{[]string{"fp32"}, VerdictFail}, // flax is TF32
		{[]string{"fp32", "cpu:tf32"}, VerdictPass},
	} {
		cmp, err := c.CompareOutputs(callCtx(t), l.compareRequest(tc.accept...))
		if err != nil {
			t.Fatal(err)
		}
		if cmp.Verdict != tc.want || cmp.Passed != (tc.want == VerdictPass) {
			t.Errorf("accept %q: verdict %q (passed %v), want %s", tc.accept, cmp.Verdict, cmp.Passed, tc.want)
		}
		if !cmp.Output("torch").Diagnosis.Accepted {
			t.Errorf("accept %q: torch's fp32 output not accepted: %+v", tc.accept, cmp.Output("torch").Diagnosis)
		}
		if lines := strings.Split(cmp.String(), "\n"); len(lines) < 2 || lines[1] != "Verdict: "+tc.want+" (accept "+strings.Join(tc.accept, ", ")+")" {
			t.Errorf("accept %q: String() =\n%s", tc.accept, cmp.String())
		}
	}
}

func TestLiveVerifyWithAcceptIsTheDiagnosisVerdict(t *testing.T) {
	c := liveClient(t)
	l := newLiveLayer()
	for _, tc := range []struct {
		accept []string
		want   string
	}{
		{[]string{"tf32"}, VerdictFail},
		{[]string{"cpu:fp32"}, VerdictPass},
	} {
		rep, err := c.VerifyLinear(callCtx(t), &LinearRequest{
			Input:    Float32Tensor(l.x, liveM, liveK),
			Weight:   l.weightTensor,
			Bias:     Float32Tensor(l.b, liveN),
			Observed: Float32Tensor(l.torch, liveM, liveN),
			Accept:   tc.accept,
		})
		if err != nil {
			t.Fatal(err)
		}
		d := rep.Diagnosis
		if d == nil || d.Headline == "" {
			t.Fatalf("accept %q: diagnosis %+v, want one with a headline", tc.accept, d)
		}
		if rep.Verdict != tc.want || rep.Passed != (tc.want == VerdictPass) {
			t.Errorf("accept %q: verdict %q, want %s", tc.accept, rep.Verdict, tc.want)
		}
		if tc.want == VerdictPass && (!d.Accepted || !strings.HasPrefix(d.AcceptedAs, "cpu:fp32:")) {
			t.Errorf("accept %q: accepted %v as %q, want a cpu:fp32 configuration", tc.accept, d.Accepted, d.AcceptedAs)
		}
		if tc.want == VerdictFail && (d.Accepted || d.AcceptedAs != "") {
			t.Errorf("accept %q: accepted %v as %q, want not accepted", tc.accept, d.Accepted, d.AcceptedAs)
		}
		text := rep.String()
		if first := strings.SplitN(text, "\n", 2)[0]; first != d.Headline {
			t.Errorf("accept %q: String() starts %q, want the headline %q", tc.accept, first, d.Headline)
		}
		err = rep.Err()
		if (err == nil) != (tc.want == VerdictPass) || (err != nil && err.Error() != text) {
			t.Errorf("accept %q: Err() = %v", tc.accept, err)
		}
	}
}

func TestLiveCallDecisionCarriesTheServersThreshold(t *testing.T) {
	c := liveClient(t)
	l := newLiveLayer()
	req := func(threshold *float64) *LinearRequest {
		return &LinearRequest{
			Input:          Float32Tensor(l.x, liveM, liveK),
			Weight:         l.weightTensor,
			Bias:           Float32Tensor(l.b, liveN),
			Observed:       Float32Tensor(l.torch, liveM, liveN),
			Configs:        []string{"cpu:fp32", "cpu:tf32"},
			BoundThreshold: threshold,
		}
	}
	rep, err := c.DiagnoseLinear(callCtx(t), req(nil))
	if err != nil {
		t.Fatal(err)
	}
	call := rep.Call
	if call == nil || !call.Explained || call.BoundThreshold != 3 || call.Divergence != "" {
		t.Fatalf("default: call %+v, want explained with threshold 3 and no divergence", call)
	}
	if len(call.Explaining) == 0 || call.Explaining[0] != rep.Diagnosis.Best {
		t.Errorf("explaining %q, want best %q first", call.Explaining, rep.Diagnosis.Best)
	}
	ten := 10.0
	rep, err = c.DiagnoseLinear(callCtx(t), req(&ten))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Call == nil || rep.Call.BoundThreshold != 10 {
		t.Errorf("threshold 10: call %+v", rep.Call)
	}
	zero := 0.0
	if _, err := c.DiagnoseLinear(callCtx(t), req(&zero)); err == nil ||
		!strings.Contains(err.Error(), "bound_threshold") {
		t.Errorf("threshold 0: err %v, want one naming bound_threshold", err)
	}
}
