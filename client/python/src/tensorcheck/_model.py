"""Whole-model checks: every linear layer call of a model, one report.

`tensorcheck.torch.check_linears` and `tensorcheck.flax.check_denses`
capture each linear layer call (input, weight, bias, output) and hand the
captures to `check_captures` here, which checks them against the server:
each distinct weight and bias goes through the tensor store once (tied
weights once, and not again on the next run of the same model), then one
Diagnose (or Verify) per layer call, at most `jobs` in flight. The result
is a `ModelReport`: one `LayerCheck` per call in execution order, the
model's consensus configuration and its first divergence; docs/model-checks.md
describes the rules, the JSON form (the CLI's `tensorcheck sweep --json`
prints the same keys) and the captures file.

The modules stack without a loop: `_model_types` (what is captured and
found per layer call), `_model_output` (how a report reads), this core,
then the framework modules (`torch`, `flax`) that call it, and
`_model_parity` (assert_model_parity), which reaches them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional, TextIO, Union

import numpy as np

from ._client import Client, _Transfer
from ._errors import DeadlineExceededError, Error, UnavailableError, UnimplementedError
from ._model_output import describe_configs, format_comparison, format_summary
from ._model_types import (
    DEFAULT_BOUND_THRESHOLD,
    ERROR,
    FAILED,
    PASSED,
    Capture,
    Captures,
    LayerCheck,
)
from ._options import VerifyOptions, fold_options
from ._render import outputs_inline, render
from ._safetensors import save_safetensors
from ._store import INLINE_MAX_BYTES, TensorRef

__all__ = [
    "Capture",
    "Captures",
    "LayerCheck",
    "ModelReport",
    "ModelComparison",
    "check_captures",
    "check_weight_keys",
    "compare_models",
    "describe_configs",
    "DEFAULT_BOUND_THRESHOLD",
    "DEFAULT_JOBS",
    "DEFAULT_TOLERANCE",
]

# Requests in flight at once.
DEFAULT_JOBS = 4
# A layer's verdict: is every element within the error bound of its output
# precision (docs/numerics.md)? That is the whole-model question, "more
# than its precision explains"; "torch" (assert_close's rtol) would fail
# every layer that adds its bias after rounding, where x·W and b cancel.
DEFAULT_TOLERANCE = "bound"


# --- `weights=` keys --------------------------------------------------------------

# Unmatched `weights=` keys a message lists at most.
_LISTED_KEYS = 10


def _strippable_prefix(keys: Sequence[str], known: Collection[str]) -> Optional[str]:
    """The shortest dotted prefix ("model.", "module.", "_orig_mod.") that
    every key starts with and whose removal makes at least one of them
    known; None when there is none."""
    parts = keys[0].split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i]) + "."
        if not all(k.startswith(prefix) for k in keys):
            return None
        if any(k[len(prefix) :] in known for k in keys):
            return prefix
    return None


def check_weight_keys(weights: Mapping[Any, Any], known: Collection[str], where: str) -> None:
    """Raises ValueError naming the keys of a `weights=` mapping that are
    not in `known` (what they may name in the model, `where` saying what
    that is), before anything runs: a key that matches nothing would
    otherwise be ignored and its layer checked against the model's own
    parameters. Sorted, the first _LISTED_KEYS and a count; with the prefix
    to strip when they all carry one (a state_dict saved from a wrapper)."""
    unmatched = sorted(str(k) for k in weights if not (isinstance(k, str) and k in known))
    if not unmatched:
        return
    listed = ", ".join(unmatched[:_LISTED_KEYS])
    if len(unmatched) > _LISTED_KEYS:
        listed += f", ... ({len(unmatched) - _LISTED_KEYS} more)"
    keys = "key matches" if len(unmatched) == 1 else "keys match"
    message = f"weights: {len(unmatched)} {keys} nothing in {where}: {listed}"
    prefix = _strippable_prefix(unmatched, known)
    if prefix is not None:
        message += (
            f'; they all start with "{prefix}" \N{EM DASH} strip that prefix '
            f'(e.g. {{k.removeprefix("{prefix}"): v for k, v in sd.items()}})'
        )
    raise ValueError(message)


def _over_threshold(layer: LayerCheck, threshold: Optional[float]) -> Optional[str]:
    """Why the layer call's bound_ratio is over `threshold` (None: the one
    its request sent, or the server's default) as "bound_ratio 7.2 exceeds
    3", or None when it is not."""
    call = layer.report.call if layer.report is not None else None
    assert call is not None, "only a checked layer call is judged"
    if threshold is None or threshold == call.bound_threshold:
        # The server decided it, at the threshold the request sent.
        return call.bound_reason if call.bound_exceeded else None
    # Any other threshold is a what-if (first_divergence(threshold=t), a
    # report made with another bound_threshold) that the response cannot
    # carry: the one place where the client applies a per-call rule, the
    # server's own (docs/model-checks.md, "The rules"): a bound_ratio not
    # at most the threshold exceeds it, NaN included.
    ratio = layer.bound_ratio
    if ratio is None or ratio <= threshold:
        return None
    return f"bound_ratio {ratio:.3g} exceeds {threshold:g}"


