package tensorcheck

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// The golden model checks (tests/golden/model_check/<case>/report.json):
// the JSON report `tensorcheck sweep --json` wrote, each answered layer
// call with the server's whole response. Report.Call, read from that
// response, must say what the report says of the call.
const goldenModelChecks = "../../tests/golden/model_check"

type goldenLayer struct {
	Name             string          `json:"name"`
	Call             int             `json:"call"`
	Status           string          `json:"status"`
	DiagnosisVerdict *string         `json:"diagnosis_verdict"`
	VerdictReason    *string         `json:"verdict_reason"`
	Best             *string         `json:"best"`
	Equivalent       []string        `json:"equivalent"`
	Tied             []string        `json:"tied"`
	Explained        bool            `json:"explained"`
	BoundRatio       json.RawMessage `json:"bound_ratio"`
	Response         json.RawMessage `json:"response"`
}

type goldenReport struct {
	Layers          []goldenLayer `json:"layers"`
	FirstDivergence *struct {
		Index  int    `json:"index"`
		Reason string `json:"reason"`
	} `json:"first_divergence"`
	Diagnose       bool     `json:"diagnose"`
	BoundThreshold *float64 `json:"bound_threshold"`
}

// jsonFloat reads a number of the JSON report: a number, or "nan", "inf",
// "-inf" (docs/json-report.md); ok is false for null.
func jsonFloat(t *testing.T, raw json.RawMessage) (v float64, ok bool) {
	t.Helper()
	if len(raw) == 0 || string(raw) == "null" {
		return 0, false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "nan":
			return math.NaN(), true
		case "inf":
			return math.Inf(1), true
		case "-inf":
			return math.Inf(-1), true
		}
		t.Fatalf("bound_ratio %q: not a number", s)
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("bound_ratio %s: %v", raw, err)
	}
	return v, true
}

func goldenCases(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(goldenModelChecks, "*", "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Skipf("no golden model checks in %s", goldenModelChecks)
	}
	sort.Strings(paths)
	return paths
}

func contains(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

func TestGoldenModelChecksCallDecisionsAreTheReports(t *testing.T) {
	for _, path := range goldenCases(t) {
		t.Run(filepath.Base(filepath.Dir(path)), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var golden goldenReport
			if err := json.Unmarshal(data, &golden); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			threshold := 3.0 // the server's default
			if golden.BoundThreshold != nil {
				threshold = *golden.BoundThreshold
			}
			answered := 0
			for i, l := range golden.Layers {
				if len(l.Response) == 0 || string(l.Response) == "null" {
					continue
				}
				answered++
				var resp pb.VerifyResponse
				if err := protojson.Unmarshal(l.Response, &resp); err != nil {
					t.Fatalf("layers[%d].response: %v", i, err)
				}
				call := reportFromProto(&resp).Call
				if call == nil {
					t.Fatalf("layers[%d] %s: the response carries no call", i, l.Name)
				}
				if call.Explained != l.Explained {
					t.Errorf("layers[%d] %s: Call.Explained %v, the report's explained %v",
						i, l.Name, call.Explained, l.Explained)
				}
				// Explaining: best first, then every equivalent and tied one.
				if l.Best != nil {
					if len(call.Explaining) == 0 || call.Explaining[0] != *l.Best {
						t.Errorf("layers[%d] %s: Call.Explaining %q does not start with best %q",
							i, l.Name, call.Explaining, *l.Best)
					}
					for _, name := range append(append([]string{}, l.Equivalent...), l.Tied...) {
						if !contains(call.Explaining, name) {
							t.Errorf("layers[%d] %s: Call.Explaining %q lacks %q",
								i, l.Name, call.Explaining, name)
						}
					}
				} else if len(call.Explaining) != 0 {
					t.Errorf("layers[%d] %s: Call.Explaining %q without a best", i, l.Name,
						call.Explaining)
				}
				// Its own divergence: a defect or unexplained verdict is its
				// sentence; without a best (diagnosed), no candidate explains it.
				if v := l.DiagnosisVerdict; v != nil && (*v == "defect" || *v == "unexplained") {
					if l.VerdictReason == nil || call.Divergence != *l.VerdictReason {
						t.Errorf("layers[%d] %s: Call.Divergence %q, the verdict reason %v",
							i, l.Name, call.Divergence, l.VerdictReason)
					}
				} else if golden.Diagnose && l.Best == nil &&
					call.Divergence != "no candidate explains its output" {
					t.Errorf("layers[%d] %s: unexplained, but Call.Divergence %q", i, l.Name,
						call.Divergence)
				}
				// The bound decision: the run's threshold, NaN over it.
				if call.BoundThreshold != threshold {
					t.Errorf("layers[%d] %s: Call.BoundThreshold %g, the run's %g", i, l.Name,
						call.BoundThreshold, threshold)
				}
				ratio, has := jsonFloat(t, l.BoundRatio)
				if want := has && !(ratio <= threshold); call.BoundExceeded != want {
					t.Errorf("layers[%d] %s: Call.BoundExceeded %v for bound_ratio %s at %g",
						i, l.Name, call.BoundExceeded, l.BoundRatio, threshold)
				}
				if call.BoundExceeded == (call.BoundReason == "") {
					t.Errorf("layers[%d] %s: BoundExceeded %v with BoundReason %q", i, l.Name,
						call.BoundExceeded, call.BoundReason)
				}
				// A call that diverges by itself or by its bound fails.
				if (call.Divergence != "" || call.BoundExceeded) && l.Status != "failed" {
					t.Errorf("layers[%d] %s: status %q, but Call diverges (%q, bound %v)", i,
						l.Name, l.Status, call.Divergence, call.BoundExceeded)
				}
				// The first divergence's reason: the call's own first, else
				// the consensus's (the client's: "matches ..."), else the bound's.
				if f := golden.FirstDivergence; f != nil && f.Index == i {
					switch {
					case call.Divergence != "":
						if f.Reason != call.Divergence {
							t.Errorf("first_divergence.reason %q, Call.Divergence %q", f.Reason,
								call.Divergence)
						}
					case !strings.HasPrefix(f.Reason, "matches "):
						if !call.BoundExceeded || f.Reason != call.BoundReason {
							t.Errorf("first_divergence.reason %q, Call.BoundReason %q", f.Reason,
								call.BoundReason)
						}
					}
				}
			}
			if answered == 0 {
				t.Errorf("%s: no layer call with a response", path)
			}
		})
	}
}
