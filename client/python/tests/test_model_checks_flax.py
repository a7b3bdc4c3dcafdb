"""`tensorcheck.flax.check_denses` on the Flax tiny GPT of
examples/tiny_gpt.py, against a live server (conftest.py).

As in test_model_checks.py, every Dense call's diagnosis is held against
what XLA computed, established here independently: our own
`flax.linen.intercept_methods` interceptor captures each Dense call's x,
kernel, bias and output during the checked `apply`, and
tests/layer_numerics.py decides in numpy float64 which candidate the
output is. What we found, jax/jaxlib 0.10 and flax 0.12 on this 2-core AMD
EPYC (XLA:CPU), 2x16 tokens:

- fp32: fp32 inputs (tf32- and bf16-rounded candidates 1,000 to 10,000
  times further in rms), fp32 accumulation (7-20% of the elements equal the
  correctly rounded fp64 result). Bias placement invisible at fp32, as for
  torch.
- bf16: `unfused`: 99.99-100% of each layer's elements equal
  round_bf16(round_bf16(x·W) + b), against 69-74% for one rounding. XLA
  computes the bf16 dot in fp32, converts the result to bf16, and adds the
  bias as a separate op (in fp32, rounded to bf16 again). Under `jax.jit`
  too: the compiled HLO keeps the convert to bf16 and back between the dot
  and the add (`convert(convert(dot))` is not simplified away), and a jitted
  Dense gives the eager one's bits, which
  `test_xla_cpu_dense_numerics_as_documented` checks.

So on a CPU, torch's and Flax's bf16 Linear differ in every layer with a
bias, by one bf16 ULP in about 26-31% of the elements: fused against
unfused, the candle case of the README without a GPU.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import pytest

pytest.importorskip("flax", reason="flax is not installed")

import flax.linen as fnn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import tensorcheck  # noqa: E402
import tensorcheck.flax  # noqa: E402
from layer_numerics import BF16, Identified, identify, torch_tolerance_verdict  # noqa: E402
from tiny_gpt_loader import load_tiny_gpt  # noqa: E402

tiny_gpt = load_tiny_gpt()

DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}
DOCUMENTED = {
    "fp32": {"bias": {"cpu:fp32:fused", "cpu:fp32:unfused"}, "none": {"cpu:fp32:none"}},
    "bf16": {"bias": {"cpu:bf16:unfused"}, "none": {"cpu:bf16:none"}},
}
DENSE_NAMES = [
    f"blocks_{i}.{layer}"
    for i in range(tiny_gpt.BLOCKS)
    for layer in ("attn.qkv", "attn.proj", "mlp.up", "mlp.down")
] + ["lm_head"]


@dataclass
class Call:
    """One Dense call as our own interceptor saw it (`w`: the kernel
    transposed to [N, K], as layer_numerics takes it)."""

    name: str
    x: np.ndarray
    w: np.ndarray
    b: Optional[np.ndarray]
    y: np.ndarray

    def identify(self) -> Identified:
        return identify(self.x, self.w, self.b, self.y)


@contextlib.contextmanager
def own_capture() -> Iterator[list[Call]]:
    """Our own interceptor on every Dense call, independent of the client's."""
    calls: list[Call] = []

    def intercept(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        out = next_fun(*args, **kwargs)
        mod = context.module
        if isinstance(mod, fnn.Dense) and context.method_name == "__call__":
            p = mod.variables["params"]
            b = np.asarray(p["bias"]).copy() if "bias" in p else None
            calls.append(
                Call(
                    ".".join(mod.path),
                    np.asarray(args[0]).copy(),
                    np.asarray(p["kernel"]).T.copy(),
                    b,
                    np.asarray(out).copy(),
                )
            )
        return out

    with fnn.intercept_methods(intercept):
        yield calls


def token_ids() -> jax.Array:
    return jnp.asarray(tiny_gpt.make_inputs(batch=2, seq=16, seed=0))


def variables(dtype: Any) -> Any:
    """FlaxGPT's own deterministic initialisation (nonzero biases), in `dtype`."""
    v = tiny_gpt.FlaxGPT().init(jax.random.PRNGKey(0), token_ids())
    return jax.tree_util.tree_map(lambda a: a.astype(dtype), v)


def check(v: Any, client: tensorcheck.Client) -> tuple[Any, list[Call]]:
    with own_capture() as calls:
        report = tensorcheck.flax.check_denses(tiny_gpt.FlaxGPT(), v, token_ids(), client=client)
    assert [c.name for c in calls] == [la.name for la in report.layers], (
        "check_denses should apply the model once and report every Dense call in order"
    )
    return report, calls


@pytest.fixture(scope="module")
def runs(client: tensorcheck.Client) -> Callable[[str], tuple[Any, list[Call]]]:
    cache: dict[str, tuple[Any, list[Call]]] = {}

    def get(dtype: str) -> tuple[Any, list[Call]]:
        if dtype not in cache:
            cache[dtype] = check(variables(DTYPES[dtype]), client)
        return cache[dtype]

    return get


@jax.jit
def _jitted_dense(params: Any, x: jax.Array) -> jax.Array:
    """One Dense, compiled as a whole by XLA (once per shape)."""
    dense = fnn.Dense(params["kernel"].shape[1], use_bias="bias" in params)
    return dense.apply({"params": params}, x)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_xla_cpu_dense_numerics_as_documented(dtype: str) -> None:
    v = variables(DTYPES[dtype])
    with own_capture() as calls:
        tiny_gpt.FlaxGPT().apply(v, token_ids())
    assert [c.name for c in calls] == DENSE_NAMES
    for c in calls:
        found = c.identify()
        want = DOCUMENTED[dtype]["none" if c.b is None else "bias"]
        assert found.configs == want, (
            f"{c.name}: jax {jax.__version__} on this CPU computed {found}, where the "
            f"module docstring (and docs/numerics.md) say {sorted(want)}: update them"
        )
        # Compiled by jax.jit, the Dense gives the same bits as op by op.
        params = {"kernel": jnp.asarray(c.w.T)}
        if c.b is not None:
            params["bias"] = jnp.asarray(c.b)
        jitted = np.asarray(_jitted_dense(params, jnp.asarray(c.x)))
        assert jitted.dtype == c.y.dtype
        assert np.array_equal(jitted.view(np.uint8), c.y.view(np.uint8)), c.name


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_each_dense_call_is_diagnosed_as_what_xla_computed(runs: Any, dtype: str) -> None:
    report, calls = runs(dtype)
    assert [la.name for la in report.layers] == DENSE_NAMES
    wrong = []
    for c, layer in zip(calls, report.layers):
        found = c.identify()
        assert found.precision == dtype, f"{c.name}: our own identification failed: {found}"
        assert layer.weight_layout == "in_out"
        assert layer.weight_shape == c.w.T.shape and layer.input_shape == c.x.shape
        assert layer.dtype == {"fp32": "float32", "bf16": "bfloat16"}[dtype]
        if not found.configs & layer.configs_explaining:
            wrong.append(
                f"{layer.label}: XLA computed {found}; the service says best {layer.best}, "
                f"explained by {sorted(layer.configs_explaining)}: {layer.explanation}"
            )
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_unmodified_flax_model_has_no_divergence(
    runs: Any, dtype: str, client: tensorcheck.Client
) -> None:
    """No divergence, and every layer passes the default (error-model,
    "bound") tolerance. torch's tolerance, asked for, fails XLA's bf16 layers
    with a bias against the exact reference: the double rounding is a full
    bf16 ULP of x·W where x·W and b nearly cancel, far outside rtol of the
    tiny output; which layers fail it is computed here."""
    report, calls = runs(dtype)
    labels = [c.identify() for c in calls]
    votes = Counter(cfg for label in labels for cfg in label.configs)
    assert report.consensus in {cfg for cfg, n in votes.items() if 2 * n > len(labels)}
    assert report.first_divergence() is None
    bad = [f"{la.label}: {la.divergence_reason}" for la in report.layers if la.status != "passed"]
    assert not bad, "\n".join(bad)
    assert all(la.verdict == "pass" for la in report.layers)
    assert tensorcheck.assert_model_parity(report) is report

    v = variables(DTYPES[dtype])
    with own_capture() as strict_calls:
        strict = tensorcheck.flax.check_denses(
            tiny_gpt.FlaxGPT(), v, token_ids(), client=client, tolerance="torch"
        )
    verdicts = [torch_tolerance_verdict(c.x, c.w, c.b, c.y) for c in strict_calls]
    assert [la.verdict for la in strict.layers] == verdicts
    if dtype == "bf16":
        assert verdicts.count("fail") == len(verdicts) - 1  # all but the bias-free lm_head
    assert strict.first_divergence() is None
    assert strict.passed == all(v == "pass" for v in verdicts)


def test_torch_and_flax_differ_exactly_in_the_layers_with_a_bias(
    client: tensorcheck.Client,
) -> None:
    """The same bf16 weights in both frameworks (torch_to_flax_params): the
    comparison pairs the layers by `mapping` and parts them in every layer
    whose bias each framework places differently, by our own computation."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import tensorcheck.torch

    model = tiny_gpt.TorchGPT(seed=0).eval().to(torch.bfloat16)
    torch_calls: dict[str, Identified] = {}

    def hook(name: str) -> Callable[..., None]:
        def save(mod: Any, args: Any, out: Any) -> None:
            def arr(t: Any) -> np.ndarray:  # bf16 values, exactly (via fp32)
                return t.detach().float().numpy().astype(BF16)

            b = None if mod.bias is None else arr(mod.bias)
            torch_calls[name] = identify(arr(args[0]), arr(mod.weight), b, arr(out))

        return save

    handles = [
        m.register_forward_hook(hook(n))
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    ]
    try:
        torch_report = tensorcheck.torch.check_linears(
            model, torch.from_numpy(tiny_gpt.make_inputs(batch=2, seq=16, seed=0)), client=client
        )
    finally:
        for h in handles:
            h.remove()
    flax_report, flax_calls = check(tiny_gpt.torch_to_flax_params(model), client)

    mapping = {n: tiny_gpt.flax_name(n) for n in torch_calls}
    flax_found = {c.name: c.identify() for c in flax_calls}
    expected = [
        n for n in torch_calls if not torch_calls[n].configs & flax_found[mapping[n]].configs
    ]
    assert len(expected) == len(DENSE_NAMES) - 1  # all but the bias-free lm_head

    cmp = tensorcheck.compare_models(
        torch_report, flax_report, mapping=mapping, names=("torch", "flax")
    )
    assert all(a is not None and b is not None for a, b in cmp.pairs)
    differ = [a.name for a, b in cmp.pairs if not (a.configs_explaining & b.configs_explaining)]
    assert differ == expected
    a, b = cmp.first_difference
    assert (a.name, b.name) == ("blocks.0.attn.qkv", "blocks_0.attn.qkv")
    assert "cpu:bf16:fused" in a.configs_explaining and "cpu:bf16:unfused" in b.configs_explaining
    text = cmp.summary()
    assert "torch: cpu:bf16:fused" in text and "flax: cpu:bf16:unfused" in text