def _divergence(
    layer: LayerCheck,
    threshold: Optional[float],
    consensus: Optional[str],
    explained_by: int,
    checked: int,
    expected: Optional[set[str]] = None,
) -> Optional[str]:
    """Why a checked layer call diverges, the first that applies: its own
    divergence (the server's `call.divergence`), the configurations
    explaining it exclude the `expected` ones, else the consensus
    (`explained_by` of the `checked` layer calls match it), or its
    bound_ratio is over `threshold`; None when none applies."""
    call = layer.report.call if layer.report is not None else None
    assert call is not None, "only a checked layer call is judged"
    if call.divergence:
        return call.divergence
    # Only a diagnosed call names configurations (Verify: `explaining` is empty).
    if call.explained and call.explaining:
        if expected is not None:
            if not expected & set(call.explaining):
                return f"matches {layer.best}, not the expected {', '.join(sorted(expected))}"
        elif consensus is not None and consensus not in call.explaining:
            return (
                f"matches {layer.best}, while {explained_by} of {checked} layers match {consensus}"
            )
    return _over_threshold(layer, threshold)


@dataclasses.dataclass
class ModelReport:
    """Every linear layer call of one model run, in execution order.

    report.layers                 # [LayerCheck, ...]
    report.first_divergence()     # the first layer not explained, or None
    report.consensus              # "cpu:bf16:fused": what most layers match
    report.passed                 # every layer passed, every one checked
    print(report.summary())       # the table
    report.to_dict()              # the JSON report
    report.to_junit(path), report.to_html(path), report.to_github()
                                  # drawn from it by `tensorcheck render`
    report.save_captures(path)    # for `tensorcheck sweep --captures`

    The server decides each layer call's part (`layer.report.call`:
    which configurations explain it, whether it diverges on its own,
    whether its bound_ratio exceeds the threshold); the report decides
    only what spans calls, the consensus and the first divergence
    (docs/model-checks.md, "The rules"). `bound_threshold` is the
    threshold the run sent with each request (None: none, the server's
    default, DEFAULT_BOUND_THRESHOLD, applied; `applied_bound_threshold`
    says which one was), `diagnose` whether it diagnosed each layer call
    (else Verify only): the run's options that to_dict() records, as
    `tensorcheck sweep --json` does.

    `error` is set when the run stopped early (the server went away):
    the layer call whose request failed is "error", those not sent yet
    "not_checked". `uploaded_bytes` counts what
    went to the tensor store (weights, large activations), `sent_bytes`
    that plus the tensors sent inline in the requests: what this run put
    on the wire in tensors.
    """

    layers: list[LayerCheck]
    framework: str = ""
    model: str = ""
    bound_threshold: Optional[float] = None
    error: Optional[str] = None
    uploaded_bytes: int = 0
    reused_bytes: int = 0
    sent_bytes: int = 0
    elapsed_s: float = 0.0
    captures: list[Capture] = dataclasses.field(default_factory=list, repr=False)
    diagnose: bool = True

    def __post_init__(self) -> None:
        self._grade()

    # --- the rules --------------------------------------------------------

    def _consensus(self) -> tuple[Optional[str], int, int]:
        """(config, layer calls it explains, layer calls checked)."""
        checked = self.checked
        votes: Counter[str] = Counter()
        bests: Counter[str] = Counter()
        for layer in checked:
            call = layer.report.call if layer.report is not None else None
            assert call is not None
            votes.update(call.explaining)
            if call.explaining:
                bests[call.explaining[0]] += 1
        if not votes:
            return None, 0, len(checked)
        # Most layers first; among equals, the one that is `best` most
        # often, then the greater name.
        config, count = max(votes.items(), key=lambda kv: (kv[1], bests[kv[0]], kv[0]))
        if 2 * count <= len(checked):
            return None, count, len(checked)
        return config, count, len(checked)

    @property
    def applied_bound_threshold(self) -> float:
        """The bound_ratio threshold the layer calls are judged by: the
        run's (`bound_threshold`), else the one the server applied by
        default (its responses name it), else DEFAULT_BOUND_THRESHOLD."""
        if self.bound_threshold is not None:
            return self.bound_threshold
        for layer in self.layers:
            call = None if layer.report is None else layer.report.call
            if call is not None:
                return call.bound_threshold
        return DEFAULT_BOUND_THRESHOLD

    @property
    def consensus(self) -> Optional[str]:
        """The configuration explaining the most checked layer calls, when
        it explains more than half of them; else None."""
        return self._consensus()[0]

    def _grade(self) -> None:
        consensus, count, checked = self._consensus()
        for layer in self.layers:
            if not layer.checked:
                continue
            layer.divergence_reason = _divergence(
                layer, self.bound_threshold, consensus, count, checked
            )
            diverged = layer.divergence_reason is not None
            layer.status = FAILED if diverged or layer.verdict == "fail" else PASSED

    def first_divergence(
        self, threshold: Optional[float] = None, expected: Union[None, str, Iterable[str]] = None
    ) -> Optional[LayerCheck]:
        """The first layer call (in execution order) that diverges: by the
        server's decision about it alone (non-finite output, a "defect" or
        "unexplained" verdict, no candidate explaining it), by matching
        only configurations other than the `expected` ones (default: the
        consensus), or by a bound_ratio over the threshold. None when
        there is none. Its `divergence_reason` says which rule it broke.

        `threshold` None is the run's (`bound_threshold`), at which the
        server decided each layer call's bound_ratio; any other is a what-if
        the responses cannot answer, judged here by the server's rule: a
        bound_ratio not at most `threshold` (NaN included) exceeds it."""
        threshold = self.bound_threshold if threshold is None else float(threshold)
        want = None
        if expected is not None:
            want = {expected} if isinstance(expected, str) else set(expected)
        consensus, count, checked = self._consensus()
        for layer in self.layers:
            if not layer.checked:
                continue
            reason = _divergence(layer, threshold, consensus, count, checked, want)
            if reason is not None:
                layer.divergence_reason = reason
                return layer
        return None

    @property
    def checked(self) -> list[LayerCheck]:
        return [layer for layer in self.layers if layer.checked]

    @property
    def passed(self) -> bool:
        """Every layer call checked and passed (and there was at least one)."""
        return (
            bool(self.layers)
            and self.error is None
            and all(layer.status == PASSED for layer in self.layers)
        )

    # --- output ---------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of docs/model-checks.md (`tensorcheck sweep --json`
        prints the same keys)."""
        first = self.first_divergence()
        # What was checked titles the rendered page; the keys are there
        # only when set, as the CLI writes them.
        named = {k: v for k, v in (("framework", self.framework), ("model", self.model)) if v}
        return {
            "layers": [layer.to_dict() for layer in self.layers],
            "first_divergence": (
                None
                if first is None
                else {
                    "name": first.name,
                    "call": first.call,
                    "index": self.layers.index(first),
                    "reason": first.divergence_reason,
                }
            ),
            "consensus": self.consensus,
            "layers_checked": len(self.checked),
            "layers_total": len(self.layers),
            "passed": self.passed,
            "uploaded_bytes": self.uploaded_bytes,
            "reused_bytes": self.reused_bytes,
            "sent_bytes": self.sent_bytes,
            "error": self.error,
            "diagnose": self.diagnose,
            "bound_threshold": self.bound_threshold,
            **named,
        }

    def summary(self) -> str:
        return format_summary(self)

    def __str__(self) -> str:
        return self.summary()

    # --- the artifacts `tensorcheck render` draws from to_dict() ----------------
    #
    # One renderer per artifact (docs/model-checks.md, "tensorcheck render"):
    # the CLI's, which `tensorcheck sweep` writes its own with. It is found
    # as `cli=` says, else $TENSORCHECK_CLI, else `tensorcheck` on PATH
    # (tensorcheck.CliNotFoundError when it is not there).

    def _render_dict(self) -> dict[str, Any]:
        """to_dict(), which render reads: each checked layer call's
        response is what it decides the rest from again."""
        d = self.to_dict()
        for layer, j in zip(self.layers, d["layers"]):
            if layer.report is not None and j["response"] is None:
                raise ValueError(
                    f"layer call {layer.label}: its report no longer holds the server's response "
                    "(a copied or unpickled report), which tensorcheck render draws from"
                )
        return d

    def to_junit(
        self, path: Union[str, os.PathLike[str]], *, cli: Union[None, str, os.PathLike[str]] = None
    ) -> None:
        """Writes the JUnit XML of `tensorcheck render --junit`: one test
        case per layer call (a failed one with its reason, an `error` one
        as an error, a `not_checked` one skipped)."""
        render(self._render_dict(), {"--junit": path}, cli=cli)

    def to_html(
        self, path: Union[str, os.PathLike[str]], *, cli: Union[None, str, os.PathLike[str]] = None
    ) -> None:
        """Writes the page of `tensorcheck render --html`: bound_ratio across
        depth, the table of layer calls, then each layer call's report
        (ranking, histograms, and, for a check run with
        `return_outputs=True`, heatmaps of the observed output, which go to
        render as a temporary captures file)."""
        d = self._render_dict()
        for layer, j in zip(self.layers, d["layers"]):
            if layer.report is not None and j["response"] is not None:
                j["response"] = outputs_inline(j["response"], layer.report)
        # The observed outputs matter only beside outputs the responses carry.
        carried = any(
            "output" in (j["response"] or {}).get("reference", {})
            or any("output" in r for r in (j["response"] or {}).get("results", []))
            for j in d["layers"]
        )
        if not carried or len(self.captures) != len(self.layers):
            render(d, {"--html": path}, cli=cli)
            return
        with tempfile.TemporaryDirectory(prefix="tensorcheck-html-") as tmp:
            captures = os.path.join(tmp, "outputs.safetensors")
            self._write_captures(captures, inputs=False)
            render(d, {"--html": path}, captures=captures, cli=cli)

    def to_github(
        self,
        summary: Union[None, str, os.PathLike[str]] = None,
        *,
        cli: Union[None, str, os.PathLike[str]] = None,
    ) -> str:
        """The GitHub Actions output of `tensorcheck render --github`:
        returns the annotations (an `::error` line per failed layer call;
        print them in the job's log) and appends the Markdown summary to
        `summary`, default $GITHUB_STEP_SUMMARY (none when unset)."""
        env = None if summary is None else {"GITHUB_STEP_SUMMARY": os.fspath(summary)}
        return render(self._render_dict(), {}, ["--github"], env=env, cli=cli).stdout

    def save_captures(self, path: Union[str, os.PathLike[str]], *, weights: bool = False) -> None:
        """Writes the captures file of docs/model-checks.md: `{layer}.input`
        and `{layer}.output` per call (`{layer}#1.input` for a second call),
        the execution order in the metadata; with weights=True also each
        layer's `{layer}.weight` (or `.kernel` for IN_OUT) and `.bias`, so
        that the file alone feeds `tensorcheck sweep`."""
        if not self.captures:
            raise ValueError(
                "save_captures: this report holds no captures (a report built "
                "from JSON, or a model without linear layers)"
            )
        self._write_captures(path, weights=weights)

    def _write_captures(
        self, path: Union[str, os.PathLike[str]], *, inputs: bool = True, weights: bool = False
    ) -> None:
        """save_captures' file; without `inputs`, the outputs alone (the
        observed outputs that `tensorcheck render --captures` reads)."""
        tensors: dict[str, np.ndarray] = {}
        for c in self.captures:
            if inputs:
                tensors[f"{c.label}.input"] = c.input
            tensors[f"{c.label}.output"] = c.output
            if weights and c.call == 0:
                kind = "weight" if c.weight_layout == "out_in" else "kernel"
                tensors[f"{c.name}.{kind}"] = c.weight
                if c.bias is not None:
                    tensors[f"{c.name}.bias"] = c.bias
        order = json.dumps([c.label for c in self.captures])
        write_safetensors(path, tensors, {"tensorcheck.layers": order})


# --- checking -------------------------------------------------------------------


def write_safetensors(
    path: Union[str, os.PathLike[str]],
    tensors: Mapping[str, np.ndarray],
    metadata: Optional[Mapping[str, str]] = None,
) -> None:
    """A .safetensors file of `tensors` (see tensorcheck.save_safetensors)."""
    save_safetensors(path, tensors, metadata)


class _Progress:
    """ "layers 12/24" on stderr, redrawn in place; off unless asked or a
    terminal."""

    def __init__(self, total: int, enabled: Optional[bool], stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._total = total
        self._done = 0
        self._lock = threading.Lock()
        self._on = enabled if enabled is not None else bool(stream.isatty())

    def step(self) -> None:
        with self._lock:
            self._done += 1
            if self._on:
                width = 30
                filled = width * self._done // max(self._total, 1)
                self._stream.write(
                    f"\rtensorcheck: [{'#' * filled}{'.' * (width - filled)}] "
                    f"layers {self._done}/{self._total}"
                )
                self._stream.flush()

    def close(self) -> None:
        if self._on and self._done:
            self._stream.write("\n")
            self._stream.flush()


def _lost_server(e: BaseException) -> bool:
    """An error after which no further request can succeed: the server went
    away, or the caller's deadline passed."""
    return isinstance(e, (UnavailableError, DeadlineExceededError))


