package tensorcheck

import (
	"fmt"
	"math"
	"strconv"
	"strings"
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

// How many ranking rows, and how many defect columns, rows and elements,
// FormatDiagnosis lists (the Diagnosis has all the server sent).
const (
	rankingShown = 5
	defectShown  = 5
)

// sharedMarker marks a candidate that reused another candidate's GEMM.
const sharedMarker = "*"

// namesWidth is where a ranking row's names wrap, before an "=".
const namesWidth = 72

// FormatDiagnosis is the diagnosis as a message for people, the Python
// client's: the server's headline first (from a server that predates it,
// the verdict's sentence) and its advice ("Advice: ..."), then the
// verdict's sentence when the headline came first ("Why: ..."), the
// accepted configuration, what is not rounding (where to look, the columns
// and rows, the elements beyond the threshold, a few of each), the best
// match with the verdict word, the framework hint, the explanation (from a
// server without a headline) and the ranking (one row per group of
// RankingGroups, with the plausibility test, the shared GEMMs and why
// candidates are ruled out). It decides nothing and writes no sentence of
// its own: every verdict, sentence and count is the server's; it adds
// labels and numbers.
//
//	fmt.Println(tensorcheck.FormatDiagnosis(rep.Diagnosis))
func FormatDiagnosis(d *Diagnosis) string {
	if d == nil {
		return ""
	}
	return strings.Join(append(leadLines(d), diagnosisLines(d)...), "\n")
}

// lead is the sentence a text about d starts with: the server's headline,
// else (a server that predates it) the verdict's sentence.
func (d *Diagnosis) lead() string {
	if d.Headline != "" {
		return d.Headline
	}
	return d.VerdictReason
}

// leadLines: what every text about a diagnosis opens with, the lead and
// the advice, each only when sent.
func leadLines(d *Diagnosis) []string {
	var lines []string
	if l := d.lead(); l != "" {
		lines = append(lines, l)
	}
	if d.Advice != "" {
		lines = append(lines, "Advice: "+d.Advice)
	}
	return lines
}

// diagnosisLines: FormatDiagnosis after the lead lines.
func diagnosisLines(d *Diagnosis) []string {
	var lines []string
	if d.Headline != "" && d.VerdictReason != "" {
		lines = append(lines, "Why: "+d.VerdictReason)
	}
	if d.AcceptedAs != "" {
		lines = append(lines, "Accepted as: "+d.AcceptedAs)
	}
	if d.Defect != nil {
		lines = append(lines, defectLines(d.Defect, d.Headline)...)
	}
	best, verdict := d.Best, ""
	if best == "" {
		best = "none"
	}
	if d.Verdict != "" {
		verdict = "; verdict " + d.Verdict
	}
	head := fmt.Sprintf("Best match: %s (confidence %.2f%s)", best, d.Confidence, verdict)
	if d.Best != "" && len(d.Equivalent) > 0 {
		head += ", equivalent here: " + strings.Join(d.Equivalent, ", ")
	}
	if d.Best != "" && len(d.Tied) > 0 {
		head += "; cannot be told apart from: " + strings.Join(d.Tied, ", ")
	}
	lines = append(lines, head)
	if d.FrameworkHint != "" {
		lines = append(lines, "Framework hint: "+d.FrameworkHint)
	}
	if d.Explanation != "" && d.Headline == "" {
		// The headline says it in one sentence; the paragraph is for
		// servers that predate it (Diagnosis.Explanation keeps it).
		lines = append(lines, d.Explanation)
	}
	if len(d.Ranking) > 0 {
		lines = append(lines, rankingLines(d)...)
	}
	return lines
}

// defectLines: where to look (unless the headline says it already), the
// columns and rows rounding does not explain, the elements beyond the
// threshold; each only when sent.
func defectLines(f *Defect, headline string) []string {
	var lines []string
	if f.WhereToLook != "" && !strings.Contains(headline, f.WhereToLook) {
		lines = append(lines, "Where to look: "+f.WhereToLook)
	}
	if len(f.Columns) > 0 {
		lines = append(lines, "Columns not explained by rounding:")
		lines = append(lines, defectGroupLines("column", f.Columns)...)
	}
	if len(f.Rows) > 0 {
		lines = append(lines, "Rows not explained by rounding:")
		lines = append(lines, defectGroupLines("row", f.Rows)...)
	}
	if f.ElementCount > 0 || len(f.Elements) > 0 {
		lines = append(lines, fmt.Sprintf("Elements beyond %s sigma: %d (farthest: %s ULP, %s sigma)",
			sigmaText(f.ElementThresholdSigma), f.ElementCount, ulpText(f.MaxULP),
			sigmaText(f.MaxSigma)))
		shown := f.Elements
		if len(shown) > defectShown {
			shown = shown[:defectShown]
		}
		for _, e := range shown {
			lines = append(lines, fmt.Sprintf("  %s: observed %s, best %s, %s ULP, %s sigma",
				indexText(e.Element.Index), floatText(e.Element.Actual),
				floatText(e.Element.Expected), ulpText(e.Element.ULP), sigmaText(e.Sigma)))
		}
		total := f.ElementCount
		if int64(len(f.Elements)) > total {
			total = int64(len(f.Elements))
		}
		if more := total - int64(len(shown)); more > 0 {
			lines = append(lines, fmt.Sprintf("  ... %d more", more))
		}
	}
	return lines
}

func defectGroupLines(kind string, groups []DefectGroup) []string {
	var lines []string
	for i, g := range groups {
		if i == defectShown {
			lines = append(lines, fmt.Sprintf("  ... %d more %ss", len(groups)-defectShown, kind))
			break
		}
		line := fmt.Sprintf("  %s %d: %d disagreements vs %s expected, max %s ULP, %s sigma",
			kind, g.Index, g.Disagreements, gText(g.ExpectedDisagreements), ulpText(g.MaxULP),
			sigmaText(g.MaxSigma))
		if g.ShiftT != 0 {
			line += fmt.Sprintf(", shift t = %.1f", g.ShiftT)
		}
		lines = append(lines, line)
	}
	return lines
}

// rankingLines: the ranking's rows (candidates with the same bits share
// one), the shared GEMMs, and why the listed rows are ruled out.
func rankingLines(d *Diagnosis) []string {
	rows := d.RankingGroups()
	if len(rows) > rankingShown {
		rows = rows[:rankingShown]
	}
	ranked := map[string]bool{}
	for _, c := range d.Ranking {
		ranked[c.Config] = true
	}
	lines := []string{"Ranking (config: plausible, bitwise-equal share, max ULP, bound ratio):"}
	var listed []RankedCandidate
	for _, row := range rows {
		r := row[0]
		br := "n/a"
		if r.BoundRatio != nil {
			br = gText(*r.BoundRatio)
		}
		rowLines := wrappedNames(rowNames(row, ranked, true))
		rowLines[len(rowLines)-1] += fmt.Sprintf(": %s, %s, %s, %s",
			plausibleText(r), FormatShare(r.BitwiseEqualFraction), ulpText(r.MaxULP), br)
		lines = append(lines, rowLines...)
		listed = append(listed, row...)
	}
	// "* A, B reused the GEMM of C.", in order of first appearance.
	var shared []string
	reusers := map[string][]string{}
	for _, c := range listed {
		if c.SharedComputation == "" {
			continue
		}
		if _, ok := reusers[c.SharedComputation]; !ok {
			shared = append(shared, c.SharedComputation)
		}
		reusers[c.SharedComputation] = append(reusers[c.SharedComputation], c.Config)
	}
	for _, s := range shared {
		lines = append(lines, fmt.Sprintf("  %s %s reused the GEMM of %s.", sharedMarker,
			strings.Join(reusers[s], ", "), s))
	}
	var ruledOut []string
	for i, row := range rows {
		if row[0].RuledOut != "" {
			ruledOut = append(ruledOut, fmt.Sprintf("    %d. %s: %s", i+1,
				strings.Join(rowNames(row, ranked, false), " = "), row[0].RuledOut))
		}
	}
	if len(ruledOut) > 0 {
		lines = append(lines, "  Ruled out:")
		lines = append(lines, ruledOut...)
	}
	return lines
}

// rowNames: the row's candidates (each marked, if marked, when it reused
// another's GEMM), then the names in the first one's Equivalent that the
// ranking lacks.
func rowNames(row []RankedCandidate, ranked map[string]bool, marked bool) []string {
	var names []string
	for _, c := range row {
		name := c.Config
		if marked && c.SharedComputation != "" {
			name += sharedMarker
		}
		names = append(names, name)
	}
	seen := map[string]bool{}
	for _, e := range row[0].Equivalent {
		if !ranked[e] && !seen[e] {
			names = append(names, e)
			seen[e] = true
		}
	}
	return names
}

// wrappedNames: "  A = B = C", wrapped before an "=" at namesWidth into
// continuation lines "    = D = E"; a name longer than that stays whole.
func wrappedNames(names []string) []string {
	lines := []string{"  " + names[0]}
	for _, name := range names[1:] {
		last := &lines[len(lines)-1]
		if len(*last)+3+len(name) > namesWidth {
			lines = append(lines, "    = "+name)
		} else {
			*last += " = " + name
		}
	}
	return lines
}

// plausibleText: "yes", "no", or "-" when the server ran no plausibility
// test.
func plausibleText(c RankedCandidate) string {
	switch {
	case c.Plausible:
		return "yes"
	case c.ComparedElements > 0:
		return "no"
	}
	return "-"
}

// ulpText: a ULP distance; the server's "infinitely far" (NaN against a
// number) as "inf".
func ulpText(v uint64) string {
	if v == math.MaxUint64 {
		return "inf"
	}
	return strconv.FormatUint(v, 10)
}

// sigmaText: a distance in predicted standard errors, one decimal.
func sigmaText(v float64) string { return nonFinite(v, strconv.FormatFloat(v, 'f', 1, 64)) }

// gText: three significant digits, as Python's ".3g".
func gText(v float64) string { return nonFinite(v, strconv.FormatFloat(v, 'g', 3, 64)) }

// floatText: the shortest text that reads back as v.
func floatText(v float64) string { return nonFinite(v, strconv.FormatFloat(v, 'g', -1, 64)) }

func nonFinite(v float64, text string) string {
	switch {
	case math.IsNaN(v):
		return "nan"
	case math.IsInf(v, 1):
		return "inf"
	case math.IsInf(v, -1):
		return "-inf"
	}
	return text
}

// indexText: Python tuple notation, (), (3,), (1, 3).
func indexText(idx []int64) string {
	parts := make([]string, len(idx))
	for i, v := range idx {
		parts[i] = strconv.FormatInt(v, 10)
	}
	s := "(" + strings.Join(parts, ", ")
	if len(idx) == 1 {
		s += ","
	}
	return s + ")"
}

// resultsShown is how many configurations Report.String lists.
const resultsShown = 8

// String is the report for people, the Python client's str(report): the
// server's answer first (the diagnosis's headline and advice), the
// verdict ("Verdict: PASS (tolerance torch)", or with LinearRequest.Accept
// "Verdict: FAIL (accept tf32)"), the observed output and each
// configuration against the reference in a line each, then the rest of
// the diagnosis as FormatDiagnosis prints it. It decides nothing: every
// verdict and sentence is the server's.
func (r *Report) String() string {
	if r == nil {
		return ""
	}
	var lines []string
	if r.Diagnosis != nil {
		lines = leadLines(r.Diagnosis)
	}
	if r.Verdict != "" {
		line := "Verdict: " + r.Verdict
		if len(r.accept) > 0 {
			line += " (accept " + strings.Join(r.accept, ", ") + ")"
		} else if r.Tolerance.Preset != "" {
			line += " (tolerance " + r.Tolerance.Preset + ")"
		}
		lines = append(lines, line)
	}
	ref := "reference"
	if r.Reference != nil && r.Reference.Config != "" {
		ref = r.Reference.Config
	}
	if s := r.ObservedVsReference; s != nil {
		lines = append(lines, statsLine("observed vs "+ref, s, r.Tolerance.Preset))
	}
	for i, c := range r.Results {
		if i == resultsShown {
			lines = append(lines, fmt.Sprintf("... %d more configurations", len(r.Results)-resultsShown))
			break
		}
		if c.VsReference != nil {
			lines = append(lines, statsLine(c.Config+" vs "+ref, c.VsReference, r.Tolerance.Preset))
		}
	}
	if r.Diagnosis != nil {
		lines = append(lines, diagnosisLines(r.Diagnosis)...)
	}
	return strings.Join(lines, "\n")
}

// ulpCell: the headline ULP figure of a comparison, "5", or "5 (2 near
// 0)" when the server left two differing elements near zero out of it.
func ulpCell(s *Stats) string {
	text := ulpText(s.HeadlineMaxULP())
	if s.Negligible != nil {
		text += fmt.Sprintf(" (%d near 0)", s.Negligible.Differing)
	}
	return text
}

// statsLine: one comparison in a line, "observed vs cpu:fp64: 3 / 1024
// outside tolerance torch, max_abs 0.00105, max 12 ULP".
func statsLine(label string, s *Stats, preset string) string {
	tolerance := "tolerance"
	if preset != "" {
		tolerance += " " + preset
	}
	line := fmt.Sprintf("%s: %d / %d outside %s, max_abs %s, max %s ULP", label, s.Mismatched,
		s.Total, tolerance, gText(s.MaxAbs), ulpCell(s))
	if s.BoundRatio != nil {
		line += ", bound_ratio " + gText(*s.BoundRatio)
	}
	return line
}

// String is the comparison for people, the Python client's
// str(result): the server's headline, the verdict when the request
// accepted configurations, a line per output (its diagnosis's headline,
// else its best match), the pair's numbers, and the advice for each side
// that the headline does not already give. It decides nothing: every
// sentence is the server's; it adds labels and numbers.
func (c *CompareResult) String() string {
	if c == nil {
		return ""
	}
	var lines []string
	if c.Headline != "" {
		lines = append(lines, c.Headline)
	}
	if c.Verdict != "" {
		accept := strings.Join(c.accept, ", ")
		if accept == "" {
			accept = "?"
		}
		lines = append(lines, "Verdict: "+c.Verdict+" (accept "+accept+")")
	}
	for _, o := range c.Outputs {
		what := "-"
		if d := o.Diagnosis; d != nil {
			if what = d.lead(); what == "" {
				what = "best match " + d.Best
				if d.Best == "" {
					what += "none"
				}
			}
		}
		lines = append(lines, "  "+o.Name+": "+what)
	}
	p := c.Pair
	if p != nil && p.Stats != nil {
		rounding := "no"
		if p.Rounding {
			rounding = "yes"
		}
		lines = append(lines, fmt.Sprintf("  %s vs %s: max_abs %s, max %s ULP; expected at most %s (rounding of both: %s)",
			p.A, p.B, gText(p.Stats.MaxAbs), ulpCell(p.Stats), gText(p.ExpectedMaxAbs), rounding))
	}
	if p != nil {
		for _, a := range [][2]string{{p.B, p.AdviceBToA}, {p.A, p.AdviceAToB}} {
			if a[1] != "" && !strings.Contains(c.Headline, a[1]) {
				lines = append(lines, "  Advice for "+a[0]+": "+a[1])
			}
		}
	}
	return strings.Join(lines, "\n")
}
