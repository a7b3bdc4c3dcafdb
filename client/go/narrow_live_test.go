package tensorcheck

import (
	"context"
	"testing"
	"time"
)

// Block-wise FP8, MXFP8 and NVFP4 against a live server (docs/numerics.md,
// "Block-wise FP8", "MXFP8 and NVFP4"): the server names the configuration
// its scales say, and the output of each is the dequantised layer, computed
// here from values decoded by hand: every operand value is 1.0 (e4m3 0x38,
// e2m1 0x2), so each output element is K times its scales.

func TestLiveNarrowOperandsRunTheirBlockScaledConfigurations(t *testing.T) {
	c := liveClient(t)
	const m, n, k = 2, 3, 256
	repeat := func(b byte, count int) []byte {
		out := make([]byte, count)
		for i := range out {
			out[i] = b
		}
		return out
	}
	ones8 := func(rows, cols int) *Tensor {
		return Float8E4M3FNTensor(repeat(0x38, rows*cols), int64(rows), int64(cols))
	}
	cases := []struct {
		name   string
		req    *LinearRequest
		config string
		want   [m]float32 // each row's output, the same for every column
	}{
		{
			// 1x128 input blocks [M, 2], 128x128 weight blocks [1, 2]:
			// row i is 128 (sx[i,0] sw[0] + sx[i,1] sw[1]).
			name: "block128",
			req: &LinearRequest{Input: ones8(m, k), Weight: ones8(n, k),
				InputScale:  Float32Tensor([]float32{0.5, 0.25, 1, 2}, m, 2),
				WeightScale: Float32Tensor([]float32{0.125, 4}, 1, 2),
				Configs:     []string{"cpu:fp8e4m3"}},
			config: "cpu:fp8e4m3:none@scaling=block128",
			want:   [m]float32{128 * (0.5*0.125 + 0.25*4), 128 * (1*0.125 + 2*4)},
		},
		{
			// e8m0 scales per 32 elements, [M, 8] and [N, 8]: 2^0 and 2^1
			// for x's rows, 2^-1 for W: row i is 256 * 2^i * 0.5.
			name: "mxfp8",
			req: &LinearRequest{Input: ones8(m, k), Weight: ones8(n, k),
				InputScale:  Float8E8M0FNUTensor(append(repeat(127, 8), repeat(128, 8)...), m, 8),
				WeightScale: Float8E8M0FNUTensor(repeat(126, n*8), n, 8),
				Configs:     []string{"cpu:mxfp8e4m3@scaling=rceil"}},
			config: "cpu:mxfp8e4m3:none@scaling=rceil",
			want:   [m]float32{128, 256},
		},
		{
			// e2m1 ones packed two per byte (0x22), e4m3 block scales 1.0
			// (0x38) per 16 elements, global scales 0.5 and 0.25: 256/8.
			name: "nvfp4",
			req: &LinearRequest{
				Input:             Float4E2M1FNTensor(repeat(0x22, m*k/2), m, k),
				Weight:            Float4E2M1FNTensor(repeat(0x22, n*k/2), n, k),
				InputScale:        &Tensor{DType: Float8E4M3FN, Shape: []int64{m, k / 16}, Data: repeat(0x38, m*k/16)},
				WeightScale:       &Tensor{DType: Float8E4M3FN, Shape: []int64{n, k / 16}, Data: repeat(0x38, n*k/16)},
				InputGlobalScale:  Float32Scalar(0.5),
				WeightGlobalScale: Float32Scalar(0.25),
				Configs:           []string{"cpu:nvfp4"}},
			config: "cpu:nvfp4:none",
			want:   [m]float32{32, 32},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.ReturnOutputs = true
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			r, err := c.VerifyLinear(ctx, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Results) != 1 || r.Results[0].Config != tc.config {
				t.Fatalf("results %+v, want one %s", r.Results, tc.config)
			}
			out := r.Results[0].Output
			if out == nil {
				t.Fatal("no output returned")
			}
			got, err := out.Float64s()
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < m; i++ {
				for j := 0; j < n; j++ {
					if got[i*n+j] != float64(tc.want[i]) {
						t.Errorf("y[%d,%d] = %v, want %v", i, j, got[i*n+j], tc.want[i])
					}
				}
			}
		})
	}
}

// Split-K (docs/numerics.md, "Split-K") named by its configuration: K = 24
// of ones in 3 slices of 8, each partial 8 * 1.5 = 12 in bf16, the sum 36.
func TestLiveSplitKConfigurationIsEchoedAndComputed(t *testing.T) {
	c := liveClient(t)
	const m, n, k = 2, 2, 24
	ones := make([]uint16, m*k)
	halves := make([]uint16, n*k)
	for i := range ones {
		ones[i] = 0x3f80 // bf16 1.0
	}
	for i := range halves {
		halves[i] = 0x3fc0 // bf16 1.5
	}
	req := &LinearRequest{Input: BFloat16Tensor(ones, m, k), Weight: BFloat16Tensor(halves, n, k),
		Configs: []string{"cpu:bf16@splitk=3"}, ReturnOutputs: true}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := c.VerifyLinear(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Results) != 1 || r.Results[0].Config != "cpu:bf16:none@splitk=3,reduce=output" {
		t.Fatalf("results %+v", r.Results)
	}
	got, err := r.Results[0].Output.Float64s()
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != 36 {
			t.Errorf("y[%d] = %v, want 36", i, v)
		}
	}
}
