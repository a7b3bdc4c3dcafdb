package tensorcheck

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

func TestFloat32TensorIsLittleEndianRowMajor(t *testing.T) {
	x := Float32Tensor([]float32{1, -2, 0.5}, 1, 3)
	// 1.0f = 0x3f800000, -2.0f = 0xc0000000, 0.5f = 0x3f000000.
	want := []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0, 0, 0, 0, 0x3f}
	if !bytes.Equal(x.Data, want) || x.DType != Float32 || len(x.Shape) != 2 || x.Shape[1] != 3 {
		t.Fatalf("got %v %v % x", x.DType, x.Shape, x.Data)
	}
}

func TestFloat64AndBFloat16TensorsEncodeBits(t *testing.T) {
	x := Float64Tensor([]float64{1})
	if want := []byte{0, 0, 0, 0, 0, 0, 0xf0, 0x3f}; !bytes.Equal(x.Data, want) || x.Shape[0] != 1 {
		t.Errorf("Float64Tensor(1) = %v % x", x.Shape, x.Data)
	}
	b := BFloat16Tensor([]uint16{0x3f80, 0xc049}, 2)
	if want := []byte{0x80, 0x3f, 0x49, 0xc0}; !bytes.Equal(b.Data, want) || b.DType != BFloat16 {
		t.Errorf("BFloat16Tensor = %v % x", b.DType, b.Data)
	}
	h := Float16Tensor([]uint16{0x3c00}, 1, 1)
	if h.DType != Float16 || h.DType.ItemSize() != 2 || len(h.Data) != 2 {
		t.Errorf("Float16Tensor = %v % x", h.DType, h.Data)
	}
}

func TestFloat64sDecodesEveryDType(t *testing.T) {
	for _, x := range []*Tensor{
		Float64Tensor([]float64{1.5, -3}),
		Float32Tensor([]float32{1.5, -3}),
		BFloat16Tensor([]uint16{0x3fc0, 0xc040}),
		Float16Tensor([]uint16{0x3e00, 0xc200}),
	} {
		got, err := x.Float64s()
		if err != nil || len(got) != 2 || got[0] != 1.5 || got[1] != -3 {
			t.Errorf("%v: Float64s() = %v, %v; want [1.5 -3]", x.DType, got, err)
		}
	}
}

func validRequest() *LinearRequest {
	return &LinearRequest{
		Input:  Float32Tensor([]float32{1, 2, 3, 4, 5, 6}, 2, 3),
		Weight: Float32Tensor([]float32{1, 0, 0, 0, 1, 0}, 2, 3),
		Bias:   Float32Tensor([]float32{0, 0}, 2),
	}
}

// wantInvalid checks err is a client-side InvalidArgument naming field and
// containing every fragment.
func wantInvalid(t *testing.T, err error, field string, fragments ...string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.InvalidArgument {
		t.Fatalf("got %v, want *Error with InvalidArgument", err)
	}
	if !strings.HasPrefix(e.Message, field+": ") {
		t.Errorf("message %q does not start with the field %q", e.Message, field)
	}
	for _, f := range fragments {
		if !strings.Contains(e.Message, f) {
			t.Errorf("message %q lacks %q", e.Message, f)
		}
	}
}

func TestDataLengthMismatchIsInvalidArgumentNamingTheField(t *testing.T) {
	r := validRequest()
	r.Weight = Float32Tensor([]float32{1, 2, 3, 4, 5}, 2, 3)
	_, err := r.toProto(false)
	wantInvalid(t, err, "weight", "[2 3]", "6 float32", "5 elements")
}

func TestRaggedByteCountIsInvalidArgument(t *testing.T) {
	r := validRequest()
	r.Bias = &Tensor{DType: Float32, Shape: []int64{2}, Data: make([]byte, 7)}
	_, err := r.toProto(false)
	wantInvalid(t, err, "bias", "8 bytes", "7 bytes")
}

func TestNegativeAndOverflowingDimsAreInvalidArgument(t *testing.T) {
	r := validRequest()
	r.Input = &Tensor{DType: Float32, Shape: []int64{2, -3}}
	_, err := r.toProto(false)
	wantInvalid(t, err, "input", "shape[1] is -3")

	r.Input = &Tensor{DType: Float32, Shape: []int64{1 << 31, 1 << 31, 1 << 31}}
	_, err = r.toProto(false)
	wantInvalid(t, err, "input", "more than")
}

