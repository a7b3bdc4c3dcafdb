"""The JSON encoding shared by the report and capabilities objects:
to_dict() over dataclass fields, non-finite floats as strings."""

from __future__ import annotations

import math
from dataclasses import Field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Optional, Union

Ulp = Union[int, float]  # an int, or math.inf for NaN against a number


def _json_float(v: Optional[float]) -> Union[float, str, None]:
    if v is None:
        return None
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def _json_ulp(v: Ulp) -> Union[int, str]:
    return "inf" if v == math.inf else int(v)


def _json(value: Any) -> Any:
    if isinstance(value, _Node):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, float):
        return _json_float(value)
    return value


class _Node:
    """to_dict() over the dataclass fields, in order; subclasses list the
    fields that are not part of the JSON and override special encodings."""

    _not_json: tuple[str, ...] = ()
    _ulp_fields: tuple[str, ...] = ()

    if TYPE_CHECKING:
        # Every subclass is a dataclass; declaring what @dataclass adds lets
        # dataclasses.fields() take `self` here.
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in self._not_json:
                continue
            v = getattr(self, f.name)
            out[f.name] = _json_ulp(v) if f.name in self._ulp_fields else _json(v)
        return out
