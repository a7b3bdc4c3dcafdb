"""A tiny GPT in PyTorch and in Flax, and every linear layer of it checked.

The model: 4 pre-LayerNorm blocks of width 256 with 4 attention heads and an
MLP of 1024 (GELU, tanh form), learned positions, vocabulary 512. The torch
model ties `lm_head.weight` to the token embedding, as GPT-2 does; the Flax
model is the same architecture with `nn.Dense` layers, whose kernels are the
transposed torch weights (`torch_to_flax_params`), so both run on the same
numbers.

    python examples/tiny_gpt.py [--server localhost:50051]

runs `tensorcheck.torch.check_linears` on the torch model in fp32, bf16 and
fp16, `tensorcheck.flax.check_denses` on the Flax model in fp32 and bf16,
prints each report's summary, and compares torch with Flax layer by layer.
On a CPU, torch adds a Linear's bias to the fp32 accumulator and rounds once
(`fused`), XLA rounds the matmul, then adds the bias (`unfused`): in bf16 the
comparison names every layer with a bias.

The test suite (tests/test_model_checks*.py) imports this file for its model.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import ml_dtypes
import numpy as np

# Each half works without the other framework installed.
try:
    import torch
    import torch.nn.functional as F
    from torch import nn

    _TorchModule: Any = nn.Module
except ImportError:
    torch = None
    _TorchModule = object
try:
    import flax.linen as fnn
    import jax
    import jax.numpy as jnp

    _FlaxModule: Any = fnn.Module
except ImportError:
    fnn = None
    _FlaxModule = object

VOCAB = 512
WIDTH = 256
HEADS = 4
MLP = 1024
BLOCKS = 4
MAX_SEQ = 64
LN_EPS = 1e-5


def make_inputs(batch: int = 2, seq: int = 16, seed: int = 0) -> np.ndarray:
    """Token ids [batch, seq] (int32); the same ones on every host for a given seed."""
    return np.random.default_rng(seed).integers(0, VOCAB, size=(batch, seq), dtype=np.int32)


# --- PyTorch -----------------------------------------------------------------


class TorchAttention(_TorchModule):
    """Causal multi-head self-attention: one `qkv` projection, one `proj`."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, _ = h.shape
        q, k, v = self.qkv(h).split(WIDTH, dim=-1)
        # [b, t, width] -> [b, heads, t, head_dim]
        q, k, v = (z.view(b, t, HEADS, WIDTH // HEADS).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(WIDTH // HEADS)
        causal = torch.ones(t, t, dtype=torch.bool, device=h.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out = scores.softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, WIDTH))


class TorchMLP(_TorchModule):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, MLP)
        self.down = nn.Linear(MLP, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(h), approximate="tanh"))


