package tensorcheck

import (
	"math"
	"reflect"
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
		{float64(24575) / 24576, "99.996%"}, // one of 24,576 differs: never "100.0%"
		{math.NaN(), "nan%"},
		{1.5, "150.0%"},
		{-0.25, "-25.0%"},
	} {
		if got := FormatShare(c.fraction); got != c.want {
			t.Errorf("FormatShare(%v) = %q, want %q", c.fraction, got, c.want)
		}
	}
}

func TestRankingGroupsPutsCandidatesWithTheSameBitsInOneRow(t *testing.T) {
	same := []string{"cpu:fp32:fused", "cpu:tf32:fused", "cpu:fp32:unfused"}
	d := &Diagnosis{Best: "cpu:fp32:fused"}
	for _, name := range same {
		var others []string
		for _, e := range same {
			if e != name {
				others = append(others, e)
			}
		}
		d.Ranking = append(d.Ranking, RankedCandidate{
			Config: name, BitwiseEqualFraction: 24575.0 / 24576, MaxULP: 1, Equivalent: others,
		})
	}
	d.Ranking = append(d.Ranking,
		RankedCandidate{Config: "cpu:bf16:fused", BitwiseEqualFraction: 0.25, MaxULP: 40},
		RankedCandidate{Config: "cpu:fp16:fused", BitwiseEqualFraction: 0.125, MaxULP: 80})

	rows := d.RankingGroups()
	var got [][]string
	for _, row := range rows {
		var configs []string
		for _, c := range row {
			configs = append(configs, c.Config)
		}
		got = append(got, configs)
	}
	want := [][]string{
		{"cpu:fp32:fused", "cpu:tf32:fused", "cpu:fp32:unfused"},
		{"cpu:bf16:fused"},
		{"cpu:fp16:fused"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("RankingGroups() = %v, want %v", got, want)
	}
	if len(d.Ranking) != 5 {
		t.Errorf("Ranking has %d entries, want one per candidate (5)", len(d.Ranking))
	}
	if s := FormatShare(rows[0][0].BitwiseEqualFraction); s != "99.996%" {
		t.Errorf("row 1 bitwise-equal share = %q, want 99.996%%", s)
	}
}
