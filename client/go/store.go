package tensorcheck

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
)

// The tensor store (docs/api.md): a tensor is uploaded once, in chunks, and
// named by the SHA-256 of its bytes afterwards.

// StoreThreshold is the size above which VerifyLinear and DiagnoseLinear
// send a tensor through the server's store instead of inline: tensors with
// more than this many bytes of Data are hashed, the store is asked which
// of them it lacks, only those are uploaded, and the request names them by
// digest.
const StoreThreshold = 1 << 20

// MaxChunkBytes is the most data one UploadTensor message carries: the
// store's chunk_bytes, 4 MiB (less when the server's
// Capabilities().Store.ChunkBytes says so).
const MaxChunkBytes = 4 << 20

// digestPrefix starts every digest the client sends.
const digestPrefix = "sha256:"

// maxParallel bounds the uploads (and the hashes and reads) one call runs at
// once.
const maxParallel = 4

// maxResumes is how many times one upload or read continues after its
// stream broke (codes.Unavailable without a retry hint).
const maxResumes = 3

// TensorRef names a tensor in the server's store: the digest of its bytes
// and the dtype and shape it is read as. Upload returns one; Tensor turns it
// into a *Tensor for a LinearRequest field, and ReadTensor reads the bytes
// back. The same stored bytes may be referenced with another shape of the
// same size.
type TensorRef struct {
	// "sha256:" and the 64 lowercase hex digits of the SHA-256 of the
	// tensor's little-endian, row-major bytes.
	Digest string
	// DType.StorageBytes(numel(Shape)).
	SizeBytes int64
	DType     DType
	Shape     []int64
}

// Tensor is the reference as a request tensor: DType, Shape and Digest, no
// Data. Use it in place of the tensor in a LinearRequest.
func (r *TensorRef) Tensor() *Tensor {
	if r == nil {
		return nil
	}
	return &Tensor{DType: r.DType, Shape: append([]int64(nil), r.Shape...), Digest: r.Digest}
}

// normalizeDigest returns d with the "sha256:" prefix, or false when d is
// not 64 lowercase hex digits with or without it.
func normalizeDigest(d string) (string, bool) {
	h := strings.TrimPrefix(d, digestPrefix)
	if len(h) != 64 {
		return "", false
	}
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", false
		}
	}
	return digestPrefix + h, true
}

// digestOf is the store's name for data.
func digestOf(data []byte) *pb.TensorDigest {
	sum := sha256.Sum256(data)
	return &pb.TensorDigest{Hash: digestPrefix + hex.EncodeToString(sum[:]), SizeBytes: int64(len(data))}
}

// newUploadID is a random (version 4) UUID: one per upload, so that an
// interrupted upload can be resumed and other uploads of the same tensor
// run independently.
func newUploadID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on supported platforms; a clock-based
		// id is still unique enough to name one upload.
		return fmt.Sprintf("go-%d", time.Now().UnixNano())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// asError returns err as an *Error, converting a raw gRPC error.
func asError(err error) *Error {
	if e, ok := err.(*Error); ok {
		return e
	}
	return fromRPC(err, nil)
}

// prefixed is e with its message prefixed by what the client was doing; the
// gRPC status (and its details) stays the one received.
func prefixed(e *Error, format string, args ...interface{}) *Error {
	return &Error{
		Code:       e.Code,
		Message:    fmt.Sprintf(format, args...) + ": " + e.Message,
		RetryAfter: e.RetryAfter,
		status:     e.status,
	}
}

// sleepCtx waits d, or returns false when ctx ends first or its deadline
// would pass during the wait.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= d {
		return false
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// resumeWait is the pause before the n-th (1-based) resume of a broken
// stream, while the connection comes back: 50 ms, 200 ms, 450 ms.
func resumeWait(n int) time.Duration {
	return time.Duration(n*n) * 50 * time.Millisecond
}

