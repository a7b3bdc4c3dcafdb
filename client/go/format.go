package tensorcheck

import (
	"math"
	"strconv"
)

// shareMaxDecimals is how many decimals FormatShare adds at most before it
// prints a bound.
const shareMaxDecimals = 6

// FormatShare prints a fraction in [0, 1] as a percentage that reads 100% or
// 0% only when it is exactly that: a bitwise-equal share of 0.99996831 is
// "99.997%", not "100.0%", which would read as "every element agrees".
//
// Exactly 1 is "100%" and exactly 0 "0%"; anything else has one decimal, or
// as many more (up to 6) as it takes not to read 100.0 or 0.0; beyond that
// "<0.000001%" and ">99.999999%". NaN is "nan%"; values outside [0, 1] get
// one decimal. The CLI and the Python client follow the same rule.
//
//	FormatShare(rep.Diagnosis.Ranking[0].BitwiseEqualFraction) // "99.997%"
func FormatShare(fraction float64) string {
	switch {
	case math.IsNaN(fraction):
		return "nan%"
	case fraction == 1:
		return "100%"
	case fraction == 0:
		return "0%"
	}
	percent := 100 * fraction
	if fraction < 0 || fraction > 1 {
		return strconv.FormatFloat(percent, 'f', 1, 64) + "%"
	}
	for decimals := 1; decimals <= shareMaxDecimals; decimals++ {
		// Decided on the printed text: would the reader see 100.0... or 0.0...?
		text := strconv.FormatFloat(percent, 'f', decimals, 64)
		if v, err := strconv.ParseFloat(text, 64); err == nil && v != 0 && v != 100 {
			return text + "%"
		}
	}
	if percent < 50 {
		return "<0.000001%"
	}
	return ">99.999999%"
}
