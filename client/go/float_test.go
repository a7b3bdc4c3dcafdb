package tensorcheck

import (
	"math"
	"testing"
)

// Expected bit patterns are from the IEEE 754 definitions, worked by hand.
func TestBFloat16FromFloat32RoundsToNearestEven(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{float32(math.Pi), 0x4049},                 // 3.140625
		{1 + 1.0/256, 0x3f80},                      // tie, even stays
		{1 + 3.0/256, 0x3f82},                      // tie, odd rounds up
		{1 + 1.0/256 + 1.0/65536, 0x3f81},          // above the tie
		{math.MaxFloat32, 0x7f80},                  // rounds up to +inf
		{float32(math.Inf(-1)), 0xff80},            // -inf
		{math.Float32frombits(0x00000001), 0x0000}, // tiny subnormal
	}
	for _, c := range cases {
		if got := BFloat16FromFloat32(c.in); got != c.want {
			t.Errorf("BFloat16FromFloat32(%g) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	if got := BFloat16FromFloat32(float32(math.NaN())); got&0x7f80 != 0x7f80 || got&0x7f == 0 {
		t.Errorf("BFloat16FromFloat32(NaN) = %#04x, not a NaN", got)
	}
	if got := Float32FromBFloat16(0x4049); got != 3.140625 {
		t.Errorf("Float32FromBFloat16(0x4049) = %g, want 3.140625", got)
	}
}

func TestFloat16FromFloat32RoundsToNearestEven(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3c00},
		{-2, 0xc000},
		{0.1, 0x2e66},
		{65504, 0x7bff},                          // largest finite
		{65519, 0x7bff},                          // below the tie
		{65520, 0x7c00},                          // tie to even: infinity
		{float32(math.Ldexp(1, -14)), 0x0400},    // smallest normal
		{float32(math.Ldexp(1, -24)), 0x0001},    // smallest subnormal
		{float32(math.Ldexp(1, -25)), 0x0000},    // tie, even is zero
		{float32(math.Ldexp(3, -26)), 0x0001},    // 1.5 * 2^-25 rounds up
		{float32(math.Ldexp(3, -25)), 0x0002},    // 1.5 units, tie to even 2
		{float32(math.Ldexp(1023, -24)), 0x03ff}, // largest subnormal
		{1 + 1.0/2048, 0x3c00},                   // tie, even stays
		{1 + 3.0/2048, 0x3c02},                   // tie, odd rounds up
		{float32(math.Inf(1)), 0x7c00},
		{-0.0, 0x0000},
	}
	for _, c := range cases {
		if got := Float16FromFloat32(c.in); got != c.want {
			t.Errorf("Float16FromFloat32(%g) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	if got := Float16FromFloat32(float32(math.NaN())); got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
		t.Errorf("Float16FromFloat32(NaN) = %#04x, not a NaN", got)
	}
}

func TestFloat16RoundTripsEveryFiniteValue(t *testing.T) {
	for b := 0; b < 1<<16; b++ {
		bits := uint16(b)
		if bits&0x7c00 == 0x7c00 {
			continue // inf and NaN
		}
		if got := Float16FromFloat32(Float32FromFloat16(bits)); got != bits {
			t.Fatalf("round trip of %#04x gave %#04x", bits, got)
		}
	}
	if got := Float32FromFloat16(0x0001); float64(got) != math.Ldexp(1, -24) {
		t.Errorf("Float32FromFloat16(0x0001) = %g, want 2^-24", got)
	}
	if got := Float32FromFloat16(0xfbff); got != -65504 {
		t.Errorf("Float32FromFloat16(0xfbff) = %g, want -65504", got)
	}
}

// The expected values here come from the formats' definitions, computed in
// float64 by the formula below, never from the conversions under test.

// fp8Spec is a format's parameters as the tests see them.
type fp8Spec struct {
	name        string
	expBits     int
	mantBits    int
	bias        int
	hasInfinity bool // E5M2: exponent all ones is Inf/NaN; E4M3FN: only 0x7f is NaN
	maxFinite   float64
	maxBits     uint8
	toBits      func(float32) uint8
	toBitsSat   func(float32) uint8
	toFloat     func(uint8) float32
}

var fp8Specs = []fp8Spec{
	{"e4m3fn", 4, 3, 7, false, 448, 0x7e,
		Float8E4M3FNFromFloat32, Float8E4M3FNFromFloat32Sat, Float32FromFloat8E4M3FN},
	{"e5m2", 5, 2, 15, true, 57344, 0x7b,
		Float8E5M2FromFloat32, Float8E5M2FromFloat32Sat, Float32FromFloat8E5M2},
}

// decode is the textbook value of bits: (-1)^s * 2^(e-bias) * (1 + m/2^M)
// for normal numbers, (-1)^s * 2^(1-bias) * (m/2^M) for subnormals; ok is
// false for NaN.
func (s fp8Spec) decode(bits uint8) (v float64, ok bool) {
	sign := 1.0
	if bits&0x80 != 0 {
		sign = -1
	}
	e := int(bits>>uint(s.mantBits)) & (1<<uint(s.expBits) - 1)
	m := float64(int(bits) & (1<<uint(s.mantBits) - 1))
	frac := m / float64(int(1)<<uint(s.mantBits))
	allOnes := 1<<uint(s.expBits) - 1
	switch {
	case s.hasInfinity && e == allOnes && m == 0:
		return sign * math.Inf(1), true
	case s.hasInfinity && e == allOnes:
		return 0, false
	case !s.hasInfinity && bits&0x7f == 0x7f:
		return 0, false
	case e == 0:
		return sign * math.Ldexp(frac, 1-s.bias), true
	}
	return sign * math.Ldexp(1+frac, e-s.bias), true
}

// isNaN reports whether bits is a NaN of the format.
func (s fp8Spec) isNaN(bits uint8) bool {
	_, ok := s.decode(bits)
	return !ok
}

// same compares a float32 with an expected float64 bit for bit in meaning:
// equal values with equal signs (so -0 differs from +0).
func same(got float32, want float64) bool {
	return float64(got) == want && math.Signbit(float64(got)) == math.Signbit(want)
}

func TestFloat8DecodesEveryPatternAsTheFormulaSays(t *testing.T) {
	for _, s := range fp8Specs {
		nans := 0
		for i := 0; i < 256; i++ {
			bits := uint8(i)
			got := s.toFloat(bits)
			want, ok := s.decode(bits)
			if !ok {
				nans++
				if !math.IsNaN(float64(got)) {
					t.Errorf("%s: %#02x decodes to %g, want NaN", s.name, bits, got)
				} else if math.Signbit(float64(got)) != (bits&0x80 != 0) {
					t.Errorf("%s: NaN %#02x lost its sign", s.name, bits)
				}
				continue
			}
			if !same(got, want) {
				t.Errorf("%s: %#02x decodes to %g, want %g", s.name, bits, got, want)
			}
		}
		// E4M3FN: 0x7f, 0xff. E5M2: 0x7d-0x7f, 0xfd-0xff.
		if wantNaNs := map[string]int{"e4m3fn": 2, "e5m2": 6}[s.name]; nans != wantNaNs {
			t.Errorf("%s: %d NaN patterns, want %d", s.name, nans, wantNaNs)
		}
	}
}

func TestFloat8LandmarksDecodeToTheirValues(t *testing.T) {
	cases := []struct {
		got  float32
		want float64
	}{
		{Float32FromFloat8E4M3FN(0x7e), 448},
		{Float32FromFloat8E4M3FN(0xfe), -448},
		{Float32FromFloat8E4M3FN(0x01), math.Ldexp(1, -9)}, // smallest subnormal
		{Float32FromFloat8E4M3FN(0x07), math.Ldexp(7, -9)}, // largest subnormal
		{Float32FromFloat8E4M3FN(0x08), math.Ldexp(1, -6)}, // smallest normal
		{Float32FromFloat8E4M3FN(0x38), 1},                 // exponent 7 = bias
		{Float32FromFloat8E4M3FN(0x80), math.Copysign(0, -1)},
		{Float32FromFloat8E5M2(0x7b), 57344},
		{Float32FromFloat8E5M2(0x01), math.Ldexp(1, -16)}, // smallest subnormal
		{Float32FromFloat8E5M2(0x04), math.Ldexp(1, -14)}, // smallest normal
		{Float32FromFloat8E5M2(0x3c), 1},
		{Float32FromFloat8E5M2(0x7c), math.Inf(1)},
		{Float32FromFloat8E5M2(0xfc), math.Inf(-1)},
		{Float32FromFloat8E5M2(0x80), math.Copysign(0, -1)},
	}
	for i, c := range cases {
		if !same(c.got, c.want) {
			t.Errorf("case %d: got %g, want %g", i, c.got, c.want)
		}
	}
}

func TestFloat8RoundTripsEveryNonNaNPattern(t *testing.T) {
	for _, s := range fp8Specs {
		for i := 0; i < 256; i++ {
			bits := uint8(i)
			if s.isNaN(bits) {
				continue
			}
			f := s.toFloat(bits)
			if got := s.toBits(f); got != bits {
				t.Errorf("%s: %#02x -> %g -> %#02x", s.name, bits, f, got)
			}
			if math.IsInf(float64(f), 0) {
				continue // saturates, checked below
			}
			if got := s.toBitsSat(f); got != bits {
				t.Errorf("%s sat: %#02x -> %g -> %#02x", s.name, bits, f, got)
			}
		}
	}
}

// Between every two neighbouring representable values (0 and the smallest
// subnormal included) the midpoint rounds to the one with the even
// mantissa, and the float32 just above or below it to the nearer one. Just
// above a midpoint is where a conversion through float16 would go wrong:
// float16 rounds it onto the midpoint, and the tie then goes to even.
func TestFloat8RoundsEveryMidpointToEvenAndItsNeighboursToNearest(t *testing.T) {
	for _, s := range fp8Specs {
		for lo := 0; lo < int(s.maxBits); lo++ {
			hi := lo + 1
			a, _ := s.decode(uint8(lo))
			b, _ := s.decode(uint8(hi))
			mid := float32((a + b) / 2) // one bit more than the format: exact
			if float64(mid) != (a+b)/2 {
				t.Fatalf("%s: midpoint of %g and %g not exact in float32", s.name, a, b)
			}
			even := lo
			if lo&1 == 1 {
				even = hi
			}
			above := math.Nextafter32(mid, float32(math.Inf(1)))
			below := math.Nextafter32(mid, 0)
			for _, neg := range []bool{false, true} {
				sign, m, up, down := 0, mid, above, below
				if neg {
					sign, m, up, down = 0x80, -mid, -above, -below
				}
				checks := []struct {
					in   float32
					want int
				}{{m, even}, {up, hi}, {down, lo}}
				for _, c := range checks {
					want := uint8(c.want | sign)
					if got := s.toBits(c.in); got != want {
						t.Errorf("%s(%g) = %#02x, want %#02x (between %#02x and %#02x)", s.name, c.in, got, want, lo, hi)
					}
					if got := s.toBitsSat(c.in); got != want {
						t.Errorf("%s sat(%g) = %#02x, want %#02x", s.name, c.in, got, want)
					}
				}
			}
		}
	}
}

func TestFloat8OneRoundingFromFloat32NotThroughFloat16(t *testing.T) {
	// 1 + 2^-3 + 2^-12 lies just above the E5M2 midpoint between 1 (0x3c)
	// and 1.25 (0x3d). As float16 it is 1.125 exactly (2^-12 is under half
	// of float16's step 2^-10), a tie that would then go to 1.
	f := float32(1 + math.Ldexp(1, -3) + math.Ldexp(1, -12))
	if got := Float8E5M2FromFloat32(f); got != 0x3d {
		t.Errorf("Float8E5M2FromFloat32(%g) = %#02x, want 0x3d (1.25)", f, got)
	}
	// The same for E4M3FN: 1 + 2^-4 + 2^-13 is above the midpoint of 1
	// (0x38) and 1.125 (0x39).
	f = float32(1 + math.Ldexp(1, -4) + math.Ldexp(1, -13))
	if got := Float8E4M3FNFromFloat32(f); got != 0x39 {
		t.Errorf("Float8E4M3FNFromFloat32(%g) = %#02x, want 0x39 (1.125)", f, got)
	}
}

func TestFloat8E4M3FNOverflowIsNaNBeyondTheTieAt464(t *testing.T) {
	nextUp := func(v float32) float32 { return math.Nextafter32(v, float32(math.Inf(1))) }
	nextDown := func(v float32) float32 { return math.Nextafter32(v, 0) }
	inf := float32(math.Inf(1))
	cases := []struct {
		in        float32
		want, sat uint8
	}{
		{448, 0x7e, 0x7e},
		{nextUp(448), 0x7e, 0x7e},
		{449, 0x7e, 0x7e},
		{nextDown(464), 0x7e, 0x7e},
		{464, 0x7e, 0x7e}, // tie between 448 (mantissa 110, even) and 480: even
		{nextUp(464), 0x7f, 0x7e},
		{480, 0x7f, 0x7e},
		{1e6, 0x7f, 0x7e},
		{math.MaxFloat32, 0x7f, 0x7e},
		{inf, 0x7f, 0x7e},
		{-464, 0xfe, 0xfe},
		{-nextUp(464), 0xff, 0xfe},
		{-inf, 0xff, 0xfe},
	}
	for _, c := range cases {
		if got := Float8E4M3FNFromFloat32(c.in); got != c.want {
			t.Errorf("Float8E4M3FNFromFloat32(%g) = %#02x, want %#02x", c.in, got, c.want)
		}
		if got := Float8E4M3FNFromFloat32Sat(c.in); got != c.sat {
			t.Errorf("Float8E4M3FNFromFloat32Sat(%g) = %#02x, want %#02x", c.in, got, c.sat)
		}
	}
}

func TestFloat8E5M2OverflowIsInfinityFromTheTieAt61440(t *testing.T) {
	nextUp := func(v float32) float32 { return math.Nextafter32(v, float32(math.Inf(1))) }
	nextDown := func(v float32) float32 { return math.Nextafter32(v, 0) }
	inf := float32(math.Inf(1))
	cases := []struct {
		in        float32
		want, sat uint8
	}{
		{57344, 0x7b, 0x7b},
		{nextUp(57344), 0x7b, 0x7b},
		{nextDown(61440), 0x7b, 0x7b},
		{61440, 0x7c, 0x7b}, // tie between 57344 (mantissa 11, odd) and 65536: Inf
		{65536, 0x7c, 0x7b},
		{math.MaxFloat32, 0x7c, 0x7b},
		{inf, 0x7c, 0x7b},
		{-nextDown(61440), 0xfb, 0xfb},
		{-61440, 0xfc, 0xfb},
		{-inf, 0xfc, 0xfb},
	}
	for _, c := range cases {
		if got := Float8E5M2FromFloat32(c.in); got != c.want {
			t.Errorf("Float8E5M2FromFloat32(%g) = %#02x, want %#02x", c.in, got, c.want)
		}
		if got := Float8E5M2FromFloat32Sat(c.in); got != c.sat {
			t.Errorf("Float8E5M2FromFloat32Sat(%g) = %#02x, want %#02x", c.in, got, c.sat)
		}
	}
}

func TestFloat8NaNStaysNaNWithItsSignAndZeroKeepsItsSign(t *testing.T) {
	negNaN := math.Float32frombits(0xffc00000)
	nans := []float32{float32(math.NaN()), negNaN, math.Float32frombits(0x7f800001), math.Float32frombits(0xff800001)}
	for _, s := range fp8Specs {
		for _, conv := range []func(float32) uint8{s.toBits, s.toBitsSat} {
			for _, n := range nans {
				got := conv(n)
				if !s.isNaN(got) {
					t.Errorf("%s(NaN %#08x) = %#02x, not a NaN", s.name, math.Float32bits(n), got)
				}
				if (got&0x80 != 0) != math.Signbit(float64(n)) {
					t.Errorf("%s(NaN %#08x) = %#02x, sign lost", s.name, math.Float32bits(n), got)
				}
			}
			negZero := float32(math.Copysign(0, -1))
			tinyNeg := -math.Float32frombits(1) // a float32 subnormal
			if got := conv(0); got != 0x00 {
				t.Errorf("%s(+0) = %#02x, want 0x00", s.name, got)
			}
			if got := conv(negZero); got != 0x80 {
				t.Errorf("%s(-0) = %#02x, want 0x80", s.name, got)
			}
			if got := conv(tinyNeg); got != 0x80 {
				t.Errorf("%s(%g) = %#02x, want 0x80", s.name, tinyNeg, got)
			}
		}
	}
	if got := Float32FromFloat8E4M3FN(0xff); !math.IsNaN(float64(got)) || !math.Signbit(float64(got)) {
		t.Errorf("Float32FromFloat8E4M3FN(0xff) = %g, want -NaN", got)
	}
}