class TorchBlock(_TorchModule):
    """Pre-LayerNorm: h + attn(ln1(h)), then h + mlp(ln2(h))."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH, eps=LN_EPS)
        self.attn = TorchAttention()
        self.ln2 = nn.LayerNorm(WIDTH, eps=LN_EPS)
        self.mlp = TorchMLP()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.ln1(h))
        return h + self.mlp(self.ln2(h))


class TorchGPT(_TorchModule):
    """The tiny GPT. Linear layers, in execution order: blocks.{i}.attn.qkv,
    blocks.{i}.attn.proj, blocks.{i}.mlp.up, blocks.{i}.mlp.down for i in
    0..3, then lm_head (no bias; its weight is the token embedding's)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, WIDTH)
        self.pos_emb = nn.Embedding(MAX_SEQ, WIDTH)
        self.blocks = nn.ModuleList(TorchBlock() for _ in range(BLOCKS))
        self.ln_f = nn.LayerNorm(WIDTH, eps=LN_EPS)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied: one tensor, two uses
        self._init(seed)

    def _init(self, seed: int) -> None:
        # GPT-2's scales, but biases and LayerNorm parameters drawn too (a
        # trained model has them): a zero bias would make a fused and an
        # unfused bias compute the same output, and there would be nothing
        # to tell the frameworks apart by.
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():  # the tied weight once
                noise = torch.randn(p.shape, generator=g)
                module, kind = name.split(".")[-2:]
                is_ln_scale = module in ("ln1", "ln2", "ln_f") and kind == "weight"
                p.copy_(1 + 0.1 * noise if is_ln_scale else 0.02 * noise)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        h = self.tok_emb(ids) + self.pos_emb(positions)
        for block in self.blocks:
            h = block(h)
        return self.lm_head(self.ln_f(h))


# --- Flax --------------------------------------------------------------------


def _normal(scale: float, mean: float = 0.0) -> Any:
    """A Flax initializer: mean + scale * N(0, 1), as TorchGPT draws its parameters."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return mean + scale * jax.random.normal(key, shape, dtype)

    return init


def _dense(features: int, use_bias: bool = True) -> fnn.Dense:
    # kernel [in, out]: torch's weight transposed
    return fnn.Dense(
        features, use_bias=use_bias, kernel_init=_normal(0.02), bias_init=_normal(0.02)
    )


def _layer_norm() -> fnn.LayerNorm:
    return fnn.LayerNorm(epsilon=LN_EPS, scale_init=_normal(0.1, mean=1.0))


class FlaxAttention(_FlaxModule):
    def setup(self) -> None:
        self.qkv = _dense(3 * WIDTH)
        self.proj = _dense(WIDTH)

    def __call__(self, h: jax.Array) -> jax.Array:
        b, t, _ = h.shape
        q, k, v = jnp.split(self.qkv(h), 3, axis=-1)
        q, k, v = (z.reshape(b, t, HEADS, WIDTH // HEADS).transpose(0, 2, 1, 3) for z in (q, k, v))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(WIDTH // HEADS)
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(causal, scores, -jnp.inf)
        out = jax.nn.softmax(scores, axis=-1) @ v
        return self.proj(out.transpose(0, 2, 1, 3).reshape(b, t, WIDTH))


class FlaxMLP(_FlaxModule):
    def setup(self) -> None:
        self.up = _dense(MLP)
        self.down = _dense(WIDTH)

    def __call__(self, h: jax.Array) -> jax.Array:
        return self.down(jax.nn.gelu(self.up(h), approximate=True))


class FlaxBlock(_FlaxModule):
    def setup(self) -> None:
        self.ln1 = _layer_norm()
        self.attn = FlaxAttention()
        self.ln2 = _layer_norm()
        self.mlp = FlaxMLP()

    def __call__(self, h: jax.Array) -> jax.Array:
        h = h + self.attn(self.ln1(h))
        return h + self.mlp(self.ln2(h))


class FlaxGPT(_FlaxModule):
    """The same model. Dense layers, in execution order: blocks_{i}.attn.qkv,
    blocks_{i}.attn.proj, blocks_{i}.mlp.up, blocks_{i}.mlp.down, lm_head
    (a Dense of its own without bias; `torch_to_flax_params` puts the torch
    embedding there, transposed). Computes in the dtype of its parameters.
    `FlaxGPT().init(jax.random.PRNGKey(seed), ids)` draws parameters as
    TorchGPT does (biases and LayerNorm scales too), from JAX's generator;
    `torch_to_flax_params` gives the torch model's own."""

    def setup(self) -> None:
        self.tok_emb = fnn.Embed(VOCAB, WIDTH, embedding_init=_normal(0.02))
        self.pos_emb = fnn.Embed(MAX_SEQ, WIDTH, embedding_init=_normal(0.02))
        self.blocks = [FlaxBlock() for _ in range(BLOCKS)]  # named blocks_0 .. blocks_3
        self.ln_f = _layer_norm()
        self.lm_head = _dense(VOCAB, use_bias=False)

    def __call__(self, ids: jax.Array) -> jax.Array:
        h = self.tok_emb(ids) + self.pos_emb(jnp.arange(ids.shape[1]))
        for block in self.blocks:
            h = block(h)
        return self.lm_head(self.ln_f(h))


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """A torch tensor's values as numpy, bit for bit (bf16 as ml_dtypes.bfloat16)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def torch_to_flax_params(model: TorchGPT) -> dict[str, Any]:
    """FlaxGPT's variables holding `model`'s parameters exactly, in their dtype:
    a Linear's weight [out, in] becomes the Dense kernel [in, out]."""
    sd = {k: _to_numpy(v) for k, v in model.state_dict().items()}

    def dense(name: str) -> dict[str, Any]:
        p = {"kernel": jnp.asarray(sd[f"{name}.weight"].T)}
        if f"{name}.bias" in sd:
            p["bias"] = jnp.asarray(sd[f"{name}.bias"])
        return p

    def layer_norm(name: str) -> dict[str, Any]:
        return {"scale": jnp.asarray(sd[f"{name}.weight"]), "bias": jnp.asarray(sd[f"{name}.bias"])}

    params: dict[str, Any] = {
        "tok_emb": {"embedding": jnp.asarray(sd["tok_emb.weight"])},
        "pos_emb": {"embedding": jnp.asarray(sd["pos_emb.weight"])},
        "ln_f": layer_norm("ln_f"),
        "lm_head": dense("lm_head"),  # the tied weight, transposed: a copy of its own in Flax
    }
    for i in range(BLOCKS):
        t = f"blocks.{i}"
        params[f"blocks_{i}"] = {
            "ln1": layer_norm(f"{t}.ln1"),
            "attn": {"qkv": dense(f"{t}.attn.qkv"), "proj": dense(f"{t}.attn.proj")},
            "ln2": layer_norm(f"{t}.ln2"),
            "mlp": {"up": dense(f"{t}.mlp.up"), "down": dense(f"{t}.mlp.down")},
        }
    return {"params": params}


def flax_name(torch_name: str) -> str:
    """The Flax layer name of a torch Linear's: blocks.1.mlp.up -> blocks_1.mlp.up."""
    parts = torch_name.split(".")
    if parts[0] == "blocks":
        return ".".join([f"blocks_{parts[1]}", *parts[2:]])
    return torch_name


def main() -> None:
    import tensorcheck
    import tensorcheck.flax
    import tensorcheck.torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--server",
        default=None,
        help="tensorcheck server host:port (default: $TENSORCHECK_SERVER, else localhost:50051)",
    )
    args = parser.parse_args()

    model = TorchGPT(seed=0).eval()
    ids = make_inputs(batch=2, seq=16, seed=0)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    mapping = {n: flax_name(n) for n in names}

    with tensorcheck.Client(args.server, timeout=600) as client:
        torch_reports = {}
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            m = TorchGPT(seed=0).eval().to(dtype)  # .to() keeps lm_head tied
            # One forward pass (under no_grad), every nn.Linear call checked.
            report = tensorcheck.torch.check_linears(m, torch.from_numpy(ids), client=client)
            print(f"== torch {dtype}\n{report.summary()}\n")
            torch_reports[dtype] = report

        flax_reports = {}
        variables = torch_to_flax_params(model)
        for dtype in (jnp.float32, jnp.bfloat16):
            v = jax.tree_util.tree_map(lambda a, dt=dtype: a.astype(dt), variables)
            report = tensorcheck.flax.check_denses(FlaxGPT(), v, jnp.asarray(ids), client=client)
            print(f"== flax {jnp.dtype(dtype)}\n{report.summary()}\n")
            flax_reports[dtype] = report

    # Layer by layer: which configuration explains torch's output, which
    # Flax's. In fp32 both accumulate in fp32 from fp32 inputs on a CPU; in
    # bf16 every layer with a bias parts: torch fused, XLA unfused.
    for torch_dtype, flax_dtype in ((torch.float32, jnp.float32), (torch.bfloat16, jnp.bfloat16)):
        print(f"== torch vs flax, {jnp.dtype(flax_dtype)}")
        print(
            tensorcheck.compare_models(
                torch_reports[torch_dtype],
                flax_reports[flax_dtype],
                mapping=mapping,
                names=("torch", "flax"),
            )
        )


if __name__ == "__main__":
    main()
