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

# The newest parts of the API definition the client uses. The stubs are
# git-ignored and an editable install keeps them across a `git pull`: stubs
# generated from an older proto would otherwise fail far from the cause, as
# an AttributeError in the middle of building a request.
_NEWEST = ("DTYPE_FLOAT8_E4M3FN", "DTYPE_FLOAT8_E5M2")
if not all(hasattr(pb, n) for n in _NEWEST) or not {"input_scale", "weight_scale"} <= set(
    pb.LinearOp.DESCRIPTOR.fields_by_name
):  # pragma: no cover - stale install
    raise ImportError(
        "tensorcheck: the generated gRPC stubs (tensorcheck/_proto) are older "
        "than proto/tensorcheck/v1/tensorcheck.proto (no FP8 dtypes or "
        "LinearOp scales); generate them again: `pip install -e client/python` "
        "(or `python setup.py build_py` in client/python)"
    )

__all__ = ["pb", "pb_grpc"]
