package tensorcheck

import "math"

// BFloat16FromFloat32 rounds f to the nearest bfloat16 (ties to even) and
// returns its bits. NaN stays NaN (quiet, sign kept).
func BFloat16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x0040
	}
	// Adding 0x7fff plus the lowest kept bit rounds half to even; a carry
	// out of the mantissa correctly bumps the exponent (up to infinity).
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// Float32FromBFloat16 widens bfloat16 bits to float32 (exact).
func Float32FromBFloat16(bits uint16) float32 {
	return math.Float32frombits(uint32(bits) << 16)
}

// Float16FromFloat32 rounds f to the nearest IEEE binary16 (ties to even),
// with overflow to infinity and gradual underflow, and returns its bits.
func Float16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // binary16 biased exponent
	if e >= 31 {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal (or zero) result: count units of 2^-24. Values below
		// 2^-25 (e < -10) round to zero; float32 subnormals land here too.
		if e < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint(14 - e)
		return sign | uint16(roundShiftEven(m, shift))
	}
	// Carry out of the mantissa increments the exponent, up to infinity.
	return sign | uint16(roundShiftEven(uint32(e)<<23|mant, 13))
}

// roundShiftEven returns v >> shift rounded to nearest, ties to even.
func roundShiftEven(v uint32, shift uint) uint32 {
	q := v >> shift
	r := v & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if r > half || (r == half && q&1 == 1) {
		q++
	}
	return q
}

// Float32FromFloat16 widens IEEE binary16 bits to float32 (exact).
func Float32FromFloat16(bits uint16) float32 {
	sign := uint32(bits&0x8000) << 16
	exp := uint32(bits>>10) & 0x1f
	mant := uint32(bits & 0x3ff)
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0:
		v := float32(math.Ldexp(float64(mant), -24))
		if sign != 0 {
			v = -v
		}
		return v
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp-15+127)<<23 | mant<<13)
}

// fp8Format describes an OCP FP8 format for the conversions below.
type fp8Format struct {
	mantBits uint // 3 (E4M3FN) or 2 (E5M2)
	bias     int  // 7 or 15
	// The largest finite value's bits (0x7e, 0x7b) and the positive NaN a
	// conversion produces (0x7f, 0x7e: ml_dtypes' and the server's).
	maxBits, nanBits uint8
	// What a positive value beyond maxBits becomes without saturation:
	// 0x7c (infinity) for E5M2, the NaN for E4M3FN, which has no infinity.
	overflowBits uint8
}

var (
	e4m3fn = fp8Format{mantBits: 3, bias: 7, maxBits: 0x7e, nanBits: 0x7f, overflowBits: 0x7f}
	e5m2   = fp8Format{mantBits: 2, bias: 15, maxBits: 0x7b, nanBits: 0x7e, overflowBits: 0x7c}
)

// fromFloat32 rounds f to the format once, to nearest with ties to even
// (never through float16, whose rounding first could turn a value just
// above a midpoint into a tie). saturate clamps overflow and infinities to
// the largest finite value of their sign.
func (ff fp8Format) fromFloat32(f float32, saturate bool) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff && mant != 0 {
		return sign | ff.nanBits
	}
	tooLarge := ff.overflowBits
	if saturate {
		tooLarge = ff.maxBits
	}
	if exp == 0xff {
		return sign | tooLarge
	}
	var r uint32
	// e is the target's biased exponent; at most 254-127+15, so e<<23
	// below cannot overflow.
	if e := exp - 127 + ff.bias; e <= 0 {
		// Subnormal (or zero) result: count units of 2^(1-bias-mantBits).
		// shift > 24 means f < half the smallest subnormal: zero. float32
		// subnormals (exp == 0) land there too.
		shift := uint(24 - int(ff.mantBits) - e)
		if shift > 24 {
			return sign
		}
		r = roundShiftEven(mant|0x800000, shift)
	} else {
		// A carry out of the mantissa bumps the exponent, possibly past
		// the largest finite value (checked next).
		r = roundShiftEven(uint32(e)<<23|mant, 23-ff.mantBits)
	}
	if r > uint32(ff.maxBits) {
		return sign | tooLarge
	}
	return sign | uint8(r)
}

