"""`tensorcheck.torch.check_linears` on the tiny GPT of examples/tiny_gpt.py,
against a live server (conftest.py).

The diagnosis of every layer call is held against what torch computed,
established here independently: our own forward hooks capture each
nn.Linear call's x, W, b and output during the checked run, and
tests/layer_numerics.py decides in numpy float64 which candidate the output
is (bitwise share for 16-bit outputs, rms distance per input rounding for
fp32). What we found, torch 2.15 on this 2-core AMD EPYC (AVX2, no AVX-512,
no native bf16), 2x16 tokens of the tiny GPT:

- fp32: fp32 inputs (the tf32- and bf16-rounded candidates are 1,000 to
  10,000 times further in rms), fp32 accumulation (only 11-17% of the
  elements equal the correctly rounded fp64 result; the rest sit a few ULPs
  off). The bias placement cannot be seen at fp32; the service merges
  cpu:fp32:fused and cpu:fp32:unfused (equivalent) and names fused.
- bf16 and fp16: `fused`: the bias is added to the wider accumulator and the
  sum rounded once. bf16: 99.98-100% of each layer's elements equal
  round_bf16(x·Wᵀ + b), against 67-74% for the unfused two roundings; fp16:
  99.87-99.98% against 68-74%. The few others are one-ULP flips of fp32
  summation order (an fp64 accumulator would match 100%): where we looked
  (fp16, blocks.3.attn.proj), the exact value lay 0.004% and 2% of an ULP
  from the rounding boundary. oneDNN's bf16/fp16 GEMMs need AVX-512
  (torch.ops.mkldnn._is_mkldnn_bf16_supported() is False here), so torch's
  own CPU kernel runs them, accumulating in fp32 in an order of its own:
  its outputs equal torch's fp32 F.linear of the same values, rounded once,
  in 99.96% (bf16) and 99.82% (fp16) of the elements. Inputs are
  [batch, seq, K]; the bias-free lm_head is one rounding of x·Wᵀ.

`test_torch_cpu_linear_numerics_as_documented` keeps that paragraph true
(no server needed).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import tensorcheck  # noqa: E402
import tensorcheck.torch  # noqa: E402
from layer_numerics import Identified, identify, round_to, torch_tolerance_verdict  # noqa: E402
from tiny_gpt_loader import load_tiny_gpt  # noqa: E402

tiny_gpt = load_tiny_gpt()

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# What torch computed on this CPU (module docstring), per storage dtype.
DOCUMENTED = {
    "fp32": {"bias": {"cpu:fp32:fused", "cpu:fp32:unfused"}, "none": {"cpu:fp32:none"}},
    "bf16": {"bias": {"cpu:bf16:fused"}, "none": {"cpu:bf16:none"}},
    "fp16": {"bias": {"cpu:fp16:fused"}, "none": {"cpu:fp16:none"}},
}
LINEAR_NAMES = [
    f"blocks.{i}.{layer}"
    for i in range(tiny_gpt.BLOCKS)
    for layer in ("attn.qkv", "attn.proj", "mlp.up", "mlp.down")
] + ["lm_head"]
BROKEN_LAYER = "blocks.1.mlp.up"
PERTURBED_LAYER = "blocks.2.attn.proj"
NONFINITE_LAYER = "blocks.3.mlp.down"
# Never listens: a check that needs no server proves it made no call.
NOWHERE = "127.0.0.1:1"


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A copy of a tensor's values, bit for bit (bf16 as ml_dtypes.bfloat16)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


@dataclass
class Call:
    """One nn.Linear call as our own hook saw it."""

    name: str
    call: int
    x: np.ndarray
    w: np.ndarray
    b: Optional[np.ndarray]
    y: np.ndarray

    def identify(self, w: Optional[np.ndarray] = None) -> Identified:
        return identify(self.x, self.w if w is None else w, self.b, self.y)


@contextlib.contextmanager
def own_capture(model: nn.Module) -> Iterator[list[Call]]:
    """Our own forward hooks on every nn.Linear, independent of the client's."""
    calls: list[Call] = []
    counts: Counter[str] = Counter()

    def hook(name: str) -> Callable[..., None]:
        def save(mod: nn.Linear, args: tuple[Any, ...], out: torch.Tensor) -> None:
            b = None if mod.bias is None else _numpy(mod.bias)
            calls.append(
                Call(name, counts[name], _numpy(args[0]), _numpy(mod.weight), b, _numpy(out))
            )
            counts[name] += 1

        return save

    handles = [
        m.register_forward_hook(hook(n))
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear)
    ]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def gpt(dtype: torch.dtype) -> nn.Module:
    return tiny_gpt.TorchGPT(seed=0).eval().to(dtype)


