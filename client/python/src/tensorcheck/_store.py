"""The server's tensor store from the client's side (docs/api.md).

A stored tensor is a blob, exactly the bytes `Tensor.data` would carry, named
by `sha256:<hex>` of those bytes and their size. This module has the pieces
the `Client` puts together:

* `TensorRef`, the public name of a stored tensor (digest, size, dtype,
  shape), and `digest_of`, which hashes an array's buffer in place
  (hashlib over a uint8 view of the C-contiguous array: no copy, no
  per-element work, the GIL released while hashing);
* `DigestMemo`, which recognises a tensor hashed before by comparing its
  bytes with a copy kept then (memcmp, several times faster than SHA-256),
  so that the same weight verified again is not hashed again;
* `Uploader`: `UploadTensor` in chunks of at most 4 MiB under a random
  upload_id, resumed from `QueryUploadStatus`'s committed_size when the
  stream breaks, and `ReadTensor`, resumed likewise;
* (`_errors.missing_tensors` parses the MissingTensors status detail of a
  FAILED_PRECONDITION.)
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Optional

import grpc
import numpy as np

from ._errors import (
    MissingTensor,
    error_for,
    missing_tensors,
    retry_after_from_metadata,
    time_left,
)
from ._pb import pb
from ._tensors import DTYPES, dtype_enum, dtype_name, wire_bytes, wire_nbytes, wire_size

__all__ = [
    "TensorRef",
    "MissingTensor",
    "INLINE_MAX_BYTES",
    "CHUNK_BYTES",
    "EMPTY_DIGEST",
    "digest_of",
    "byte_view",
    "DigestMemo",
    "missing_tensors",
    "Uploader",
]

# Tensors above this many bytes go by digest (docs/api.md, "How the
# clients use it"); smaller ones stay inline.
INLINE_MAX_BYTES = 1 << 20
# The most bytes one UploadTensor message carries: the server's
# StoreInfo.chunk_bytes when smaller, never more (default proxy and
# load-balancer limits).
CHUNK_BYTES = 4 << 20
EMPTY_DIGEST = "sha256:" + hashlib.sha256(b"").hexdigest()
# How many times one upload or read is resumed after its stream broke.
MAX_RESUMES = 5
# First wait before resuming (doubled each time, capped), when the server
# gave no retry hint.
_RESUME_BACKOFF_S = 0.1
_RESUME_BACKOFF_MAX_S = 5.0
_MAX_HINT_WAIT_S = 30.0

# DigestMemo: the most bytes of tensor copies one client keeps, and the
# largest tensor it keeps a copy of (larger ones are hashed on every call:
# a copy would double their memory, and they are rarely sent twice in a
# row without Client.upload).
MEMO_BUDGET_BYTES = 64 << 20
MEMO_MAX_TENSOR_BYTES = 16 << 20

_HASH = re.compile(r"(?:sha256:)?([0-9a-f]{64})")


@dataclass(frozen=True)
class TensorRef:
    """A tensor in the server's store, named by its digest.

    `Client.upload(array)` returns one; pass it wherever `verify_linear`,
    `diagnose_linear` or `assert_linear_parity` take a tensor, and the
    request names the stored tensor instead of carrying it, and
    `Client.read_tensor(ref)` reads it back.

    Attributes:
      digest: "sha256:" and the 64 lowercase hex digits of the SHA-256 of
        the tensor's raw bytes (little-endian, row-major).
      size_bytes: their number, numel(shape) * itemsize(dtype)
        (ceil(numel / 2) for float4_e2m1fn, packed two per byte).
      dtype: "float64", "float32", "float16", "bfloat16", "float8_e4m3fn",
        "float8_e5m2", "float4_e2m1fn" or "float8_e8m0fnu"
        (`tensorcheck._tensors.DTYPES`).
      shape: the tensor's shape (elements, not bytes).

    The store is a cache: a tensor it evicted is named in vain (the server
    answers FAILED_PRECONDITION, `tensorcheck.FailedPreconditionError`
    with `missing_tensors`). Tensors the client uploads by itself are
    uploaded again and the call retried; a TensorRef has no bytes to
    upload again: call `Client.upload` anew.
    """

    digest: str
    size_bytes: int
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        m = _HASH.fullmatch(self.digest) if isinstance(self.digest, str) else None
        if m is None:
            raise ValueError(
                f"TensorRef.digest: expected 'sha256:' and 64 lowercase hex digits, "
                f"got {self.digest!r}"
            )
        object.__setattr__(self, "digest", "sha256:" + m.group(1))
        if self.dtype not in DTYPES:
            raise ValueError(f"TensorRef.dtype: expected one of {DTYPES}, got {self.dtype!r}")
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"TensorRef.shape: negative dimension in {list(shape)}")
        object.__setattr__(self, "shape", shape)
        want = wire_size(self.dtype, shape)
        if self.size_bytes != want:
            raise ValueError(
                f"TensorRef.size_bytes: {self.size_bytes} for shape {list(shape)} of "
                f"{self.dtype} (expected {want})"
            )

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def to_proto(self) -> pb.Tensor:
        """`Tensor{dtype, shape, digest}`, the reference a request carries."""
        return pb.Tensor(dtype=dtype_enum(self.dtype), shape=self.shape, digest=self.digest)

    def tensor_digest(self) -> pb.TensorDigest:
        return pb.TensorDigest(hash=self.digest, size_bytes=self.size_bytes)

    @classmethod
    def of(cls, arr: np.ndarray) -> TensorRef:
        """The reference of an array from `as_array` (hashes its bytes)."""
        return cls.of_digest(arr, digest_of(arr))

    @classmethod
    def of_digest(cls, arr: np.ndarray, digest: str) -> TensorRef:
        """The reference of an array whose digest is known."""
        name = dtype_name(dtype_enum(arr.dtype))
        assert name is not None
        return cls(digest, wire_nbytes(arr), name, tuple(arr.shape))

    @classmethod
    def from_proto(cls, t: pb.Tensor, name: str = "tensor") -> TensorRef:
        """The reference of a digest-carrying wire tensor (a returned output)."""
        dt = dtype_name(t.dtype)
        if dt is None:
            raise ValueError(f"{name}: unknown dtype {t.dtype} in the response")
        shape = tuple(t.shape)
        size = wire_size(dt, shape)
        return cls(t.digest, size, dt, shape)


def byte_view(arr: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array as stored and sent, without a
    copy (float4_e2m1fn packed, a copy of half the size: `wire_bytes`)."""
    return wire_bytes(arr)


