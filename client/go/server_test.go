package tensorcheck

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// These tests run against a live server. They start the binary named by
// TENSORCHECK_SERVER_BIN (default <repo>/build/server/tensorcheck-server)
// with --port 0 and read "listening on HOST:PORT" from its output, or use a
// running server at TENSORCHECK_SERVER (TENSORCHECK_TARGET: the deprecated
// spelling). Without either they skip.

var live struct {
	once   sync.Once
	server string
	skip   string
	err    error
	cmd    *exec.Cmd
	done   chan struct{}
	out    *tailBuffer
}

func TestMain(m *testing.M) {
	code := m.Run()
	stopServer()
	os.Exit(code)
}

// tailBuffer keeps the last lines of the server's output for failure
// messages.
type tailBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *tailBuffer) add(line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, line)
	if len(b.lines) > 40 {
		b.lines = b.lines[len(b.lines)-40:]
	}
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}

func serverBinary() string {
	if p := os.Getenv("TENSORCHECK_SERVER_BIN"); p != "" {
		return p
	}
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	if real, err := filepath.EvalSymlinks(wd); err == nil {
		wd = real // the repository, not the GOPATH link to it
	}
	return filepath.Join(wd, "..", "..", "build", "server", "tensorcheck-server")
}

func startServer() {
	if s := runningServer(); s != "" {
		live.server = s
		return
	}
	bin := serverBinary()
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		live.skip = fmt.Sprintf("server binary %s not found (build it, or set TENSORCHECK_SERVER_BIN or TENSORCHECK_SERVER)", bin)
		return
	}
	// Loopback only: a test server has no business on other interfaces.
	cmd := exec.Command(bin, "--host", "127.0.0.1", "--port", "0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		live.err = err
		return
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		live.err = err
		return
	}
	if err := cmd.Start(); err != nil {
		live.err = fmt.Errorf("starting %s: %v", bin, err)
		return
	}
	live.cmd, live.out, live.done = cmd, &tailBuffer{}, make(chan struct{})
	addr := make(chan string, 2)
	var wg sync.WaitGroup
	// The line is specified on stdout; stderr is scanned too so a server
	// that logs it there still works. Both pipes are drained for the whole
	// run so the server never blocks on a full pipe.
	for _, r := range []io.Reader{stdout, stderr} {
		wg.Add(1)
		go func(r io.Reader) {
			defer wg.Done()
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				line := sc.Text()
				live.out.add(line)
				if i := strings.Index(line, "listening on "); i >= 0 {
					if f := strings.Fields(line[i+len("listening on "):]); len(f) > 0 {
						select {
						case addr <- f[0]:
						default:
						}
					}
				}
			}
		}(r)
	}
	go func() {
		wg.Wait()
		cmd.Wait()
		close(live.done)
	}()
	select {
	case a := <-addr:
		live.server = dialable(a)
	case <-live.done:
		live.err = fmt.Errorf("%s exited before printing \"listening on\"; output:\n%s", bin, live.out)
	case <-time.After(60 * time.Second):
		live.err = fmt.Errorf("%s printed no \"listening on\" line within 60s; output:\n%s", bin, live.out)
		stopServer()
	}
}

// runningServer is the address of a running server to test against:
// TENSORCHECK_SERVER, else the deprecated TENSORCHECK_TARGET; "" for none.
func runningServer() string {
	if s := os.Getenv("TENSORCHECK_SERVER"); s != "" {
		return s
	}
	return os.Getenv("TENSORCHECK_TARGET")
}

// dialable turns a wildcard listen address into a loopback one.
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(strings.TrimRight(addr, ".,;"))
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}

func stopServer() {
	if live.cmd == nil || live.cmd.Process == nil {
		return
	}
	live.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-live.done:
	case <-time.After(10 * time.Second):
		live.cmd.Process.Kill()
		<-live.done
	}
	live.cmd = nil
}

