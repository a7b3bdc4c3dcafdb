package tensorcheck

import (
	"math"
	"strings"

	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// WeightLayout says how the weight is stored. The zero value is OutIn.
type WeightLayout int32

const (
	// OutIn is [N, K]: torch.nn.Linear.weight, candle Linear.
	OutIn WeightLayout = WeightLayout(pb.WeightLayout_WEIGHT_LAYOUT_OUT_IN)
	// InOut is [K, N]: a flax nn.Dense kernel.
	InOut WeightLayout = WeightLayout(pb.WeightLayout_WEIGHT_LAYOUT_IN_OUT)
)

// Activation applied after the bias. The zero value is ActivationNone.
type Activation int32

const (
	ActivationNone Activation = Activation(pb.Activation_ACTIVATION_NONE)
	ActivationReLU Activation = Activation(pb.Activation_ACTIVATION_RELU)
	// ActivationGELUTanh is 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))),
	// as cuBLASLt's GELU epilogue.
	ActivationGELUTanh Activation = Activation(pb.Activation_ACTIVATION_GELU_TANH)
)

// Tolerance decides pass/fail. The zero value is the "torch" preset with
// torch.testing.assert_close's defaults for the compared dtype.
type Tolerance struct {
	// "torch" (default), "numpy", "polygraphy", "explicit", "ulp" or "bound".
	Preset string
	// Overrides of the preset's atol/rtol; for "explicit", the values.
	Atol, Rtol *float64
	// For "ulp".
	MaxULP uint64
	// The constant c of "bound"; 0 means 1.
	BoundFactor float64
	// Whether NaN compares equal to NaN.
	NaNEqual bool
	// For "bound": the precision ("fp32", "tf32", "bf16", ...) whose bound
	// the observed output is held to; empty: the output dtype's own.
	BoundPrecision string
}

// Float returns a pointer to v, for Tolerance.Atol and Tolerance.Rtol:
// Tolerance{Atol: tensorcheck.Float(1e-4), Rtol: tensorcheck.Float(0)}.
func Float(v float64) *float64 { return &v }

var presets = map[string]pb.Tolerance_Preset{
	"":           pb.Tolerance_PRESET_UNSPECIFIED,
	"torch":      pb.Tolerance_PRESET_TORCH,
	"numpy":      pb.Tolerance_PRESET_NUMPY,
	"polygraphy": pb.Tolerance_PRESET_POLYGRAPHY,
	"explicit":   pb.Tolerance_PRESET_EXPLICIT,
	"ulp":        pb.Tolerance_PRESET_ULP,
	"bound":      pb.Tolerance_PRESET_BOUND,
}

func presetName(p pb.Tolerance_Preset) string {
	for name, v := range presets {
		if v == p && name != "" {
			return name
		}
	}
	return ""
}

// LinearRequest is y = act(x·Wᵀ + b) with the output a framework produced
// and the configurations to run. Input, Weight and, for DiagnoseLinear,
// Observed are required.
type LinearRequest struct {
	// [..., K]; leading dimensions are flattened to M.
	Input *Tensor
	// [N, K] (OutIn, the default) or [K, N] (InOut); same dtype as Input.
	Weight       *Tensor
	WeightLayout WeightLayout
	// Optional, [N].
	Bias       *Tensor
	Activation Activation
	// Dtype every configuration rounds its output to; 0: Input's dtype
	// (BFloat16 for FP8 inputs). FP8 dtypes are for inputs and weights
	// only.
	OutputDType DType
	// Dequantisation scales of FP8 inputs and weights, float32, as
	// torch._scaled_mm's scale_a and scale_b: the layer computes
	// act((Input * InputScale) (Weight * WeightScale)ᵀ + Bias). Per-tensor:
	// one value each, shape [] (Float32Scalar) or [1]. Row-wise: InputScale
	// [M] (or [M, 1]) and WeightScale [N] (or [N, 1] for OutIn, [1, N] for
	// InOut). Required when Input and Weight are FP8 (Float8E4M3FNTensor,
	// Float8E5M2Tensor); the server refuses them when they are not.
	// Block-wise (docs/numerics.md, "MXFP8 and NVFP4"): float32 [M,
	// ceil(K/128)] and [ceil(N/128), ceil(K/128)] (scaling=block128);
	// Float8E8M0FNUTensor [M, K/32] and [N, K/32] for MXFP8;
	// float8_e4m3fn [M, K/16] and [N, K/16] for NVFP4's Float4E2M1FN
	// operands; or 1-D in cuBLASLt's swizzled layout. The server judges
	// which fits.
	InputScale, WeightScale *Tensor
	// NVFP4's float32 per-tensor scales (shape [] or [1]: Float32Scalar),
	// required with Float4E2M1FN operands: the layer computes
	// act(InputGlobalScale * WeightGlobalScale * (Input dequantised per
	// block) (Weight dequantised per block)ᵀ + Bias).
	InputGlobalScale, WeightGlobalScale *Tensor
	// The output the caller's framework produced, [..., N]; optional for
	// VerifyLinear.
	Observed *Tensor
	// Configurations "backend:precision[:bias]", e.g. "cpu:fp32",
	// "cublaslt:bf16:fused". VerifyLinear with none runs the reference
	// alone; DiagnoseLinear with none ranks every configuration the host
	// supports.
	Configs []string
	// Configurations you accept for Observed (docs/numerics.md, "Accepting
	// a configuration"), each "backend:precision[:bias]",
	// "precision[:bias]" or "backend:precision", a part left out matching
	// any: "tf32", "cpu:bf16:unfused". With Accept, VerifyLinear diagnoses
	// too (Report.Diagnosis, among Configs and the accepted
	// configurations), and Report.Verdict is the diagnosis's acceptance
	// (PASS: rounding of an accepted configuration, Diagnosis.AcceptedAs
	// says which) instead of the tolerance's. Requires Observed.
	Accept []string
	// The bound_ratio above which the server decides this call diverges
	// (Report.Call); nil: the server's default, 3. The server refuses one
	// that is not positive and finite.
	BoundThreshold *float64
	// A GPU Observed may have come from: "a100", "h100", "h200", "gh200",
	// "b200", "gb200", or a generation "sm80", "sm90", "sm100"
	// (case-insensitive). A diagnosis over the default candidates (no
	// Configs) then also ranks the CPU replays of that GPU's default
	// kernels, "cpu:PRECISION@mma=GEN[,tile_k=N]..." (docs/numerics.md,
	// "Kernel K order"), and Report.Notes says which replays ran and where
	// their kernel orders came from. "": none. The server judges the name
	// (InvalidArgument naming "gpu" for one it does not know).
	Gpu string
	// The configuration everything is compared with. "": the server's
	// default reference (the fp64 configuration of its fastest backend:
	// "cublaslt:fp64" on a GPU host, "cpu:fp64" elsewhere), sent as an empty
	// field; Report.Reference.Config names the one used.
	Reference string
	Tolerance Tolerance
	// Return every configuration's output tensor (ConfigResult.Output).
	ReturnOutputs bool
	// Returned outputs larger than this many bytes travel through the
	// server's store (the client reads them back with ReadTensor, so
	// ConfigResult.Output carries Data either way); 0: the server's default
	// (Capabilities().Store.InlineOutputBytes, 4 MiB), also the most a
	// request may ask for.
	MaxInlineOutputBytes int64
	// Worst elements listed per comparison (0: 10) and columns/rows listed
	// where mismatches concentrate (0: 5).
	TopK, TopGroups int32
	// Run each configuration this many times and report determinism.
	Repeat int32
	// Forbid reduced-precision reductions on GPU backends.
	DisallowReducedPrecisionReduction bool
	// Run each configuration that names no algorithm with each of the first
	// AlgorithmSweep algorithms its backend offers (0..16; 0: no sweep), as
	// "...@algo=i" configurations; a backend with one algorithm (cpu) runs
	// it once. RankedCandidate.Exact and Details then name the kernel.
	AlgorithmSweep int32
	// Also run every configuration on sub-batches of the rows (single rows,
	// and BatchSizes, each 1..M, at most 8) and report whether each row keeps
	// its bits (ConfigResult.BatchInvariance). BatchSizes only with
	// BatchInvariance.
	BatchInvariance bool
	BatchSizes      []int64
}

// toProto validates what the client can check alone and builds the message.
func (r *LinearRequest) toProto(needObserved bool) (*pb.VerifyRequest, error) {
	if r == nil {
		return nil, invalidArgument("request", "is nil")
	}
	op, err := r.opToProto()
	if err != nil {
		return nil, err
	}
	if r.Observed == nil {
		if needObserved {
			return nil, invalidArgument("observed", "is required")
		}
		if len(r.Accept) > 0 {
			return nil, invalidArgument("accept", "needs observed: the output to accept or not")
		}
	} else if err := r.Observed.validate("observed"); err != nil {
		return nil, err
	}
	if err := checkConfigs(r.Configs, r.Accept); err != nil {
		return nil, err
	}
	if r.MaxInlineOutputBytes < 0 {
		return nil, invalidArgument("output.max_inline_output_bytes", "is %d, expected >= 0", r.MaxInlineOutputBytes)
	}
	if r.AlgorithmSweep < 0 {
		return nil, invalidArgument("algorithm_sweep", "is %d, expected >= 0", r.AlgorithmSweep)
	}
	if len(r.BatchSizes) > 0 && !r.BatchInvariance {
		return nil, invalidArgument("batch_invariance.batch_sizes", "set without BatchInvariance")
	}
	var bi *pb.BatchInvarianceOptions
	if r.BatchInvariance {
		for i, n := range r.BatchSizes {
			if n < 1 {
				return nil, invalidArgument("batch_invariance.batch_sizes", "entry %d is %d, expected >= 1", i, n)
			}
		}
		bi = &pb.BatchInvarianceOptions{Enabled: true, BatchSizes: r.BatchSizes}
	}
	tol, err := r.Tolerance.toProto()
	if err != nil {
		return nil, err
	}
	var boundThreshold *wrapperspb.DoubleValue
	if r.BoundThreshold != nil {
		boundThreshold = wrapperspb.Double(*r.BoundThreshold)
	}
	return &pb.VerifyRequest{
		Op:             op,
		BoundThreshold: boundThreshold,
		Observed:       r.Observed.toProto(),
		Configs:        r.Configs,
		Reference:      r.Reference,
		Tolerance:      tol,
		Output: &pb.OutputOptions{
			ReturnOutputs: r.ReturnOutputs,
			TopK:          r.TopK,
			TopGroups:     r.TopGroups,

			MaxInlineOutputBytes: r.MaxInlineOutputBytes,
		},
		Repeat:                            r.Repeat,
		DisallowReducedPrecisionReduction: r.DisallowReducedPrecisionReduction,
		AlgorithmSweep:                    r.AlgorithmSweep,
		BatchInvariance:                   bi,
		Accept:                            r.Accept,
		Gpu:                               r.Gpu,
	}, nil
}

// checkConfigs refuses empty entries of configs and accept.
func checkConfigs(configs, accept []string) error {
	for _, f := range []struct {
		name, want string
		list       []string
	}{{"configs", "backend:precision[:bias]", configs},
		{"accept", "backend:precision[:bias], precision[:bias] or backend:precision", accept}} {
		for i, c := range f.list {
			if strings.TrimSpace(c) == "" {
				return invalidArgument(f.name, "entry %d is empty; expected %s", i, f.want)
			}
		}
	}
	return nil
}

// opToProto validates the layer (x, W, b, the scales, dtypes, layout and
// activation) and builds its message; VerifyRequest and CompareRequest
// share it.
func (r *LinearRequest) opToProto() (*pb.LinearOp, error) {
	required := []struct {
		name string
		t    *Tensor
		need bool
	}{
		{"input", r.Input, true},
		{"weight", r.Weight, true},
		{"bias", r.Bias, false},
		{"input_scale", r.InputScale, false},
		{"weight_scale", r.WeightScale, false},
		{"input_global_scale", r.InputGlobalScale, false},
		{"weight_global_scale", r.WeightGlobalScale, false},
	}
	for _, f := range required {
		if f.t == nil {
			if f.need {
				return nil, invalidArgument(f.name, "is required")
			}
			continue
		}
		if err := f.t.validate(f.name); err != nil {
			return nil, err
		}
	}
	// The scales' dtypes are the protocol's (as torch._scaled_mm's):
	// float32, or a block scale's float8_e8m0fnu (MXFP8) or float8_e4m3fn
	// (NVFP4); the global scales float32. Which one fits the operands,
	// whether they are required, and their shapes are the server's checks.
	for _, f := range []struct {
		name string
		t    *Tensor
	}{{"input_scale", r.InputScale}, {"weight_scale", r.WeightScale}} {
		if f.t != nil && f.t.DType != Float32 && f.t.DType != Float8E8M0FNU && f.t.DType != Float8E4M3FN {
			return nil, invalidArgument(f.name, "dtype %v, expected float32, float8_e8m0fnu or float8_e4m3fn", f.t.DType)
		}
	}
	for _, f := range []struct {
		name string
		t    *Tensor
	}{{"input_global_scale", r.InputGlobalScale}, {"weight_global_scale", r.WeightGlobalScale}} {
		if f.t != nil && f.t.DType != Float32 {
			return nil, invalidArgument(f.name, "dtype %v, expected float32", f.t.DType)
		}
	}
	switch r.OutputDType {
	case 0, Float64, Float32, Float16, BFloat16:
	default:
		return nil, invalidArgument("output_dtype", "%v is not one of float64, float32, float16, bfloat16", r.OutputDType)
	}
	switch r.WeightLayout {
	case 0, OutIn, InOut:
	default:
		return nil, invalidArgument("weight_layout", "%d is not OutIn or InOut", r.WeightLayout)
	}
	switch r.Activation {
	case 0, ActivationNone, ActivationReLU, ActivationGELUTanh:
	default:
		return nil, invalidArgument("activation", "%d is not None, ReLU or GELUTanh", r.Activation)
	}
	return &pb.LinearOp{
		Input:        r.Input.toProto(),
		Weight:       r.Weight.toProto(),
		WeightLayout: pb.WeightLayout(r.WeightLayout),
		Bias:         r.Bias.toProto(),
		Activation:   pb.Activation(r.Activation),
		OutputDtype:  pb.DType(r.OutputDType),
		InputScale:   r.InputScale.toProto(),
		WeightScale:  r.WeightScale.toProto(),

		InputGlobalScale:  r.InputGlobalScale.toProto(),
		WeightGlobalScale: r.WeightGlobalScale.toProto(),
	}, nil
}

func (t *Tolerance) toProto() (*pb.Tolerance, error) {
	preset, ok := presets[strings.ToLower(t.Preset)]
	if !ok {
		return nil, invalidArgument("tolerance.preset", "%q is not one of torch, numpy, polygraphy, explicit, ulp, bound", t.Preset)
	}
	out := &pb.Tolerance{
		Preset:         preset,
		MaxUlp:         t.MaxULP,
		BoundFactor:    t.BoundFactor,
		NanEqual:       t.NaNEqual,
		BoundPrecision: t.BoundPrecision,
	}
	for _, v := range []struct {
		name string
		p    *float64
		dst  **wrapperspb.DoubleValue
	}{{"tolerance.atol", t.Atol, &out.Atol}, {"tolerance.rtol", t.Rtol, &out.Rtol}} {
		if v.p == nil {
			continue
		}
		if math.IsNaN(*v.p) || *v.p < 0 {
			return nil, invalidArgument(v.name, "is %v, expected a number >= 0", *v.p)
		}
		*v.dst = &wrapperspb.DoubleValue{Value: *v.p}
	}
	if t.BoundFactor < 0 || math.IsNaN(t.BoundFactor) {
		return nil, invalidArgument("tolerance.bound_factor", "is %v, expected a number >= 0", t.BoundFactor)
	}
	return out, nil
}

func toleranceFromProto(p *pb.Tolerance) Tolerance {
	if p == nil {
		return Tolerance{}
	}
	t := Tolerance{
		Preset:         presetName(p.Preset),
		MaxULP:         p.MaxUlp,
		BoundFactor:    p.BoundFactor,
		NaNEqual:       p.NanEqual,
		BoundPrecision: p.BoundPrecision,
	}
	if p.Atol != nil {
		t.Atol = Float(p.Atol.Value)
	}
	if p.Rtol != nil {
		t.Rtol = Float(p.Rtol.Value)
	}
	return t
}
