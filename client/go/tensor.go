package tensorcheck

import (
	"encoding/binary"
	"fmt"
	"math"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// DType is a tensor's storage type.
type DType int32

// The storage types the service accepts. The zero value is "unspecified".
const (
	Float64  DType = DType(pb.DType_DTYPE_FLOAT64)
	Float32  DType = DType(pb.DType_DTYPE_FLOAT32)
	Float16  DType = DType(pb.DType_DTYPE_FLOAT16)
	BFloat16 DType = DType(pb.DType_DTYPE_BFLOAT16)
	// OCP FP8 E4M3 (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn): 1 sign, 4
	// exponent (bias 7) and 3 mantissa bits, no infinities, NaN 0x7f/0xff,
	// largest finite 448. For the inputs and weights of fp8 precisions.
	Float8E4M3FN DType = DType(pb.DType_DTYPE_FLOAT8_E4M3FN)
	// OCP FP8 E5M2 (torch.float8_e5m2): 1 sign, 5 exponent (bias 15) and 2
	// mantissa bits, IEEE infinities and NaNs, largest finite 57344.
	Float8E5M2 DType = DType(pb.DType_DTYPE_FLOAT8_E5M2)
	// OCP FP4 E2M1 (torch.float4_e2m1fn_x2's elements, ml_dtypes
	// float4_e2m1fn): 1 sign, 2 exponent (bias 1) and 1 mantissa bit, values
	// 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. Packed two per byte,
	// element 2i in the low nibble: a tensor's Shape counts elements and its
	// Data holds ceil(numel / 2) bytes. For the inputs and weights of the
	// nvfp4 precision (docs/numerics.md, "MXFP8 and NVFP4").
	Float4E2M1FN DType = DType(pb.DType_DTYPE_FLOAT4_E2M1FN)
	// UE8M0 (torch.float8_e8m0fnu): 2^(bits - 127), 0xff NaN. MXFP8's
	// block scales (LinearRequest.InputScale, WeightScale).
	Float8E8M0FNU DType = DType(pb.DType_DTYPE_FLOAT8_E8M0FNU)
)

// String returns the name used in the JSON report: "float64", "float32",
// "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn",
// "float8_e8m0fnu".
func (d DType) String() string {
	switch d {
	case Float64:
		return "float64"
	case Float32:
		return "float32"
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	case Float8E4M3FN:
		return "float8_e4m3fn"
	case Float8E5M2:
		return "float8_e5m2"
	case Float4E2M1FN:
		return "float4_e2m1fn"
	case Float8E8M0FNU:
		return "float8_e8m0fnu"
	case 0:
		return "unspecified"
	}
	return fmt.Sprintf("DType(%d)", int32(d))
}

// ItemSize is the size of one element in bytes; 0 for an unknown dtype.
// Float4E2M1FN's is 1, the byte that holds two elements (StorageBytes).
func (d DType) ItemSize() int {
	switch d {
	case Float64:
		return 8
	case Float32:
		return 4
	case Float16, BFloat16:
		return 2
	case Float8E4M3FN, Float8E5M2, Float8E8M0FNU, Float4E2M1FN:
		return 1
	}
	return 0
}

// StorageBytes is the size of numel elements in bytes: numel * ItemSize,
// ceil(numel / 2) for Float4E2M1FN (two to a byte).
func (d DType) StorageBytes(numel int64) int64 {
	if d == Float4E2M1FN {
		return (numel + 1) / 2
	}
	return numel * int64(d.ItemSize())
}

// Tensor is a dense tensor as the service sees it: a dtype, a row-major
// shape and the elements as little-endian bytes. The constructors encode a
// Go slice once; the bytes are sent as they are, with no further copy.
//
// A Tensor may instead name a tensor in the server's store by its Digest,
// with Data left empty: TensorRef.Tensor makes one from what Upload
// returns. Tensors with Data larger than StoreThreshold go through the
// store by themselves (see Client.VerifyLinear).
type Tensor struct {
	DType DType
	Shape []int64
	// DType.StorageBytes(numel(Shape)) bytes, little-endian, row-major
	// (Float4E2M1FN packed two elements to a byte).
	Data []byte
	// "sha256:" and the 64 lowercase hex digits of the SHA-256 of the
	// tensor's bytes (the prefix may be left out): the tensor is in the
	// server's store and the request names it instead of carrying it.
	// Empty for a tensor that carries Data; never both.
	Digest string
}

// shapeOr returns shape, or [n] when no shape was given.
func shapeOr(shape []int64, n int) []int64 {
	if len(shape) == 0 {
		return []int64{int64(n)}
	}
	return append([]int64(nil), shape...)
}

// Float64Tensor encodes data with the given shape ([len(data)] if omitted).
func Float64Tensor(data []float64, shape ...int64) *Tensor {
	b := make([]byte, 8*len(data))
	for i, v := range data {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	return &Tensor{DType: Float64, Shape: shapeOr(shape, len(data)), Data: b}
}

// Float32Tensor encodes data with the given shape ([len(data)] if omitted).
func Float32Tensor(data []float32, shape ...int64) *Tensor {
	b := make([]byte, 4*len(data))
	for i, v := range data {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return &Tensor{DType: Float32, Shape: shapeOr(shape, len(data)), Data: b}
}

// BFloat16Tensor encodes bfloat16 bit patterns (as torch.bfloat16's
// .view(torch.int16), or BFloat16FromFloat32) with the given shape.
func BFloat16Tensor(bits []uint16, shape ...int64) *Tensor {
	return &Tensor{DType: BFloat16, Shape: shapeOr(shape, len(bits)), Data: encode16(bits)}
}

// Float16Tensor encodes IEEE binary16 bit patterns (as Float16FromFloat32)
// with the given shape.
func Float16Tensor(bits []uint16, shape ...int64) *Tensor {
	return &Tensor{DType: Float16, Shape: shapeOr(shape, len(bits)), Data: encode16(bits)}
}

// Float8E4M3FNTensor holds float8_e4m3fn bit patterns (as torch's
// .view(torch.uint8), or Float8E4M3FNFromFloat32) with the given shape. An
// FP8 input or weight needs its dequantisation scale in the request
// (LinearRequest.InputScale, WeightScale).
func Float8E4M3FNTensor(bits []uint8, shape ...int64) *Tensor {
	return &Tensor{DType: Float8E4M3FN, Shape: shapeOr(shape, len(bits)), Data: append([]byte(nil), bits...)}
}

// Float8E5M2Tensor holds float8_e5m2 bit patterns (as Float8E5M2FromFloat32)
// with the given shape; see Float8E4M3FNTensor.
func Float8E5M2Tensor(bits []uint8, shape ...int64) *Tensor {
	return &Tensor{DType: Float8E5M2, Shape: shapeOr(shape, len(bits)), Data: append([]byte(nil), bits...)}
}

// Float4E2M1FNTensor holds FP4 E2M1 codes packed two per byte, element 2i
// in the low nibble (torch.float4_e2m1fn_x2's .view(torch.uint8), cuBLASLt's
// CUDA_R_4F_E2M1), with the given shape in elements ([2 * len(packed)] if
// omitted): a torch.float4_e2m1fn_x2 tensor of shape [..., K/2] is [..., K]
// here. An FP4 input or weight needs float8_e4m3fn block scales
// (LinearRequest.InputScale, WeightScale) and float32 global scales
// (InputGlobalScale, WeightGlobalScale).
func Float4E2M1FNTensor(packed []uint8, shape ...int64) *Tensor {
	return &Tensor{DType: Float4E2M1FN, Shape: shapeOr(shape, 2*len(packed)), Data: append([]byte(nil), packed...)}
}

// Float8E8M0FNUTensor holds UE8M0 bit patterns (torch.float8_e8m0fnu's
// .view(torch.uint8)) with the given shape: MXFP8's block scales.
func Float8E8M0FNUTensor(bits []uint8, shape ...int64) *Tensor {
	return &Tensor{DType: Float8E8M0FNU, Shape: shapeOr(shape, len(bits)), Data: append([]byte(nil), bits...)}
}

// Float32Scalar is a 0-d (shape []) float32 tensor holding v: a per-tensor
// scale (LinearRequest.InputScale, WeightScale), as torch.tensor(v).
func Float32Scalar(v float32) *Tensor {
	b := make([]byte, 4)
	binary.LittleEndian.PutUint32(b, math.Float32bits(v))
	return &Tensor{DType: Float32, Shape: []int64{}, Data: b}
}

func encode16(bits []uint16) []byte {
	b := make([]byte, 2*len(bits))
	for i, v := range bits {
		binary.LittleEndian.PutUint16(b[2*i:], v)
	}
	return b
}

// maxElements bounds numel so that numel*itemsize fits in an int on every
// platform; the server's own limits are far lower.
const maxElements = math.MaxInt32 / 8

// Numel is the product of the shape, or an error for negative or
// overflowing dimensions.
func (t *Tensor) Numel() (int64, error) {
	n := int64(1)
	for i, d := range t.Shape {
		if d < 0 {
			return 0, fmt.Errorf("shape[%d] is %d, dimensions must be >= 0", i, d)
		}
		if d != 0 && n > maxElements/d {
			return 0, fmt.Errorf("shape %v has more than %d elements", t.Shape, int64(maxElements))
		}
		n *= d
	}
	return n, nil
}

// validate checks what can be checked of one tensor alone: a known dtype,
// sane dimensions and a data length that matches the shape. The op-level
// checks (K, N, bias length, dtypes agreeing) are the server's.
func (t *Tensor) validate(field string) error {
	size := t.DType.ItemSize()
	if size == 0 {
		return invalidArgument(field, "dtype %v is not one of float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, float4_e2m1fn, float8_e8m0fnu", t.DType)
	}
	n, err := t.Numel()
	if err != nil {
		return invalidArgument(field, "%v", err)
	}
	if t.Digest != "" {
		if len(t.Data) != 0 {
			return invalidArgument(field, "has both data (%d bytes) and digest %q; set one", len(t.Data), t.Digest)
		}
		if _, ok := normalizeDigest(t.Digest); !ok {
			return invalidArgument(field, "digest %q is not \"sha256:\" and 64 lowercase hex digits", t.Digest)
		}
		return nil
	}
	if want := t.DType.StorageBytes(n); t.DType == Float4E2M1FN && int64(len(t.Data)) != want {
		return invalidArgument(field, "shape %v needs %d %v elements (%d bytes, two to a byte), data has %d bytes",
			t.Shape, n, t.DType, want, len(t.Data))
	}
	if int64(len(t.Data)) != n*int64(size) && t.DType != Float4E2M1FN {
		if len(t.Data)%size == 0 {
			return invalidArgument(field, "shape %v needs %d %v elements (%d bytes), data has %d elements (%d bytes)",
				t.Shape, n, t.DType, n*int64(size), len(t.Data)/size, len(t.Data))
		}
		return invalidArgument(field, "shape %v needs %d %v elements (%d bytes), data has %d bytes",
			t.Shape, n, t.DType, n*int64(size), len(t.Data))
	}
	return nil
}

// sizeBytes is DType.StorageBytes(numel(Shape)); the tensor must be valid.
func (t *Tensor) sizeBytes() int64 {
	n, _ := t.Numel()
	return t.DType.StorageBytes(n)
}

func (t *Tensor) toProto() *pb.Tensor {
	if t == nil {
		return nil
	}
	p := &pb.Tensor{Dtype: pb.DType(t.DType), Shape: t.Shape}
	if t.Digest != "" {
		d, _ := normalizeDigest(t.Digest)
		p.Source = &pb.Tensor_Digest{Digest: d}
	} else {
		p.Source = &pb.Tensor_Data{Data: t.Data}
	}
	return p
}

// tensorFromProto converts a tensor of a response; one returned by digest
// keeps its Digest (the client reads it back before handing it out).
func tensorFromProto(p *pb.Tensor) *Tensor {
	if p == nil {
		return nil
	}
	return &Tensor{DType: DType(p.Dtype), Shape: p.Shape, Data: p.GetData(), Digest: p.GetDigest()}
}

// Float64s decodes the elements, widening 32-, 16- and 8-bit types exactly.
func (t *Tensor) Float64s() ([]float64, error) {
	if t.Digest != "" {
		return nil, invalidArgument("tensor", "has no data: it names %s in the server's store (read it with Client.ReadTensor)", t.Digest)
	}
	if err := t.validate("tensor"); err != nil {
		return nil, err
	}
	n := len(t.Data) / t.DType.ItemSize()
	if t.DType == Float4E2M1FN {
		numel, _ := t.Numel()
		n = int(numel)
	}
	out := make([]float64, n)
	b := t.Data
	switch t.DType {
	case Float64:
		for i := range out {
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		}
	case Float32:
		for i := range out {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		}
	case BFloat16:
		for i := range out {
			out[i] = float64(Float32FromBFloat16(binary.LittleEndian.Uint16(b[2*i:])))
		}
	case Float16:
		for i := range out {
			out[i] = float64(Float32FromFloat16(binary.LittleEndian.Uint16(b[2*i:])))
		}
	case Float8E4M3FN:
		for i := range out {
			out[i] = float64(Float32FromFloat8E4M3FN(b[i]))
		}
	case Float8E5M2:
		for i := range out {
			out[i] = float64(Float32FromFloat8E5M2(b[i]))
		}
	case Float8E8M0FNU:
		for i := range out {
			out[i] = float64(Float32FromFloat8E8M0FNU(b[i]))
		}
	case Float4E2M1FN:
		for i := range out {
			out[i] = float64(Float32FromFloat4E2M1FN(b[i/2] >> (4 * uint(i%2))))
		}
	}
	return out, nil
}