// parallel runs f(ctx, i) for every i < n, at most maxParallel at once. The
// first error cancels the others' context and is returned.
func parallel(ctx context.Context, n int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	sem := make(chan struct{}, maxParallel)
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			if err := f(ctx, i); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
					cancel()
				}
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	return firstErr
}

// chunkBytes is the chunk size for uploads: MaxChunkBytes, or the server's
// smaller StoreInfo.chunk_bytes. The server is asked once per Client (again
// after a failed attempt).
func (c *Client) chunkBytes(ctx context.Context) int {
	c.storeMu.Lock()
	n := c.chunk
	c.storeMu.Unlock()
	if n > 0 {
		return n
	}
	resp, err := c.stub.GetCapabilities(ctx, &pb.GetCapabilitiesRequest{})
	if err != nil {
		return MaxChunkBytes
	}
	n = MaxChunkBytes
	if cb := resp.GetStore().GetChunkBytes(); cb > 0 && cb < MaxChunkBytes {
		n = int(cb)
	}
	c.storeMu.Lock()
	c.chunk = n
	c.storeMu.Unlock()
	return n
}

// Upload puts t into the server's store, in chunks of at most MaxChunkBytes,
// and returns its reference: use ref.Tensor() in place of t in any number
// of requests (by this client or another of the same server) while the
// store keeps it. When the store already holds the tensor the server ends
// the upload at once (already_present) and the rest is not sent. An
// upload whose stream breaks (codes.Unavailable) continues where the
// server's copy ends (QueryUploadStatus), up to 3 times; a refusal with the
// server's retry hint is retried as every call is (WithMaxRetries).
//
// A server without a store answers codes.Unimplemented. VerifyLinear and
// DiagnoseLinear upload large tensors by themselves; Upload is for tensors
// sent many times, or once ahead of the requests that use them.
func (c *Client) Upload(ctx context.Context, t *Tensor) (*TensorRef, error) {
	if t == nil {
		return nil, invalidArgument("tensor", "is nil")
	}
	if t.Digest != "" {
		return nil, invalidArgument("tensor", "has no data to upload: it names %s already", t.Digest)
	}
	if err := t.validate("tensor"); err != nil {
		return nil, err
	}
	d := digestOf(t.Data)
	if _, err := c.upload(ctx, d, t.Data, c.chunkBytes(ctx)); err != nil {
		return nil, c.callError(err)
	}
	return &TensorRef{Digest: d.Hash, SizeBytes: d.SizeBytes, DType: t.DType, Shape: append([]int64(nil), t.Shape...)}, nil
}

// upload stores data under d; stored is false when the store already held
// it (nothing was sent past the first chunks).
func (c *Client) upload(ctx context.Context, d *pb.TensorDigest, data []byte, chunk int) (stored bool, err error) {
	id := newUploadID()
	var offset int64
	retries, resumes := 0, 0
	for {
		var trailer metadata.MD
		resp, err := c.uploadOnce(ctx, d, id, offset, data, chunk, grpc.Trailer(&trailer))
		if err == nil {
			return !resp.AlreadyPresent, nil
		}
		e := fromRPC(err, trailer)
		if wait, ok := c.retryWait(ctx, e, retries); ok {
			retries++
			if !sleepCtx(ctx, wait) {
				return false, e
			}
		} else if e.Code == codes.Unavailable && resumes < maxResumes {
			resumes++
			if !sleepCtx(ctx, resumeWait(resumes)) {
				return false, e
			}
		} else {
			return false, e
		}
		// Continue from the bytes the server holds.
		for {
			var q *pb.QueryUploadStatusResponse
			qerr := c.invoke(ctx, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
				q, err = c.stub.QueryUploadStatus(ctx, &pb.QueryUploadStatusRequest{Digest: d, UploadId: id}, opts...)
				return err
			})
			if qerr == nil {
				if q.Complete {
					return true, nil
				}
				if q.CommittedSize < 0 || q.CommittedSize > int64(len(data)) {
					return false, prefixed(e, "resuming upload %s: server holds %d of %d bytes", id, q.CommittedSize, len(data))
				}
				offset = q.CommittedSize
				break
			}
			if Code(qerr) != codes.Unavailable || resumes >= maxResumes {
				return false, e
			}
			resumes++
			if !sleepCtx(ctx, resumeWait(resumes)) {
				return false, e
			}
		}
	}
}

