package tensorcheck

import (
	"strings"

	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// Report is the answer to VerifyLinear and DiagnoseLinear. It mirrors the
// VerifyResponse message and the CLI's JSON report (docs/json-report.md).
// String prints it for people, the server's headline first.
type Report struct {
	// The server's verdict, VerdictPass or VerdictFail: whether the
	// observed output is within the tolerance of the reference or, with
	// LinearRequest.Accept, whether the diagnosis accepts it. "" from a
	// server that sent none.
	Verdict string
	// Whether Verdict is VerdictPass.
	Passed bool
	// The tolerance as applied: preset resolved, Atol/Rtol filled in.
	Tolerance Tolerance
	// The observed output against the reference; nil without Observed.
	ObservedVsReference *Stats
	// One per requested configuration, in request order.
	Results []ConfigResult
	// The reference configuration's own run.
	Reference *ConfigResult
	// Set by DiagnoseLinear.
	Diagnosis *Diagnosis
	// The server's decisions about this call that a whole-model check rests
	// on (docs/model-checks.md, "The rules"); nil from a server that sent
	// none.
	Call *CallDecision
	// Numerics facts relevant to this request.
	Notes []string
	// Shape of every output, [..., N].
	OutputShape []int64

	// The tensor store's part in this call. UploadedBytes: the bytes of the
	// tensors this call uploaded into the server's store (those larger than
	// StoreThreshold that the store lacked). ReusedBytes: the bytes of the
	// tensors the request named by digest without uploading them, because
	// the store already held them (a weight verified before, a tensor from
	// Upload). A tensor used by several fields counts once. Both are 0 when
	// every tensor went inline: all of them small, or a server without a
	// store. A tensor sent inline after its store missed it twice (see
	// VerifyLinear) is not in ReusedBytes, and in UploadedBytes if this call
	// uploaded it.
	UploadedBytes int64
	ReusedBytes   int64

	// LinearRequest.Accept, for String.
	accept []string
}

// Result returns the result for config: an exact match of the canonical
// "backend:precision:bias" name, else the first result whose name starts
// with config followed by ':' (so "cpu:fp32" finds "cpu:fp32:fused").
// It returns nil when none matches.
func (r *Report) Result(config string) *ConfigResult {
	for i := range r.Results {
		if r.Results[i].Config == config {
			return &r.Results[i]
		}
	}
	for i := range r.Results {
		if strings.HasPrefix(r.Results[i].Config, config+":") {
			return &r.Results[i]
		}
	}
	return nil
}

// ConfigResult is one configuration's run.
type ConfigResult struct {
	// Canonical "backend:precision:bias".
	Config      string
	VsReference *Stats
	// Nil when no observed output was sent.
	VsObserved *Stats
	ElapsedMS  float64
	// With LinearRequest.ReturnOutputs.
	Output *Tensor
	// Backend detail: algorithm id, device, workspace.
	Details map[string]string
	// With Repeat > 1: whether every run gave the same bits.
	Deterministic bool
	Runs          int32
	// Non-empty when this configuration reused the GEMM of the one named:
	// on these inputs both multiply the same operands in the same
	// arithmetic, so the GEMM ran once and only this configuration's
	// epilogue (bias, activation, output rounding) ran for it. ElapsedMS is
	// then the epilogue's time.
	SharedComputation string
	// With LinearRequest.BatchInvariance: whether the rows keep their bits
	// on sub-batches; nil otherwise.
	BatchInvariance *BatchInvariance
}

// BatchInvariance says whether a configuration gives every row the same
// bits when it runs on sub-batches of the rows.
type BatchInvariance struct {
	// Every row bitwise identical in every sub-batch size.
	Invariant bool
	Rows      int64
	// Rows that differ in some sub-batch size, and the largest ULP distance.
	RowsDiffering int64
	MaxULP        uint64
	// The kernel the backend chose for the whole batch.
	FullBatchDetails map[string]string
	SubBatches       []SubBatch
}

// SubBatch is one sub-batch size: Runs runs of BatchSize rows, the last of
// TailRows when the row count is not a multiple.
type SubBatch struct {
	BatchSize int64
	Runs      int64
	// Rows not bitwise identical to the whole batch's, and the largest ULP
	// distance of their elements.
	RowsDiffering int64
	MaxULP        uint64
	// The kernel the backend chose for BatchSize rows ("algo", ...), and
	// for the shorter last run.
	Details     map[string]string
	TailRows    int64
	TailDetails map[string]string
}

// Stats are the differences between an actual and an expected tensor.
type Stats struct {
	Total             int64
	Mismatched        int64
	MaxAbs            float64
	MaxAbsIndex       []int64
	MaxRel            float64
	MaxRelIndex       []int64
	MeanAbs           float64
	RMS               float64
	RelL2             float64 // ||a-e|| / ||e||
	Cosine            float64
	MaxULP            uint64
	MeanULP           float64
	ULPHistogram      []ULPBucket
	BitwiseEqual      bool
	BitwiseEqualCount int64
	NaNActual         int64
	NaNExpected       int64
	InfActual         int64
	InfExpected       int64
	NaNMismatch       int64 // positions where exactly one side is NaN
	Worst             []Element
	TopColumns        []Group
	TopRows           []Group
	// Observed error over the error the precision BoundPrecision predicts
	// (~1: as predicted); nil when no error model applies.
	BoundRatio     *float64
	BoundPrecision string
	// The dtype the ULP distance and the tolerance defaults are taken in.
	ComparedDType DType
	// Whether this comparison passes the request's tolerance.
	Passed bool
	// The differing elements near zero the server left out of the
	// headline ULP figure (HeadlineMaxULP); nil when none was.
	Negligible *NegligibleElements
}

// NegligibleElements are the differing elements whose expected value is
// negligible against the output's scale: |expected| < Below, 2^-10 of
// the largest finite |expected| (docs/numerics.md, "ULP figures and
// elements near zero"). Their ULP distances measure cancellation, not
// rounding.
type NegligibleElements struct {
	Below     float64
	Differing int64
	// Their largest |actual - expected|.
	MaxAbs float64
	// The largest ULP distance over every other element.
	SignificantMaxULP uint64
	// The server's words for what was left out, printed after the figure.
	Note string
}

// HeadlineMaxULP is the ULP figure to show: without the differing
// elements near zero when the server left them out, else MaxULP.
func (s *Stats) HeadlineMaxULP() uint64 {
	if s.Negligible != nil {
		return s.Negligible.SignificantMaxULP
	}
	return s.MaxULP
}

// ULPBucket counts elements whose ULP distance lies in [Lo, Hi].
type ULPBucket struct {
	Lo, Hi uint64
	Count  int64
}

// Element is one compared element, as listed among the worst.
type Element struct {
	Index                    []int64
	Actual, Expected         float64
	ActualBits, ExpectedBits string // "0x..." in the compared dtype
	AbsDiff, RelDiff         float64
	ULP                      uint64
}

// Group is a column (last dimension) or row (flattened leading dimensions)
// where mismatches concentrate.
type Group struct {
	Index      int64
	Mismatched int64
	// Share of all mismatched elements this group holds.
	Share float64
}

// The values of Report.Verdict and CompareResult.Verdict: the proto's
// VERDICT_PASS and VERDICT_FAIL, as the CLI prints them.
const (
	VerdictPass = "PASS"
	VerdictFail = "FAIL"
)

// Diagnosis says which configuration the observed output matches.
type Diagnosis struct {
	// The answer in words, one sentence of the server's to print first:
	// "Rounding, not a bug: ...", "Not rounding: ... Look at ...",
	// "Unexplained: ...". "" from a server that predates it (then
	// VerdictReason is the sentence to print first).
	Headline string
	// What to change in the framework so that the output becomes the
	// configuration wanted (the accepted one, else the storage dtype's
	// PyTorch default), one sentence of the server's; "" when the output
	// already is it or no switch is known.
	Advice string
	// With LinearRequest.Accept (or CompareRequest.Accept): whether the
	// output is rounding of an accepted configuration, and which (a
	// canonical configuration name, "" when not accepted).
	Accepted   bool
	AcceptedAs string

	// Empty when no candidate explains the observed output.
	Best string
	// Configurations indistinguishable from Best on this request.
	Equivalent []string
	// Candidates the evidence cannot separate from Best.
	Tied          []string
	Confidence    float64
	Ranking       []RankedCandidate
	FrameworkHint string
	Localization  *Localization
	Explanation   string

	// The server's answer to "bug or rounding?" (docs/numerics.md,
	// "Verdict"): VerdictRounding, VerdictDefect or VerdictUnexplained;
	// "" from a server that predates the verdict.
	Verdict string
	// The server's sentence for the verdict, with the numbers it rests on.
	VerdictReason string
	// What is not rounding of Best (a VerdictDefect); nil when the server
	// sent none.
	Defect *Defect
	// The tiers of the server's default candidates that ran
	// (docs/numerics.md, "Diagnosis"): [1], or [1, 2] when no first-tier
	// candidate explained the output and the second tier (FP8 recipes,
	// multi-pass precisions) ran too; empty when the request named its
	// candidates, or from a server that predates the tiers.
	CandidateTiers []int32
}

// The values of Diagnosis.Verdict (the Python client's and the CLI's JSON
// report's words).
const (
	// Every element, column and row is consistent with Best under its
	// error model.
	VerdictRounding = "rounding"
	// Best explains the bulk, but Diagnosis.Defect lists elements, columns
	// or rows that are not rounding: a wrong weight, input or bias value.
	VerdictDefect = "defect"
	// No candidate explains the bulk; Confidence is at most 0.5.
	VerdictUnexplained = "unexplained"
)

// Defect is where the observed output is not rounding of Best, as the
// server found it.
type Defect struct {
	// The per-element threshold in predicted standard errors, which a clean
	// output crosses anywhere with chance at most FalseAlarmRate.
	ElementThresholdSigma float64
	FalseAlarmRate        float64
	// Elements beyond the threshold; Elements lists the largest of them.
	ElementCount int64
	Elements     []DefectElement
	// Columns (last dimension) and rows (flattened leading dimensions)
	// holding more disagreements with Best than rounding allows.
	Columns, Rows []DefectGroup
	// The largest distance from Best of any element, in ULP and sigma.
	MaxULP   uint64
	MaxSigma float64
	// Which weight row, input row or bias element to check, e.g. "output
	// column 2 <-> weight row 2 (out_in layout) and bias element 2".
	WhereToLook string
}

// DefectGroup is a column or row that rounding of Best does not explain.
type DefectGroup struct {
	Index int64
	// Elements differing from Best in bits, against the rounding flips its
	// error model expects there; PValue is the chance of at least that
	// many (Bonferroni-corrected, capped at 1).
	Disagreements         int64
	ExpectedDisagreements float64
	PValue                float64
	// Elements of the group beyond the per-element threshold.
	BeyondThreshold int64
	// The group's largest distance from Best, in ULP and sigma.
	MaxULP   uint64
	MaxSigma float64
	// Columns only: the self-normalised sum of the group's differences in
	// predicted standard errors (about standard normal under rounding) and
	// its two-sided tail (Bonferroni-corrected, capped at 1): a column
	// shifted to one side.
	ShiftT      float64
	ShiftPValue float64
}

// DefectElement is an element beyond the per-element threshold: the
// observed value (Element.Actual) against Best's (Element.Expected).
type DefectElement struct {
	Element Element
	// |observed - best| in predicted standard errors of another order.
	Sigma float64
}

// RankingGroups is the ranking as displays show it: one slice per row, in
// ranking order. A row holds the candidates that computed the same bits on
// the given inputs (they name each other in Equivalent and carry identical
// statistics), the one ranked highest first; a candidate joins the row of
// the first candidate ranked above it that names it (or that it names).
// Ranking itself keeps one entry per candidate.
//
//	for i, row := range rep.Diagnosis.RankingGroups() {
//		// i+1, row[0].Config, row[1].Config, ..., row[0].BitwiseEqualFraction
//	}
func (d *Diagnosis) RankingGroups() [][]RankedCandidate {
	names := func(c RankedCandidate, config string) bool {
		for _, e := range c.Equivalent {
			if e == config {
				return true
			}
		}
		return false
	}
	var rows [][]RankedCandidate
	placed := make([]bool, len(d.Ranking))
	for i, head := range d.Ranking {
		if placed[i] {
			continue
		}
		row := []RankedCandidate{head}
		for j := i + 1; j < len(d.Ranking); j++ {
			c := d.Ranking[j]
			if placed[j] || c.Config == head.Config {
				continue
			}
			if names(head, c.Config) || names(c, head.Config) {
				row = append(row, c)
				placed[j] = true
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// RankedCandidate is one candidate's agreement with the observed output.
type RankedCandidate struct {
	Config               string
	BitwiseEqualFraction float64
	MaxULP               uint64
	MeanULP              float64
	BoundRatio           *float64
	// Candidates that computed the same bits for this request.
	Equivalent []string

	// The plausibility test: could the observed output be this candidate
	// computed in another summation order? Disagreements of
	// ComparedElements differ from it in bits where its own accumulation
	// noise predicts ExpectedDisagreements; PlausibilityP is the Poisson
	// probability of at least that many; ConsistentFraction the share
	// within 4 predicted standard errors. A server that predates the test
	// leaves all of them zero (ComparedElements 0).
	Disagreements         int64
	ExpectedDisagreements float64
	PlausibilityP         float64
	Plausible             bool
	ConsistentFraction    float64
	ComparedElements      int64
	// Why this candidate cannot be Best, in one sentence; empty when the
	// evidence allows it.
	RuledOut string
	// As in ConfigResult.
	SharedComputation string
	// Every element bitwise equal to the observed output; among kernels of
	// one arithmetic an exact reproduction is named first.
	Exact bool
	// The kernel, as its backend reports it: the algorithm a sweep ran.
	Details map[string]string
	// Which frameworks compute this configuration by default for the
	// storage dtype, the server's words ("PyTorch's default for fp32
	// tensors"); "" when none does.
	FrameworkDefault string
	// Whether it matches a configuration of LinearRequest.Accept.
	Accepted bool
}

// Localization is where the remaining differences sit.
type Localization struct {
	Columns, Rows []Group
	// Elements far beyond the best candidate's error model.
	Outliers []Element
}

func reportFromProto(p *pb.VerifyResponse) *Report {
	r := &Report{
		Verdict:             verdictWords[p.Verdict],
		Passed:              p.Verdict == pb.Verdict_VERDICT_PASS,
		Tolerance:           toleranceFromProto(p.Tolerance),
		ObservedVsReference: statsFromProto(p.ObservedVsReference),
		Reference:           configResultFromProto(p.Reference),
		Diagnosis:           diagnosisFromProto(p.Diagnosis),
		Call:                callDecisionFromProto(p.Call),
		Notes:               p.Notes,
		OutputShape:         p.OutputShape,
	}
	if len(p.Results) > 0 {
		r.Results = make([]ConfigResult, len(p.Results))
		for i, c := range p.Results {
			if c != nil {
				r.Results[i] = *configResultFromProto(c)
			}
		}
	}
	return r
}

// CallDecision is the server's decision about one layer call
// (docs/api.md, "Layer-call decisions").
type CallDecision struct {
	// A configuration explains the observed output (with a diagnosis: Best
	// is set; without: the verdict is PASS).
	Explained bool
	// Best first, then the equivalent and tied configurations; without a
	// bias each "b:p:none" is followed by "b:p:fused" and "b:p:unfused".
	Explaining []string
	// Why the call diverges whatever the other calls say; "" when it does
	// not.
	Divergence string
	// The bound_ratio threshold applied (LinearRequest.BoundThreshold, else
	// the server's 3), whether the observed output's bound_ratio exceeds it,
	// and the sentence saying so.
	BoundThreshold float64
	BoundExceeded  bool
	BoundReason    string
}

func callDecisionFromProto(p *pb.CallDecision) *CallDecision {
	if p == nil {
		return nil
	}
	return &CallDecision{
		Explained:      p.Explained,
		Explaining:     p.Explaining,
		Divergence:     p.Divergence,
		BoundThreshold: p.BoundThreshold,
		BoundExceeded:  p.BoundExceeded,
		BoundReason:    p.BoundReason,
	}
}

func configResultFromProto(p *pb.ConfigResult) *ConfigResult {
	if p == nil {
		return nil
	}
	return &ConfigResult{
		Config:            p.Config,
		VsReference:       statsFromProto(p.VsReference),
		VsObserved:        statsFromProto(p.VsObserved),
		ElapsedMS:         p.ElapsedMs,
		Output:            tensorFromProto(p.Output),
		Details:           p.Details,
		Deterministic:     p.Deterministic,
		Runs:              p.Runs,
		SharedComputation: p.SharedComputation,
		BatchInvariance:   batchInvarianceFromProto(p.BatchInvariance),
	}
}

func batchInvarianceFromProto(p *pb.BatchInvariance) *BatchInvariance {
	if p == nil {
		return nil
	}
	b := &BatchInvariance{
		Invariant:        p.Invariant,
		Rows:             p.Rows,
		RowsDiffering:    p.RowsDiffering,
		MaxULP:           p.MaxUlp,
		FullBatchDetails: p.FullBatchDetails,
	}
	for _, s := range p.SubBatches {
		if s == nil {
			continue
		}
		b.SubBatches = append(b.SubBatches, SubBatch{
			BatchSize:     s.BatchSize,
			Runs:          s.Runs,
			RowsDiffering: s.RowsDiffering,
			MaxULP:        s.MaxUlp,
			Details:       s.Details,
			TailRows:      s.TailRows,
			TailDetails:   s.TailDetails,
		})
	}
	return b
}

func optFloat(v *wrapperspb.DoubleValue) *float64 {
	if v == nil {
		return nil
	}
	return Float(v.Value)
}

func statsFromProto(p *pb.Stats) *Stats {
	if p == nil {
		return nil
	}
	s := &Stats{
		Total:             p.Total,
		Mismatched:        p.Mismatched,
		MaxAbs:            p.MaxAbs,
		MaxAbsIndex:       p.MaxAbsIndex,
		MaxRel:            p.MaxRel,
		MaxRelIndex:       p.MaxRelIndex,
		MeanAbs:           p.MeanAbs,
		RMS:               p.Rms,
		RelL2:             p.RelL2,
		Cosine:            p.Cosine,
		MaxULP:            p.MaxUlp,
		MeanULP:           p.MeanUlp,
		BitwiseEqual:      p.BitwiseEqual,
		BitwiseEqualCount: p.BitwiseEqualCount,
		NaNActual:         p.NanActual,
		NaNExpected:       p.NanExpected,
		InfActual:         p.InfActual,
		InfExpected:       p.InfExpected,
		NaNMismatch:       p.NanMismatch,
		Worst:             elementsFromProto(p.Worst),
		TopColumns:        groupsFromProto(p.TopColumns),
		TopRows:           groupsFromProto(p.TopRows),
		BoundRatio:        optFloat(p.BoundRatio),
		BoundPrecision:    p.BoundPrecision,
		ComparedDType:     DType(p.ComparedDtype),
		Passed:            p.Passed,
	}
	if n := p.Negligible; n != nil {
		s.Negligible = &NegligibleElements{
			Below:             n.Below,
			Differing:         n.Differing,
			MaxAbs:            n.MaxAbs,
			SignificantMaxULP: n.SignificantMaxUlp,
			Note:              n.Note,
		}
	}
	for _, b := range p.UlpHistogram {
		s.ULPHistogram = append(s.ULPHistogram, ULPBucket{Lo: b.Lo, Hi: b.Hi, Count: b.Count})
	}
	return s
}

func elementsFromProto(ps []*pb.Element) []Element {
	var out []Element
	for _, e := range ps {
		out = append(out, Element{
			Index:        e.Index,
			Actual:       e.Actual,
			Expected:     e.Expected,
			ActualBits:   e.ActualBits,
			ExpectedBits: e.ExpectedBits,
			AbsDiff:      e.AbsDiff,
			RelDiff:      e.RelDiff,
			ULP:          e.Ulp,
		})
	}
	return out
}

func groupsFromProto(ps []*pb.Group) []Group {
	var out []Group
	for _, g := range ps {
		out = append(out, Group{Index: g.Index, Mismatched: g.Mismatched, Share: g.Share})
	}
	return out
}

func diagnosisFromProto(p *pb.Diagnosis) *Diagnosis {
	if p == nil {
		return nil
	}
	d := &Diagnosis{
		Best:          p.Best,
		Equivalent:    p.Equivalent,
		Tied:          p.Tied,
		Confidence:    p.Confidence,
		FrameworkHint: p.FrameworkHint,
		Explanation:   p.Explanation,
	}
	for _, c := range p.Ranking {
		d.Ranking = append(d.Ranking, RankedCandidate{
			Config:               c.Config,
			BitwiseEqualFraction: c.BitwiseEqualFraction,
			MaxULP:               c.MaxUlp,
			MeanULP:              c.MeanUlp,
			BoundRatio:           optFloat(c.BoundRatio),
			Equivalent:           c.Equivalent,

			Disagreements:         c.Disagreements,
			ExpectedDisagreements: c.ExpectedDisagreements,
			PlausibilityP:         c.PlausibilityP,
			Plausible:             c.Plausible,
			ConsistentFraction:    c.ConsistentFraction,
			ComparedElements:      c.ComparedElements,
			RuledOut:              c.RuledOut,
			SharedComputation:     c.SharedComputation,
			Exact:                 c.Exact,
			Details:               c.Details,
			FrameworkDefault:      c.FrameworkDefault,
			Accepted:              c.Accepted,
		})
	}
	if l := p.Localization; l != nil {
		d.Localization = &Localization{
			Columns:  groupsFromProto(l.Columns),
			Rows:     groupsFromProto(l.Rows),
			Outliers: elementsFromProto(l.Outliers),
		}
	}
	d.Headline = p.Headline
	d.Advice = p.Advice
	d.Accepted = p.Accepted
	d.AcceptedAs = p.AcceptedAs
	d.Verdict = diagnosisVerdicts[p.Verdict]
	d.VerdictReason = p.VerdictReason
	d.Defect = defectFromProto(p.Defect)
	d.CandidateTiers = append([]int32(nil), p.CandidateTiers...)
	return d
}

// verdictWords names the pass/fail verdicts; UNSPECIFIED is "".
var verdictWords = map[pb.Verdict]string{
	pb.Verdict_VERDICT_PASS: VerdictPass,
	pb.Verdict_VERDICT_FAIL: VerdictFail,
}

// diagnosisVerdicts names the verdicts; UNSPECIFIED (an older server) and
// values this client does not know are "".
var diagnosisVerdicts = map[pb.Diagnosis_Verdict]string{
	pb.Diagnosis_VERDICT_ROUNDING:    VerdictRounding,
	pb.Diagnosis_VERDICT_DEFECT:      VerdictDefect,
	pb.Diagnosis_VERDICT_UNEXPLAINED: VerdictUnexplained,
}

func defectFromProto(p *pb.Defect) *Defect {
	if p == nil {
		return nil
	}
	d := &Defect{
		ElementThresholdSigma: p.ElementThresholdSigma,
		FalseAlarmRate:        p.FalseAlarmRate,
		ElementCount:          p.ElementCount,
		Columns:               defectGroupsFromProto(p.Columns),
		Rows:                  defectGroupsFromProto(p.Rows),
		MaxULP:                p.MaxUlp,
		MaxSigma:              p.MaxSigma,
		WhereToLook:           p.WhereToLook,
	}
	for _, e := range p.Elements {
		if e == nil {
			continue
		}
		de := DefectElement{Sigma: e.Sigma}
		if e.Element != nil {
			de.Element = elementsFromProto([]*pb.Element{e.Element})[0]
		}
		d.Elements = append(d.Elements, de)
	}
	return d
}

func defectGroupsFromProto(ps []*pb.DefectGroup) []DefectGroup {
	var out []DefectGroup
	for _, g := range ps {
		if g == nil {
			continue
		}
		out = append(out, DefectGroup{
			Index:                 g.Index,
			Disagreements:         g.Disagreements,
			ExpectedDisagreements: g.ExpectedDisagreements,
			PValue:                g.PValue,
			BeyondThreshold:       g.BeyondThreshold,
			MaxULP:                g.MaxUlp,
			MaxSigma:              g.MaxSigma,
			ShiftT:                g.ShiftT,
			ShiftPValue:           g.ShiftPValue,
		})
	}
	return out
}
