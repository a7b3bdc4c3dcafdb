package tensorcheck

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// The 16 E2M1 codes by hand: sign, 2 exponent bits (bias 1), 1 mantissa
// bit; e = 0 is subnormal (m / 2).
var e2m1Values = [16]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, math.Copysign(0, -1), -0.5, -1, -1.5, -2, -3, -4, -6}

func TestFloat32FromFloat4E2M1FNDecodesEveryCode(t *testing.T) {
	for code, want := range e2m1Values {
		got := Float32FromFloat4E2M1FN(uint8(code))
		if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
			t.Errorf("code %#x: %v, want %v", code, got, want)
		}
		// The high nibble is another element's.
		if hi := Float32FromFloat4E2M1FN(uint8(code) | 0xa0); hi != got {
			t.Errorf("code %#x with a high nibble: %v, want %v", code, hi, got)
		}
	}
}

func TestFloat32FromFloat8E8M0FNUIsAPowerOfTwo(t *testing.T) {
	for bits := 0; bits < 255; bits++ {
		if got, want := float64(Float32FromFloat8E8M0FNU(uint8(bits))), math.Ldexp(1, bits-127); got != want {
			t.Errorf("%#x: %v, want 2^%d", bits, got, bits-127)
		}
	}
	if !math.IsNaN(float64(Float32FromFloat8E8M0FNU(0xff))) {
		t.Error("0xff is not NaN")
	}
}

func TestFloat4TensorIsPackedTwoPerByteWithItsShapeInElements(t *testing.T) {
	// [1.0, 0.5, 6, -1]: codes 0x2, 0x1, 0x7, 0xa; element 2i in the low
	// nibble: bytes 0x12, 0xa7.
	x := Float4E2M1FNTensor([]uint8{0x12, 0xa7}, 1, 4)
	if x.DType.String() != "float4_e2m1fn" || !reflect.DeepEqual(x.Shape, []int64{1, 4}) {
		t.Fatalf("dtype %v shape %v", x.DType, x.Shape)
	}
	if got := Float4E2M1FNTensor([]uint8{0x12, 0xa7}).Shape; !reflect.DeepEqual(got, []int64{4}) {
		t.Errorf("default shape %v, want [4]", got)
	}
	v, err := x.Float64s()
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{1, 0.5, 6, -1}; !reflect.DeepEqual(v, want) {
		t.Errorf("Float64s %v, want %v", v, want)
	}
	if x.sizeBytes() != 2 {
		t.Errorf("sizeBytes %d, want 2", x.sizeBytes())
	}
	bad := &Tensor{DType: Float4E2M1FN, Shape: []int64{1, 4}, Data: []byte{1, 2, 3, 4}}
	if err := bad.validate("input"); err == nil || !strings.Contains(err.Error(), "(2 bytes, two to a byte), data has 4 bytes") {
		t.Errorf("4 bytes for 4 FP4 elements: %v", err)
	}
	s := Float8E8M0FNUTensor([]uint8{127, 130}, 2, 1)
	if v, _ := s.Float64s(); !reflect.DeepEqual(v, []float64{1, 8}) {
		t.Errorf("e8m0 Float64s %v, want [1 8]", v)
	}
}