// uploadOnce runs one UploadTensor stream from offset to the end of data.
func (c *Client) uploadOnce(ctx context.Context, d *pb.TensorDigest, id string, offset int64, data []byte,
	chunk int, opts ...grpc.CallOption) (*pb.UploadTensorResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.stub.UploadTensor(ctx, opts...)
	if err != nil {
		return nil, err
	}
	size := int64(len(data))
	for first := true; ; first = false {
		end := offset + int64(chunk)
		if end > size {
			end = size
		}
		msg := &pb.UploadTensorRequest{Offset: offset, Data: data[offset:end]}
		if first {
			msg.Digest, msg.UploadId = d, id
		}
		if err := stream.Send(msg); err != nil {
			// io.EOF: the server ended the call, with success when the
			// store already holds the tensor (already_present) or with an
			// error; CloseAndRecv returns which.
			break
		}
		offset = end
		if offset >= size {
			break
		}
	}
	return stream.CloseAndRecv()
}

// ReadTensor reads a stored tensor back: ref.SizeBytes bytes (0: numel(Shape)
// × itemsize), checked against the digest, as a Tensor with ref's dtype and
// shape. A read whose stream breaks continues where it stopped. A digest the
// store lacks is codes.NotFound (never uploaded, or evicted).
func (c *Client) ReadTensor(ctx context.Context, ref *TensorRef) (*Tensor, error) {
	if ref == nil {
		return nil, invalidArgument("ref", "is nil")
	}
	hash, ok := normalizeDigest(ref.Digest)
	if !ok {
		return nil, invalidArgument("ref.digest", "%q is not \"sha256:\" and 64 lowercase hex digits", ref.Digest)
	}
	t := &Tensor{DType: ref.DType, Shape: append([]int64(nil), ref.Shape...), Digest: hash}
	if err := t.validate("ref"); err != nil {
		return nil, err
	}
	size := t.sizeBytes()
	if ref.SizeBytes != 0 && ref.SizeBytes != size {
		return nil, invalidArgument("ref.size_bytes", "is %d, shape %v of %v needs %d", ref.SizeBytes, ref.Shape, ref.DType, size)
	}
	data, err := c.readBlob(ctx, &pb.TensorDigest{Hash: hash, SizeBytes: size})
	if err != nil {
		return nil, c.callError(err)
	}
	t.Data, t.Digest = data, ""
	return t, nil
}

// readBlob reads all of d's bytes and checks their hash.
func (c *Client) readBlob(ctx context.Context, d *pb.TensorDigest) ([]byte, error) {
	buf := make([]byte, d.SizeBytes)
	var got int64
	for resumes := 0; ; resumes++ {
		err := c.invoke(ctx, func(ctx context.Context, opts ...grpc.CallOption) error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			stream, err := c.stub.ReadTensor(ctx, &pb.ReadTensorRequest{Digest: d, Offset: got}, opts...)
			if err != nil {
				return err
			}
			for {
				m, err := stream.Recv()
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return err
				}
				if m.Offset != got || int64(len(m.Data)) > d.SizeBytes-got {
					return status.Errorf(codes.DataLoss, "reading %s: chunk of %d bytes at offset %d, expected offset %d of %d bytes",
						d.Hash, len(m.Data), m.Offset, got, d.SizeBytes)
				}
				got += int64(copy(buf[got:], m.Data))
			}
		})
		if err == nil {
			break
		}
		if Code(err) != codes.Unavailable || resumes >= maxResumes || asError(err).RetryAfter > 0 ||
			!sleepCtx(ctx, resumeWait(resumes+1)) {
			return nil, err
		}
	}
	if got != d.SizeBytes {
		return nil, &Error{Code: codes.DataLoss, Message: fmt.Sprintf("reading %s: the server sent %d of %d bytes", d.Hash, got, d.SizeBytes)}
	}
	if h := digestOf(buf).Hash; h != d.Hash {
		return nil, &Error{Code: codes.DataLoss, Message: fmt.Sprintf("reading %s: the bytes hash to %s", d.Hash, h)}
	}
	return buf, nil
}