def token_ids() -> torch.Tensor:
    return torch.from_numpy(tiny_gpt.make_inputs(batch=2, seq=16, seed=0))


def check(
    model: nn.Module, client: tensorcheck.Client, **kwargs: Any
) -> tuple[tensorcheck.ModelReport, list[Call]]:
    """check_linears on the tiny GPT's tokens, with our capture of the same run."""
    with own_capture(model) as calls:
        report = tensorcheck.torch.check_linears(model, token_ids(), client=client, **kwargs)
    assert [(c.name, c.call) for c in calls] == [(la.name, la.call) for la in report.layers], (
        "check_linears should run the model once and report every nn.Linear call in order"
    )
    return report, calls


def majority(labels: list[Identified]) -> set[str]:
    """The configurations our own identification gives to more than half the calls."""
    votes = Counter(c for label in labels for c in label.configs)
    return {c for c, n in votes.items() if 2 * n > len(labels)}


@pytest.fixture(scope="module")
def runs(client: tensorcheck.Client) -> Callable[[str], tuple[Any, list[Call]]]:
    """The tiny GPT checked once per dtype, shared by the tests of this file."""
    cache: dict[str, tuple[Any, list[Call]]] = {}

    def get(dtype: str) -> tuple[Any, list[Call]]:
        if dtype not in cache:
            cache[dtype] = check(gpt(DTYPES[dtype]), client)
        return cache[dtype]

    return get


# --- what torch does, without a server --------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_torch_cpu_linear_numerics_as_documented(dtype: str) -> None:
    model = gpt(DTYPES[dtype])
    with own_capture(model) as calls, torch.no_grad():
        model(token_ids())
    assert [c.name for c in calls] == LINEAR_NAMES
    for c in calls:
        found = c.identify()
        want = DOCUMENTED[dtype]["none" if c.b is None else "bias"]
        assert found.configs == want, (
            f"{c.name}: torch {torch.__version__} on this CPU computed {found}, where the "
            f"module docstring (and docs/numerics.md) say {sorted(want)}: update them"
        )


# --- the diagnosis names what torch did --------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_each_layer_call_is_diagnosed_as_what_torch_computed(runs: Any, dtype: str) -> None:
    report, calls = runs(dtype)
    wrong = []
    for c, layer in zip(calls, report.layers):
        found = c.identify()
        assert found.precision == dtype, f"{c.name}: our own identification failed: {found}"
        assert layer.dtype == {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]
        assert layer.weight_layout == "out_in"
        assert layer.weight_shape == c.w.shape and layer.input_shape == c.x.shape
        if not found.configs & layer.configs_explaining:
            wrong.append(
                f"{layer.label}: torch computed {found}; the service says best {layer.best}, "
                f"explained by {sorted(layer.configs_explaining)}: {layer.explanation}"
            )
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_unmodified_model_has_no_divergence(runs: Any, dtype: str) -> None:
    report, calls = runs(dtype)
    assert report.consensus in majority([c.identify() for c in calls])
    assert all(la.verdict == "pass" for la in report.layers)
    # torch's outputs are within torch's own tolerance of the exact result too.
    assert all(torch_tolerance_verdict(c.x, c.w, c.b, c.y) == "pass" for c in calls)
    bad = [f"{la.label}: {la.divergence_reason}" for la in report.layers if la.status != "passed"]
    assert not bad, "\n".join(bad)
    assert report.first_divergence() is None
    assert report.passed
    assert tensorcheck.assert_model_parity(report) is report


# --- broken ports -------------------------------------------------------------------


