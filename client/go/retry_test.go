package tensorcheck

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// The client honours the server's retry hint (grpc-retry-pushback-ms). The
// fake server refuses the first N calls, then answers. Waits are checked
// from below only: the client must wait at least what the server asked.

var transientCodes = []codes.Code{codes.Unavailable, codes.ResourceExhausted}

func TestRetryRefusalsWithPushbackUntilAnswered(t *testing.T) {
	for _, code := range transientCodes {
		t.Run(code.String(), func(t *testing.T) {
			fake, c := startFake(t)
			fake.refusals, fake.refusalCode, fake.pushback = 2, code, "50"
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			caps, err := c.Capabilities(ctx)
			elapsed := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if caps.ServerVersion != "fake" {
				t.Errorf("capabilities = %+v", caps)
			}
			if calls, _ := fake.counts(); calls != 3 {
				t.Errorf("calls = %d, want 3 (two refusals, then the answer)", calls)
			}
			if elapsed < 2*50*time.Millisecond {
				t.Errorf("took %v, less than the two 50 ms hints", elapsed)
			}
		})
	}
}

func TestRetryVerifyAndDiagnoseLikeEveryCall(t *testing.T) {
	fake, c := startFake(t)
	fake.resp = &pb.VerifyResponse{Verdict: pb.Verdict_VERDICT_PASS}
	fake.refusals, fake.refusalCode, fake.pushback = 1, codes.Unavailable, "10"
	rep, err := c.VerifyLinear(context.Background(), validRequest())
	if err != nil || !rep.Passed {
		t.Fatalf("VerifyLinear = %+v, %v", rep, err)
	}
	fake.refusals = 3 // the next call, the third, is refused once more
	r := validRequest()
	r.Observed = Float32Tensor([]float32{1, 2, 3}, 1, 3)
	if _, err := c.DiagnoseLinear(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if calls, _ := fake.counts(); calls != 4 {
		t.Errorf("calls = %d, want 4", calls)
	}
}

func TestRetryStopsAtMaxRetriesWithTheLastRefusal(t *testing.T) {
	fake, c := startFake(t, WithMaxRetries(2))
	fake.refusals, fake.refusalCode, fake.pushback = 100, codes.Unavailable, "40"
	start := time.Now()
	_, err := c.Capabilities(context.Background())
	elapsed := time.Since(start)
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	if e.RetryAfter != 40*time.Millisecond || !strings.Contains(e.Message, "retry after 40 ms") {
		t.Errorf("error = %+v", e)
	}
	if calls, _ := fake.counts(); calls != 3 {
		t.Errorf("calls = %d, want 3 (the call and two retries)", calls)
	}
	if elapsed < 2*40*time.Millisecond {
		t.Errorf("took %v, less than the two 40 ms hints", elapsed)
	}
}

func TestRetryZeroMaxRetriesDisablesRetries(t *testing.T) {
	fake, c := startFake(t, WithMaxRetries(0))
	fake.refusals, fake.refusalCode, fake.pushback = 1, codes.ResourceExhausted, "50"
	_, err := c.Capabilities(context.Background())
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.ResourceExhausted || e.RetryAfter != 50*time.Millisecond {
		t.Fatalf("got %#v", err)
	}
	if calls, _ := fake.counts(); calls != 1 {
		t.Errorf("calls = %d, want 1", calls)
	}
}

func TestRetryNotWithoutPushback(t *testing.T) {
	// E.g. ResourceExhausted for a tensor over the per-tensor limit:
	// permanent, sending it again cannot help.
	for _, code := range transientCodes {
		t.Run(code.String(), func(t *testing.T) {
			fake, c := startFake(t)
			fake.refusals, fake.refusalCode, fake.pushback = 1, code, ""
			_, err := c.Capabilities(context.Background())
			var e *Error
			if !errors.As(err, &e) || e.Code != code || e.RetryAfter != 0 {
				t.Fatalf("got %#v", err)
			}
			if calls, _ := fake.counts(); calls != 1 {
				t.Errorf("calls = %d, want 1", calls)
			}
		})
	}
}

func TestRetryNotForOtherCodesEvenWithPushback(t *testing.T) {
	for _, code := range []codes.Code{codes.Internal, codes.InvalidArgument, codes.Aborted} {
		t.Run(code.String(), func(t *testing.T) {
			fake, c := startFake(t)
			fake.refusals, fake.refusalCode, fake.pushback = 1, code, "50"
			_, err := c.Capabilities(context.Background())
			var e *Error
			// Reported, not acted on.
			if !errors.As(err, &e) || e.Code != code || e.RetryAfter != 50*time.Millisecond {
				t.Fatalf("got %#v", err)
			}
			if calls, _ := fake.counts(); calls != 1 {
				t.Errorf("calls = %d, want 1", calls)
			}
		})
	}
}

func TestRetryWaitPastTheDeadlineReturnsTheRefusal(t *testing.T) {
	fake, c := startFake(t)
	fake.refusals, fake.refusalCode, fake.pushback = 1, codes.Unavailable, "5000"
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := c.Capabilities(ctx)
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.Unavailable || e.RetryAfter != 5*time.Second {
		t.Fatalf("got %#v, want the Unavailable refusal", err)
	}
	if calls, _ := fake.counts(); calls != 1 {
		t.Errorf("calls = %d, want 1", calls)
	}
}

func TestRetryStopsAtTheContextDeadline(t *testing.T) {
	fake, c := startFake(t, WithMaxRetries(1000))
	fake.refusals, fake.refusalCode, fake.pushback = 1000, codes.Unavailable, "100"
	const timeout = 450 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err := c.Capabilities(ctx)
	if code := Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
		t.Fatalf("got %v, want Unavailable or DeadlineExceeded", err)
	}
	calls, remaining := fake.counts()
	// Each wait is at least 100 ms and ends before the 450 ms deadline: at
	// most four waits, so at most five attempts.
	if calls < 1 || calls > 5 {
		t.Errorf("calls = %d, want 1..5", calls)
	}
	for i, r := range remaining {
		if r < 0 || r > timeout {
			t.Errorf("attempt %d had %v to its deadline, want 0..%v", i, r, timeout)
		}
	}
}

