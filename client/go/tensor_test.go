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