// liveClient returns a client of the live server, skipping the test when
// there is none.
func liveClient(t *testing.T) *Client {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the unit tests only, no live server")
	}
	live.once.Do(startServer)
	if live.skip != "" {
		t.Skip(live.skip)
	}
	if live.err != nil {
		t.Fatal(live.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, live.server, WithBlock())
	if err != nil {
		t.Fatalf("dialing %s: %v", live.server, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// lcg is a small deterministic generator, so failures reproduce.
type lcg uint64

func (g *lcg) uniform(lo, hi float64) float64 {
	*g = *g*6364136223846793005 + 1442695040888963407
	return lo + (hi-lo)*float64(uint64(*g)>>11)/(1<<53)
}

func (g *lcg) float32s(n int, lo, hi float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(g.uniform(lo, hi))
	}
	return out
}

// linear64 computes y = x·Wᵀ + b in float64 and, per element, the scale
// Σ|x||w| + |b| that error bounds are taken relative to.
func linear64(x, w, b []float64, m, k, n int) (y, scale []float64) {
	y, scale = make([]float64, m*n), make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s, a float64
			for p := 0; p < k; p++ {
				s += x[i*k+p] * w[j*k+p]
				a += math.Abs(x[i*k+p] * w[j*k+p])
			}
			if b != nil {
				s += b[j]
				a += math.Abs(b[j])
			}
			y[i*n+j], scale[i*n+j] = s, a
		}
	}
	return y, scale
}

func widen(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, f := range v {
		out[i] = float64(f)
	}
	return out
}

func decode(t *testing.T, what string, x *Tensor, n int) []float64 {
	t.Helper()
	if x == nil {
		t.Fatalf("%s: no output returned", what)
	}
	v, err := x.Float64s()
	if err != nil || len(v) != n {
		t.Fatalf("%s: output of %d elements (%v), want %d", what, len(v), err, n)
	}
	return v
}

// maxAbsDiff is max |a-e| and its flat index.
func maxAbsDiff(a, e []float64) (float64, int) {
	best, at := 0.0, 0
	for i := range a {
		if d := math.Abs(a[i] - e[i]); d > best {
			best, at = d, i
		}
	}
	return best, at
}

