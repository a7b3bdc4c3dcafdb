// Command tensorcheck-go-example sends a small fp32 linear layer to a
// tensorcheck server under strict fp32 and TF32 and prints the verdict and
// each configuration's largest difference from the fp64 reference and its
// bitwise-equal share.
//
//	tensorcheck-go-example -server localhost:50051   # default: $TENSORCHECK_SERVER
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	tensorcheck "github.com/tensorcheck/tensorcheck/client/go"
)

func main() {
	server := flag.String("server", "", "tensorcheck server address (default: $TENSORCHECK_SERVER, else localhost:50051)")
	token := flag.String("token", "", "bearer token, if the server requires one")
	timeout := flag.Duration("timeout", 30*time.Second, "deadline for the call")
	flag.Parse()

	// x: [2, 4], W: [3, 4] (torch layout), b: [3]. Values with more than
	// TF32's 10 mantissa bits, so the two configurations differ.
	x := []float32{0.1, -0.2, 0.3, 0.7, 1.1, 0.9, -0.45, 0.123}
	w := []float32{0.5, -0.25, 0.333, 0.1, 0.77, 0.01, -0.6, 0.2, -0.3, 0.41, 0.05, 0.9}
	b := []float32{0.01, -0.02, 0.03}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	opts := []tensorcheck.Option{tensorcheck.WithInsecure()}
	if *token != "" {
		opts = append(opts, tensorcheck.WithToken(*token))
	}
	c, err := tensorcheck.Dial(ctx, *server, opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	rep, err := c.VerifyLinear(ctx, &tensorcheck.LinearRequest{
		Input:   tensorcheck.Float32Tensor(x, 2, 4),
		Weight:  tensorcheck.Float32Tensor(w, 3, 4),
		Bias:    tensorcheck.Float32Tensor(b, 3),
		Configs: []string{"cpu:fp32", "cpu:tf32:fused"},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%s (tolerance %s)\n", rep.Verdict, rep.Tolerance.Preset)
	for _, r := range rep.Results {
		s := r.VsReference
		if s == nil {
			continue
		}
		line := fmt.Sprintf("%-20s max_abs %.3g  max_ulp %d  passed %v", r.Config, s.MaxAbs, s.MaxULP, s.Passed)
		if s.Total > 0 {
			// Never "100.0%" while some element differs.
			line += "  bitwise-equal " + tensorcheck.FormatShare(float64(s.BitwiseEqualCount)/float64(s.Total))
		}
		if r.SharedComputation != "" {
			line += "  (GEMM shared with " + r.SharedComputation + ")"
		}
		fmt.Println(line)
	}
}
