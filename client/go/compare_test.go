package tensorcheck

import (
	"bytes"
	"context"
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// CompareOutputs, LinearRequest.Accept, the headline-first texts and the
// error for a server that cannot be reached, through the fake server.

// The server's sentences, as the fake sends them: the client must print
// them verbatim and compose none.
const (
	cmpHeadline = "torch is cpu:fp32:fused (rounding), flax is cpu:tf32:unfused (rounding); " +
		"their difference is rounding: at most 1.1e-03 expected, 1.05e-03 seen. " +
		"To match torch, flax: set jax_default_matmul_precision to highest."
	torchHeadline = "Rounding, not a bug: torch's output is cpu:fp32:fused to 0.9 of its error bound."
	flaxHeadline  = "Rounding, not a bug: flax's output is cpu:tf32:unfused to 0.8 of its error bound."
	flaxAdvice    = "Set jax_default_matmul_precision to \"highest\"."
)

func compareResponse() *pb.CompareResponse {
	return &pb.CompareResponse{
		Headline: cmpHeadline,
		Outputs: []*pb.ComparedOutput{
			{Name: "torch", VsReference: &pb.Stats{MaxAbs: 2.5e-7, Total: 4},
				Diagnosis: &pb.Diagnosis{Best: "cpu:fp32:fused", Verdict: pb.Diagnosis_VERDICT_ROUNDING,
					VerdictReason: "Every element is within 4 sigma.", Headline: torchHeadline,
					Accepted: true, AcceptedAs: "cpu:fp32:fused"}},
			{Name: "flax", VsReference: &pb.Stats{MaxAbs: 1e-3, Total: 4},
				Diagnosis: &pb.Diagnosis{Best: "cpu:tf32:unfused", Verdict: pb.Diagnosis_VERDICT_ROUNDING,
					Headline: flaxHeadline, Advice: flaxAdvice}},
		},
		Pair: &pb.OutputPair{A: "torch", B: "flax", Rounding: true,
			Stats:         &pb.Stats{MaxAbs: 1.05e-3, MaxUlp: 8800, Total: 4, BitwiseEqualCount: 1},
			ConfigsMaxAbs: 2.5e-4, ExpectedMaxAbs: 8.5e-4, AdviceBToA: flaxAdvice},
		Reference:   "cpu:fp64",
		OutputShape: []int64{2, 2},
		Notes:       []string{"TF32 keeps 10 mantissa bits."},
		Verdict:     pb.Verdict_VERDICT_FAIL,
	}
}

func compareRequest() *CompareRequest {
	return &CompareRequest{
		Input:  Float32Tensor([]float32{1, 2, 3, 4, 5, 6}, 2, 3),
		Weight: Float32Tensor([]float32{1, 0, 0, 0, 1, 0}, 2, 3),
		Bias:   Float32Tensor([]float32{0.5, -0.5}, 2),
		// Not in alphabetical order: the request keeps the caller's.
		Outputs: []NamedTensor{
			{Name: "torch", Tensor: Float32Tensor([]float32{1.5, 1.5, 4.5, 4.5}, 2, 2)},
			{Name: "flax", Tensor: Float32Tensor([]float32{1.5, 1.5, 4.5, 4.25}, 2, 2)},
		},
		Configs:   []string{"cpu:fp32", "cpu:tf32"},
		Reference: "cpu:fp64",
		Accept:    []string{"fp32", "cpu:bf16:unfused"},
		TopK:      3,
	}
}

func TestCompareOutputsSendsTheOutputsInOrderAndRendersTheServersAnswer(t *testing.T) {
	fake, c := startFake(t)
	fake.compareResp = compareResponse()
	req := compareRequest()
	cmp, err := c.CompareOutputs(storeCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(fake.compareReqs) != 1 {
		t.Fatalf("%d Compare calls, want 1", len(fake.compareReqs))
	}
	sent := fake.compareReqs[0]
	want := &pb.CompareRequest{
		Op: &pb.LinearOp{Input: req.Input.toProto(), Weight: req.Weight.toProto(), Bias: req.Bias.toProto()},
		Observed: []*pb.NamedTensor{{Name: "torch", Tensor: req.Outputs[0].Tensor.toProto()},
			{Name: "flax", Tensor: req.Outputs[1].Tensor.toProto()}},
		Configs:   []string{"cpu:fp32", "cpu:tf32"},
		Reference: "cpu:fp64",
		Output:    &pb.OutputOptions{TopK: 3},
		Accept:    []string{"fp32", "cpu:bf16:unfused"},
	}
	if !proto.Equal(sent, want) {
		t.Errorf("sent %v\nwant %v", sent, want)
	}

	if cmp.Headline != cmpHeadline || cmp.Reference != "cpu:fp64" || !reflect.DeepEqual(cmp.OutputShape, []int64{2, 2}) ||
		cmp.Verdict != VerdictFail || cmp.Passed || cmp.UploadedBytes != 0 || cmp.ReusedBytes != 0 {
		t.Errorf("comparison = %+v", cmp)
	}
	if len(cmp.Outputs) != 2 || cmp.Outputs[0].Name != "torch" || cmp.Outputs[1].Name != "flax" {
		t.Fatalf("outputs = %+v, want torch then flax", cmp.Outputs)
	}
	if d := cmp.Output("torch").Diagnosis; d.Headline != torchHeadline || !d.Accepted || d.AcceptedAs != "cpu:fp32:fused" ||
		d.Verdict != VerdictRounding || cmp.Output("torch").VsReference.MaxAbs != 2.5e-7 {
		t.Errorf("torch = %+v", d)
	}
	if d := cmp.Output("flax").Diagnosis; d.Advice != flaxAdvice || d.Accepted || d.Best != "cpu:tf32:unfused" {
		t.Errorf("flax = %+v", d)
	}
	if cmp.Output("jax") != nil {
		t.Errorf("Output of an absent name is not nil")
	}
	wantPair := OutputPair{A: "torch", B: "flax", Rounding: true, ConfigsMaxAbs: 2.5e-4, ExpectedMaxAbs: 8.5e-4,
		AdviceBToA: flaxAdvice}
	if p := cmp.Pair; p == nil || p.Stats == nil || p.Stats.MaxAbs != 1.05e-3 {
		t.Fatalf("pair = %+v", p)
	}
	gotPair := *cmp.Pair
	gotPair.Stats = nil
	if gotPair != wantPair {
		t.Errorf("pair = %+v, want %+v", gotPair, wantPair)
	}

	wantText := []string{
		cmpHeadline,
		"Verdict: FAIL (accept fp32, cpu:bf16:unfused)",
		"  torch: " + torchHeadline,
		"  flax: " + flaxHeadline,
		"  torch vs flax: max_abs 0.00105, max 8800 ULP; expected at most 0.00085 (rounding of both: yes)",
		// The headline gives flax's advice in other words: it is shown.
		"  Advice for flax: " + flaxAdvice,
	}
	if got := strings.Split(cmp.String(), "\n"); !reflect.DeepEqual(got, wantText) {
		t.Errorf("String() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantText, "\n"))
	}
}

// An output whose diagnosis has no headline (an older server) is shown by
// its verdict sentence, one without either by its best match; advice the
// headline already holds is not repeated; a comparison without Accept has
// no verdict line.
func TestCompareResultStringFallsBackToTheVerdictSentenceThenTheBestMatch(t *testing.T) {
	resp := compareResponse()
	resp.Headline += " " + flaxAdvice
	resp.Outputs[0].Diagnosis.Headline = ""
	resp.Outputs[1].Diagnosis.Headline = ""
	resp.Pair.AdviceAToB = "Set torch.backends.cuda.matmul.allow_tf32 = True."
	resp.Verdict = pb.Verdict_VERDICT_UNSPECIFIED
	cmp := compareResultFromProto(resp)
	want := []string{
		resp.Headline,
		"  torch: Every element is within 4 sigma.",
		"  flax: best match cpu:tf32:unfused",
		"  torch vs flax: max_abs 0.00105, max 8800 ULP; expected at most 0.00085 (rounding of both: yes)",
		"  Advice for torch: Set torch.backends.cuda.matmul.allow_tf32 = True.",
	}
	if got := strings.Split(cmp.String(), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("String() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if cmp.Verdict != "" || cmp.Passed {
		t.Errorf("verdict %q, passed %v without Accept", cmp.Verdict, cmp.Passed)
	}

	// A server that fills the verdict without Accept: it means nothing.
	fake, c := startFake(t)
	fake.compareResp = compareResponse()
	fake.compareResp.Verdict = pb.Verdict_VERDICT_FAIL
	req := compareRequest()
	req.Accept = nil
	if cmp, err := c.CompareOutputs(storeCtx(t), req); err != nil || cmp.Verdict != "" || cmp.Passed ||
		strings.Contains(cmp.String(), "Verdict") {
		t.Errorf("without Accept: %v, verdict %q, String()\n%s", err, cmp.Verdict, cmp)
	}
}

func TestCompareOutputsSendsLargeTensorsThroughTheStore(t *testing.T) {
	fake, c := startFake(t)
	fake.compareResp = compareResponse()
	const m, k, n = 4, 1024, 384 // weight 1.5 MiB; outputs 6 KiB
	req := &CompareRequest{
		Input:  float32s(1, m*k, m, k),
		Weight: float32s(2, n*k, n, k),
		Outputs: []NamedTensor{
			{Name: "torch", Tensor: float32s(3, m*n, m, n)},
			{Name: "flax", Tensor: float32s(4, m*n, m, n)},
		},
	}
	weightHash := sha256Hex(req.Weight.Data)
	cmp, err := c.CompareOutputs(storeCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	s := fake.storeSnapshot()
	if s.finds != 1 || !reflect.DeepEqual(s.findHashes[0], []string{weightHash}) {
		t.Errorf("FindMissingTensors asked %v, want the weight %s alone", s.findHashes, weightHash)
	}
	if !reflect.DeepEqual(s.stored, []string{weightHash}) {
		t.Errorf("stored %v, want the weight", s.stored)
	}
	sent := fake.compareReqs[0]
	if sent.Op.Weight.GetDigest() != weightHash || !bytes.Equal(sent.Op.Input.GetData(), req.Input.Data) ||
		!bytes.Equal(sent.Observed[1].Tensor.GetData(), req.Outputs[1].Tensor.Data) {
		t.Errorf("the weight was not named by digest, or a small tensor did not go inline")
	}
	if cmp.UploadedBytes != n*k*4 || cmp.ReusedBytes != 0 {
		t.Errorf("uploaded %d, reused %d; want %d, 0", cmp.UploadedBytes, cmp.ReusedBytes, n*k*4)
	}

	// Again: the store has it.
	cmp, err = c.CompareOutputs(storeCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if s := fake.storeSnapshot(); len(s.stored) != 1 || cmp.UploadedBytes != 0 || cmp.ReusedBytes != n*k*4 {
		t.Errorf("second call: stored %v, uploaded %d, reused %d; want nothing uploaded, %d reused",
			s.stored, cmp.UploadedBytes, cmp.ReusedBytes, n*k*4)
	}
}

func TestCompareOutputsRefusesMistakesBeforeSending(t *testing.T) {
	fake, c := startFake(t)
	for _, tc := range []struct {
		name   string
		edit   func(r *CompareRequest)
		field  string
		fragms []string
	}{
		{"one output", func(r *CompareRequest) { r.Outputs = r.Outputs[:1] }, "observed", []string{"1 outputs", "exactly 2"}},
		{"three outputs", func(r *CompareRequest) { r.Outputs = append(r.Outputs, r.Outputs[0]) }, "observed", []string{"3 outputs"}},
		{"no name", func(r *CompareRequest) { r.Outputs[1].Name = "" }, "observed[1].name", []string{"empty"}},
		{"same name", func(r *CompareRequest) { r.Outputs[1].Name = "torch" }, "observed[1].name", []string{`"torch"`, "observed[0]"}},
		{"no tensor", func(r *CompareRequest) { r.Outputs[0].Tensor = nil }, "observed[0].tensor", []string{"required"}},
		{"bad tensor", func(r *CompareRequest) { r.Outputs[1].Tensor = Float32Tensor([]float32{1}, 2, 2) }, "observed[1].tensor", []string{"4 float32 elements"}},
		{"no weight", func(r *CompareRequest) { r.Weight = nil }, "weight", []string{"required"}},
		{"empty accept", func(r *CompareRequest) { r.Accept = []string{"tf32", " "} }, "accept", []string{"entry 1"}},
	} {
		r := compareRequest()
		tc.edit(r)
		_, err := c.CompareOutputs(context.Background(), r)
		t.Run(tc.name, func(t *testing.T) { wantInvalid(t, err, tc.field, tc.fragms...) })
	}
	if _, err := c.CompareOutputs(context.Background(), nil); Code(err) != codes.InvalidArgument {
		t.Errorf("nil request: %v", err)
	}
	if n := len(fake.compareReqs); n != 0 {
		t.Errorf("%d requests reached the server", n)
	}
}

// With Accept, the request carries it and the verdict is the response's
// (the server's acceptance), whatever the tolerance's statistics say; the
// report's text and Err start with the server's headline.
func TestVerifyWithAcceptSendsItAndTakesTheServersVerdict(t *testing.T) {
	fake, c := startFake(t)
	const headline = "Not rounding: column 1 differs from cpu:bf16:fused by 64 sigma. Look at weight row 1."
	fake.resp = &pb.VerifyResponse{
		Verdict:             pb.Verdict_VERDICT_FAIL,
		Reference:           &pb.ConfigResult{Config: "cpu:fp64"},
		ObservedVsReference: &pb.Stats{Passed: true, MaxAbs: 0.125, MaxUlp: 2, Total: 4, BitwiseEqualCount: 4},
		Diagnosis: &pb.Diagnosis{Best: "cpu:bf16:fused", Verdict: pb.Diagnosis_VERDICT_DEFECT,
			VerdictReason: "Column 1 holds 2 disagreements where 0.01 are expected.",
			Headline:      headline, Advice: "Check the weight's row 1."},
	}
	r := validRequest()
	r.Observed = Float32Tensor([]float32{1, 2, 4, 5}, 2, 2)
	r.Accept = []string{"tf32", "cpu:bf16:unfused"}
	rep, err := c.VerifyLinear(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if got := fake.lastReq.GetAccept(); !reflect.DeepEqual(got, r.Accept) {
		t.Errorf("accept sent %q, want %q", got, r.Accept)
	}
	// The observed output passes the tolerance; the verdict is the server's.
	if rep.Passed || rep.Verdict != VerdictFail {
		t.Errorf("Passed %v, Verdict %q; want false, FAIL", rep.Passed, rep.Verdict)
	}
	wantText := []string{
		headline,
		"Advice: Check the weight's row 1.",
		"Verdict: FAIL (accept tf32, cpu:bf16:unfused)",
		"observed vs cpu:fp64: 0 / 4 outside tolerance, max_abs 0.125, max 2 ULP",
		"Why: Column 1 holds 2 disagreements where 0.01 are expected.",
		"Best match: cpu:bf16:fused (confidence 0.00; verdict defect)",
	}
	if got := strings.Split(rep.String(), "\n"); !reflect.DeepEqual(got, wantText) {
		t.Errorf("String() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantText, "\n"))
	}
	err = rep.Err()
	var fe *FailError
	if !errors.As(err, &fe) || fe.Report != rep || !strings.HasPrefix(err.Error(), headline+"\n") {
		t.Errorf("Err() = %v, want a *FailError starting with the headline", err)
	}

	fake.resp.Verdict = pb.Verdict_VERDICT_PASS
	if rep, err = c.VerifyLinear(context.Background(), r); err != nil || !rep.Passed ||
		rep.Verdict != VerdictPass || rep.Err() != nil {
		t.Errorf("a PASS: %+v, %v", rep, err)
	}

	r.Observed = nil
	_, err = c.VerifyLinear(context.Background(), r)
	wantInvalid(t, err, "accept", "needs observed")
	r.Observed, r.Accept = Float32Tensor([]float32{1, 2, 4, 5}, 2, 2), []string{""}
	_, err = c.VerifyLinear(context.Background(), r)
	wantInvalid(t, err, "accept", "entry 0 is empty")
}

func TestReportStringWithoutADiagnosisStartsWithTheVerdict(t *testing.T) {
	rep := reportFromProto(&pb.VerifyResponse{
		Verdict:   pb.Verdict_VERDICT_PASS,
		Tolerance: &pb.Tolerance{Preset: pb.Tolerance_PRESET_TORCH},
		Reference: &pb.ConfigResult{Config: "cpu:fp64"},
		Results: []*pb.ConfigResult{
			{Config: "cpu:fp32:fused", VsReference: &pb.Stats{Passed: true, MaxAbs: 5.96e-8, MaxUlp: 1, Total: 8,
				BoundRatio: &wrapperspb.DoubleValue{Value: 0.25}}},
			{Config: "cpu:bf16:fused", VsReference: &pb.Stats{MaxAbs: 0.0039, MaxUlp: 30000, Mismatched: 3, Total: 8}},
		},
	})
	want := []string{
		"Verdict: PASS (tolerance torch)",
		"cpu:fp32:fused vs cpu:fp64: 0 / 8 outside tolerance torch, max_abs 5.96e-08, max 1 ULP, bound_ratio 0.25",
		"cpu:bf16:fused vs cpu:fp64: 3 / 8 outside tolerance torch, max_abs 0.0039, max 30000 ULP",
	}
	if got := strings.Split(rep.String(), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("String() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// closedAddress is a loopback address nothing listens on.
func closedAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// A server that is down: every call's error names the address and
// TENSORCHECK_SERVER, and not the store RPCs the client makes on the way
// (FindMissingTensors for a large tensor, before the call asked for).
func TestServerDownErrorNamesTheAddressAndTheEnvironmentVariable(t *testing.T) {
	clearConnectionEnv(t)
	addr := closedAddress(t)
	large := largeRequest()
	for _, tc := range []struct {
		name, arg, env, from string
	}{
		{"given to Dial", addr, "", "given to Dial"},
		{"from the environment", "", addr, "from TENSORCHECK_SERVER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TENSORCHECK_SERVER", tc.env)
			c, err := Dial(context.Background(), tc.arg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx := storeCtx(t)
			calls := map[string]func() error{
				"VerifyLinear (large tensors)": func() error { _, err := c.VerifyLinear(ctx, large); return err },
				"DiagnoseLinear":               func() error { _, err := c.DiagnoseLinear(ctx, large); return err },
				"CompareOutputs":               func() error { _, err := c.CompareOutputs(ctx, compareRequest()); return err },
				"Capabilities":                 func() error { _, err := c.Capabilities(ctx); return err },
				"Upload":                       func() error { _, err := c.Upload(ctx, large.Weight); return err },
			}
			for name, call := range calls {
				err := call()
				var e *Error
				if !errors.As(err, &e) || e.Code != codes.Unavailable {
					t.Errorf("%s: %v, want Unavailable", name, err)
					continue
				}
				want := "no answer from a tensorcheck server at " + addr + " (" + tc.from + "; "
				if !strings.HasPrefix(e.Message, want) || !strings.Contains(e.Message, "TENSORCHECK_SERVER=host:port") {
					t.Errorf("%s: message %q, want it to start %q and say how to set TENSORCHECK_SERVER", name, e.Message, want)
				}
				for _, internal := range []string{"FindMissingTensors", "tensor store", "uploading", "GetCapabilities"} {
					if strings.Contains(e.Message, internal) {
						t.Errorf("%s: message %q names %q, a call the caller did not make", name, e.Message, internal)
					}
				}
			}
		})
	}
}

// With WithBlock, Dial itself fails within its context and names the
// default address and TENSORCHECK_SERVER when neither was given.
func TestDialWithBlockToNoServerNamesTheDefaultAndTheVariable(t *testing.T) {
	clearConnectionEnv(t)
	// The default address must be one nothing answers on for this test.
	if conn, err := net.Dial("tcp", DefaultServer); err == nil {
		conn.Close()
		t.Skipf("something listens on %s", DefaultServer)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := Dial(ctx, "", WithBlock())
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.DeadlineExceeded {
		t.Fatalf("Dial = %v, want DeadlineExceeded", err)
	}
	want := "no answer from a tensorcheck server at localhost:50051 (the default: TENSORCHECK_SERVER is unset; "
	if !strings.HasPrefix(e.Message, want) {
		t.Errorf("message %q, want it to start %q", e.Message, want)
	}
}

// Refusals with the server's retry hint keep the server's message: the
// server was reached.
func TestHintedUnavailableKeepsTheServersMessage(t *testing.T) {
	fake, c := startFake(t, WithMaxRetries(0))
	fake.refusals, fake.refusalCode, fake.pushback = 1, codes.Unavailable, "10"
	_, err := c.Capabilities(context.Background())
	var e *Error
	if !errors.As(err, &e) || e.Message != "server busy; retry after 10 ms" || e.RetryAfter != 10*time.Millisecond {
		t.Errorf("got %#v, want the server's refusal as sent", err)
	}
}

func TestDefaultTargetIsTheDeprecatedNameOfDefaultServer(t *testing.T) {
	if DefaultTarget != DefaultServer || DefaultServer != "localhost:50051" {
		t.Errorf("DefaultTarget %q, DefaultServer %q", DefaultTarget, DefaultServer)
	}
}
