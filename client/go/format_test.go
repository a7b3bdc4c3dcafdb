package tensorcheck

import (
	"math"
	"reflect"
	"strings"
	"testing"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
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

// The verdict is the server's: FormatDiagnosis shows its sentence first
// (from a server without a headline), verbatim, then where to look and the
// defect's groups and elements.
func TestFormatDiagnosisShowsTheDefectVerdictFirstThenWhereToLook(t *testing.T) {
	const reason = "Column 2 holds 64 of the 72 disagreements with cpu:fp32:fused where " +
		"rounding predicts 0.8 (p 1e-30): not rounding."
	const where = "output column 2 <-> weight row 2 (out_in layout) and bias element 2"
	d := &Diagnosis{
		Best:          "cpu:fp32:fused",
		Confidence:    0.9,
		Verdict:       VerdictDefect,
		VerdictReason: reason,
		Ranking: []RankedCandidate{
			{Config: "cpu:fp32:fused", MaxULP: 4096, Plausible: true, ComparedElements: 128},
		},
		Defect: &Defect{
			ElementThresholdSigma: 6.1875,
			ElementCount:          7,
			MaxULP:                math.MaxUint64,
			MaxSigma:              math.Inf(1),
			WhereToLook:           where,
			Columns: []DefectGroup{{Index: 2, Disagreements: 64, ExpectedDisagreements: 0.8,
				PValue: 1e-30, BeyondThreshold: 7, MaxULP: math.MaxUint64, MaxSigma: math.Inf(1),
				ShiftT: 7.5, ShiftPValue: 0.25}},
			Rows: []DefectGroup{{Index: 5, Disagreements: 3, ExpectedDisagreements: 0.025,
				PValue: 2.5e-6, BeyondThreshold: 1, MaxULP: 4096, MaxSigma: 812.25}},
			Elements: []DefectElement{{
				Element: Element{Index: []int64{9, 2}, Actual: math.NaN(), Expected: 0.5,
					ULP: math.MaxUint64},
				Sigma: math.Inf(1),
			}},
		},
	}
	for row := int64(0); row < 6; row++ {
		d.Defect.Elements = append(d.Defect.Elements, DefectElement{
			Element: Element{Index: []int64{row, 2}, Actual: 1.5, Expected: 0.5, ULP: 4096},
			Sigma:   812.25 - float64(row),
		})
	}
	want := []string{
		reason,
		"Where to look: " + where,
		"Columns not explained by rounding:",
		"  column 2: 64 disagreements vs 0.8 expected, max inf ULP, inf sigma, shift t = 7.5",
		"Rows not explained by rounding:",
		"  row 5: 3 disagreements vs 0.025 expected, max 4096 ULP, 812.2 sigma",
		"Elements beyond 6.2 sigma: 7 (farthest: inf ULP, inf sigma)",
		"  (9, 2): observed nan, best 0.5, inf ULP, inf sigma",
		"  (0, 2): observed 1.5, best 0.5, 4096 ULP, 812.2 sigma",
		"  (1, 2): observed 1.5, best 0.5, 4096 ULP, 811.2 sigma",
		"  (2, 2): observed 1.5, best 0.5, 4096 ULP, 810.2 sigma",
		"  (3, 2): observed 1.5, best 0.5, 4096 ULP, 809.2 sigma",
		"  ... 2 more", // 7 beyond the threshold, 5 shown
		"Best match: cpu:fp32:fused (confidence 0.90; verdict defect)",
		"Ranking (config: plausible, bitwise-equal share, max ULP, bound ratio):",
		"  cpu:fp32:fused: yes, 0%, 4096, n/a",
	}
	if got := strings.Split(FormatDiagnosis(d), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("FormatDiagnosis() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestFormatDiagnosisShowsEachVerdictFirstWithItsReasonVerbatim(t *testing.T) {
	for _, verdict := range []string{VerdictRounding, VerdictDefect, VerdictUnexplained} {
		reason := "A sentence of the server's, " + verdict + ": 0.5 <= 1.5 (kept as sent)."
		// An empty Defect adds no line.
		d := &Diagnosis{Confidence: 0.4, Verdict: verdict, VerdictReason: reason, Defect: &Defect{}}
		lines := strings.Split(FormatDiagnosis(d), "\n")
		if lines[0] != reason {
			t.Errorf("%s: first line %q, want %q", verdict, lines[0], reason)
		}
		if want := "Best match: none (confidence 0.40; verdict " + verdict + ")"; lines[1] != want {
			t.Errorf("%s: second line %q, want %q", verdict, lines[1], want)
		}
	}
}

// The server's headline comes first, then its advice, the verdict's
// sentence and the accepted configuration; all verbatim. Where to look is
// not repeated when the headline says it, nor the explanation paragraph.
func TestFormatDiagnosisShowsTheHeadlineFirst(t *testing.T) {
	const where = "output column 2 <-> weight row 2 (out_in layout)"
	const headline = "Not rounding: column 2 is 64 sigma from cpu:tf32:fused. Look at " + where + "."
	const advice = "Set torch.backends.cuda.matmul.allow_tf32 = False for fp32."
	d := diagnosisFromProto(&pb.Diagnosis{
		Best: "cpu:tf32:fused", Confidence: 0.95, Verdict: pb.Diagnosis_VERDICT_DEFECT,
		Ranking: []*pb.RankedCandidate{{Config: "cpu:tf32:fused", Accepted: true,
			FrameworkDefault: "JAX/Flax's default on Ampere+ GPUs for fp32 tensors"}},
		VerdictReason: "Column 2 holds 64 disagreements where 0.8 are expected.", Headline: headline,
		Advice: advice, Accepted: true, AcceptedAs: "cpu:tf32:fused", Explanation: "A paragraph.",
		FrameworkHint: "PyTorch with allow_tf32.", Defect: &pb.Defect{WhereToLook: where},
	})
	if r := d.Ranking[0]; !r.Accepted || r.FrameworkDefault != "JAX/Flax's default on Ampere+ GPUs for fp32 tensors" {
		t.Errorf("ranking[0] = %+v", r)
	}
	d.Ranking = nil
	want := []string{
		headline,
		"Advice: " + advice,
		"Why: Column 2 holds 64 disagreements where 0.8 are expected.",
		"Accepted as: cpu:tf32:fused",
		"Best match: cpu:tf32:fused (confidence 0.95; verdict defect)",
		"Framework hint: PyTorch with allow_tf32.",
	}
	if got := strings.Split(FormatDiagnosis(d), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("FormatDiagnosis() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Without a headline: the verdict's sentence leads, no "Why:", and the
	// explanation and where to look are shown.
	d.Headline = ""
	want = []string{
		"Column 2 holds 64 disagreements where 0.8 are expected.",
		"Advice: " + advice,
		"Accepted as: cpu:tf32:fused",
		"Where to look: " + where,
		"Best match: cpu:tf32:fused (confidence 0.95; verdict defect)",
		"Framework hint: PyTorch with allow_tf32.",
		"A paragraph.",
	}
	if got := strings.Split(FormatDiagnosis(d), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("without a headline, FormatDiagnosis() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestFormatDiagnosisFromAServerWithoutAVerdictHasNoVerdictLine(t *testing.T) {
	got := FormatDiagnosis(&Diagnosis{Best: "cpu:fp32:fused", Confidence: 0.97})
	if want := "Best match: cpu:fp32:fused (confidence 0.97)"; got != want {
		t.Errorf("FormatDiagnosis() = %q, want %q", got, want)
	}
}

func TestFormatDiagnosisRankingMatchesThePythonClientsMessage(t *testing.T) {
	same := []string{"cpu:fp32:fused", "cpu:tf32:fused", "cpu:fp32:unfused"}
	d := &Diagnosis{Best: "cpu:fp32:fused", Confidence: 0.9}
	for _, name := range same {
		var others []string
		for _, e := range same {
			if e != name {
				others = append(others, e)
			}
		}
		c := RankedCandidate{Config: name, BitwiseEqualFraction: 24575.0 / 24576, MaxULP: 1,
			Plausible: true, ComparedElements: 24576, Equivalent: others}
		if name == "cpu:fp32:unfused" {
			c.SharedComputation = "cpu:fp32:fused"
		}
		d.Ranking = append(d.Ranking, c)
	}
	d.Ranking = append(d.Ranking,
		RankedCandidate{Config: "cpu:bf16:fused", BitwiseEqualFraction: 0.25, MaxULP: 40,
			ComparedElements: 24576, RuledOut: "bf16 rounding everywhere."})
	// As client/python/tests/test_report.py's
	// test_diagnosis_message_shows_equivalent_candidates_as_one_row.
	want := []string{
		"Best match: cpu:fp32:fused (confidence 0.90)",
		"Ranking (config: plausible, bitwise-equal share, max ULP, bound ratio):",
		"  cpu:fp32:fused = cpu:tf32:fused = cpu:fp32:unfused*: yes, 99.996%, 1, n/a",
		"  cpu:bf16:fused: no, 25.0%, 40, n/a",
		"  * cpu:fp32:unfused reused the GEMM of cpu:fp32:fused.",
		"  Ruled out:",
		"    2. cpu:bf16:fused: bf16 rounding everywhere.",
	}
	if got := strings.Split(FormatDiagnosis(d), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("FormatDiagnosis() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestStatsLeaveElementsNearZeroOutOfTheULPFigure(t *testing.T) {
	p := &pb.Stats{Total: 3, Mismatched: 1, MaxAbs: 0.5, MaxUlp: 1901874441,
		Negligible: &pb.NegligibleElements{Below: 0.25, Differing: 3, MaxAbs: 6e-8,
			SignificantMaxUlp: 2, Note: "leaving out 3 elements near zero"}}
	s := statsFromProto(p)
	if s.Negligible == nil || s.Negligible.Differing != 3 || s.Negligible.Note != "leaving out 3 elements near zero" {
		t.Fatalf("Negligible = %+v", s.Negligible)
	}
	if got := s.HeadlineMaxULP(); got != 2 {
		t.Errorf("HeadlineMaxULP() = %d, want 2", got)
	}
	if got, want := statsLine("observed vs cpu:fp64:none", s, "torch"),
		"observed vs cpu:fp64:none: 1 / 3 outside tolerance torch, max_abs 0.5, max 2 (3 near 0) ULP"; got != want {
		t.Errorf("statsLine = %q, want %q", got, want)
	}
	p.Negligible = nil
	s = statsFromProto(p)
	if s.Negligible != nil || s.HeadlineMaxULP() != 1901874441 {
		t.Errorf("without negligible: %+v, %d", s.Negligible, s.HeadlineMaxULP())
	}
	if got := statsLine("x", s, "torch"); !strings.HasSuffix(got, "max 1901874441 ULP") {
		t.Errorf("statsLine = %q", got)
	}
}