func TestRetryContextCancelledDuringTheWait(t *testing.T) {
	fake, c := startFake(t)
	fake.refusals, fake.refusalCode, fake.pushback = 1, codes.Unavailable, "10000"
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := c.Capabilities(ctx)
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.Unavailable {
		t.Fatalf("got %#v, want the Unavailable refusal", err)
	}
	if calls, _ := fake.counts(); calls != 1 {
		t.Errorf("calls = %d, want 1", calls)
	}
}

func TestRetrySharesTheCallsDeadline(t *testing.T) {
	// Each attempt gets what is left of the one deadline, not a fresh one.
	fake, c := startFake(t)
	fake.refusals, fake.refusalCode, fake.pushback = 2, codes.Unavailable, "200"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := c.Capabilities(ctx); err != nil {
		t.Fatal(err)
	}
	calls, remaining := fake.counts()
	if calls != 3 {
		t.Fatalf("calls = %d, want 3", calls)
	}
	for i := 1; i < len(remaining); i++ {
		// At least the 200 ms hint passed; 20 ms for the rounding of the
		// deadline on the wire (grpc-timeout).
		if remaining[i] > remaining[i-1]-200*time.Millisecond+20*time.Millisecond {
			t.Errorf("time to the deadline per attempt = %v: not one shared deadline", remaining)
		}
	}
}

func TestRetryAfterParsesThePushbackTrailer(t *testing.T) {
	for _, tc := range []struct {
		md   metadata.MD
		want time.Duration
	}{
		{metadata.Pairs(RetryPushbackKey, "250"), 250 * time.Millisecond},
		{metadata.Pairs(RetryPushbackKey, " 7 "), 7 * time.Millisecond},
		{metadata.Pairs(RetryPushbackKey, "0"), time.Millisecond}, // "at once" is still a hint
		{metadata.Pairs(RetryPushbackKey, "-5"), 0},
		{metadata.Pairs(RetryPushbackKey, "1.5"), 0},
		{metadata.Pairs(RetryPushbackKey, "soon"), 0},
		{metadata.Pairs(RetryPushbackKey, ""), 0},
		{metadata.Pairs(RetryPushbackKey, "9999999999999"), 0},
		{metadata.Pairs("other", "1"), 0},
		{nil, 0},
	} {
		if got := retryAfter(tc.md); got != tc.want {
			t.Errorf("retryAfter(%v) = %v, want %v", tc.md, got, tc.want)
		}
	}
}

func TestRetryNegativeMaxRetriesIsInvalid(t *testing.T) {
	_, err := Dial(context.Background(), "127.0.0.1:1", WithMaxRetries(-1))
	if Code(err) != codes.InvalidArgument || !strings.HasPrefix(err.(*Error).Message, "max_retries:") {
		t.Fatalf("got %v, want InvalidArgument naming max_retries", err)
	}
}
