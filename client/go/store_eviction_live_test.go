package tensorcheck

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"
)

// startSmallStoreServer starts a server of its own with a store of
// storeBytes (the shared live server's store is far too large to evict
// from), and a client for it.
func startSmallStoreServer(t *testing.T, storeBytes string) *Client {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the unit tests only, no live server")
	}
	if runningServer() != "" {
		t.Skip("TENSORCHECK_SERVER names a running server: this test needs a server of its own")
	}
	bin := serverBinary()
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		t.Skipf("server binary %s not found", bin)
	}
	cmd := exec.Command(bin, "--host", "127.0.0.1", "--port", "0", "--store-bytes", storeBytes)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = nil // logs go to /dev/null
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		re := regexp.MustCompile(`^listening on (\S+:\d+)$`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	var server string
	select {
	case server = <-addr:
	case <-time.After(60 * time.Second):
		t.Fatal("the server did not print 'listening on HOST:PORT'")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, server, WithBlock())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A weight evicted by other uploads is uploaded again by the next
// VerifyLinear (counted by the server), and the answer is the same.
func TestLiveStoreWeightEvictedIsUploadedAgain(t *testing.T) {
	c := startSmallStoreServer(t, "8388608") // 8 MiB
	if !liveStore(t, c).Present {
		t.Skip("the server has no tensor store")
	}
	m, k, n := 2, 1024, 768 // a 3 MiB fp32 weight
	g := lcg(time.Now().UnixNano())
	x, w := g.float32s(m*k, -1, 1), g.float32s(n*k, -0.1, 0.1)
	req := &LinearRequest{
		Input:   Float32Tensor(x, int64(m), int64(k)),
		Weight:  Float32Tensor(w, int64(n), int64(k)),
		Configs: []string{"cpu:fp32"},
	}
	first, err := c.VerifyLinear(callCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if first.UploadedBytes != int64(4*n*k) {
		t.Fatalf("first call uploaded %d bytes, want the weight's %d", first.UploadedBytes, 4*n*k)
	}
	// Three other 3 MiB tensors: the 8 MiB store must evict the weight.
	for i := 0; i < 3; i++ {
		other := Float32Tensor(g.float32s(n*k, -1, 1), int64(n), int64(k))
		if _, err := c.Upload(callCtx(t), other); err != nil {
			t.Fatal(err)
		}
	}
	before := liveStore(t, c)
	if before.Evictions == 0 {
		t.Fatalf("nothing was evicted: %+v", before)
	}
	second, err := c.VerifyLinear(callCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	after := liveStore(t, c)
	if second.UploadedBytes != int64(4*n*k) || after.Uploads != before.Uploads+1 {
		t.Errorf("after the eviction: uploaded %d bytes (want %d), the server counted %d uploads (want %d)",
			second.UploadedBytes, 4*n*k, after.Uploads, before.Uploads+1)
	}
	if a, b := first.Result("cpu:fp32"), second.Result("cpu:fp32"); a == nil || b == nil ||
		a.VsReference.MaxAbs != b.VsReference.MaxAbs || a.VsReference.MaxULP != b.VsReference.MaxULP {
		t.Errorf("the two calls disagree: %+v, %+v", a, b)
	}
}
