"""The artifacts of a whole-model check, rendered by their one owner: the
CLI's `tensorcheck render` (docs/model-checks.md, "tensorcheck render").

The JSON report (`ModelReport.to_dict()`) is the one artifact Python
makes; the JUnit XML, the HTML page and the GitHub annotations and
summary are drawn from it by the CLI, with the very code `tensorcheck
sweep` writes its own with, so that a model reads alike from either
client. `ModelReport.to_junit`, `to_html` and `to_github` call `render`
here.

The CLI is found (`find_cli`) as `cli=` says, else $TENSORCHECK_CLI, else
`tensorcheck` on PATH (this package installs no command of that name, so
a `tensorcheck` on PATH is the CLI); none is CliNotFoundError.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
from google.protobuf import json_format

from ._errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnknownError,
)
from ._report import Report
from ._tensors import to_proto

__all__ = [
    "CLI_ENV",
    "RENDER_TIMEOUT_S",
    "CliNotFoundError",
    "find_cli",
    "outputs_inline",
    "render",
]

PathArg = Union[str, "os.PathLike[str]"]

# Where the CLI is, when not on PATH.
CLI_ENV = "TENSORCHECK_CLI"
# Rendering is local and takes well under a second for a model of a few
# hundred layer calls; a page with heatmaps of large outputs, seconds. The
# limit only keeps a hung process from hanging the caller.
RENDER_TIMEOUT_S = 300.0
# `render`'s exit codes for the report's result (docs/model-checks.md):
# the file is written. 2 is also a bad report, which writes nothing and
# says why on stderr.
_RESULT_CODES = (0, 1, 2, 3)

_HOW_TO_GET_IT = (
    "ModelReport.to_junit, to_html and to_github run the tensorcheck CLI's "
    "`tensorcheck render`, the one renderer of these files: build it (cmake --build build "
    "--target tensorcheck, giving build/client/cli/tensorcheck) and put it on PATH, set "
    f"{CLI_ENV} to its path, or pass cli="
)


class CliNotFoundError(FailedPreconditionError):
    """FAILED_PRECONDITION: the tensorcheck CLI, which renders a
    ModelReport's JUnit XML, HTML page and GitHub summary (`tensorcheck
    render`), is not where `cli=`, $TENSORCHECK_CLI or PATH say. The
    message says what was looked for and how to provide it."""


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_cli(cli: Optional[PathArg] = None) -> str:
    """The path of the tensorcheck CLI: `cli`, else $TENSORCHECK_CLI, else
    `tensorcheck` on PATH. CliNotFoundError naming what was tried."""
    if cli is not None or os.environ.get(CLI_ENV):
        given = Path(os.fspath(cli)) if cli is not None else Path(os.environ[CLI_ENV])
        where = "cli=" if cli is not None else f"{CLI_ENV}="
        if _executable(given):
            return str(given)
        raise CliNotFoundError(
            f"{where}{given}: no executable file there. {_HOW_TO_GET_IT}", method="render"
        )
    found = shutil.which("tensorcheck")
    if found is None:
        raise CliNotFoundError(
            f"no `tensorcheck` on PATH and {CLI_ENV} is unset. {_HOW_TO_GET_IT}", method="render"
        )
    return found


def _as_json(value: Any) -> str:
    # Non-finite floats are strings in the report ("nan", "inf"): a bare
    # NaN here is a bug of to_dict(), not something to write.
    return json.dumps(value, allow_nan=False, ensure_ascii=False, indent=1) + "\n"


def render(
    report: Mapping[str, Any],
    files: Mapping[str, PathArg],
    flags: Sequence[str] = (),
    *,
    captures: Optional[PathArg] = None,
    env: Optional[Mapping[str, str]] = None,
    cli: Optional[PathArg] = None,
    timeout: float = RENDER_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """Runs `tensorcheck render REPORT.json` on `report` (the JSON report,
    to_dict()'s) with `files` ({"--junit": path, "--html": path}) and the
    other `flags` ("--github"), and returns the finished process: its exit
    code the report's result (0, 1, 2 or 3), its stdout what render
    printed. Each file is written to a temporary path first and moved
    into place once render has written it, so a failed render leaves none
    half-written. `captures` is the `--captures` file of the page's
    heatmaps: `{name}.output` (name#call for a later call) per layer call
    (docs/model-checks.md, "Captures file").

    CliNotFoundError without a CLI; InvalidArgumentError with the CLI's
    message (it names the JSON path) when render rejects the report;
    DeadlineExceededError after `timeout` seconds; UnknownError for any
    other failure to render (a crash, a file it could not write)."""
    exe = find_cli(cli)
    with tempfile.TemporaryDirectory(prefix="tensorcheck-render-") as tmp:
        report_path = Path(tmp, "report.json")
        report_path.write_text(_as_json(report), encoding="utf-8")
        args = [exe, "render", str(report_path), *flags]
        staged = {flag: Path(tmp, f"out{i}") for i, flag in enumerate(files)}
        # Without a file to write, a JUnit file all the same, thrown away:
        # render writes one only from a report it could read (below).
        canary = {} if files else {"--junit": Path(tmp, "canary.xml")}
        for flag, path in {**staged, **canary}.items():
            args += [flag, str(path)]
        if captures is not None:
            args += ["--captures", os.fspath(captures)]
        try:
            done = subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=None if env is None else {**os.environ, **env},
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise DeadlineExceededError(
                f"{exe} render did not finish within {timeout:g} s", method="render"
            ) from e
        except OSError as e:
            raise CliNotFoundError(
                f"{exe}: cannot be run ({e}). {_HOW_TO_GET_IT}", method="render"
            ) from e
        # Exit 2 is both a result (a request the server rejected) and a
        # report render could not read; only the result writes the files.
        written = all(p.is_file() for p in (*staged.values(), *canary.values()))
        why = done.stderr.strip() or "(no message)"
        if done.returncode == 2 and not written:
            raise InvalidArgumentError(f"{exe} render rejected the report: {why}", method="render")
        if done.returncode not in _RESULT_CODES or not written:
            raise UnknownError(
                f"{exe} render failed (exit {done.returncode}): {why}", method="render"
            )
        for flag, path in staged.items():
            shutil.move(str(path), os.fspath(files[flag]))
    return done


def outputs_inline(response: Mapping[str, Any], report: Report) -> Mapping[str, Any]:
    """A layer call's `response` (protobuf's JSON mapping, `report`'s)
    with each output the server returned by digest given as its data, as
    the client read it with the response (`report`'s reference and
    results): the page draws heatmaps only of outputs carried as data, as
    `sweep --html` keeps them. `response` itself when none went by digest."""

    def by_digest(t: Mapping[str, Any]) -> bool:
        return "digest" in t.get("output", {})

    ref = response.get("reference", {})
    results = response.get("results", [])
    if not by_digest(ref) and not any(by_digest(r) for r in results):
        return response

    def inline(t: Mapping[str, Any], arr: Optional[np.ndarray]) -> Mapping[str, Any]:
        if not by_digest(t) or arr is None:
            return t
        return {**t, "output": json_format.MessageToDict(to_proto(arr))}

    out = dict(response)
    if "reference" in out and report.reference is not None:
        out["reference"] = inline(ref, report.reference.output)
    if "results" in out:
        arrays = {r.config: r.output for r in report.results}
        out["results"] = [inline(r, arrays.get(r.get("config", ""))) for r in results]
    return out