class BiasAfterRounding(nn.Linear):
    """A port's Linear that rounds the matmul to the output dtype, then adds
    the bias (candle's and XLA's order), where torch adds it before rounding."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) + self.bias


def port_with_bias_after_rounding(dtype: torch.dtype) -> nn.Module:
    model = gpt(dtype)
    good = model.get_submodule(BROKEN_LAYER)
    bad = BiasAfterRounding(good.in_features, good.out_features, dtype=dtype)
    bad.weight, bad.bias = good.weight, good.bias
    model.blocks[1].mlp.up = bad
    return model


@pytest.fixture(scope="module")
def broken_run(client: tensorcheck.Client) -> tuple[Any, list[Call]]:
    return check(port_with_bias_after_rounding(torch.bfloat16), client)


def test_bias_added_after_rounding_is_the_first_divergence(broken_run: Any) -> None:
    report, calls = broken_run
    found = {c.name: c.identify() for c in calls}
    # Our own computation: that layer rounds twice, the others once.
    assert found[BROKEN_LAYER].configs == {"cpu:bf16:unfused"}, found[BROKEN_LAYER]
    first = report.first_divergence()
    assert first is not None and first.name == BROKEN_LAYER, report.summary()
    assert "cpu:bf16:unfused" in first.configs_explaining
    assert "cpu:bf16:fused" not in first.configs_explaining
    assert first.divergence_reason and "cpu:bf16:fused" in first.divergence_reason
    assert report.consensus == "cpu:bf16:fused"
    assert first.status == "failed"
    assert [la.name for la in report.layers if la.status != "passed"] == [BROKEN_LAYER]


def test_weights_perturbed_by_one_ulp_against_the_checkpoint(client: tensorcheck.Client) -> None:
    """The port runs with a weight 1 bf16 ULP off in its 4 largest elements;
    `weights=` checks its outputs against the checkpoint's weights."""
    model = gpt(torch.bfloat16)
    checkpoint = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model.get_submodule(PERTURBED_LAYER).weight
    with torch.no_grad():
        largest = weight.abs().flatten().argsort(descending=True)[:4]
        weight.view(-1).view(torch.int16)[largest] += 1  # one ULP away from zero
    assert int((weight != checkpoint[f"{PERTURBED_LAYER}.weight"]).sum()) == 4

    report, calls = check(model, client, weights=checkpoint)

    # Our own computation: with the checkpoint's weight, one rounding of
    # x·Wᵀ + b differs from the port's output in a share of the elements
    # several times the summation-order flips of any clean layer.
    c = next(c for c in calls if c.name == PERTURBED_LAYER)
    original = _numpy(checkpoint[f"{PERTURBED_LAYER}.weight"])
    expected = round_to(
        c.x.astype(np.float64).reshape(-1, c.x.shape[-1]) @ original.astype(np.float64).T
        + c.b.astype(np.float64),
        c.y.dtype,
    )
    differing = float(np.mean(expected != c.y.astype(np.float64).reshape(expected.shape)))
    flips = max(
        1 - c2.identify().shares["fused"]
        for c2 in calls
        if c2.b is not None and c2.name != PERTURBED_LAYER
    )
    assert differing >= 5 * flips and differing * c.y.size >= 10, (differing, flips)

    first = report.first_divergence()
    assert first is not None and first.name == PERTURBED_LAYER, report.summary()
    # The server's verdict: the bulk is rounding of some candidate, but not
    # the perturbed rows; the reason is its sentence, naming only them (a
    # weight row's element changes its output column: out_in layout).
    assert first.diagnosis_verdict == "defect", report.summary()
    assert first.divergence_reason == first.verdict_reason
    d = first.report.diagnosis if first.report is not None else None
    assert d is not None and d.defect is not None and d.defect.columns
    perturbed_rows = {int(i) // weight.shape[1] for i in largest}
    assert {g.index for g in d.defect.columns} <= perturbed_rows, (d.defect, perturbed_rows)
    assert first.status == "failed"
    # The layers before it are those of the checkpoint.
    before = report.layers[: report.layers.index(first)]
    assert before and all(la.status == "passed" for la in before)


def test_one_checkpoint_weight_doubled_is_a_defect_naming_its_output_column(
    client: tensorcheck.Client,
) -> None:
    """The checkpoint holds one weight element of a layer twice what the
    port runs with: checked against it, that layer's diagnosis reads
    defect, with the server's reason naming the output column, and it is
    the first divergence."""
    model = gpt(torch.bfloat16)
    with own_capture(model) as calls, torch.no_grad():
        model(token_ids())
    c = next(c for c in calls if c.name == PERTURBED_LAYER)
    x = c.x.astype(np.float64).reshape(-1, c.x.shape[-1])
    w = c.w.astype(np.float64)
    # The input feature of the largest magnitude, and the weight row whose
    # element there is largest: doubling it moves output column n by
    # x[:, k]·W[n, k] in every row.
    k = int(np.argmax(np.abs(x).max(axis=0)))
    n = int(np.argmax(np.abs(w[:, k])))
    checkpoint = {name: v.clone() for name, v in model.state_dict().items()}
    checkpoint[f"{PERTURBED_LAYER}.weight"][n, k] *= 2  # exact in bfloat16

    # Our own computation: one rounding of x·Wᵀ + b with the checkpoint's
    # weight differs from the port's output in column n, and nowhere else.
    assert c.b is not None
    w_ckpt = w.copy()
    w_ckpt[n, k] *= 2
    expected = round_to(x @ w_ckpt.T + c.b.astype(np.float64), c.y.dtype)
    observed = c.y.astype(np.float64).reshape(expected.shape)
    ours = round_to(x @ w.T + c.b.astype(np.float64), c.y.dtype)
    moved = (expected != ours).any(axis=0)
    assert list(np.flatnonzero(moved)) == [n]
    assert int((expected[:, n] != observed[:, n]).sum()) >= x.shape[0] // 2

    report, _ = check(model, client, weights=checkpoint)

    first = report.first_divergence()
    assert first is not None and first.name == PERTURBED_LAYER, report.summary()
    assert first.status == "failed"
    assert first.diagnosis_verdict == "defect", first.verdict_reason
    # The reason is the server's sentence, as it wrote it.
    assert first.divergence_reason == first.verdict_reason
    assert f"output column {n} \N{LEFT RIGHT ARROW} weight row {n}" in first.divergence_reason
    d = first.report.diagnosis if first.report is not None else None
    assert d is not None and d.defect is not None
    assert [g.index for g in d.defect.columns] == [n]
    as_dict = report.to_dict()
    assert as_dict["first_divergence"]["reason"] == first.verdict_reason
    layer = as_dict["layers"][report.layers.index(first)]
    assert (layer["diagnosis_verdict"], layer["verdict_reason"]) == ("defect", first.verdict_reason)
    # Every other layer call is rounding of what the port ran.
    others = [la for la in report.layers if la is not first]
    assert all(la.status == "passed" for la in others), report.summary()
    assert all(la.diagnosis_verdict == "rounding" for la in others), report.summary()


def test_assert_model_parity_names_the_diverging_layer(
    broken_run: Any, client: tensorcheck.Client
) -> None:
    report, _ = broken_run
    # Layer calls are numbered from 0 in execution order (the table's #).
    where = rf"layer call #{LINEAR_NAMES.index(BROKEN_LAYER)} {BROKEN_LAYER}\b"
    with pytest.raises(AssertionError, match=where) as e:
        tensorcheck.assert_model_parity(report)
    lines = str(e.value).splitlines()
    first = report.first_divergence()
    assert first is not None and first.headline
    assert lines[0] == first.headline and len(lines) <= 25
    # The same from the model, run and checked by assert_model_parity itself.
    with pytest.raises(AssertionError, match=where):
        tensorcheck.assert_model_parity(
            port_with_bias_after_rounding(torch.bfloat16), token_ids(), client=client
        )


def test_compare_models_names_the_broken_layer(runs: Any, broken_run: Any) -> None:
    good, _ = runs("bf16")
    bad, _ = broken_run
    cmp = tensorcheck.compare_models(good, bad, names=("torch", "port"))
    a, b = cmp.first_difference
    assert a.name == BROKEN_LAYER and b.name == BROKEN_LAYER
    differ = [x.name for x, y in cmp.pairs if not (x.configs_explaining & y.configs_explaining)]
    assert differ == [BROKEN_LAYER]
    assert f"First difference: {BROKEN_LAYER}" in cmp.summary()


# --- bad inputs ----------------------------------------------------------------------


def test_model_without_linear_layers_gives_an_empty_report() -> None:
    model = nn.Sequential(nn.Embedding(16, 8), nn.ReLU())
    with pytest.warns(UserWarning, match="ran no torch.nn.Linear"):
        # NOWHERE never answers: any request would fail.
        report = tensorcheck.torch.check_linears(model, torch.arange(4), server=NOWHERE)
    assert report.layers == [] and report.error is None
    assert report.first_divergence() is None and report.consensus is None
    assert not report.passed
    assert "nothing was checked" in report.summary()


@contextlib.contextmanager
def forward_counter(model: nn.Module) -> Iterator[list[int]]:
    """How many times `model` ran, while inside."""
    count = [0]

    def hook(*_: Any) -> None:
        count[0] += 1

    handle = model.register_forward_hook(hook)
    try:
        yield count
    finally:
        handle.remove()


def test_state_dict_with_a_model_prefix_is_an_error_naming_the_keys_and_the_prefix(
    client: tensorcheck.Client,
) -> None:
    """A checkpoint saved from a wrapper ("model." before every key), and a
    port whose weight is 5 times the checkpoint's: no key names a layer of
    the port, so no layer would be checked against the checkpoint."""
    model = gpt(torch.bfloat16)
    checkpoint = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.get_submodule(PERTURBED_LAYER).weight.mul_(5)
    saved = {f"model.{k}": v for k, v in checkpoint.items()}
    keys = sorted(saved)
    assert len(keys) == 53  # 2 embeddings, 4 blocks of 12, ln_f's 2, lm_head's weight

    with forward_counter(model) as ran, pytest.raises(ValueError) as e:
        # NOWHERE never answers: the error comes before any request.
        tensorcheck.torch.check_linears(model, token_ids(), server=NOWHERE, weights=saved)
    message = str(e.value)
    assert ran == [0], "the model ran before its weights= keys were checked"
    assert message.startswith("weights: 53 keys match nothing in TorchGPT"), message
    assert ": " + ", ".join(keys[:10]) + ", ... (43 more); " in message, message
    assert keys[9] == "model.blocks.0.mlp.down.weight"  # sorted, not in model order
    assert (
        'they all start with "model." \N{EM DASH} strip that prefix '
        '(e.g. {k.removeprefix("model."): v for k, v in sd.items()})'
    ) in message, message
    # Under DataParallel's "module." the hint names that one.
    with pytest.raises(ValueError, match=r'they all start with "module\."'):
        tensorcheck.torch.capture_linears(
            model, token_ids(), weights={f"module.{k}": v for k, v in checkpoint.items()}
        )

    # The hint's own fix: every layer checked against the checkpoint, and
    # the one whose weight differs is the first divergence.
    fixed = {k.removeprefix("model."): v for k, v in saved.items()}
    report, _ = check(model, client, weights=fixed)
    first = report.first_divergence()
    assert first is not None and first.name == PERTURBED_LAYER, report.summary()
    # Its output is 5 times what the checkpoint's weight gives: hundreds of
    # times what bfloat16's rounding explains.
    assert first.bound_ratio is not None and first.bound_ratio > 100, report.summary()


def test_weights_key_matching_nothing_is_an_error() -> None:
    model = gpt(torch.bfloat16)
    state = model.state_dict()
    extra = {**state, "blocks.0.mlp.upp.weight": state["blocks.0.mlp.up.weight"]}
    with forward_counter(model) as ran, pytest.raises(ValueError) as e:
        tensorcheck.torch.check_linears(model, token_ids(), server=NOWHERE, weights=extra)
    assert ran == [0]
    assert str(e.value) == (
        "weights: 1 key matches nothing in TorchGPT (its state_dict() keys, or a "
        "torch.nn.Linear's name): blocks.0.mlp.upp.weight"
    )
    # By module name, only a torch.nn.Linear's: a LayerNorm is not checked.
    w = state["blocks.0.mlp.up.weight"]
    with pytest.raises(ValueError, match=r": blocks\.0\.ln1, blocks\.9\.mlp\.up$"):
        tensorcheck.torch.capture_linears(
            model,
            token_ids(),
            weights={"blocks.0.mlp.up": {"weight": w}, "blocks.0.ln1": {}, "blocks.9.mlp.up": w},
        )
    # Several under no common prefix that would help: no hint.
    with pytest.raises(ValueError) as e:
        tensorcheck.torch.capture_linears(
            model, token_ids(), weights={"blocks.7.mlp.up.weight": w, "blocks.8.mlp.up.weight": w}
        )
    assert str(e.value).endswith(": blocks.7.mlp.up.weight, blocks.8.mlp.up.weight")


class _NormedPair(nn.Module):
    """Two Linears around a LayerNorm, and a buffer kept out of the
    state_dict (as GPT-2's attention mask is in recent versions)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.down = nn.Linear(16, 8, bias=False)
        self.register_buffer("mask", torch.ones(16), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.norm(self.up(x)) * self.mask)


def test_weights_with_parameters_that_are_not_checked_are_accepted() -> None:
    """A whole checkpoint: the LayerNorm's weight and bias (and a buffer's
    name) match parameters of the model that no check uses; the Linears'
    keys replace their parameters in what is checked."""
    model = _NormedPair()
    torch.manual_seed(1)
    checkpoint = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    assert set(checkpoint) == {"up.weight", "up.bias", "norm.weight", "norm.bias", "down.weight"}
    checkpoint["mask"] = torch.zeros(16)
    captures = tensorcheck.torch.capture_linears(model, torch.ones(2, 8), weights=checkpoint)
    up, down = captures.items
    assert np.array_equal(up.weight, checkpoint["up.weight"].numpy())
    assert np.array_equal(up.bias, checkpoint["up.bias"].numpy())
    assert np.array_equal(down.weight, checkpoint["down.weight"].numpy()) and down.bias is None
    # The output is still the model's own (the run used its own parameters).
    with torch.no_grad():
        assert np.array_equal(up.output, model.up(torch.ones(2, 8)).numpy())

    # A bias alone replaces the bias only.
    bias = torch.full((16,), 0.5)
    (up, _) = tensorcheck.torch.capture_linears(
        model, torch.ones(2, 8), weights={"up.bias": bias}
    ).items
    assert np.array_equal(up.weight, model.up.weight.detach().numpy())
    assert np.array_equal(up.bias, bias.numpy())
    # The model itself a Linear: its state_dict keys have no prefix.
    lin = nn.Linear(8, 4)
    own = {"weight": torch.zeros(4, 8), "bias": torch.ones(4)}
    (c,) = tensorcheck.torch.capture_linears(lin, torch.ones(2, 8), weights=own).items
    assert c.name == "Linear"
    assert np.array_equal(c.weight, own["weight"].numpy())
    assert np.array_equal(c.bias, own["bias"].numpy())


def test_non_finite_output_is_reported_for_its_layer(client: tensorcheck.Client) -> None:
    model = gpt(torch.bfloat16)
    with torch.no_grad():
        model.get_submodule(NONFINITE_LAYER).weight[7, 3] = math.inf
    report, calls = check(model, client)
    # Our own count: only that layer's own output and what follows it are
    # non-finite (its column 7: x·inf).
    nonfinite = {c.name: int(np.sum(~np.isfinite(c.y.astype(np.float32)))) for c in calls}
    index = LINEAR_NAMES.index(NONFINITE_LAYER)
    assert not any(nonfinite[n] for n in LINEAR_NAMES[:index])
    assert nonfinite[NONFINITE_LAYER] == math.prod(calls[index].y.shape[:-1])
    first = report.first_divergence()
    assert first is not None and first.name == NONFINITE_LAYER, report.summary()
    assert "non-finite" in first.divergence_reason
    assert str(nonfinite[NONFINITE_LAYER]) in first.divergence_reason
    assert first.status in ("failed", "error")
    assert all(la.status == "passed" for la in report.layers[:index])
    # The server's reason (CallDecision.divergence), for the output it observed.
    with pytest.raises(
        AssertionError,
        match=rf"layer call #{index} {NONFINITE_LAYER} \(of \d+, numbered from 0\): its observed",
    ):
        tensorcheck.assert_model_parity(report)


class _KillsServerAt(tensorcheck.Client):
    """A client that kills its server (SIGKILL) just before the request for
    one layer call: the server goes away mid-run at a known point."""

    def __init__(self, server: Any, at: int) -> None:
        super().__init__(server.target, timeout=60)
        self._server, self._at, self._requests = server, at, 0

    def diagnose_linear(self, *args: Any, **kwargs: Any) -> Any:
        if self._requests == self._at:
            self._server.proc.kill()
            self._server.proc.wait()
        self._requests += 1
        return super().diagnose_linear(*args, **kwargs)


def test_server_gone_mid_run_reports_what_was_checked(start_server: Any) -> None:
    """check_linears runs the model first and checks after: a server killed
    from a forward hook leaves every call unchecked, one killed before the
    9th request (jobs=1: in order) leaves the first 8 checked, the 9th an
    `error` (its RPC failed) and the rest `not_checked`, as the CLI's sweep
    and docs/model-checks.md ("The rules") have it."""
    model = gpt(torch.bfloat16)
    srv = start_server()
    try:
        middle = model.get_submodule("blocks.2.attn.qkv")

        def kill(*_: Any) -> None:
            srv.proc.kill()
            srv.proc.wait()

        handle = middle.register_forward_hook(kill)
        try:
            report = tensorcheck.torch.check_linears(model, token_ids(), server=srv.target)
        finally:
            handle.remove()
        assert report.error and len(report.layers) == len(LINEAR_NAMES)
        assert all(la.status == "not_checked" for la in report.layers)
        assert report.checked == [] and not report.passed
        assert "Stopped early" in report.summary()
    finally:
        srv.stop()

    srv = start_server()
    try:
        with _KillsServerAt(srv, at=8) as cl:
            report = tensorcheck.torch.check_linears(model, token_ids(), client=cl, jobs=1)
    finally:
        srv.stop()
    statuses = [la.status for la in report.layers]
    rest = len(LINEAR_NAMES) - 9
    assert statuses == ["passed"] * 8 + ["error"] + ["not_checked"] * rest, statuses
    assert [la.name for la in report.checked] == LINEAR_NAMES[:8]
    assert report.error and report.layers[8].error
    assert report.layers[8].error_code == "UNAVAILABLE"
    assert all(la.error is None for la in report.layers[9:])
    assert not report.passed and report.first_divergence() is None
    assert f"8 of {len(LINEAR_NAMES)} layer calls checked" in report.summary()
    with pytest.raises(AssertionError):
        tensorcheck.assert_model_parity(report)


class _Raises(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the model's own error")


def test_hooks_are_removed_when_the_model_raises() -> None:
    model = nn.Sequential(nn.Linear(8, 8), _Raises(), nn.Linear(8, 8))
    global_hooks = dict(torch.nn.modules.module._global_forward_hooks)
    with pytest.raises(RuntimeError, match="the model's own error"):
        tensorcheck.torch.check_linears(model, torch.ones(2, 8), server=NOWHERE)
    for name, m in model.named_modules():
        assert not m._forward_hooks and not m._forward_pre_hooks, name
    assert dict(torch.nn.modules.module._global_forward_hooks) == global_hooks
    # And after a run that completes: the model runs unobserved afterwards.
    ok = nn.Sequential(nn.Linear(8, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tensorcheck.torch.check_linears(ok, torch.ones(2, 8), server=NOWHERE)
    assert not ok[0]._forward_hooks


# --- the tensor store -------------------------------------------------------------


def _distinct_parameter_bytes(model: nn.Module) -> int:
    """Bytes of the nn.Linear weights and biases, each tensor once however
    many layers share it."""
    seen: dict[int, int] = {}
    for m in model.modules():
        if isinstance(m, nn.Linear):
            for p in (m.weight, m.bias):
                if p is not None:
                    seen[id(p)] = p.numel() * p.element_size()
    return sum(seen.values())


class _TiedPair(nn.Module):
    """`a` called twice, `b` holding a's weight: one weight, three calls."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(512, 512)
        self.b = nn.Linear(512, 512)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(torch.tanh(self.b(self.a(x))))


