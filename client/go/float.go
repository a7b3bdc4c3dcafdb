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