func TestLiveCapabilitiesListCPU(t *testing.T) {
	c := liveClient(t)
	caps, err := c.Capabilities(callCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range caps.Backends {
		if b.Name == "cpu" {
			if !b.Available {
				t.Errorf("cpu backend unavailable: %s", b.UnavailableReason)
			}
			return
		}
	}
	t.Errorf("no cpu backend in %+v", caps.Backends)
}

func TestLiveFloat32VerifyMatchesFloat64Computation(t *testing.T) {
	c := liveClient(t)
	const m, k, n = 3, 64, 5
	g := lcg(42)
	x, w, b := g.float32s(m*k, -1, 1), g.float32s(n*k, -0.1, 0.1), g.float32s(n, -0.5, 0.5)
	y64, scale := linear64(widen(x), widen(w), widen(b), m, k, n)
	observed := make([]float32, m*n)
	for i, v := range y64 {
		observed[i] = float32(v)
	}
	req := &LinearRequest{
		Input:         Float32Tensor(x, m, k),
		Weight:        Float32Tensor(w, n, k),
		Bias:          Float32Tensor(b, n),
		Observed:      Float32Tensor(observed, m, n),
		Configs:       []string{"cpu:fp32", "cpu:tf32:fused"},
		ReturnOutputs: true,
	}
	rep, err := c.VerifyLinear(callCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.OutputShape) != 2 || rep.OutputShape[0] != m || rep.OutputShape[1] != n {
		t.Errorf("output shape %v, want [%d %d]", rep.OutputShape, m, n)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("%d results, want 2", len(rep.Results))
	}
	atol, rtol := rep.Tolerance.Atol, rep.Tolerance.Rtol
	if atol == nil || rtol == nil {
		t.Fatalf("tolerance as applied lacks atol/rtol: %+v", rep.Tolerance)
	}

	// The reference (fp64, rounded to the float32 output) is float32(y64)
	// to within one rounding.
	if rep.Reference == nil {
		t.Fatal("no reference result")
	}
	ref := decode(t, "reference", rep.Reference.Output, m*n)
	for i := range ref {
		if d := math.Abs(ref[i] - y64[i]); d > math.Ldexp(math.Abs(y64[i]), -24)*(1+1e-9) {
			t.Errorf("reference[%d] = %v, float64 computation %v: off by %g", i, ref[i], y64[i], d)
		}
	}
	obsVsRef, _ := maxAbsDiff(widen(observed), ref)
	if s := rep.ObservedVsReference; s == nil || s.Total != m*n || s.MaxAbs != obsVsRef {
		t.Errorf("observed vs reference = %+v, want total %d, max_abs %g", s, m*n, obsVsRef)
	}

	// u_p per input: 2^-24 for fp32; tf32 keeps 10 mantissa bits, so even
	// truncation costs < 2^-10 per input.
	bounds := map[string]float64{"cpu:fp32": float64(k+2) * math.Ldexp(1, -24),
		"cpu:tf32": 2*math.Ldexp(1, -10) + float64(k+2)*math.Ldexp(1, -24)}
	maxAbs := map[string]float64{}
	for cfg, u := range bounds {
		r := rep.Result(cfg)
		if r == nil {
			t.Fatalf("no result for %s in %+v", cfg, rep.Results)
		}
		out := decode(t, cfg, r.Output, m*n)
		for i := range out {
			if d := math.Abs(out[i] - y64[i]); d > u*scale[i] {
				t.Errorf("%s[%d] = %v, float64 computation %v: error %g over the bound %g", cfg, i, out[i], y64[i], d, u*scale[i])
			}
		}
		wantRef, at := maxAbsDiff(out, ref)
		s := r.VsReference
		if s == nil || s.Total != m*n || s.MaxAbs != wantRef || s.ComparedDType != Float32 {
			t.Errorf("%s vs reference = %+v, want total %d max_abs %g compared float32", cfg, s, m*n, wantRef)
		} else if wantRef > 0 && (len(s.MaxAbsIndex) != 2 || s.MaxAbsIndex[0]*n+s.MaxAbsIndex[1] != int64(at)) {
			t.Errorf("%s max_abs_index %v, want flat %d", cfg, s.MaxAbsIndex, at)
		}
		// |a-e| <= atol + rtol|e| counted here, against the tolerance the
		// server says it applied.
		var mismatched int64
		for i := range out {
			if math.Abs(out[i]-ref[i]) > *atol+*rtol*math.Abs(ref[i]) {
				mismatched++
			}
		}
		if s != nil && (s.Mismatched != mismatched || s.Passed != (mismatched == 0)) {
			t.Errorf("%s: mismatched %d passed %v, want %d under atol %g rtol %g", cfg, s.Mismatched, s.Passed, mismatched, *atol, *rtol)
		}
		wantObs, _ := maxAbsDiff(out, widen(observed))
		if r.VsObserved == nil || r.VsObserved.MaxAbs != wantObs {
			t.Errorf("%s vs observed = %+v, want max_abs %g", cfg, r.VsObserved, wantObs)
		}
		maxAbs[cfg] = wantRef
		t.Logf("%s: max_abs vs reference %.3g, mismatched %d under atol %g rtol %g", cfg, wantRef, mismatched, *atol, *rtol)
	}
	// Full 24-bit inputs lose bits in TF32; fp32 keeps them.
	if !(maxAbs["cpu:tf32"] > maxAbs["cpu:fp32"]) {
		t.Errorf("tf32 max_abs %g not above fp32's %g", maxAbs["cpu:tf32"], maxAbs["cpu:fp32"])
	}

	// With fp32 alone and the observed output equal to float32(y64), the
	// verdict passes whenever fp32 is within the tolerance (counted above).
	req.Configs, req.ReturnOutputs = []string{"cpu:fp32"}, false
	rep2, err := c.VerifyLinear(callCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if s := rep2.Results[0].VsReference; s.Mismatched == 0 && !rep2.Passed {
		t.Errorf("fp32 within tolerance but verdict fail: %+v", rep2)
	}
	if rep2.Results[0].Output != nil {
		t.Errorf("output returned without ReturnOutputs")
	}
}

// bf16Bits returns the bfloat16 bits of v, which the test data keeps
// exactly representable.
func bf16Bits(t *testing.T, v []float64) []uint16 {
	t.Helper()
	out := make([]uint16, len(v))
	for i, f := range v {
		b := math.Float32bits(float32(f))
		if float64(float32(f)) != f || b&0xffff != 0 {
			t.Fatalf("test data %v is not a bfloat16", f)
		}
		out[i] = uint16(b >> 16)
	}
	return out
}

func TestLiveBFloat16BitsOneULPOff(t *testing.T) {
	c := liveClient(t)
	// Products are multiples of 1/8 and sums stay below 16, so every
	// configuration is exact and equals the float64 computation.
	x := []float64{1, 0.5, -1, 2, 1.5, 1, 0.25, -0.5}
	w := []float64{1, 1, 0, 0.5, 0.5, -1, 1, 1, 1, 0.5, 1.5, 1}
	b := []float64{0.25, -0.5, 0.5}
	y, _ := linear64(x, w, b, 2, 4, 3)
	if y[5] != 2.375 {
		t.Fatalf("test data: y[1,2] = %v", y[5])
	}
	// One bf16 ULP at magnitude [2, 4) is 2^-6.
	obs := append([]float64(nil), y...)
	obs[5] += 0.015625
	rep, err := c.VerifyLinear(callCtx(t), &LinearRequest{
		Input:    BFloat16Tensor(bf16Bits(t, x), 2, 4),
		Weight:   BFloat16Tensor(bf16Bits(t, w), 3, 4),
		Bias:     BFloat16Tensor(bf16Bits(t, b), 3),
		Observed: BFloat16Tensor(bf16Bits(t, obs), 2, 3),
		Configs:  []string{"cpu:bf16:fused", "cpu:bf16:unfused"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Passed {
		t.Errorf("one bf16 ULP at magnitude 2.4 fails the torch bf16 tolerance: %+v", rep)
	}
	check := func(what string, s *Stats) {
		t.Helper()
		if s == nil {
			t.Errorf("%s: no stats", what)
			return
		}
		if s.Total != 6 || s.MaxULP != 1 || s.MaxAbs != 0.015625 || s.BitwiseEqual || s.BitwiseEqualCount != 5 ||
			s.ComparedDType != BFloat16 || len(s.MaxAbsIndex) != 2 || s.MaxAbsIndex[0] != 1 || s.MaxAbsIndex[1] != 2 {
			t.Errorf("%s = %+v; want total 6, max_ulp 1, max_abs 0.015625 at [1 2], 5 bitwise equal, bfloat16", what, s)
		}
	}
	check("observed vs reference", rep.ObservedVsReference)
	for _, cfg := range []string{"cpu:bf16:fused", "cpu:bf16:unfused"} {
		r := rep.Result(cfg)
		if r == nil {
			t.Fatalf("no result for %s in %+v", cfg, rep.Results)
		}
		if s := r.VsReference; s == nil || !s.BitwiseEqual || s.MaxAbs != 0 || s.MaxULP != 0 {
			t.Errorf("%s vs reference = %+v, want bitwise equal (exact data)", cfg, s)
		}
		check(cfg+" vs observed", r.VsObserved)
	}
}

func TestLiveDiagnoseFindsUnfusedBias(t *testing.T) {
	c := liveClient(t)
	// acc = 2 + 2^-7 (or 3 + 2^-7) and b = 2^-7. Fused rounds once:
	// 2 + 2^-6, one ULP up. Unfused rounds acc (a tie, to even: 2), then
	// 2 + 2^-7 (a tie again: 2). The observed output is the unfused one.
	x := []float64{1, 0.0078125, 1, 0.0078125}
	w := []float64{2, 1, 3, 1}
	b := []float64{0.0078125, 0.0078125}
	unfused := []float64{2, 3, 2, 3}
	rep, err := c.DiagnoseLinear(callCtx(t), &LinearRequest{
		Input:    BFloat16Tensor(bf16Bits(t, x), 2, 2),
		Weight:   BFloat16Tensor(bf16Bits(t, w), 2, 2),
		Bias:     BFloat16Tensor(bf16Bits(t, b), 2),
		Observed: BFloat16Tensor(bf16Bits(t, unfused), 2, 2),
		Configs:  []string{"cpu:bf16:fused", "cpu:bf16:unfused"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Diagnosis == nil || rep.Diagnosis.Best != "cpu:bf16:unfused" {
		t.Fatalf("diagnosis %+v, want best cpu:bf16:unfused", rep.Diagnosis)
	}
	if r := rep.Result("cpu:bf16:fused"); r != nil && r.VsObserved != nil && r.VsObserved.MaxULP != 1 {
		t.Errorf("fused vs observed max_ulp %d, want 1", r.VsObserved.MaxULP)
	}
}

func wantCode(t *testing.T, err error, code codes.Code, mentions ...string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("got %v, want *Error with %v", err, code)
	}
	msg := strings.ToLower(e.Message)
	for _, m := range mentions {
		if strings.Contains(msg, m) {
			return
		}
	}
	if len(mentions) > 0 {
		t.Errorf("message %q names none of %q", e.Message, mentions)
	}
}

func TestLiveKMismatchIsInvalidArgument(t *testing.T) {
	c := liveClient(t)
	// Each tensor is consistent alone, so the client sends it and the server
	// must refuse it.
	_, err := c.VerifyLinear(callCtx(t), &LinearRequest{
		Input:  Float32Tensor(make([]float32, 6), 2, 3),
		Weight: Float32Tensor(make([]float32, 20), 4, 5),
	})
	wantCode(t, err, codes.InvalidArgument, "weight", "input", "k")

	_, err = c.VerifyLinear(callCtx(t), &LinearRequest{
		Input:  Float32Tensor(make([]float32, 6), 2, 3),
		Weight: Float32Tensor(make([]float32, 12), 4, 3),
		Bias:   Float32Tensor(make([]float32, 5), 5),
	})
	wantCode(t, err, codes.InvalidArgument, "bias")
}

func TestLiveUnknownBackendIsNotFound(t *testing.T) {
	c := liveClient(t)
	_, err := c.VerifyLinear(callCtx(t), &LinearRequest{
		Input:   Float32Tensor(make([]float32, 6), 2, 3),
		Weight:  Float32Tensor(make([]float32, 12), 4, 3),
		Configs: []string{"nosuchbackend:fp32"},
	})
	wantCode(t, err, codes.NotFound)
}

func TestLiveDeadlineFromContext(t *testing.T) {
	c := liveClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	_, err := c.VerifyLinear(ctx, validRequest())
	if Code(err) != codes.DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expired context: got %v, want DeadlineExceeded", err)
	}

	// A call that cannot finish in 10ms: 512^3 multiply-adds per run, five
	// configurations run three times, plus the fp64 reference.
	const d = 512
	g := lcg(7)
	x, w := g.float32s(d*d, -1, 1), g.float32s(d*d, -1, 1)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err = c.VerifyLinear(ctx, &LinearRequest{
		Input:   Float32Tensor(x, d, d),
		Weight:  Float32Tensor(w, d, d),
		Configs: []string{"cpu:fp32", "cpu:tf32:fused", "cpu:bf16:fused", "cpu:bf16:unfused", "cpu:fp16:fused"},
		Repeat:  3,
	})
	if Code(err) != codes.DeadlineExceeded {
		t.Fatalf("10ms deadline on a large problem: got %v, want DeadlineExceeded", err)
	}

	// The server is still serving after the abandoned call.
	if _, err := c.VerifyLinear(callCtx(t), validRequest()); err != nil {
		t.Errorf("call after a deadline: %v", err)
	}
}