def test_weights_uploaded_once_and_not_again(start_server: Any) -> None:
    srv = start_server()  # a store of its own: it holds nothing yet
    try:
        with tensorcheck.Client(srv.target, timeout=120) as cl:
            tied = _TiedPair()
            report = tensorcheck.torch.check_linears(tied, torch.randn(4, 512), client=cl)
            assert [la.label for la in report.layers] == ["a", "b", "a#1"]
            assert (
                report.uploaded_bytes == _distinct_parameter_bytes(tied) == (512 * 512 + 1024) * 4
            )
            assert cl.capabilities().store.uploaded_bytes == report.uploaded_bytes

            model = gpt(torch.bfloat16)
            first = tensorcheck.torch.check_linears(model, token_ids(), client=cl)
            expected = _distinct_parameter_bytes(model)
            assert first.uploaded_bytes == expected
            second = tensorcheck.torch.check_linears(model, token_ids(), client=cl)
            assert second.uploaded_bytes == 0
            assert second.reused_bytes == expected
            assert second.sent_bytes <= 0.3 * first.sent_bytes, (
                second.sent_bytes,
                first.sent_bytes,
            )
            # What the server itself counts: each tensor once.
            assert cl.capabilities().store.uploaded_bytes == report.uploaded_bytes + expected
            assert first.passed and second.passed
    finally:
        srv.stop()