def digest_of(arr: np.ndarray) -> str:
    """ "sha256:<hex>" of an array's raw bytes (packed for float4_e2m1fn),
    hashed in place."""
    return "sha256:" + hashlib.sha256(byte_view(arr)).hexdigest()


class DigestMemo:
    """The TensorRefs of the arrays hashed most recently, each kept with a
    private copy of the bytes it is the digest of.

    `ref(arr)` compares `arr`'s bytes (with its dtype and shape) with the
    copies kept and returns the remembered TensorRef on an exact match;
    otherwise it copies the bytes, hashes the copy and remembers both. A
    match is a full byte comparison, never a guess from the array's
    identity, so an array changed in place gets the digest of its new
    bytes; the digest kept is that of the copy kept, whatever happens to
    the array afterwards. Comparing costs a memcmp (about 0.1 ms for
    1.5 MiB here, against 1 ms for SHA-256), a miss a copy more than
    hashing alone.

    At most `budget_bytes` of copies are kept, least recently used dropped
    first; arrays above `max_tensor_bytes` are hashed every time and not
    kept. Thread-safe: the comparisons run under a lock, hashing outside
    it.
    """

    def __init__(
        self,
        budget_bytes: int = MEMO_BUDGET_BYTES,
        max_tensor_bytes: int = MEMO_MAX_TENSOR_BYTES,
    ) -> None:
        self._budget = budget_bytes
        self._max_tensor = min(max_tensor_bytes, budget_bytes)
        # (digest, dtype, shape) -> (the bytes hashed, their numpy dtype, the ref)
        self._entries: OrderedDict[
            tuple[str, str, tuple[int, ...]], tuple[bytes, np.dtype[Any], TensorRef]
        ] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def ref(self, arr: np.ndarray) -> TensorRef:
        """The TensorRef of an array from `as_array`."""
        nbytes = wire_nbytes(arr)
        if nbytes > self._max_tensor:
            return TensorRef.of(arr)
        view = byte_view(arr)
        shape = tuple(arr.shape)
        with self._lock:
            for key, (kept, dtype, ref) in self._entries.items():
                # Lengths equal first: startswith alone would accept a prefix.
                if (
                    len(kept) == nbytes
                    and ref.shape == shape
                    and dtype == arr.dtype
                    and kept.startswith(view)
                ):
                    self._entries.move_to_end(key)
                    return ref
        kept = view.tobytes()
        ref = TensorRef.of_digest(arr, "sha256:" + hashlib.sha256(kept).hexdigest())
        key = (ref.digest, ref.dtype, ref.shape)
        with self._lock:
            if key not in self._entries:
                self._entries[key] = (kept, arr.dtype, ref)
                self._bytes += nbytes
                while self._bytes > self._budget:
                    _, (old, _, _) = self._entries.popitem(last=False)
                    self._bytes -= len(old)
        return ref

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


