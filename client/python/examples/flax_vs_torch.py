"""Why does Flax's nn.Dense disagree with torch.nn.Linear in fp32?

The Flax case (the repository's README): a 2x768 -> 512 fp32 layer, max abs difference
~1e-3 between the two frameworks on an A100. JAX computes fp32 matmuls in
TF32 by default on Ampere and newer GPUs; PyTorch (>= 1.12) does not. This
script asks a tensorcheck server which configuration each output matches.

    python examples/flax_vs_torch.py [--server HOST:PORT]   # default $TENSORCHECK_SERVER

The "flax" output comes from Flax/JAX when they run on a GPU. Elsewhere
(JAX on CPU computes true fp32) it is emulated as a GPU would compute it:
inputs rounded to TF32, products summed in fp32. The "torch" output is
torch.nn.functional.linear on the CPU, or numpy fp32 without torch.
"""

from __future__ import annotations

import argparse

import numpy as np

import tensorcheck


def tf32(a: np.ndarray) -> np.ndarray:
    """Round fp32 to TF32 (10 mantissa bits, round to nearest even)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x0FFF + ((u >> 13) & 1)) & ~np.uint64(0x1FFF)
    return u.astype(np.uint32).view(np.float32)


def flax_output(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray):
    """nn.Dense(512) applied to x, as Flax on an Ampere GPU computes it."""
    try:
        import jax

        if jax.default_backend() == "gpu":
            import jax.numpy as jnp

            try:
                import flax.linen as nn

                dense = nn.Dense(kernel.shape[1])
                params = {"params": {"kernel": jnp.asarray(kernel), "bias": jnp.asarray(bias)}}
                return np.asarray(dense.apply(params, jnp.asarray(x))), "flax on GPU"
            except ImportError:
                return np.asarray(jnp.asarray(x) @ jnp.asarray(kernel) + bias), "jax on GPU"
    except ImportError:
        pass
    y = tf32(x) @ tf32(kernel)  # fp32 GEMM on TF32-rounded inputs
    return (y + bias).astype(np.float32), "TF32 emulation in numpy"


def torch_output(x: np.ndarray, weight: np.ndarray, bias: np.ndarray):
    """torch.nn.Linear's forward with this weight (fp32, no TF32)."""
    try:
        import torch
    except ImportError:
        return (x @ weight.T + bias).astype(np.float32), "numpy fp32"
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default since 1.12
    y = torch.nn.functional.linear(
        torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias)
    )
    return y.numpy(), "torch fp32"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--server",
        default=None,
        help="tensorcheck server host:port (default: $TENSORCHECK_SERVER, else localhost:50051)",
    )
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 768)).astype(np.float32)
    kernel = (rng.standard_normal((768, 512)) / np.sqrt(768)).astype(np.float32)  # flax [K, N]
    bias = np.zeros(512, np.float32)

    y_flax, flax_how = flax_output(x, kernel, bias)
    y_torch, torch_how = torch_output(x, kernel.T.copy(), bias)
    diff = np.abs(y_flax.astype(np.float64) - y_torch)
    print(
        f"flax ({flax_how}) vs torch ({torch_how}): max abs diff {diff.max():.3g}, "
        f"max rel diff {(diff / np.abs(y_torch)).max():.3g}\n"
    )

    with tensorcheck.Client(args.server, timeout=60) as client:
        # 0. The answer in one call: what each output is, and whether their
        #    difference is rounding (the server's headline first).
        result = client.compare_outputs(
            x, kernel, bias, {"torch": y_torch, "flax": y_flax}, weight_layout="in_out"
        )
        print(result, "\n")

        # 1. Does the Flax output pass against an fp64 reference, with torch's
        #    fp32 tolerance? It does not: the server's answer first, then a
        #    torch-style report of by how much.
        try:
            client.assert_linear_parity(x, kernel, bias, observed=y_flax, weight_layout="in_out")
            print("flax output passes against the fp64 reference")
        except AssertionError as e:
            print(e, "\n")
        # ... and it passes when TF32 is what you accept.
        client.assert_linear_parity(
            x, kernel, bias, observed=y_flax, weight_layout="in_out", accept=["tf32"]
        )
        print("flax output accepted as TF32 rounding\n")

        # 2. The numbers behind it: fp32 and TF32 against the reference and
        #    against what Flax produced.
        report = client.verify_linear(
            x,
            kernel,
            bias,
            observed=y_flax,
            weight_layout="in_out",
            configs=["cpu:fp32", "cpu:tf32"],
        )
        print(
            f"{'config':<18} {'max abs vs fp64':>16} {'max abs vs flax':>16} {'bitwise = flax':>15}"
        )
        for r in report.results:
            print(
                f"{r.config:<18} {r.vs_reference.max_abs:>16.3g} "
                f"{r.vs_observed.max_abs:>16.3g} "
                f"{r.vs_observed.bitwise_equal_count / r.vs_observed.total:>14.1%}"
            )

        # 3. And the torch output is plain fp32.
        report = client.diagnose_linear(
            x,
            kernel,
            bias,
            observed=y_torch,
            weight_layout="in_out",
            candidates=["cpu:fp32", "cpu:tf32"],
        )
        print(f"\ntorch output: {report.diagnosis.headline or report.diagnosis.best}")


if __name__ == "__main__":
    main()