func TestMissingTensorsAndUnknownEnumsAreInvalidArgument(t *testing.T) {
	r := validRequest()
	r.Input = nil
	_, err := r.toProto(false)
	wantInvalid(t, err, "input", "required")

	_, err = validRequest().toProto(true)
	wantInvalid(t, err, "observed", "required")

	r = validRequest()
	r.Weight.DType = 9
	_, err = r.toProto(false)
	wantInvalid(t, err, "weight", "DType(9)")

	r = validRequest()
	r.Tolerance.Preset = "torhc"
	_, err = r.toProto(false)
	wantInvalid(t, err, "tolerance.preset", `"torhc"`)

	r = validRequest()
	r.Tolerance.Atol = Float(-1)
	_, err = r.toProto(false)
	wantInvalid(t, err, "tolerance.atol", "-1")

	r = validRequest()
	r.Configs = []string{"cpu:fp32", " "}
	_, err = r.toProto(false)
	wantInvalid(t, err, "configs", "entry 1")
}

func TestRequestCarriesEveryField(t *testing.T) {
	r := validRequest()
	r.WeightLayout = InOut
	r.Activation = ActivationGELUTanh
	r.OutputDType = BFloat16
	r.Observed = Float32Tensor([]float32{1, 2, 3, 4}, 2, 2)
	r.Configs = []string{"cpu:fp32", "cpu:tf32:fused"}
	r.Reference = "cpu:fp64"
	r.Tolerance = Tolerance{Preset: "Explicit", Atol: Float(1e-3), Rtol: Float(0), NaNEqual: true, BoundPrecision: "tf32"}
	r.ReturnOutputs = true
	r.TopK = 3
	r.Repeat = 2
	m, err := r.toProto(false)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Op.Input.GetData(); !bytes.Equal(got, r.Input.Data) {
		t.Errorf("input data % x", got)
	}
	if m.Op.WeightLayout.String() != "WEIGHT_LAYOUT_IN_OUT" || m.Op.Activation.String() != "ACTIVATION_GELU_TANH" ||
		m.Op.OutputDtype.String() != "DTYPE_BFLOAT16" || m.Op.Bias == nil || m.Observed == nil {
		t.Errorf("op = %v", m.Op)
	}
	tol := m.Tolerance
	if tol.Preset.String() != "PRESET_EXPLICIT" || tol.Atol.GetValue() != 1e-3 || tol.Rtol == nil ||
		tol.Rtol.Value != 0 || !tol.NanEqual || tol.BoundPrecision != "tf32" {
		t.Errorf("tolerance = %v", tol)
	}
	if len(m.Configs) != 2 || m.Reference != "cpu:fp64" || !m.Output.ReturnOutputs || m.Output.TopK != 3 || m.Repeat != 2 {
		t.Errorf("request = %v", m)
	}
	// Unset tolerance overrides stay unset, so the server applies defaults.
	m, _ = validRequest().toProto(false)
	if m.Tolerance.Atol != nil || m.Tolerance.Rtol != nil || m.Op.Bias == nil || m.Observed != nil {
		t.Errorf("defaults: %v", m)
	}
}

func TestFloat8TensorsCarryOneBytePerElement(t *testing.T) {
	bits := []uint8{0x38, 0xfe, 0x7f, 0x01, 0x00, 0x80}
	x := Float8E4M3FNTensor(bits, 2, 3)
	if x.DType != Float8E4M3FN || x.DType.ItemSize() != 1 || !bytes.Equal(x.Data, bits) ||
		len(x.Shape) != 2 || x.Shape[0] != 2 || x.Shape[1] != 3 {
		t.Errorf("Float8E4M3FNTensor = %v %v % x", x.DType, x.Shape, x.Data)
	}
	bits[0] = 0 // the tensor holds its own copy
	if x.Data[0] != 0x38 {
		t.Errorf("Float8E4M3FNTensor shares the caller's slice")
	}
	y := Float8E5M2Tensor([]uint8{0x3c, 0xc0, 0x7c})
	if y.DType != Float8E5M2 || y.DType.ItemSize() != 1 || len(y.Shape) != 1 || y.Shape[0] != 3 ||
		!bytes.Equal(y.Data, []byte{0x3c, 0xc0, 0x7c}) {
		t.Errorf("Float8E5M2Tensor = %v %v % x", y.DType, y.Shape, y.Data)
	}
	if Float8E4M3FN.String() != "float8_e4m3fn" || Float8E5M2.String() != "float8_e5m2" {
		t.Errorf("names %q %q", Float8E4M3FN, Float8E5M2)
	}
	if n, err := y.Numel(); err != nil || n != 3 || y.sizeBytes() != 3 {
		t.Errorf("numel %d, %v, size %d bytes", n, err, y.sizeBytes())
	}
	if p := x.toProto(); p.Dtype.String() != "DTYPE_FLOAT8_E4M3FN" || len(p.GetData()) != 6 {
		t.Errorf("proto %v", p)
	}
	if p := y.toProto(); p.Dtype.String() != "DTYPE_FLOAT8_E5M2" {
		t.Errorf("proto %v", p)
	}
}

