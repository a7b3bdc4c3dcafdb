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
