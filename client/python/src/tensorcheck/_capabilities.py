"""`Capabilities`: a GetCapabilitiesResponse as Python objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ._node import _Node
from ._pb import pb
from ._tensors import dtype_name


@dataclass(frozen=True)
class DeviceInfo(_Node):
    name: str
    compute_capability: str
    memory_bytes: int
    driver_version: str
    runtime_version: str
    cublas_version: str

    @classmethod
    def from_proto(cls, m: pb.DeviceInfo) -> DeviceInfo:
        return cls(
            name=m.name,
            compute_capability=m.compute_capability,
            memory_bytes=m.memory_bytes,
            driver_version=m.driver_version,
            runtime_version=m.runtime_version,
            cublas_version=m.cublas_version,
        )


@dataclass(frozen=True)
class BackendInfo(_Node):
    name: str
    available: bool
    unavailable_reason: str
    precisions: list[str]
    bias_modes: list[str]
    configs: list[str]
    device: Optional[DeviceInfo]
    storage_dtypes: list[Optional[str]]  # None for a dtype this client does not know

    @classmethod
    def from_proto(cls, m: pb.BackendInfo) -> BackendInfo:
        return cls(
            name=m.name,
            available=m.available,
            unavailable_reason=m.unavailable_reason,
            precisions=list(m.precisions),
            bias_modes=list(m.bias_modes),
            configs=list(m.configs),
            device=DeviceInfo.from_proto(m.device) if m.HasField("device") else None,
            storage_dtypes=[dtype_name(d) for d in m.storage_dtypes],
        )


@dataclass(frozen=True)
class Limits(_Node):
    max_message_bytes: int
    max_tensor_bytes: int
    max_configs: int
    max_rank: int
    max_top_k: int
    max_repeat: int

    @classmethod
    def from_proto(cls, m: pb.Limits) -> Limits:
        return cls(
            max_message_bytes=m.max_message_bytes,
            max_tensor_bytes=m.max_tensor_bytes,
            max_configs=m.max_configs,
            max_rank=m.max_rank,
            max_top_k=m.max_top_k,
            max_repeat=m.max_repeat,
        )


@dataclass(frozen=True)
class StoreInfo(_Node):
    """The server's tensor store (docs/api.md); all zero when it has none.

    `chunk_bytes` is the most one upload or read message carries;
    `uploads` / `uploaded_bytes` count the tensors (and their bytes) stored
    by uploads since the server started, `evictions` those evicted to make
    room; `partial_uploads` / `partial_bytes` the uploads in progress or
    kept for resuming."""

    present: bool
    budget_bytes: int
    bytes_used: int
    tensor_count: int
    largest_tensor_bytes: int
    chunk_bytes: int
    max_tensor_bytes: int
    persistent: bool
    partial_upload_seconds: int
    inline_output_bytes: int
    uploads: int
    uploaded_bytes: int
    evictions: int
    partial_uploads: int
    partial_bytes: int

    @classmethod
    def from_proto(cls, m: pb.StoreInfo) -> StoreInfo:
        return cls(
            present=m.present,
            budget_bytes=m.budget_bytes,
            bytes_used=m.bytes_used,
            tensor_count=m.tensor_count,
            largest_tensor_bytes=m.largest_tensor_bytes,
            chunk_bytes=m.chunk_bytes,
            max_tensor_bytes=m.max_tensor_bytes,
            persistent=m.persistent,
            partial_upload_seconds=m.partial_upload_seconds,
            inline_output_bytes=m.inline_output_bytes,
            uploads=m.uploads,
            uploaded_bytes=m.uploaded_bytes,
            evictions=m.evictions,
            partial_uploads=m.partial_uploads,
            partial_bytes=m.partial_bytes,
        )


@dataclass(frozen=True)
class Capabilities(_Node):
    """What a server host runs (GetCapabilitiesResponse)."""

    server_version: str
    backends: list[BackendInfo]
    limits: Optional[Limits]
    default_reference: str
    tolerance_presets: list[str]
    tensor_store: bool
    # None from a server that predates the store's numbers.
    store: Optional[StoreInfo] = None

    @classmethod
    def from_proto(cls, m: pb.GetCapabilitiesResponse) -> Capabilities:
        return cls(
            server_version=m.server_version,
            backends=[BackendInfo.from_proto(b) for b in m.backends],
            limits=Limits.from_proto(m.limits) if m.HasField("limits") else None,
            default_reference=m.default_reference,
            tolerance_presets=list(m.tolerance_presets),
            tensor_store=m.tensor_store,
            store=StoreInfo.from_proto(m.store) if m.HasField("store") else None,
        )

    def backend(self, name: str) -> Optional[BackendInfo]:
        return next((b for b in self.backends if b.name == name), None)

    @property
    def configs(self) -> list[str]:
        """Every configuration an available backend runs here."""
        return [c for b in self.backends if b.available for c in b.configs]
