package tensorcheck

import (
	"math"
	"testing"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

func TestDiagnosisCarriesTheServersVerdict(t *testing.T) {
	for _, c := range []struct {
		verdict pb.Diagnosis_Verdict
		want    string
	}{
		{pb.Diagnosis_VERDICT_ROUNDING, VerdictRounding},
		{pb.Diagnosis_VERDICT_DEFECT, VerdictDefect},
		{pb.Diagnosis_VERDICT_UNEXPLAINED, VerdictUnexplained},
		{pb.Diagnosis_VERDICT_UNSPECIFIED, ""}, // a server that predates the verdict
		{pb.Diagnosis_Verdict(99), ""},         // one this client does not know
	} {
		d := diagnosisFromProto(&pb.Diagnosis{Verdict: c.verdict, VerdictReason: "Because."})
		if d.Verdict != c.want || d.VerdictReason != "Because." || d.Defect != nil {
			t.Errorf("verdict %v: got (%q, %q, %v), want (%q, \"Because.\", nil)",
				c.verdict, d.Verdict, d.VerdictReason, d.Defect, c.want)
		}
	}
	if got := []string{VerdictRounding, VerdictDefect, VerdictUnexplained}; got[0] != "rounding" ||
		got[1] != "defect" || got[2] != "unexplained" {
		t.Errorf("verdict words %q, want the Python client's and the JSON report's", got)
	}
}

func TestDiagnosisDefectFromProto(t *testing.T) {
	p := &pb.Diagnosis{
		Best:    "cpu:fp32:fused",
		Verdict: pb.Diagnosis_VERDICT_DEFECT,
		Defect: &pb.Defect{
			ElementThresholdSigma: 6.1875,
			FalseAlarmRate:        1e-3,
			ElementCount:          1,
			Elements: []*pb.DefectElement{
				{Element: &pb.Element{Index: []int64{9, 2}, Actual: 1.5, Expected: 0.5, Ulp: 4096},
					Sigma: 812.25},
				{Sigma: 7}, // no element: a zero Element
			},
			Columns: []*pb.DefectGroup{{Index: 2, Disagreements: 64, ExpectedDisagreements: 0.8,
				PValue: 1e-30, BeyondThreshold: 7, MaxUlp: math.MaxUint64, MaxSigma: 812.25,
				ShiftT: 7.5, ShiftPValue: 0.25}},
			Rows:        []*pb.DefectGroup{{Index: 9, Disagreements: 1}},
			MaxUlp:      4096,
			MaxSigma:    812.25,
			WhereToLook: "output column 2 <-> weight row 2 (out_in layout) and bias element 2",
		},
	}
	f := diagnosisFromProto(p).Defect
	if f == nil {
		t.Fatal("Defect is nil")
	}
	if f.ElementThresholdSigma != 6.1875 || f.FalseAlarmRate != 1e-3 || f.ElementCount != 1 ||
		f.MaxULP != 4096 || f.MaxSigma != 812.25 || f.WhereToLook != p.Defect.WhereToLook {
		t.Errorf("Defect = %+v", f)
	}
	wantCol := DefectGroup{Index: 2, Disagreements: 64, ExpectedDisagreements: 0.8, PValue: 1e-30,
		BeyondThreshold: 7, MaxULP: math.MaxUint64, MaxSigma: 812.25,
		ShiftT: 7.5, ShiftPValue: 0.25}
	if len(f.Columns) != 1 || f.Columns[0] != wantCol {
		t.Errorf("Columns = %+v, want [%+v]", f.Columns, wantCol)
	}
	if len(f.Rows) != 1 || f.Rows[0].Index != 9 || f.Rows[0].Disagreements != 1 {
		t.Errorf("Rows = %+v", f.Rows)
	}
	if len(f.Elements) != 2 {
		t.Fatalf("Elements = %+v, want 2", f.Elements)
	}
	e := f.Elements[0]
	if e.Sigma != 812.25 || e.Element.ULP != 4096 || e.Element.Actual != 1.5 ||
		len(e.Element.Index) != 2 || e.Element.Index[0] != 9 || e.Element.Index[1] != 2 {
		t.Errorf("Elements[0] = %+v", e)
	}
	if f.Elements[1].Sigma != 7 || f.Elements[1].Element.Index != nil {
		t.Errorf("Elements[1] = %+v, want sigma 7 and a zero Element", f.Elements[1])
	}
}
