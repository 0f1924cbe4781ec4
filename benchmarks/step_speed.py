"""Time one DCGAN iteration in JAX and in PyTorch on the same batch, side by side in one run.

    python benchmarks/step_speed.py                     # batch 64, the tutorial's 64×64 nets
    python benchmarks/step_speed.py --batch-sizes 16 64 128 --repeats 10

Reports, per batch size: compile time (JAX, apart), median step time of the jitted JAX step and
of PyTorch's eager tutorial iteration (and torch.compile with --torch-compile), the ratio
JAX / PyTorch (below 1 means JAX is faster), and the achieved GFLOP/s as a fraction of the
machine's measured peak (a 2048² float32 matmul in the same run). FLOPs are PyTorch's
FlopCounterMode count of one tutorial iteration (2 per multiply-add, convolutions only).

It also times the transposed-convolution kernel gradient with the custom VJP and with JAX's own
derivative of the dilated convolution (the XLA CPU slow path of NOTES-performance).
Threads: PyTorch gets as many threads as JAX's CPU client uses (all cores), unless --threads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from comparisons import torch_reference  # noqa: E402
from functional_gan.config import TrainConfig  # noqa: E402
from functional_gan.layers import conv_transpose2d, conv_transpose2d_reference  # noqa: E402
from functional_gan.train import init_state, make_train_step  # noqa: E402


def median_seconds(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_medians(first, second, repeats: int, warmup: int = 2) -> tuple[float, float]:
    """Median seconds of two functions timed alternately, so that a change in machine load hits both alike."""
    for _ in range(warmup):
        first()
        second()
    times_first, times_second = [], []
    for _ in range(repeats):
        for fn, times in ((first, times_first), (second, times_second)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times_first), statistics.median(times_second)


def matmul_peak_gflops(repeats: int = 5) -> tuple[float, float]:
    n = 2048
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    jax_s = median_seconds(lambda: f(a).block_until_ready(), repeats)
    t = torch.ones((n, n))
    torch_s = median_seconds(lambda: t @ t, repeats)
    flops = 2 * n**3
    return flops / jax_s / 1e9, flops / torch_s / 1e9


def tutorial_iteration_flops(config: TrainConfig, batch: int) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    net_g, net_d = torch_reference.make_models(config.nz, config.ngf, config.ndf, config.nc, config.image_size)
    opt_g, opt_d = torch_reference.make_optimizers(net_g, net_d)
    real = torch.rand(batch, config.nc, config.image_size, config.image_size) * 2 - 1
    noise = torch.randn(batch, config.nz, 1, 1)
    with FlopCounterMode(display=False) as counter:
        torch_reference.tutorial_iteration(net_g, net_d, opt_g, opt_d, torch.nn.BCELoss(), real, noise)
    return float(counter.get_total_flops())


def bench_batch(config: TrainConfig, batch: int, repeats: int, torch_compile: bool) -> dict:
    rng = np.random.default_rng(0)
    real_NCHW = rng.uniform(-1, 1, (batch, config.nc, config.image_size, config.image_size)).astype(np.float32)

    # JAX: compile apart, then the steady state.
    state = init_state(config)
    real_NHWC = jnp.asarray(real_NCHW.transpose(0, 2, 3, 1))
    start = time.perf_counter()
    step = make_train_step(config).lower(state, real_NHWC).compile()
    compile_s = time.perf_counter() - start
    holder = {"state": state}

    def jax_step():
        holder["state"], metrics = step(holder["state"], real_NHWC)
        jax.block_until_ready(metrics)

    # PyTorch: the tutorial's eager iteration on the same batch.
    net_g, net_d = torch_reference.make_models(config.nz, config.ngf, config.ndf, config.nc, config.image_size)
    opt_g, opt_d = torch_reference.make_optimizers(net_g, net_d)
    criterion = torch.nn.BCELoss()
    real_t = torch.from_numpy(real_NCHW)

    def torch_step():
        noise = torch.randn(batch, config.nz, 1, 1)
        torch_reference.tutorial_iteration(net_g, net_d, opt_g, opt_d, criterion, real_t, noise)

    jax_s, torch_s = interleaved_medians(jax_step, torch_step, repeats)
    result = {"batch": batch, "jax_compile_s": compile_s, "jax_s": jax_s, "torch_eager_s": torch_s}
    if torch_compile:
        compiled_g, compiled_d = torch.compile(net_g), torch.compile(net_d)

        def torch_compiled_step():
            noise = torch.randn(batch, config.nz, 1, 1)
            torch_reference.tutorial_iteration(compiled_g, compiled_d, opt_g, opt_d, criterion, real_t, noise)

        start = time.perf_counter()
        torch_compiled_step()
        result["torch_compile_first_s"] = time.perf_counter() - start
        result["torch_compiled_s"] = median_seconds(torch_compiled_step, repeats)
    return result


def bench_conv_transpose_kernel_grad(repeats: int) -> tuple[float, float]:
    """G's 8×8 → 16×16 layer (256 → 128 channels) at batch 64: kernel gradient, custom VJP vs autodiff."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(64, 8, 8, 256)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(256, 128, 4, 4)), jnp.float32)
    timings = []
    for impl in (conv_transpose2d, conv_transpose2d_reference):
        grad = jax.jit(jax.grad(lambda w_, impl=impl: jnp.sum(impl(x, w_, 2, 1) ** 2)))
        grad(w).block_until_ready()
        timings.append(median_seconds(lambda: grad(w).block_until_ready(), repeats, warmup=1))
    return timings[0], timings[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--ngf", type=int, default=64)
    parser.add_argument("--ndf", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--torch-compile", action="store_true", help="also time torch.compile'd models")
    parser.add_argument("--skip-layer", action="store_true", help="skip the transposed-conv kernel-gradient timing")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = TrainConfig(image_size=args.image_size, ngf=args.ngf, ndf=args.ndf)
    print(f"JAX {jax.__version__} on {jax.default_backend()} ({jax.devices()[0]}); PyTorch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; float32, default precision on both sides")
    print(f"nets: image {config.image_size}, nz {config.nz}, ngf {config.ngf}, ndf {config.ndf}; "
          f"median of {args.repeats} steps after warm-up, JAX and PyTorch steps alternating")
    jax_peak, torch_peak = matmul_peak_gflops()
    peak = max(jax_peak, torch_peak)
    print(f"measured peak (2048² matmul): JAX {jax_peak:.0f} GFLOP/s, PyTorch {torch_peak:.0f} GFLOP/s")
    header = f"{'batch':>5} {'GFLOP':>7} {'JAX compile s':>13} {'JAX ms':>8} {'torch ms':>9} {'JAX/torch':>9} {'JAX % peak':>10} {'torch % peak':>12}"
    if args.torch_compile:
        header += f" {'compiled ms':>11} {'JAX/compiled':>12}"
    print(header)
    for batch in args.batch_sizes:
        r = bench_batch(config, batch, args.repeats, args.torch_compile)
        gflop = tutorial_iteration_flops(config, batch) / 1e9
        line = (f"{batch:>5} {gflop:>7.1f} {r['jax_compile_s']:>13.1f} {r['jax_s'] * 1e3:>8.1f} {r['torch_eager_s'] * 1e3:>9.1f} "
                f"{r['jax_s'] / r['torch_eager_s']:>9.2f} {100 * gflop / r['jax_s'] / peak:>9.0f}% "
                f"{100 * gflop / r['torch_eager_s'] / peak:>11.0f}%")
        if args.torch_compile:
            line += f" {r['torch_compiled_s'] * 1e3:>11.1f} {r['jax_s'] / r['torch_compiled_s']:>12.2f}"
        print(line, flush=True)
    if not args.skip_layer:
        custom, autodiff = bench_conv_transpose_kernel_grad(max(3, args.repeats // 2))
        print(f"ConvTranspose2d 256→128 (8×8→16×16, batch 64) kernel gradient: custom VJP {custom * 1e3:.1f} ms, "
              f"JAX autodiff of the dilated conv {autodiff * 1e3:.1f} ms ({autodiff / custom:.0f}× slower)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
