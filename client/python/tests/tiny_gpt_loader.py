"""examples/tiny_gpt.py as a module, for the model tests (the examples
directory is not a package and not on sys.path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_tiny_gpt() -> Any:
    """The module, registered in sys.modules (Flax's dataclasses look their
    module up there); one instance however many test files ask."""
    name = "tiny_gpt"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