func TestNvfp4RequestCarriesPackedOperandsBlockScalesAndGlobalScales(t *testing.T) {
	x := Float4E2M1FNTensor(bytes.Repeat([]byte{0x12}, 16), 2, 16)
	w := Float4E2M1FNTensor(bytes.Repeat([]byte{0xa7}, 24), 3, 16)
	xs := &Tensor{DType: Float8E4M3FN, Shape: []int64{2, 1}, Data: []byte{0x38, 0x40}}
	ws := &Tensor{DType: Float8E4M3FN, Shape: []int64{3, 1}, Data: []byte{0x30, 0x38, 0x40}}
	req := &LinearRequest{Input: x, Weight: w, InputScale: xs, WeightScale: ws,
		InputGlobalScale: Float32Scalar(0.5), WeightGlobalScale: Float32Tensor([]float32{0.25})}
	msg, err := req.toProto(false)
	if err != nil {
		t.Fatal(err)
	}
	op := msg.Op
	if op.Input.Dtype != pb.DType_DTYPE_FLOAT4_E2M1FN || !reflect.DeepEqual(op.Input.Shape, []int64{2, 16}) ||
		!bytes.Equal(op.Input.GetData(), x.Data) {
		t.Errorf("input %v %v", op.Input.Dtype, op.Input.Shape)
	}
	if op.InputScale.Dtype != pb.DType_DTYPE_FLOAT8_E4M3FN || !bytes.Equal(op.WeightScale.GetData(), ws.Data) {
		t.Errorf("block scales %v %x", op.InputScale.Dtype, op.WeightScale.GetData())
	}
	// float32 0.5 = 0x3f000000, 0.25 = 0x3e800000, little-endian.
	if g := op.InputGlobalScale; g.Dtype != pb.DType_DTYPE_FLOAT32 || len(g.Shape) != 0 ||
		!bytes.Equal(g.GetData(), []byte{0, 0, 0, 0x3f}) {
		t.Errorf("input_global_scale %v %v %x", g.Dtype, g.Shape, g.GetData())
	}
	if g := op.WeightGlobalScale; !reflect.DeepEqual(g.Shape, []int64{1}) || !bytes.Equal(g.GetData(), []byte{0, 0, 0x80, 0x3e}) {
		t.Errorf("weight_global_scale %v %x", g.Shape, g.GetData())
	}
	// MXFP8: e8m0 block scales, no global scales.
	e4 := Float8E4M3FNTensor(make([]uint8, 64), 2, 32)
	m := &LinearRequest{Input: e4, Weight: Float8E4M3FNTensor(make([]uint8, 96), 3, 32),
		InputScale: Float8E8M0FNUTensor([]uint8{127, 128}, 2, 1), WeightScale: Float8E8M0FNUTensor([]uint8{126, 127, 128}, 3, 1)}
	if msg, err := m.toProto(false); err != nil || msg.Op.InputScale.Dtype != pb.DType_DTYPE_FLOAT8_E8M0FNU ||
		msg.Op.InputGlobalScale != nil {
		t.Errorf("mxfp8 request: %v", err)
	}
	// A global scale is float32; a block scale one of the protocol's dtypes.
	req.InputGlobalScale = xs
	if _, err := req.toProto(false); err == nil || !strings.Contains(err.Error(), "input_global_scale") ||
		!strings.Contains(err.Error(), "expected float32") {
		t.Errorf("e4m3 global scale: %v", err)
	}
	req.InputGlobalScale = Float32Scalar(0.5)
	req.WeightScale = Float16Tensor([]uint16{0x3c00, 0x3c00, 0x3c00}, 3, 1)
	if _, err := req.toProto(false); err == nil || !strings.Contains(err.Error(), "weight_scale") {
		t.Errorf("float16 block scale: %v", err)
	}
}

func TestCompareRequestCarriesTheGlobalScales(t *testing.T) {
	x := Float4E2M1FNTensor(bytes.Repeat([]byte{0x12}, 8), 1, 16)
	r := &CompareRequest{Input: x, Weight: x,
		InputScale:       &Tensor{DType: Float8E4M3FN, Shape: []int64{1, 1}, Data: []byte{0x38}},
		WeightScale:      &Tensor{DType: Float8E4M3FN, Shape: []int64{1, 1}, Data: []byte{0x38}},
		InputGlobalScale: Float32Scalar(2), WeightGlobalScale: Float32Scalar(4),
		Outputs: []NamedTensor{{Name: "a", Tensor: Float32Tensor([]float32{0})}, {Name: "b", Tensor: Float32Tensor([]float32{0})}}}
	msg, _, err := r.toProto()
	if err != nil {
		t.Fatal(err)
	}
	// 2 = 0x40000000, 4 = 0x40800000.
	if !bytes.Equal(msg.Op.InputGlobalScale.GetData(), []byte{0, 0, 0, 0x40}) ||
		!bytes.Equal(msg.Op.WeightGlobalScale.GetData(), []byte{0, 0, 0x80, 0x40}) {
		t.Errorf("global scales %x %x", msg.Op.InputGlobalScale.GetData(), msg.Op.WeightGlobalScale.GetData())
	}
}

func TestDiagnosisCarriesTheCandidateTiers(t *testing.T) {
	for _, tiers := range [][]int32{nil, {1}, {1, 2}} {
		d := diagnosisFromProto(&pb.Diagnosis{Best: "cpu:fp8e4m3:fused", CandidateTiers: tiers})
		if len(d.CandidateTiers) != len(tiers) || (len(tiers) > 0 && !reflect.DeepEqual(d.CandidateTiers, tiers)) {
			t.Errorf("CandidateTiers %v, want %v", d.CandidateTiers, tiers)
		}
	}
}
