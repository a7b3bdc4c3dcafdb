package tensorcheck

import (
	"reflect"
	"testing"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

func TestAlgorithmSweepAndBatchInvarianceReachTheRequest(t *testing.T) {
	r := validRequest()
	r.AlgorithmSweep = 3
	r.BatchInvariance = true
	r.BatchSizes = []int64{4, 16}
	p, err := r.toProto(false)
	if err != nil {
		t.Fatal(err)
	}
	if p.AlgorithmSweep != 3 {
		t.Errorf("AlgorithmSweep = %d, want 3", p.AlgorithmSweep)
	}
	if p.BatchInvariance == nil || !p.BatchInvariance.Enabled ||
		!reflect.DeepEqual(p.BatchInvariance.BatchSizes, []int64{4, 16}) {
		t.Errorf("BatchInvariance = %v, want enabled with sizes [4 16]", p.BatchInvariance)
	}
}

func TestWithoutBatchInvarianceTheOptionsAreUnset(t *testing.T) {
	p, err := validRequest().toProto(false)
	if err != nil {
		t.Fatal(err)
	}
	if p.AlgorithmSweep != 0 || p.BatchInvariance != nil {
		t.Errorf("got sweep %d, batch invariance %v; want 0, nil", p.AlgorithmSweep, p.BatchInvariance)
	}
}

func TestBadSweepAndBatchSizesAreInvalidArgumentNamingTheField(t *testing.T) {
	r := validRequest()
	r.AlgorithmSweep = -1
	_, err := r.toProto(false)
	wantInvalid(t, err, "algorithm_sweep", "-1")

	r = validRequest()
	r.BatchSizes = []int64{4}
	_, err = r.toProto(false)
	wantInvalid(t, err, "batch_invariance.batch_sizes", "without BatchInvariance")

	r.BatchInvariance = true
	r.BatchSizes = []int64{4, 0}
	_, err = r.toProto(false)
	wantInvalid(t, err, "batch_invariance.batch_sizes", "entry 1 is 0")
}

func TestBatchInvarianceAndExactComeFromTheResponse(t *testing.T) {
	p := &pb.VerifyResponse{
		Verdict: pb.Verdict_VERDICT_PASS,
		Results: []*pb.ConfigResult{
			{
				Config: "cublaslt:fp32:fused@algo=1",
				BatchInvariance: &pb.BatchInvariance{
					Rows: 10, RowsDiffering: 3, MaxUlp: 2,
					FullBatchDetails: map[string]string{"algo": "1"},
					SubBatches: []*pb.SubBatch{
						{BatchSize: 1, Runs: 10, RowsDiffering: 3, MaxUlp: 2, Details: map[string]string{"algo": "4"}},
						{BatchSize: 4, Runs: 3, TailRows: 2, Details: map[string]string{"algo": "1"},
							TailDetails: map[string]string{"algo": "2"}},
					},
				},
			},
			{Config: "cpu:fp32:none"},
		},
		Diagnosis: &pb.Diagnosis{Ranking: []*pb.RankedCandidate{
			{Config: "cublaslt:fp32:fused@algo=1", Exact: true, Details: map[string]string{"algo": "1"}},
			{Config: "cpu:fp32:none"},
		}},
	}
	r := reportFromProto(p)
	want := &BatchInvariance{
		Rows: 10, RowsDiffering: 3, MaxULP: 2,
		FullBatchDetails: map[string]string{"algo": "1"},
		SubBatches: []SubBatch{
			{BatchSize: 1, Runs: 10, RowsDiffering: 3, MaxULP: 2, Details: map[string]string{"algo": "4"}},
			{BatchSize: 4, Runs: 3, TailRows: 2, Details: map[string]string{"algo": "1"},
				TailDetails: map[string]string{"algo": "2"}},
		},
	}
	if !reflect.DeepEqual(r.Results[0].BatchInvariance, want) {
		t.Errorf("BatchInvariance = %+v, want %+v", r.Results[0].BatchInvariance, want)
	}
	if r.Results[1].BatchInvariance != nil {
		t.Errorf("unasked BatchInvariance = %+v, want nil", r.Results[1].BatchInvariance)
	}
	c := r.Diagnosis.Ranking
	if !c[0].Exact || !reflect.DeepEqual(c[0].Details, map[string]string{"algo": "1"}) {
		t.Errorf("ranking[0] exact %v details %v, want true {algo: 1}", c[0].Exact, c[0].Details)
	}
	if c[1].Exact {
		t.Errorf("ranking[1] exact, want false")
	}
}
