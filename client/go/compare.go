package tensorcheck

import (
	"context"
	"strconv"

	"google.golang.org/grpc"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// NamedTensor is an output with the name the answer calls it by ("torch",
// "flax"): letters, digits, '_', '-' and '.', at most 64 characters,
// unique in the request (the server checks the characters).
type NamedTensor struct {
	Name   string
	Tensor *Tensor
}

// CompareRequest is one layer y = act(x·Wᵀ + b), as in LinearRequest, and
// two outputs of it from different frameworks (or devices, or versions) to
// explain against each other. Input, Weight and Outputs are required.
type CompareRequest struct {
	// The layer, as the LinearRequest fields of the same names.
	Input        *Tensor
	Weight       *Tensor
	WeightLayout WeightLayout
	Bias         *Tensor
	Activation   Activation
	OutputDType  DType
	InputScale   *Tensor
	WeightScale  *Tensor
	// NVFP4's per-tensor scales, as LinearRequest's.
	InputGlobalScale, WeightGlobalScale *Tensor
	// Exactly two outputs, each [..., N], in the order the answer names
	// them: CompareResult.Pair.A is Outputs[0].Name, Pair.B Outputs[1].Name.
	Outputs []NamedTensor
	// The candidates both outputs are diagnosed against; none: the default
	// candidate set, as in DiagnoseLinear.
	Configs []string
	// As LinearRequest.Reference.
	Reference string
	// As LinearRequest.Accept, for each output: CompareResult.Verdict is
	// VerdictPass when every output is rounding of an accepted
	// configuration.
	Accept []string
	// As LinearRequest.TopK and TopGroups.
	TopK, TopGroups int32
}

// CompareResult is the answer to CompareOutputs: what each output is and
// whether their difference is rounding, all decided by the server. String
// prints it, the headline first.
type CompareResult struct {
	// One sentence of the server's, to print first: which configuration
	// each output is and whether their difference is rounding, with the
	// numbers, and what to change for one to match the other.
	Headline string
	// Each output against the reference, and its diagnosis (Headline,
	// Advice, Best, ...), in request order.
	Outputs []ComparedOutput
	// The two outputs against each other.
	Pair *OutputPair
	// The reference configuration, canonical.
	Reference   string
	OutputShape []int64
	Notes       []string
	// With CompareRequest.Accept: VerdictPass when every output is
	// accepted, else VerdictFail; "" without Accept.
	Verdict string
	// Whether Verdict is VerdictPass.
	Passed bool
	// As in Report: the bytes this call uploaded into the store, and those
	// it named by digest without uploading.
	UploadedBytes int64
	ReusedBytes   int64

	// CompareRequest.Accept, for String.
	accept []string
}

// Output returns the output named name, or nil.
func (c *CompareResult) Output(name string) *ComparedOutput {
	for i := range c.Outputs {
		if c.Outputs[i].Name == name {
			return &c.Outputs[i]
		}
	}
	return nil
}

// ComparedOutput is one output of a comparison.
type ComparedOutput struct {
	Name string
	// The output against the reference.
	VsReference *Stats
	Diagnosis   *Diagnosis
}

// OutputPair is the two outputs of a comparison against each other.
type OutputPair struct {
	// The outputs' names; Stats are A's against B's (B expected).
	A, B  string
	Stats *Stats
	// Both outputs are rounding of their configurations.
	Rounding bool
	// The largest difference the two explaining configurations leave
	// between their own outputs (max |best_a - best_b|), and the most
	// max |a - b| can be when both are rounding: ConfigsMaxAbs plus how far
	// each output strays from its configuration (max |a - best_a| +
	// max |b - best_b|).
	ConfigsMaxAbs  float64
	ExpectedMaxAbs float64
	// What to change in B's framework to match A, and in A's to match B,
	// sentences of the server's; "" when they already agree.
	AdviceBToA string
	AdviceAToB string
}

// CompareOutputs asks the server to explain two outputs of one layer
// against each other (the Compare RPC, docs/numerics.md, "Comparing two
// outputs"): each is diagnosed against the same candidates, and the answer
// says which configuration each is, whether their difference is rounding
// and what to change for one to match the other.
//
//	cmp, err := c.CompareOutputs(ctx, &tensorcheck.CompareRequest{
//		Input: x, Weight: w, Bias: b,
//		Outputs: []tensorcheck.NamedTensor{{Name: "torch", Tensor: yTorch}, {Name: "flax", Tensor: yFlax}},
//	})
//	fmt.Println(cmp) // the headline first
//
// Large tensors go through the store as in VerifyLinear; errors are *Error
// values as there.
func (c *Client) CompareOutputs(ctx context.Context, req *CompareRequest) (*CompareResult, error) {
	msg, fields, err := req.toProto()
	if err != nil {
		return nil, err
	}
	var resp *pb.CompareResponse
	uploaded, reused, err := c.sendThroughStore(ctx, fields, msg,
		func(ctx context.Context, opts ...grpc.CallOption) (err error) {
			resp, err = c.stub.Compare(ctx, msg, opts...)
			return err
		})
	if err != nil {
		return nil, c.callError(err)
	}
	cmp := compareResultFromProto(resp)
	cmp.UploadedBytes, cmp.ReusedBytes, cmp.accept = uploaded, reused, req.Accept
	if len(req.Accept) == 0 {
		// The verdict says whether the outputs are accepted: without
		// Accept there is none, whatever the field holds.
		cmp.Verdict, cmp.Passed = "", false
	}
	return cmp, nil
}

// toProto validates what the client can check alone and builds the
// message, with the tensors that may go through the store.
func (r *CompareRequest) toProto() (*pb.CompareRequest, []tensorField, error) {
	if r == nil {
		return nil, nil, invalidArgument("request", "is nil")
	}
	layer := &LinearRequest{Input: r.Input, Weight: r.Weight, WeightLayout: r.WeightLayout, Bias: r.Bias,
		Activation: r.Activation, OutputDType: r.OutputDType, InputScale: r.InputScale, WeightScale: r.WeightScale,
		InputGlobalScale: r.InputGlobalScale, WeightGlobalScale: r.WeightGlobalScale}
	op, err := layer.opToProto()
	if err != nil {
		return nil, nil, err
	}
	if len(r.Outputs) != 2 {
		return nil, nil, invalidArgument("observed", "has %d outputs, expected exactly 2", len(r.Outputs))
	}
	msg := &pb.CompareRequest{
		Op:        op,
		Configs:   r.Configs,
		Reference: r.Reference,
		Output:    &pb.OutputOptions{TopK: r.TopK, TopGroups: r.TopGroups},
		Accept:    r.Accept,
	}
	fields := []tensorField{{r.Input, op.Input}, {r.Weight, op.Weight}, {r.Bias, op.Bias},
		{r.InputScale, op.InputScale}, {r.WeightScale, op.WeightScale},
		{r.InputGlobalScale, op.InputGlobalScale}, {r.WeightGlobalScale, op.WeightGlobalScale}}
	seen := map[string]int{}
	for i, o := range r.Outputs {
		field := "observed[" + strconv.Itoa(i) + "]"
		if o.Name == "" {
			return nil, nil, invalidArgument(field+".name", "is empty; name each output (\"torch\", \"flax\")")
		}
		if j, ok := seen[o.Name]; ok {
			return nil, nil, invalidArgument(field+".name", "%q is also observed[%d]'s; names must differ", o.Name, j)
		}
		seen[o.Name] = i
		if o.Tensor == nil {
			return nil, nil, invalidArgument(field+".tensor", "is required")
		}
		if err := o.Tensor.validate(field + ".tensor"); err != nil {
			return nil, nil, err
		}
		p := o.Tensor.toProto()
		msg.Observed = append(msg.Observed, &pb.NamedTensor{Name: o.Name, Tensor: p})
		fields = append(fields, tensorField{o.Tensor, p})
	}
	if err := checkConfigs(r.Configs, r.Accept); err != nil {
		return nil, nil, err
	}
	return msg, fields, nil
}

func compareResultFromProto(p *pb.CompareResponse) *CompareResult {
	c := &CompareResult{
		Headline:    p.Headline,
		Reference:   p.Reference,
		OutputShape: p.OutputShape,
		Notes:       p.Notes,
		Verdict:     verdictWords[p.Verdict],
		Passed:      p.Verdict == pb.Verdict_VERDICT_PASS,
	}
	for _, o := range p.Outputs {
		if o == nil {
			continue
		}
		c.Outputs = append(c.Outputs, ComparedOutput{
			Name:        o.Name,
			VsReference: statsFromProto(o.VsReference),
			Diagnosis:   diagnosisFromProto(o.Diagnosis),
		})
	}
	if q := p.Pair; q != nil {
		c.Pair = &OutputPair{
			A:              q.A,
			B:              q.B,
			Stats:          statsFromProto(q.Stats),
			Rounding:       q.Rounding,
			ConfigsMaxAbs:  q.ConfigsMaxAbs,
			ExpectedMaxAbs: q.ExpectedMaxAbs,
			AdviceBToA:     q.AdviceBToA,
			AdviceAToB:     q.AdviceAToB,
		}
	}
	return c
}