// Float8E4M3FNFromFloat32 rounds f to the nearest float8_e4m3fn (ties to
// even) and returns its bits, as ml_dtypes' cast does: E4M3FN has no
// infinity, so a value that rounds beyond 448 (anything above 464, the tie
// between 448 and the next step) and ±Inf become NaN (0x7f, 0xff). NaN
// stays NaN. torch 2.15's cast to torch.float8_e4m3fn saturates instead:
// it is Float8E4M3FNFromFloat32Sat.
func Float8E4M3FNFromFloat32(f float32) uint8 { return e4m3fn.fromFloat32(f, false) }

// Float8E4M3FNFromFloat32Sat is Float8E4M3FNFromFloat32 with saturation:
// values beyond ±448 and ±Inf become ±448 (0x7e, 0xfe), as a quantisation
// recipe's clamp-then-cast does. NaN stays NaN.
func Float8E4M3FNFromFloat32Sat(f float32) uint8 { return e4m3fn.fromFloat32(f, true) }

// Float8E5M2FromFloat32 rounds f to the nearest float8_e5m2 (ties to even)
// and returns its bits, as torch's and ml_dtypes' casts do: a value that
// rounds beyond 57344 (61440, the tie with the next step, and above) becomes
// ±Inf (0x7c, 0xfc). NaN stays NaN (0x7e with f's sign).
func Float8E5M2FromFloat32(f float32) uint8 { return e5m2.fromFloat32(f, false) }

// Float8E5M2FromFloat32Sat is Float8E5M2FromFloat32 with saturation:
// values beyond ±57344 and ±Inf become ±57344 (0x7b, 0xfb). NaN stays NaN.
func Float8E5M2FromFloat32Sat(f float32) uint8 { return e5m2.fromFloat32(f, true) }

// Float32FromFloat8E4M3FN widens float8_e4m3fn bits to float32 (exact);
// 0x7f and 0xff are NaN, every other pattern finite.
func Float32FromFloat8E4M3FN(bits uint8) float32 {
	sign := uint32(bits&0x80) << 24
	exp := uint32(bits>>3) & 0xf
	mant := uint32(bits & 0x7)
	switch {
	case bits&0x7f == 0x7f:
		return math.Float32frombits(sign | 0x7fc00000)
	case exp == 0:
		// mant units of 2^-9; float32 holds them exactly.
		v := float32(mant) / 512
		return math.Float32frombits(sign | math.Float32bits(v))
	}
	return math.Float32frombits(sign | (exp-7+127)<<23 | mant<<20)
}

// Float32FromFloat8E5M2 widens float8_e5m2 bits to float32 (exact). E5M2
// is the upper byte of an IEEE binary16, infinities and NaNs included.
func Float32FromFloat8E5M2(bits uint8) float32 {
	return Float32FromFloat16(uint16(bits) << 8)
}

// Float32FromFloat4E2M1FN widens the FP4 E2M1 code in the low nibble of
// bits (the high nibble is ignored) to float32, exactly: 1 sign, 2
// exponent bits of bias 1, 1 mantissa bit; no infinities or NaNs.
func Float32FromFloat4E2M1FN(bits uint8) float32 {
	code := bits & 0x0f
	e, m := (code>>1)&0x3, code&0x1
	var v float32
	if e == 0 {
		v = float32(m) / 2 // subnormal: 0 or 0.5
	} else {
		v = float32(math.Ldexp(1+float64(m)/2, int(e)-1))
	}
	if code&0x8 != 0 {
		v = -v
	}
	return v
}

// Float32FromFloat8E8M0FNU widens UE8M0 bits to float32: 2^(bits - 127),
// 0xff NaN. 2^-127 is a float32 subnormal, exact.
func Float32FromFloat8E8M0FNU(bits uint8) float32 {
	if bits == 0xff {
		return float32(math.NaN())
	}
	return float32(math.Ldexp(1, int(bits)-127))
}