# --- uploads and reads -----------------------------------------------------------


def _resumable(e: grpc.RpcError) -> bool:
    """A broken stream worth resuming: the connection dropped or the server
    refused with a retry hint (draining, no room right now)."""
    code = e.code() if hasattr(e, "code") else None
    if code == grpc.StatusCode.UNAVAILABLE:
        return True
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
        return retry_after_from_metadata(trailing) is not None
    return False


def _wait_before_resume(e: grpc.RpcError, attempt: int, deadline: Optional[float]) -> bool:
    """Sleeps before resume number `attempt` (1-based): the server's hint
    when it gave one, else an exponential backoff. False when the wait
    would end past the deadline."""
    trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    hint = retry_after_from_metadata(trailing)
    if hint is not None:
        wait = min(hint, _MAX_HINT_WAIT_S)
    else:
        wait = min(_RESUME_BACKOFF_S * 2 ** (attempt - 1), _RESUME_BACKOFF_MAX_S)
    if deadline is not None and time.monotonic() + wait >= deadline:
        return False
    time.sleep(wait)
    return True


class Uploader:
    """UploadTensor / QueryUploadStatus / ReadTensor over one stub.

    Raises grpc.RpcError; the Client turns those into tensorcheck.Error.
    """

    def __init__(self, stub: Any, metadata: Optional[tuple[tuple[str, str], ...]]) -> None:
        self._stub = stub
        self._metadata = metadata

    def upload(
        self,
        arr: np.ndarray,
        digest: pb.TensorDigest,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        deadline: Optional[float] = None,
        on_bytes: Optional[Callable[[int], None]] = None,
    ) -> bool:
        """Uploads one tensor; True when this upload stored it, False when
        the store already held it (`already_present`). `on_bytes(n)` is
        called as each chunk of n bytes goes out (a resumed upload sends
        some again).

        One random upload_id (uuid4) names the upload; when the stream
        breaks (UNAVAILABLE, or a refusal with a retry hint), the bytes
        the server committed are asked for with QueryUploadStatus and the
        upload continues from there, at most MAX_RESUMES times.
        """
        view = byte_view(arr)
        size = len(view)
        if size != digest.size_bytes:
            raise ValueError(f"upload: {size} bytes for a digest of {digest.size_bytes}")
        chunk = max(1, min(chunk_bytes, CHUNK_BYTES))
        upload_id = str(uuid.uuid4())
        offset = 0
        resumes = 0
        while True:
            try:
                resp = self._stream(view, digest, upload_id, offset, chunk, deadline, on_bytes)
            except grpc.RpcError as e:
                if not _resumable(e) or resumes >= MAX_RESUMES:
                    raise
                error: grpc.RpcError = e
            else:
                if resp.already_present:
                    return False
                if resp.committed_size != size:
                    raise _protocol_error(
                        "UploadTensor",
                        f"the server committed {resp.committed_size} of {size} bytes "
                        f"of {digest.hash}",
                    )
                return True
            # Resume: how far did it get? QueryUploadStatus may itself meet
            # the broken connection; every failed round counts.
            while True:
                resumes += 1
                if not _wait_before_resume(error, resumes, deadline):
                    raise error
                try:
                    status = self._stub.QueryUploadStatus(
                        pb.QueryUploadStatusRequest(digest=digest, upload_id=upload_id),
                        timeout=time_left(deadline),
                        metadata=self._metadata,
                    )
                except grpc.RpcError as e:
                    if not _resumable(e) or resumes >= MAX_RESUMES:
                        raise
                    error = e
                    continue
                break
            if status.complete:
                return True
            offset = int(status.committed_size)
            if not 0 <= offset <= size:
                raise _protocol_error(
                    "QueryUploadStatus",
                    f"committed_size {offset} outside the tensor's {size} bytes",
                )

    def _stream(
        self,
        view: memoryview,
        digest: pb.TensorDigest,
        upload_id: str,
        offset: int,
        chunk: int,
        deadline: Optional[float],
        on_bytes: Optional[Callable[[int], None]] = None,
    ) -> pb.UploadTensorResponse:
        done = threading.Event()

        def requests() -> Iterator[pb.UploadTensorRequest]:
            # gRPC pulls these from its own thread, one message per write.
            # A call the server ends early (already_present) sets `done`:
            # the generator then stops instead of slicing further chunks.
            pos = offset
            size = len(view)
            first = True
            while first or pos < size:
                if done.is_set():
                    return
                end = min(pos + chunk, size)
                msg = pb.UploadTensorRequest(offset=pos, data=view[pos:end].tobytes())
                if first:
                    msg.digest.CopyFrom(digest)
                    msg.upload_id = upload_id
                    first = False
                yield msg
                # gRPC asks for the next message once this one is written.
                if on_bytes is not None:
                    on_bytes(end - pos)
                pos = end

        future = self._stub.UploadTensor.future(
            requests(), timeout=time_left(deadline), metadata=self._metadata
        )
        future.add_done_callback(lambda _f: done.set())
        try:
            resp: pb.UploadTensorResponse = future.result()
        finally:
            done.set()
        return resp

    def read(
        self,
        ref: TensorRef,
        *,
        deadline: Optional[float] = None,
    ) -> np.ndarray:
        """A stored tensor's bytes as a writable uint8 array, checked against
        the digest (DATA_LOSS otherwise). A broken stream continues from the
        bytes received, at most MAX_RESUMES times."""
        size = ref.size_bytes
        buf = np.empty(size, dtype=np.uint8)
        if size == 0:  # the empty blob is always present
            return buf
        got = 0
        resumes = 0
        while True:
            try:
                stream = self._stub.ReadTensor(
                    pb.ReadTensorRequest(digest=ref.tensor_digest(), offset=got),
                    timeout=time_left(deadline),
                    metadata=self._metadata,
                )
                for msg in stream:
                    n = len(msg.data)
                    if msg.offset != got or got + n > size:
                        raise _protocol_error(
                            "ReadTensor",
                            f"a chunk of {n} bytes at offset {msg.offset} of {ref.digest} "
                            f"({size} bytes) after {got} bytes read",
                        )
                    buf[got : got + n] = np.frombuffer(msg.data, dtype=np.uint8)
                    got += n
            except grpc.RpcError as e:
                if not _resumable(e) or resumes >= MAX_RESUMES or got >= size:
                    raise
                resumes += 1
                if not _wait_before_resume(e, resumes, deadline):
                    raise
                continue
            break
        if got != size:
            raise _protocol_error("ReadTensor", f"{got} of {size} bytes of {ref.digest} arrived")
        if digest_of(buf) != ref.digest:
            raise _protocol_error("ReadTensor", f"the bytes read do not hash to {ref.digest}")
        return buf


def _protocol_error(method: str, message: str) -> Exception:
    return error_for(grpc.StatusCode.DATA_LOSS, message, method)
