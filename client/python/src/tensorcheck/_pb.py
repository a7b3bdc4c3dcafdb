"""The generated protobuf and gRPC modules (built by setup.py, not committed)."""

from __future__ import annotations

try:
    from ._proto.tensorcheck.v1 import tensorcheck_pb2 as pb
    from ._proto.tensorcheck.v1 import tensorcheck_pb2_grpc as pb_grpc
except ModuleNotFoundError as e:  # pragma: no cover - broken install
    if not (e.name or "").startswith(__package__ + "._proto"):
        raise
    raise ImportError(
        "tensorcheck: the generated gRPC stubs (tensorcheck/_proto) are "
        "missing. They are built from proto/tensorcheck/v1/tensorcheck.proto "
        "when the package is installed: run `pip install client/python` (or "
        "`pip install -e client/python`) instead of importing from the "
        "source tree directly."
    ) from e

__all__ = ["pb", "pb_grpc"]
