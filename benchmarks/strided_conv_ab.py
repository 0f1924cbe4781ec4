"""Same-run A/B timings behind round five's strided-convolution choices, each against PyTorch eager, interleaved.

    python -m functional_gan.benchmarks.strided_conv_ab forms      # D's passes: direct against space-to-depth
    python -m functional_gan.benchmarks.strided_conv_ab budgets    # every conv's forward and kernel gradient: chunk budgets
    python -m functional_gan.benchmarks.strided_conv_ab step 64    # the DCGAN step at batch 64: (forward, kernel gradient) budgets

Each JAX program takes its output cotangent as an argument (a constant one is folded into the program); the forms and
budgets are read when a program is traced, so each variant is traced and compiled on its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from functional_gan import layers
from functional_gan.benchmarks.timing import blocking, interleaved_times

BUDGETS = {"8MiB": 8 << 20, "1MiB": 1 << 20, "2MiB": 2 << 20, "4MiB": 4 << 20, "whole": 1 << 40}
STEP_BUDGETS = {"8/8": (8 << 20, 8 << 20), "whole/2": (1 << 40, 2 << 20), "8/2": (8 << 20, 2 << 20),
                "whole/8": (1 << 40, 8 << 20)}


def _case(ctx, rng, batch, transposed, cin, cout, size, stride, padding):
    """The bench's own case (:func:`.workloads._conv_case`: the cotangent an argument) as (JAX arguments, the three JAX
    passes as functions of them, PyTorch's three passes as the bench times them)."""
    import torch

    from functional_gan.benchmarks.workloads import _conv_case, _torch_conv_pass

    x, w, op, x_j, w_j, _, cot = _conv_case(rng, batch, transposed, cin, cout, size, stride, padding)
    x_t, w_t = torch.tensor(x), torch.tensor(w)
    cot_t = torch.tensor(np.asarray(cot).transpose(0, 3, 1, 2).copy())
    function = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d

    def torch_forward():
        with torch.no_grad():
            function(x_t, w_t, stride=stride, padding=padding)

    def torch_backward(mask):
        run = _torch_conv_pass(ctx, transposed, stride, padding, mask)
        return lambda: run(cot_t, x_t, w_t)

    torch_passes = {"forward": torch_forward, "input gradient": torch_backward([True, False, False]),
                    "kernel gradient": torch_backward([False, True, False])}
    jax_passes = {"forward": lambda a, b, g: op(a, b, stride, padding),
                  "input gradient": lambda a, b, g: jax.vjp(lambda a_: op(a_, b, stride, padding), a)[1](g)[0],
                  "kernel gradient": lambda a, b, g: jax.vjp(lambda b_: op(a, b_, stride, padding), b)[1](g)[0]}
    return (x_j, w_j, cot), jax_passes, torch_passes


def _timed(label: str, variants: dict, torch_fn, repeats: int) -> None:
    times = interleaved_times({**variants, "torch": torch_fn}, repeats)
    median = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{label:52s} " + "  ".join(f"{k} {median[k] / median['torch']:.2f}x" for k in variants)
          + f"  (torch {median['torch']:.1f} ms)", flush=True)


def forms(batch: int, repeats: int) -> None:
    """D's strided convolutions, pass by pass: the direct form against the space-to-depth form."""
    from functional_gan.benchmarks.timing import Context

    ctx, rng = Context(repeats, with_torch_compile=False), np.random.default_rng(0)
    for cin, cout, size in ((3, 64, 64), (64, 128, 32), (128, 256, 16), (256, 512, 8)):
        args, jax_passes, torch_passes = _case(ctx, rng, batch, False, cin, cout, size, 2, 1)
        for which, fn in jax_passes.items():
            variants = {}
            for form in layers.STRIDED_CONV_FORMS:
                os.environ[layers.STRIDED_CONV_FORM_ENV] = form
                compiled = jax.jit(fn).lower(*args).compile()
                variants[form] = blocking(lambda c=compiled: c(*args))
            os.environ.pop(layers.STRIDED_CONV_FORM_ENV)
            _timed(f"D {cin}→{cout} @{size} {which}", variants, torch_passes[which], repeats)


def budgets(batch: int, repeats: int) -> None:
    """Every convolution of the step: forward and kernel gradient under each chunk budget."""
    from functional_gan.benchmarks.timing import Context
    from functional_gan.benchmarks.workloads import network_layers
    from functional_gan.config import TUTORIAL

    ctx, rng = Context(repeats, with_torch_compile=False), np.random.default_rng(0)
    saved = layers.CPU_CONV_CHUNK_BYTES, layers.CPU_CONV_GRADIENT_CHUNK_BYTES
    for name, transposed, cin, cout, size, stride, padding in network_layers(TUTORIAL)[0]:
        args, jax_passes, torch_passes = _case(ctx, rng, batch, transposed, cin, cout, size, stride, padding)
        for which in ("forward", "kernel gradient"):
            if which == "forward" and transposed:  # the transposed forward is not chunked
                continue
            variants = {}
            for label, budget in BUDGETS.items():
                layers.CPU_CONV_CHUNK_BYTES = layers.CPU_CONV_GRADIENT_CHUNK_BYTES = budget
                compiled = jax.jit(jax_passes[which]).lower(*args).compile()
                variants[label] = blocking(lambda c=compiled: c(*args))
            _timed(f"{name} {which}", variants, torch_passes[which], repeats)
    layers.CPU_CONV_CHUNK_BYTES, layers.CPU_CONV_GRADIENT_CHUNK_BYTES = saved


def step(batch: int, repeats: int) -> None:
    """The DCGAN step (the tutorial's nets, 64×64) under each (forward, kernel gradient) chunk budget."""
    from functional_gan.benchmarks import workloads
    from functional_gan.benchmarks.timing import Context
    from functional_gan.config import TUTORIAL
    from functional_gan.train import init_state, make_train_step

    ctx = Context(repeats, with_torch_compile=False)
    config = dataclasses.replace(TUTORIAL, batch_size=batch)
    real = np.random.default_rng(0).uniform(-1, 1, (batch, 3, 64, 64)).astype(np.float32)
    real_NHWC = jax.device_put(jnp.asarray(real.transpose(0, 2, 3, 1)))
    saved = layers.CPU_CONV_CHUNK_BYTES, layers.CPU_CONV_GRADIENT_CHUNK_BYTES
    runs = {}
    for label, (forward, gradient) in STEP_BUDGETS.items():
        layers.CPU_CONV_CHUNK_BYTES, layers.CPU_CONV_GRADIENT_CHUNK_BYTES = forward, gradient
        state = init_state(config)
        start = time.perf_counter()
        compiled = make_train_step(config).lower(state, real_NHWC).compile()
        print(f"{label}: compile {time.perf_counter() - start:.1f} s", flush=True)
        holder = {"state": state}

        def run(compiled=compiled, holder=holder):
            holder["state"], metrics = compiled(holder["state"], real_NHWC)
            return metrics

        runs[label] = blocking(run)
    layers.CPU_CONV_CHUNK_BYTES, layers.CPU_CONV_GRADIENT_CHUNK_BYTES = saved
    torch_runs, _, _ = workloads._torch_steps(ctx, config, real)
    _timed(f"DCGAN step, batch {batch}", runs, torch_runs["torch_eager"], repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m functional_gan.benchmarks.strided_conv_ab",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("forms", "budgets", "step"))
    parser.add_argument("batch", type=int, nargs="?", default=64)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    {"forms": forms, "budgets": budgets, "step": step}[args.what](args.batch, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
