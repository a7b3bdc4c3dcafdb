package tensorcheck

import (
	"math"
	"testing"
)

func TestFormatShareReadsAllOrNoneOnlyWhenExact(t *testing.T) {
	for _, c := range []struct {
		fraction float64
		want     string
	}{
		{1, "100%"},
		{0, "0%"},
		{0.5, "50.0%"},
		{0.333, "33.3%"},
		{0.99996831, "99.997%"}, // 100.0 and 100.00 at one and two decimals
		{0.9996, "99.96%"},
		{0.99999999, "99.999999%"},
		{3e-5, "0.003%"},
		{0.0004, "0.04%"},
		{1e-8, "0.000001%"},
		{1e-9, "<0.000001%"},
		{1 - 1e-10, ">99.999999%"},
		{math.SmallestNonzeroFloat64, "<0.000001%"},
		{float64(94671) / 94674, "99.997%"},
		{math.NaN(), "nan%"},
		{1.5, "150.0%"},
		{-0.25, "-25.0%"},
	} {
		if got := FormatShare(c.fraction); got != c.want {
			t.Errorf("FormatShare(%v) = %q, want %q", c.fraction, got, c.want)
		}
	}
}