func TestFloat64sDecodesFloat8(t *testing.T) {
	// E4M3FN: 0x38 = 1, 0xc4 = -(1+4/8)*2^1 = -3, 0x01 = 2^-9.
	// E5M2: 0x3e = 1.5, 0xc2 = -(1+2/4)*2^1 = -3, 0x7c = +Inf.
	got, err := Float8E4M3FNTensor([]uint8{0x38, 0xc4, 0x01}).Float64s()
	if err != nil || len(got) != 3 || got[0] != 1 || got[1] != -3 || got[2] != 1.0/512 {
		t.Errorf("e4m3fn Float64s() = %v, %v", got, err)
	}
	got, err = Float8E5M2Tensor([]uint8{0x3e, 0xc2, 0x7c}).Float64s()
	if err != nil || len(got) != 3 || got[0] != 1.5 || got[1] != -3 || got[2] <= 1e308 {
		t.Errorf("e5m2 Float64s() = %v, %v", got, err)
	}
}

func TestFloat8DataLengthMismatchCountsBytes(t *testing.T) {
	r := validRequest()
	r.Input = &Tensor{DType: Float8E4M3FN, Shape: []int64{2, 3}, Data: make([]byte, 5)}
	_, err := r.toProto(false)
	wantInvalid(t, err, "input", "6 float8_e4m3fn elements (6 bytes)", "5 elements (5 bytes)")
}

func TestFloat32ScalarIsZeroDimensional(t *testing.T) {
	s := Float32Scalar(0.5)
	// 0.5f = 0x3f000000.
	if s.DType != Float32 || s.Shape == nil || len(s.Shape) != 0 || !bytes.Equal(s.Data, []byte{0, 0, 0, 0x3f}) {
		t.Errorf("Float32Scalar(0.5) = %v %v % x", s.DType, s.Shape, s.Data)
	}
	if err := s.validate("input_scale"); err != nil {
		t.Errorf("validate: %v", err)
	}
}

func fp8Request() *LinearRequest {
	return &LinearRequest{
		Input:       Float8E4M3FNTensor([]uint8{0x38, 0x40, 0x44, 0x48, 0x4a, 0x4c}, 2, 3),
		Weight:      Float8E5M2Tensor([]uint8{0x3c, 0, 0, 0, 0x3c, 0}, 2, 3),
		InputScale:  Float32Scalar(0.25),
		WeightScale: Float32Tensor([]float32{2, 4}), // row-wise, [N]
		Configs:     []string{"cpu:fp8e4m3e5m2"},
	}
}

func TestRequestCarriesFloat8InputsAndTheirScales(t *testing.T) {
	r := fp8Request()
	m, err := r.toProto(false)
	if err != nil {
		t.Fatal(err)
	}
	op := m.Op
	if op.Input.Dtype.String() != "DTYPE_FLOAT8_E4M3FN" || op.Weight.Dtype.String() != "DTYPE_FLOAT8_E5M2" ||
		!bytes.Equal(op.Input.GetData(), r.Input.Data) || !bytes.Equal(op.Weight.GetData(), r.Weight.Data) {
		t.Errorf("op = %v", op)
	}
	// 0.25f = 0x3e800000; 2.0f = 0x40000000, 4.0f = 0x40800000.
	if s := op.InputScale; s == nil || s.Dtype.String() != "DTYPE_FLOAT32" || len(s.Shape) != 0 ||
		!bytes.Equal(s.GetData(), []byte{0, 0, 0x80, 0x3e}) {
		t.Errorf("input_scale = %v", s)
	}
	if s := op.WeightScale; s == nil || s.Dtype.String() != "DTYPE_FLOAT32" || len(s.Shape) != 1 || s.Shape[0] != 2 ||
		!bytes.Equal(s.GetData(), []byte{0, 0, 0, 0x40, 0, 0, 0x80, 0x40}) {
		t.Errorf("weight_scale = %v", s)
	}
	// Without scales the fields stay unset.
	m, _ = validRequest().toProto(false)
	if m.Op.InputScale != nil || m.Op.WeightScale != nil {
		t.Errorf("scales set without being asked: %v", m.Op)
	}
}

func TestScaleThatIsNotFloat32IsInvalidArgument(t *testing.T) {
	r := fp8Request()
	r.WeightScale = Float64Tensor([]float64{2, 4})
	_, err := r.toProto(false)
	wantInvalid(t, err, "weight_scale", "float64", "expected float32")

	r = fp8Request()
	r.InputScale = &Tensor{DType: Float32, Shape: []int64{2}, Data: make([]byte, 4)}
	_, err = r.toProto(false)
	wantInvalid(t, err, "input_scale", "8 bytes", "4 bytes")
}

func TestFloat8OutputDTypeIsInvalidArgument(t *testing.T) {
	r := fp8Request()
	r.OutputDType = Float8E4M3FN
	_, err := r.toProto(false)
	wantInvalid(t, err, "output_dtype", "float8_e4m3fn", "bfloat16")
}
