// Package tensorcheck is the Go client of the tensorcheck service, which
// verifies the numerics of linear layers y = act(x·Wᵀ + b) remotely: it runs
// the layer under backend configurations ("cpu:fp32", "cpu:tf32:fused",
// "cublaslt:bf16:fused", ...), compares each with a high-precision reference
// and with the output your framework produced, and says which configuration
// that output matches.
//
//	c, err := tensorcheck.Dial(ctx, "localhost:50051")
//	if err != nil { ... }
//	defer c.Close()
//	rep, err := c.VerifyLinear(ctx, &tensorcheck.LinearRequest{
//		Input:    tensorcheck.Float32Tensor(x, 2, 768),
//		Weight:   tensorcheck.Float32Tensor(w, 512, 768),
//		Bias:     tensorcheck.Float32Tensor(b, 512),
//		Observed: tensorcheck.Float32Tensor(y, 2, 512),
//		Configs:  []string{"cpu:fp32", "cpu:tf32:fused"},
//	})
//	if err != nil { ... }
//	fmt.Println(rep.Verdict, rep.Result("cpu:tf32").VsObserved.MaxAbs)
//
// The server decides every verdict and writes every sentence: a diagnosis
// carries its answer in one sentence (Diagnosis.Headline, "Rounding, not a
// bug: ...") and what to change (Diagnosis.Advice), and Report.String,
// FormatDiagnosis and CompareResult.String print the headline first,
// verbatim. LinearRequest.Accept makes the verdict the server's acceptance
// of the observed output as rounding of a configuration named there;
// CompareOutputs explains two frameworks' outputs of one layer against
// each other.
//
// Every call takes a context.Context first and its deadline from it. Errors
// are *Error values carrying the gRPC status code and the server's message
// (a server that cannot be reached: codes.Unavailable naming its address
// and TENSORCHECK_SERVER);
// requests with obvious mistakes (data length vs shape) are refused before
// they are sent, with codes.InvalidArgument and a message naming the field.
// A call the server refuses with a retry hint (Unavailable or
// ResourceExhausted with grpc-retry-pushback-ms: queue full, draining, bytes
// in flight over budget) is sent again after the hinted wait, up to
// WithMaxRetries times and never past the context's deadline.
//
// Tensors larger than StoreThreshold (1 MiB) go through the server's tensor
// store by themselves: hashed locally, uploaded once in chunks when the
// store lacks them, and named by their SHA-256 digest in the request, so a
// weight checked again is not sent again (Report.UploadedBytes and
// Report.ReusedBytes say how much). Upload stores a tensor explicitly and
// returns a TensorRef to use in place of it; ReadTensor reads one back.
// Against a server without a store, every tensor goes inline. A request
// the store misses twice (behind a load balancer, the re-upload and the
// resend can reach different replicas) is sent once more with its tensors
// inline when that fits the message limits (see VerifyLinear).
//
// The generated protocol code lives in the tensorcheckpb subpackage:
// google.golang.org/protobuf messages and grpc-go service stubs.
package tensorcheck