// blob is one distinct tensor of a request that goes by digest.
type blob struct {
	digest *pb.TensorDigest
	data   []byte // nil for a tensor the caller named by digest
	// Sent inline (a server without a store).
	inline bool
	// Whether this call stored it by uploading.
	uploaded bool
}

// run sends a Verify or Diagnose request, through the store where it pays
// (see VerifyLinear), and reads outputs returned by digest back.
func (c *Client) run(ctx context.Context, req *LinearRequest, diagnose bool) (*Report, error) {
	msg, err := req.toProto(diagnose)
	if err != nil {
		return nil, err
	}
	call := c.stub.Verify
	if diagnose {
		call = c.stub.Diagnose
	}
	fields := []tensorField{{req.Input, msg.Op.Input}, {req.Weight, msg.Op.Weight}, {req.Bias, msg.Op.Bias},
		{req.InputScale, msg.Op.InputScale}, {req.WeightScale, msg.Op.WeightScale},
		{req.InputGlobalScale, msg.Op.InputGlobalScale}, {req.WeightGlobalScale, msg.Op.WeightGlobalScale},
		{req.Observed, msg.Observed}}
	var resp *pb.VerifyResponse
	uploaded, reused, err := c.sendThroughStore(ctx, fields, msg,
		func(ctx context.Context, opts ...grpc.CallOption) (err error) {
			resp, err = call(ctx, msg, opts...)
			return err
		})
	if err != nil {
		return nil, err
	}
	rep := reportFromProto(resp)
	rep.accept = req.Accept
	rep.UploadedBytes, rep.ReusedBytes = uploaded, reused
	if err := c.readOutputs(ctx, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// tensorField is a tensor of a request and its field in the message.
type tensorField struct {
	t *Tensor
	p *pb.Tensor
}

// sendThroughStore sends msg with call, its large tensors (fields) through
// the store, as VerifyLinear describes: the tensors that go by digest are
// those the caller named and those over StoreThreshold (hashed here); the
// store is asked once which it lacks, those are uploaded, and msg names
// them by digest; a FailedPrecondition naming tensors the store lacks is
// met by uploading them again and resending, once, then by sending them
// inline when msg fits. It returns the bytes uploaded and the bytes named
// by digest without uploading (Report.UploadedBytes, ReusedBytes).
// requestBytesKey is the metadata that declares a Verify, Diagnose or
// Compare request's serialized size.
const requestBytesKey = "tensorcheck-request-bytes"

func (c *Client) sendThroughStore(ctx context.Context, fields []tensorField, msg proto.Message,
	call func(context.Context, ...grpc.CallOption) error) (uploaded, reused int64, err error) {
	var large []*pb.Tensor
	for _, f := range fields {
		if f.t != nil && f.t.Digest == "" && len(f.t.Data) > StoreThreshold {
			large = append(large, f.p)
		}
	}
	digests := make([]*pb.TensorDigest, len(large))
	parallel(ctx, len(large), func(_ context.Context, i int) error {
		digests[i] = digestOf(large[i].GetData())
		return nil
	})
	// One blob per distinct digest.
	blobs := map[string]*blob{}
	var order []*blob
	add := func(d *pb.TensorDigest, data []byte) {
		if blobs[d.Hash] == nil {
			blobs[d.Hash] = &blob{digest: d, data: data}
			order = append(order, blobs[d.Hash])
		}
	}
	for _, f := range fields {
		if f.t != nil && f.t.Digest != "" {
			hash, _ := normalizeDigest(f.t.Digest)
			add(&pb.TensorDigest{Hash: hash, SizeBytes: f.t.sizeBytes()}, nil)
		}
	}
	for i, p := range large {
		add(digests[i], p.GetData())
	}
	if len(large) > 0 {
		toSend, err := c.findMissing(ctx, order)
		switch {
		case Code(err) == codes.Unimplemented && !c.hasStore(ctx):
			// A server without a store, by its own capabilities: the large
			// tensors stay inline.
			for _, d := range digests {
				blobs[d.Hash].inline = true
			}
		case err != nil:
			return 0, 0, err
		default:
			if err := c.uploadBlobs(ctx, toSend); err != nil {
				return 0, 0, err
			}
			for i, p := range large {
				p.Source = &pb.Tensor_Digest{Digest: digests[i].Hash}
			}
		}
	}

	// Its size declared, so that the server admits it for that much before
	// receiving it (docs/api.md, "Request size").
	send := func() error {
		sized := metadata.AppendToOutgoingContext(ctx, requestBytesKey, strconv.Itoa(proto.Size(msg)))
		return c.invoke(sized, call)
	}
	err = send()
	if missing := missingTensors(err); missing != nil {
		// Evicted (or never there) since FindMissingTensors: upload what
		// the server names, once, and send the request again.
		again, ok := ownBlobs(blobs, missing)
		if !ok {
			return 0, 0, err // not ours to upload: a caller's reference
		}
		if uerr := c.uploadBlobs(ctx, again); uerr != nil {
			return 0, 0, uerr
		}
		err = send()
		if missing := missingTensors(err); missing != nil {
			// Missed again: behind a load balancer (round_robin over
			// replicas, each with its own store) the upload and the resend
			// can reach different replicas. Any replica takes the tensors
			// inline: send them so, once, when the request fits.
			if _, ok := ownBlobs(blobs, missing); !ok || !c.inlineFits(ctx, msg, large, digests, blobs) {
				return 0, 0, err
			}
			err = send()
		}
	}
	if err != nil {
		return 0, 0, err
	}
	for _, b := range order {
		switch {
		case b.uploaded:
			// Counted even when sent inline at last (a second miss).
			uploaded += b.digest.SizeBytes
		case b.inline:
		default:
			reused += b.digest.SizeBytes
		}
	}
	return uploaded, reused, nil
}

// ownBlobs is the blobs of the digests missing names, or false when one of
// them is not this call's to upload or inline (a reference the caller gave,
// with no data here).
func ownBlobs(blobs map[string]*blob, missing *pb.MissingTensors) ([]*blob, bool) {
	var own []*blob
	for _, d := range missing.Digests {
		hash, _ := normalizeDigest(d.GetHash())
		b := blobs[hash]
		if b == nil || b.data == nil || b.inline {
			return nil, false
		}
		own = append(own, b)
	}
	return own, true
}

// inlineFits puts the large tensors of msg (large, whose digests are
// digests) back inline, as data, and marks their blobs inline; tensors the
// caller named by digest stay so. It reports whether msg then fits in the
// server's max_message_bytes (GetCapabilities; false when that fails) and
// this client's own (WithMaxMessageBytes); when it does not, msg is not to
// be sent.
// hasStore reports whether the server's capabilities say it has a tensor
// store: the only word taken for "no store" (an UNIMPLEMENTED alone may
// come from a proxy, or from a request the server could not read). True
// when the capabilities cannot be had, so that the error is returned.
func (c *Client) hasStore(ctx context.Context) bool {
	caps, err := c.Capabilities(ctx)
	return err != nil || caps.TensorStore
}

func (c *Client) inlineFits(ctx context.Context, msg proto.Message, large []*pb.Tensor,
	digests []*pb.TensorDigest, blobs map[string]*blob) bool {
	var caps *pb.GetCapabilitiesResponse
	err := c.invoke(ctx, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		caps, err = c.stub.GetCapabilities(ctx, &pb.GetCapabilitiesRequest{}, opts...)
		return err
	})
	if err != nil {
		return false
	}
	limit := caps.GetLimits().GetMaxMessageBytes()
	if own := int64(c.maxMessageBytes); own < limit {
		limit = own
	}
	for i, p := range large {
		b := blobs[digests[i].Hash]
		p.Source = &pb.Tensor_Data{Data: b.data}
		b.inline = true
	}
	return int64(proto.Size(msg)) <= limit
}

// findMissing asks the store, once, which of the blobs with data it lacks.
func (c *Client) findMissing(ctx context.Context, blobs []*blob) ([]*blob, error) {
	req := &pb.FindMissingTensorsRequest{}
	byHash := map[string]*blob{}
	for _, b := range blobs {
		if b.data != nil {
			req.Digests = append(req.Digests, b.digest)
			byHash[b.digest.Hash] = b
		}
	}
	var resp *pb.FindMissingTensorsResponse
	err := c.invoke(ctx, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = c.stub.FindMissingTensors(ctx, req, opts...)
		return err
	})
	if err != nil {
		if Code(err) == codes.Unimplemented {
			return nil, err
		}
		return nil, prefixed(asError(err), "asking the tensor store which tensors it lacks")
	}
	var missing []*blob
	for _, d := range resp.MissingDigests {
		hash, _ := normalizeDigest(d.GetHash())
		if b := byHash[hash]; b != nil {
			missing = append(missing, b)
			delete(byHash, hash)
		}
	}
	return missing, nil
}