def check_captures(
    captures: Sequence[Capture],
    *,
    client: Optional[Client] = None,
    server: Optional[str] = None,
    diagnose: bool = True,
    jobs: int = DEFAULT_JOBS,
    progress: Optional[bool] = None,
    bound_threshold: Optional[float] = None,
    framework: str = "",
    model: str = "",
    options: Optional[VerifyOptions] = None,
    **overrides: Any,
) -> ModelReport:
    """Checks captured layer calls on a server; see the module docstring.

    `client` (a tensorcheck.Client) or `server` ("host:port", default
    $TENSORCHECK_SERVER, else localhost:50051) says where. `options` (a
    tensorcheck.VerifyOptions) and the keyword arguments `overrides` (its
    fields, applied over it) go to every layer call's diagnose_linear /
    verify_linear (e.g. `reference`, `atol`, `return_outputs=True` for
    heatmaps in to_html), with these differences: `configs` are the
    candidates (diagnose) or configurations (verify) for every layer, None
    all the server offers (diagnose) / the server's default (verify);
    `tolerance` None is DEFAULT_TOLERANCE ("bound"); `timeout` bounds each
    request (and the weights' uploads); each call's `weight_layout` is its
    capture's (a TypeError as a keyword argument), and the options'
    `progress` is not used: `progress` here is the layers' bar.
    `bound_threshold` is the options' field of that name (a keyword wins):
    each request's, the server deciding each layer call's bound_ratio by it;
    None: the options', else the server's default (3).
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: expected a positive integer, got {jobs!r}")
    if client is not None and server is not None:
        raise TypeError("server: give either client= or server=, not both")
    if "weight_layout" in overrides:
        raise TypeError("weight_layout: a model check takes each layer call's from its capture")
    if bound_threshold is not None:
        overrides = {**overrides, "bound_threshold": bound_threshold}
    opts = fold_options(options, overrides, "check_captures")
    opts = dataclasses.replace(opts, tolerance=opts.tolerance or DEFAULT_TOLERANCE, progress=None)
    layers = [
        LayerCheck(
            name=c.name,
            call=c.call,
            input_shape=tuple(c.input.shape),
            weight_shape=tuple(c.weight.shape),
            weight_layout=c.weight_layout,
            dtype=str(c.input.dtype),
        )
        for c in captures
    ]
    report = ModelReport(
        layers,
        framework=framework,
        model=model,
        bound_threshold=opts.bound_threshold,
        captures=list(captures),
        diagnose=diagnose,
    )
    if not captures:
        return report
    own = client is None
    cl = Client(server, timeout=opts.timeout) if own else client
    assert cl is not None
    started = time.monotonic()
    try:
        _run(cl, captures, report, opts, diagnose, jobs, progress)
    finally:
        if own:
            cl.close()
    report.elapsed_s = time.monotonic() - started
    report._grade()
    return report


def model_check_overrides(
    where: str, verify_options: Optional[Mapping[str, Any]], **given: Any
) -> dict[str, Any]:
    """The options of check_linears and check_denses, which take the
    model's own keyword arguments: their `verify_options` mapping, and
    those of `given` (configs=, tolerance=, timeout=) that are not None.
    TypeError for one given both ways."""
    overrides = dict(verify_options or {})
    for name, value in given.items():
        if value is None:
            continue
        if name in overrides:
            raise TypeError(f"{where}() got multiple values for keyword argument {name!r}")
        overrides[name] = value
    return overrides


def _run(
    cl: Client,
    captures: Sequence[Capture],
    report: ModelReport,
    options: VerifyOptions,
    diagnose: bool,
    jobs: int,
    progress: Optional[bool],
) -> None:
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="tensorcheck-model")
    try:
        method = "Diagnose" if diagnose else "Verify"
        try:
            refs = _store_parameters(cl, captures, pool, report, options.timeout)
        except Error as e:
            if not _lost_server(e):
                raise
            # Named as the call the run makes, not the store's RPC.
            report.error = str(cl._reachable(e, method))
            for layer in report.layers:
                layer.error = report.error
            return
        bar = _Progress(len(captures), progress)
        stop = threading.Event()
        lock = threading.Lock()

        def check(i: int) -> None:
            if stop.is_set():
                return
            c, layer = captures[i], report.layers[i]
            weight = refs.get(id(c.weight), c.weight)
            bias = None if c.bias is None else refs.get(id(c.bias), c.bias)
            # Diagnose ranks the options' `configs` as candidates; Verify
            # runs them.
            call = cl.diagnose_linear if diagnose else cl.verify_linear
            try:
                r = call(
                    c.input,
                    weight,
                    bias,
                    observed=c.output,
                    options=options,
                    weight_layout=c.weight_layout,
                )
            except Error as e:
                # Its RPC failed: `error`, also when the server went away
                # (then the calls not yet sent stay `not_checked`), as the
                # CLI's sweep marks it (docs/model-checks.md, "The rules").
                layer.status = ERROR
                layer.error = str(e)
                layer.error_code = e.code.name
                if _lost_server(e):
                    stop.set()
                    with lock:
                        report.error = report.error or str(e)
                return
            finally:
                bar.step()
            layer._fill(r)
            inline = sum(a.nbytes for a in (c.input, c.output) if a.nbytes <= INLINE_MAX_BYTES)
            with lock:
                # (The weights' reuse is counted once, in _store_parameters.)
                report.uploaded_bytes += r.uploaded_bytes
                report.sent_bytes += r.uploaded_bytes + inline

        futures: list[Future[None]] = [pool.submit(check, i) for i in range(len(captures))]
        for f in futures:
            f.result()
        bar.close()
    finally:
        pool.shutdown(wait=True)


def _store_parameters(
    cl: Client,
    captures: Sequence[Capture],
    pool: ThreadPoolExecutor,
    report: ModelReport,
    timeout: Optional[float],
) -> dict[int, TensorRef]:
    """Puts every distinct weight and bias in the server's store (what it
    already holds is only asked about, never sent) and returns their refs
    by id() of the captured array. A server without a store gets them
    inline in each request instead (an empty result)."""
    distinct: dict[int, np.ndarray] = {}
    for c in captures:
        distinct.setdefault(id(c.weight), c.weight)
        if c.bias is not None:
            distinct.setdefault(id(c.bias), c.bias)
    arrays = list(distinct.values())
    refs = list(pool.map(TensorRef.of, arrays))
    by_digest = {r.digest: (r, a) for r, a in zip(refs, arrays)}
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        # One FindMissingTensors for the whole model, then the uploads of
        # what the store lacks, several at once.
        missing = set(cl._find_missing([r for r, _ in by_digest.values()], deadline))
    except UnimplementedError:  # a server without a store: all inline
        return {}
    transfer = _Transfer()
    cl._upload_refs(
        [r for d, (r, _) in by_digest.items() if d in missing],
        {d: a for d, (_, a) in by_digest.items()},
        deadline,
        transfer,
    )
    stored = transfer.uploaded_bytes
    report.uploaded_bytes += stored
    report.sent_bytes += stored
    report.reused_bytes += sum(r.size_bytes for r, _ in by_digest.values()) - stored
    return {id(a): r for r, a in zip(refs, arrays)}


# --- two models side by side ------------------------------------------------------


@dataclasses.dataclass
class ModelComparison:
    """Two ModelReports paired layer by layer (`compare_models`).

    `pairs`: (a's layer, b's layer or None), in a's execution order, then
    b's layers that a lacks as (None, layer). `first_difference` is the
    first pair whose explaining configurations have nothing in common.
    """

    names: tuple[str, str]
    reports: tuple[ModelReport, ModelReport]
    pairs: list[tuple[Optional[LayerCheck], Optional[LayerCheck]]]

    @property
    def first_difference(self) -> Optional[tuple[Optional[LayerCheck], Optional[LayerCheck]]]:
        for a, b in self.pairs:
            if a is None or b is None:
                continue
            if not (a.configs_explaining & b.configs_explaining) or (a.explained != b.explained):
                return a, b
        return None

    def summary(self) -> str:
        return format_comparison(self)

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> dict[str, Any]:
        first = self.first_difference
        return {
            "names": list(self.names),
            "described": [describe_configs(r) for r in self.reports],
            "layers": [
                {
                    "name": (a or b).label if (a or b) else None,  # type: ignore[union-attr]
                    self.names[0]: None if a is None else a.to_dict(),
                    self.names[1]: None if b is None else b.to_dict(),
                }
                for a, b in self.pairs
            ],
            "first_difference": (
                None if first is None else [None if x is None else x.label for x in first]
            ),
        }


def compare_models(
    report_a: ModelReport,
    report_b: ModelReport,
    mapping: Optional[Mapping[str, str]] = None,
    names: tuple[str, str] = ("a", "b"),
) -> ModelComparison:
    """Pairs the layers of two reports (two frameworks, or a model and its
    port) by name, or by `mapping` {a's layer name: b's layer name} for
    layers named differently; each module's calls pair in order.

        cmp = tensorcheck.compare_models(torch_report, flax_report,
                                         names=("torch", "flax"))
        print(cmp.summary())   # torch: cpu:bf16:fused everywhere
                               # flax: cpu:bf16:unfused everywhere ...
    """
    for r, what in ((report_a, "report_a"), (report_b, "report_b")):
        if not isinstance(r, ModelReport):
            raise TypeError(f"{what}: expected a tensorcheck ModelReport, got {type(r).__name__}")
    if len(names) != 2 or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"names: expected two non-empty strings, got {names!r}")
    mapping = dict(mapping or {})
    by_key = {(layer.name, layer.call): layer for layer in report_b.layers}
    used: set[tuple[str, int]] = set()
    pairs: list[tuple[Optional[LayerCheck], Optional[LayerCheck]]] = []
    for a in report_a.layers:
        key = (mapping.get(a.name, a.name), a.call)
        b = by_key.get(key)
        if b is not None:
            used.add(key)
        pairs.append((a, b))
    pairs.extend((None, b) for k, b in by_key.items() if k not in used)
    return ModelComparison((names[0], names[1]), (report_a, report_b), pairs)
