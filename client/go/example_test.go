package tensorcheck_test

import (
	"context"
	"fmt"
	"log"
	"time"

	tensorcheck "github.com/tensorcheck/tensorcheck/client/go"
)

// Compiled, not run: it needs a server.
func ExampleClient_VerifyLinear() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := tensorcheck.Dial(ctx, "localhost:50051")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	x := []float32{0.1, -0.2, 0.3, 0.7, 1.1, 0.9}       // [2, 3]
	w := []float32{0.5, -0.25, 0.333, 0.77, 0.01, -0.6} // [2, 3], torch layout
	y := []float32{0.0299, 0.2, -0.3, 0.4}              // [2, 2], from your framework
	rep, err := c.VerifyLinear(ctx, &tensorcheck.LinearRequest{
		Input:     tensorcheck.Float32Tensor(x, 2, 3),
		Weight:    tensorcheck.Float32Tensor(w, 2, 3),
		Observed:  tensorcheck.Float32Tensor(y, 2, 2),
		Configs:   []string{"cpu:fp32", "cpu:tf32:fused"},
		Tolerance: tensorcheck.Tolerance{Preset: "torch", Atol: tensorcheck.Float(1e-4)},
	})
	if err != nil {
		log.Fatal(err) // a *tensorcheck.Error with the gRPC code
	}
	fmt.Println(rep.Verdict) // PASS or FAIL
	for _, r := range rep.Results {
		fmt.Printf("%s: max_abs vs observed %g\n", r.Config, r.VsObserved.MaxAbs)
	}
}

func ExampleClient_DiagnoseLinear() {
	ctx := context.Background()
	c, err := tensorcheck.Dial(ctx, "localhost:50051", tensorcheck.WithToken("my-token"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// bf16 tensors travel as their bit patterns.
	x := []uint16{0x3f80, 0x3c00} // 1, 2^-7
	w := []uint16{0x4000, 0x3f80} // 2, 1
	b := []uint16{0x3c00}         // 2^-7
	y := []uint16{0x4000}         // 2: what candle computes (unfused bias)
	rep, err := c.DiagnoseLinear(ctx, &tensorcheck.LinearRequest{
		Input:    tensorcheck.BFloat16Tensor(x, 1, 2),
		Weight:   tensorcheck.BFloat16Tensor(w, 1, 2),
		Bias:     tensorcheck.BFloat16Tensor(b, 1),
		Observed: tensorcheck.BFloat16Tensor(y, 1, 1),
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rep.Diagnosis.Headline) // the server's answer, one sentence
	fmt.Println(rep.Diagnosis.Advice)   // what to change, when a switch is known
}

// Compiled, not run: it needs a server. The output passes when the server
// calls it rounding of a configuration accepted here (TF32 anywhere, or an
// unfused bf16 bias on the CPU); the verdict is then the diagnosis's, not
// a tolerance's.
func ExampleLinearRequest_accept() {
	ctx := context.Background()
	c, err := tensorcheck.Dial(ctx, "") // $TENSORCHECK_SERVER, else localhost:50051
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	x := []float32{0.1, -0.2, 0.3, 0.7, 1.1, 0.9}       // [2, 3]
	w := []float32{0.5, -0.25, 0.333, 0.77, 0.01, -0.6} // [2, 3], torch layout
	y := []float32{0.0299, 0.2, -0.3, 0.4}              // [2, 2], from your framework
	rep, err := c.VerifyLinear(ctx, &tensorcheck.LinearRequest{
		Input:    tensorcheck.Float32Tensor(x, 2, 3),
		Weight:   tensorcheck.Float32Tensor(w, 2, 3),
		Observed: tensorcheck.Float32Tensor(y, 2, 2),
		Accept:   []string{"tf32", "cpu:bf16:unfused"},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		log.Fatal(err) // the server's headline first, then the summary
	}
	fmt.Println(rep.Verdict, rep.Diagnosis.AcceptedAs) // PASS cpu:tf32:...
}

// Compiled, not run: it needs a server. Two frameworks' outputs of one
// layer, explained against each other: which configuration each is,
// whether their difference is rounding, and what to change for one to
// match the other.
func ExampleClient_CompareOutputs() {
	ctx := context.Background()
	c, err := tensorcheck.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	x := []float32{0.1, -0.2, 0.3, 0.7, 1.1, 0.9}       // [2, 3]
	w := []float32{0.5, -0.25, 0.333, 0.77, 0.01, -0.6} // [2, 3], torch layout
	yTorch := []float32{0.0299, 0.2, -0.3, 0.4}         // [2, 2]
	yFlax := []float32{0.0298, 0.2, -0.3, 0.4}          // [2, 2]
	cmp, err := c.CompareOutputs(ctx, &tensorcheck.CompareRequest{
		Input:  tensorcheck.Float32Tensor(x, 2, 3),
		Weight: tensorcheck.Float32Tensor(w, 2, 3),
		Outputs: []tensorcheck.NamedTensor{
			{Name: "torch", Tensor: tensorcheck.Float32Tensor(yTorch, 2, 2)},
			{Name: "flax", Tensor: tensorcheck.Float32Tensor(yFlax, 2, 2)},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(cmp) // the headline first, then each output and the pair
	fmt.Println(cmp.Output("flax").Diagnosis.Best, cmp.Pair.AdviceBToA)
}

// Compiled, not run: it needs a server. A weight checked against many
// inputs is uploaded once and named by its digest afterwards. (Without
// Upload, VerifyLinear sends a weight over 1 MiB through the store by
// itself, asking the server first whether it has it.)
func ExampleClient_Upload() {
	ctx := context.Background()
	c, err := tensorcheck.Dial(ctx, "localhost:50051")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	w := make([]float32, 4096*1024) // [4096, 1024]: 16 MiB, sent in 4 MiB chunks
	ref, err := c.Upload(ctx, tensorcheck.Float32Tensor(w, 4096, 1024))
	if err != nil {
		log.Fatal(err) // codes.Unimplemented: the server has no store
	}
	fmt.Println("stored as", ref.Digest, ref.SizeBytes, "bytes")
	for _, x := range [][]float32{make([]float32, 8*1024), make([]float32, 8*1024)} {
		rep, err := c.VerifyLinear(ctx, &tensorcheck.LinearRequest{
			Input:         tensorcheck.Float32Tensor(x, 8, 1024),
			Weight:        ref.Tensor(), // by digest: not sent again
			Configs:       []string{"cpu:tf32:fused"},
			ReturnOutputs: true,
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(rep.Passed, rep.UploadedBytes, rep.ReusedBytes)
	}
	// The stored bytes, read back.
	back, err := c.ReadTensor(ctx, ref)
	if err != nil {
		log.Fatal(err) // codes.NotFound once evicted
	}
	fmt.Println(back.Shape, len(back.Data))
}

// Shares read 100% or 0% only when exact: 3 of 94,674 elements differing
// is not "100.0%".
func ExampleFormatShare() {
	fmt.Println(tensorcheck.FormatShare(94671.0 / 94674.0))
	fmt.Println(tensorcheck.FormatShare(1))
	fmt.Println(tensorcheck.FormatShare(0.5))
	// Output:
	// 99.997%
	// 100%
	// 50.0%
}
