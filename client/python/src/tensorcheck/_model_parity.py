"""`assert_model_parity`: a whole model's check as one assertion.

It takes a ModelReport, or a model to check first, and so reaches the
framework modules (`tensorcheck.torch`, `tensorcheck.flax`, imported only
for a model of theirs) from above: they depend on the model core
(`_model`), and the core on neither of them.
"""

from __future__ import annotations

import sys
from typing import Any

from ._model import ModelReport
from ._model_output import failure_message

__all__ = ["assert_model_parity"]


def assert_model_parity(report_or_model: Any, *args: Any, **kwargs: Any) -> ModelReport:
    """Raises AssertionError naming the first diverging layer call and its
    diagnosis; returns the ModelReport when every layer passed.

    Takes a ModelReport, a torch.nn.Module (runs
    `tensorcheck.torch.check_linears(model, *args, **kwargs)`) or a flax
    Module (`tensorcheck.flax.check_denses(module, variables, *args,
    **kwargs)`).

    The message is at most 25 lines, the first diverging layer call's
    answer from the server (its headline) first; pytest shows the test's
    line, not this library's.
    """
    __tracebackhide__ = True  # pytest: the failure is the test's line
    report = report_or_model
    if not isinstance(report, ModelReport):
        module = type(report_or_model).__module__ or ""
        if "torch" in sys.modules and isinstance(report_or_model, sys.modules["torch"].nn.Module):
            from .torch import check_linears

            report = check_linears(report_or_model, *args, **kwargs)
        elif (
            module.startswith("flax")
            or "flax.linen" in sys.modules
            and isinstance(report_or_model, sys.modules["flax.linen"].Module)
        ):
            from .flax import check_denses

            report = check_denses(report_or_model, *args, **kwargs)
        else:
            raise TypeError(
                "assert_model_parity: expected a ModelReport, a torch.nn.Module or a "
                f"flax.linen.Module, got {type(report_or_model).__name__}"
            )
    if report.passed:
        return report
    raise AssertionError(failure_message(report))