// uploadBlobs uploads blobs, several at once, and marks those it stored.
func (c *Client) uploadBlobs(ctx context.Context, blobs []*blob) error {
	if len(blobs) == 0 {
		return nil
	}
	chunk := c.chunkBytes(ctx)
	return parallel(ctx, len(blobs), func(ctx context.Context, i int) error {
		b := blobs[i]
		stored, err := c.upload(ctx, b.digest, b.data, chunk)
		if err != nil {
			return prefixed(asError(err), "uploading %s (%d bytes)", b.digest.Hash, b.digest.SizeBytes)
		}
		if stored {
			b.uploaded = true
		}
		return nil
	})
}

// missingTensors is the MissingTensors detail of a FAILED_PRECONDITION, or
// nil.
func missingTensors(err error) *pb.MissingTensors {
	if err == nil || Code(err) != codes.FailedPrecondition {
		return nil
	}
	st := status.Convert(err)
	for _, d := range st.Details() {
		if m, ok := d.(*pb.MissingTensors); ok {
			return m
		}
	}
	// A detail the registry could not resolve (another protobuf runtime):
	// decode it by its type URL.
	for _, a := range st.Proto().GetDetails() {
		if strings.HasSuffix(a.GetTypeUrl(), "/tensorcheck.v1.MissingTensors") {
			m := &pb.MissingTensors{}
			if proto.Unmarshal(a.GetValue(), m) == nil {
				return m
			}
		}
	}
	return nil
}

// readOutputs reads the outputs the server returned by digest.
func (c *Client) readOutputs(ctx context.Context, rep *Report) error {
	var outs []*ConfigResult
	for i := range rep.Results {
		if o := rep.Results[i].Output; o != nil && o.Digest != "" {
			outs = append(outs, &rep.Results[i])
		}
	}
	if r := rep.Reference; r != nil && r.Output != nil && r.Output.Digest != "" {
		outs = append(outs, r)
	}
	return parallel(ctx, len(outs), func(ctx context.Context, i int) error {
		r := outs[i]
		t, err := c.ReadTensor(ctx, &TensorRef{Digest: r.Output.Digest, DType: r.Output.DType, Shape: r.Output.Shape})
		if err != nil {
			return prefixed(asError(err), "reading the output of %s (%s)", r.Config, r.Output.Digest)
		}
		r.Output = t
		return nil
	})
}
