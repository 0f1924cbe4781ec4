"""``functional-gan bench``: JAX and PyTorch timed on the same work, side by side in one run.

Workloads: one DCGAN training iteration (the tutorial's nets, 64×64, the batch resident on the
device), sampling 64 images from G, the book's linear regression (1000 epochs), and the
per-layer forward+backward times that show where a step's time goes.

Frameworks: JAX ``jit`` (one step per call, and K steps in one ``lax.scan``), PyTorch eager and
``torch.compile`` (skipped with a note where it cannot run).

Method: warm-up calls first; ``block_until_ready`` / ``cuda.synchronize`` before every clock
read; the frameworks' calls interleaved (A B A B ...) so that a change in machine load hits all
alike; median, min and max over the repeats; compile time measured apart; PyTorch given as many
threads as XLA's CPU client uses; float32 with TF32 off on both sides on GPUs. FLOPs follow
``torch.utils.flop_counter.FlopCounterMode`` (2 per multiply-add, convolutions and matmuls) for
the tutorial's own iteration, for both frameworks; XLA's cost analysis of the JAX step is
reported beside it (it skips padding and counts the work JAX actually does). The fraction of
peak is against the faster of a 2048² float32 matmul in each framework, measured at the start and
the end of the same run (the better of the two): a measured reference, not the hardware's limit,
so a well-shaped convolution can exceed it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from functional_gan.config import TUTORIAL, TrainConfig

DESCRIPTION = (
    "JAX and PyTorch timed on the same work, side by side in one run: the DCGAN training step (the tutorial's "
    "nets, 64x64), sampling 64 images, the book's linear regression, and each convolution of the step. "
    "Frameworks: JAX jit (and K steps in one lax.scan), PyTorch eager and torch.compile."
)

FULL_BATCHES = (64, 128)
SCALING_BATCHES = (16, 32, 64, 128, 256)
SCAN_STEPS = 4  # steps per call of the unrolled lax.scan variant


@dataclasses.dataclass
class Record:
    """One workload × framework × batch."""

    workload: str
    framework: str
    backend: str
    device: str
    batch: int
    median_s: float | None
    min_s: float | None
    max_s: float | None
    compile_s: float | None
    flops: float | None
    xla_flops: float | None
    flops_per_s: float | None
    fraction_of_peak: float | None
    peak_memory_bytes: int | None
    repeats: int
    versions: dict
    note: str = ""


# --- timing -------------------------------------------------------------------------------------


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each function, the functions called in turn (A B C A B C ...)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def _torch_sync(device: str):
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _blocking(fn):
    def run():
        return jax.block_until_ready(fn())

    return run


class Context:
    """What every workload shares: versions, devices, threads, the measured peak."""

    def __init__(self, repeats: int, with_torch_compile: bool, tf32: bool = False):
        import torch

        from functional_gan.pytorch.precision import full_float32_precision

        # Full float32 on both sides by default; --tf32 lets both round matmul/convolution inputs to TF32 on GPUs.
        jax.config.update("jax_default_matmul_precision", "tensorfloat32" if tf32 else "highest")
        full_float32_precision(allow_tf32=tf32)
        self.tf32 = tf32
        self.repeats = repeats
        self.with_torch_compile = with_torch_compile
        self.backend = jax.default_backend()
        self.jax_device = str(jax.devices()[0])
        self.torch_device = "cuda" if self.backend == "gpu" and torch.cuda.is_available() else "cpu"
        self.threads = int(os.environ.get("NPROC") or os.cpu_count() or 1)  # XLA's CPU client: all logical CPUs
        torch.set_num_threads(self.threads)
        self.versions = {
            "jax": jax.__version__, "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else jax.__version__,
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.processor() or platform.machine(),
            "cpu": _cpu_name(), "threads": self.threads, "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "transposed_conv_form": _transposed_conv_form(), "tf32": tf32,
        }
        self.peak = {}

    def record(self, workload, framework, batch, times=None, compile_s=None, flops=None, xla_flops=None,
               peak_memory_bytes=None, note="") -> Record:
        torch_side = framework.startswith("torch")
        median = statistics.median(times) if times else None
        flops_per_s = flops / median if (flops and median) else None
        return Record(
            workload, framework, "torch-" + self.torch_device if torch_side else self.backend,
            self.torch_device if torch_side else self.jax_device, batch, median,
            min(times) if times else None, max(times) if times else None, compile_s, flops, xla_flops, flops_per_s,
            None, peak_memory_bytes, len(times or ()), self.versions, note,
        )

    def set_fractions_of_peak(self, records: list[Record]) -> None:
        """Achieved FLOP/s over the best matmul rate of the run (measured at its start and its end)."""
        peak = max(self.peak.values())
        for r in records:
            r.fraction_of_peak = r.flops_per_s / peak if r.flops_per_s else None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _transposed_conv_form() -> str:
    from functional_gan.layers import transposed_conv_form

    return transposed_conv_form()


# --- workloads -------------------------------------------------------------------------------------


def matmul_peak(ctx: Context, when: str, n: int = 2048) -> list[Record]:
    """A large float32 matmul in each framework: the practical ceiling of the machine."""
    import torch

    a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
    jax_matmul = jax.jit(lambda x: x @ x)
    jax_matmul(a).block_until_ready()
    t = torch.tensor(np.asarray(a), device=ctx.torch_device)

    def torch_matmul():
        t @ t
        _torch_sync(ctx.torch_device)

    times = interleaved_times({"jax": _blocking(lambda: jax_matmul(a)), "torch": torch_matmul}, max(ctx.repeats, 5))
    flops = 2.0 * n**3
    for name, ts in times.items():  # the run's best: a machine that slows down for a while does not lower it
        ctx.peak[name] = max(ctx.peak.get(name, 0.0), flops / statistics.median(ts))
    return [ctx.record(f"matmul_2048 ({when})", "jax_jit", n, times["jax"], flops=flops),
            ctx.record(f"matmul_2048 ({when})", "torch_eager", n, times["torch"], flops=flops)]


def _jax_memory(compiled) -> int | None:
    """Bytes the compiled program holds at once: arguments + outputs + temporaries (minus aliased)."""
    try:
        m = compiled.memory_analysis()
        return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)
    except Exception:  # not every backend reports it
        return None


def _xla_flops(compiled) -> float | None:
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        return float(cost["flops"])
    except Exception:
        return None


def _torch_peak_memory(fn, device: str, baseline_tensors=()) -> int:
    """Peak bytes of live tensors while ``fn()`` runs (plus the tensors it starts from)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    return _LiveTensorBytes.peak_of(fn, baseline_tensors)


class _LiveTensorBytes:
    """A dispatch mode that tracks the bytes of tensor storages alive during a call (CPU peak memory)."""

    @staticmethod
    def peak_of(fn, baseline_tensors) -> int:
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode

        live: dict[int, int] = {}
        state = {"now": 0, "peak": 0}
        for tensor in baseline_tensors:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in live:
                live[storage.data_ptr()] = storage.nbytes()
                state["now"] += storage.nbytes()
        state["peak"] = state["now"]

        def release(key):
            state["now"] -= live.pop(key, 0)

        class Tracker(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for tensor in jax.tree_util.tree_leaves(out):
                    if hasattr(tensor, "untyped_storage"):
                        storage = tensor.untyped_storage()
                        key = storage.data_ptr()
                        if key and key not in live:
                            live[key] = storage.nbytes()
                            state["now"] += storage.nbytes()
                            state["peak"] = max(state["peak"], state["now"])
                            weakref.finalize(storage, release, key)
                return out

        with Tracker():
            fn()
        return state["peak"]


def dcgan_step(ctx: Context, config: TrainConfig, batch: int, scan_steps: int) -> list[Record]:
    """One training iteration of the tutorial's DCGAN in each framework, on the same resident batch."""
    import torch

    from functional_gan.pytorch import counting, dcgan
    from functional_gan.train import gan_step, init_state, make_train_step, step_noise

    config = dataclasses.replace(config, batch_size=batch)
    rng = np.random.default_rng(0)
    real_NCHW = rng.uniform(-1, 1, (batch, config.nc, config.image_size, config.image_size)).astype(np.float32)
    real_NHWC = jax.device_put(jnp.asarray(real_NCHW.transpose(0, 2, 3, 1)))
    state = init_state(config)

    start = time.perf_counter()
    step = make_train_step(config).lower(state, real_NHWC).compile()
    compile_s = time.perf_counter() - start
    holder = {"state": state}

    def jax_step():
        holder["state"], metrics = step(holder["state"], real_NHWC)
        return metrics

    # K steps in one program: lax.scan over a stack of K resident batches, unrolled. XLA:CPU runs
    # the rolled form (a while loop around the step) far slower per step (measure: this workload
    # with `unroll=False` against the `jax` row, e.g. `functional-gan bench --batch-sizes 16`).
    stacked = jax.device_put(jnp.broadcast_to(real_NHWC, (scan_steps, *real_NHWC.shape)))

    def scan_run(state, batches):
        def body(state, real):
            noise = step_noise(config, state.step, batch, real.dtype)
            return gan_step(config, state, real, noise)

        return jax.lax.scan(body, state, batches, unroll=True)

    start = time.perf_counter()
    scan = jax.jit(scan_run).lower(state, stacked).compile()
    scan_compile_s = time.perf_counter() - start
    scan_holder = {"state": state}

    def jax_scan():
        scan_holder["state"], metrics = scan(scan_holder["state"], stacked)
        return metrics

    device = ctx.torch_device
    net_g, net_d = dcgan.make_models(config)
    net_g, net_d = net_g.to(device), net_d.to(device)
    opt_g, opt_d = dcgan.make_optimizers(net_g, net_d, config)
    criterion = torch.nn.BCELoss()
    real_t = torch.from_numpy(real_NCHW).to(device)

    def torch_step(g=net_g, d=net_d):
        noise = torch.randn(batch, config.nz, 1, 1, device=device)
        dcgan.tutorial_iteration(g, d, opt_g, opt_d, criterion, real_t, noise)
        _torch_sync(device)

    fns = {"jax_jit": _blocking(jax_step), "jax_scan": _blocking(jax_scan), "torch_eager": torch_step}
    notes, torch_compile_s = {}, None
    if ctx.with_torch_compile:
        try:
            compiled_g, compiled_d = torch.compile(net_g), torch.compile(net_d)
            start = time.perf_counter()
            torch_step(compiled_g, compiled_d)
            torch_compile_s = time.perf_counter() - start
            fns["torch_compile"] = lambda: torch_step(compiled_g, compiled_d)
        except Exception as error:  # no C++ compiler, unsupported platform ...
            notes["torch_compile"] = f"torch.compile could not run: {type(error).__name__}: {str(error)[:200]}"
    times = interleaved_times(fns, ctx.repeats)
    flops = float(counting.tutorial_iteration_flops(config, batch))
    xla = _xla_flops(step)
    params = list(net_g.parameters()) + list(net_d.parameters())
    torch_memory = _torch_peak_memory(lambda: torch_step(), device, params + [real_t])
    records = [
        ctx.record("dcgan_step", "jax_jit", batch, times["jax_jit"], compile_s, flops, xla, _jax_memory(step)),
        ctx.record("dcgan_step", "jax_scan", batch, [t / scan_steps for t in times["jax_scan"]], scan_compile_s, flops,
                   xla, _jax_memory(scan), note=f"{scan_steps} steps per call (lax.scan, unrolled); time per step"),
        ctx.record("dcgan_step", "torch_eager", batch, times["torch_eager"], None, flops, None, torch_memory),
    ]
    if "torch_compile" in times:
        records.append(ctx.record("dcgan_step", "torch_compile", batch, times["torch_compile"], torch_compile_s, flops,
                                  note="compile_s: the first call"))
    elif ctx.with_torch_compile:
        records.append(ctx.record("dcgan_step", "torch_compile", batch, note=notes["torch_compile"]))
    return records


def sampling(ctx: Context, config: TrainConfig, num: int = 64) -> list[Record]:
    """G's forward on 64 noise vectors (the tutorial's fixed-noise grid)."""
    import torch

    from functional_gan.pytorch import counting, dcgan
    from functional_gan.train import fixed_noise, init_state, make_sampler

    state = init_state(config)
    noise = fixed_noise(config, num)
    start = time.perf_counter()
    sampler = make_sampler(config).lower(state, noise).compile()
    compile_s = time.perf_counter() - start
    net_g, _ = dcgan.make_models(config)
    net_g = net_g.to(ctx.torch_device)
    noise_t = torch.as_tensor(np.asarray(noise)[:, :, None, None], device=ctx.torch_device)

    def torch_sample():
        with torch.no_grad():
            net_g(noise_t)
        _torch_sync(ctx.torch_device)

    times = interleaved_times({"jax": _blocking(lambda: sampler(state, noise)), "torch": torch_sample}, ctx.repeats)
    flops, _ = counting.count(torch_sample)
    return [ctx.record("sampling", "jax_jit", num, times["jax"], compile_s, float(flops), _xla_flops(sampler), _jax_memory(sampler)),
            ctx.record("sampling", "torch_eager", num, times["torch"], None, float(flops))]


def linear_regression(ctx: Context) -> list[Record]:
    """The book's 1000 full-batch epochs: one jitted lax.scan against PyTorch's eager loop."""
    import torch

    from functional_gan import linreg
    from functional_gan.pytorch import linreg as torch_linreg

    data = linreg.make_data()
    x, y = jnp.asarray(data.x_train, jnp.float32), jnp.asarray(data.y_train, jnp.float32)
    b0, w0 = linreg.initial_parameters()
    params = {"b": jnp.float32(b0), "w": jnp.float32(w0)}

    def run(params):
        def epoch(params, _):
            grads = jax.grad(linreg.mse_loss)(params, x, y)
            return jax.tree_util.tree_map(lambda p, g: p - linreg.LEARNING_RATE * g, params, grads), None

        return jax.lax.scan(epoch, params, None, length=linreg.EPOCHS)[0]

    start = time.perf_counter()
    compiled = jax.jit(run).lower(params).compile()
    compile_s = time.perf_counter() - start
    times = interleaved_times(
        {"jax": _blocking(lambda: compiled(params)), "torch": lambda: torch_linreg.train_backward(data, dtype=torch.float32)},
        ctx.repeats,
    )
    note = "1000 epochs per call; FlopCounterMode counts no elementwise work, so no FLOPs"
    return [ctx.record("linreg_1000_epochs", "jax_jit", 80, times["jax"], compile_s, note=note + "; all epochs one lax.scan"),
            ctx.record("linreg_1000_epochs", "torch_eager", 80, times["torch"], note=note + "; backward() + no_grad update")]


DCGAN_LAYERS = (  # (name, transposed, in, out, input size, stride, padding): the tutorial's nets at 64×64
    ("G main.0 ConvT 100→512 1→4", True, 100, 512, 1, 1, 0),
    ("G main.3 ConvT 512→256 4→8", True, 512, 256, 4, 2, 1),
    ("G main.6 ConvT 256→128 8→16", True, 256, 128, 8, 2, 1),
    ("G main.9 ConvT 128→64 16→32", True, 128, 64, 16, 2, 1),
    ("G main.12 ConvT 64→3 32→64", True, 64, 3, 32, 2, 1),
    ("D main.0 Conv 3→64 64→32", False, 3, 64, 64, 2, 1),
    ("D main.2 Conv 64→128 32→16", False, 64, 128, 32, 2, 1),
    ("D main.5 Conv 128→256 16→8", False, 128, 256, 16, 2, 1),
    ("D main.8 Conv 256→512 8→4", False, 256, 512, 8, 2, 1),
    ("D main.11 Conv 512→1 4→1", False, 512, 1, 4, 1, 0),
)


def _conv_case(rng, batch, transposed, cin, cout, size, stride, padding):
    """One convolution of the step at ``batch``: NCHW input and PyTorch-layout kernel (NumPy), this project's op,
    the JAX arrays (NHWC), the output's shape and an all-ones output cotangent."""
    from functional_gan import layers as jax_layers

    x = rng.normal(size=(batch, cin, size, size)).astype(np.float32)
    w = (0.02 * rng.normal(size=(cin, cout, 4, 4) if transposed else (cout, cin, 4, 4))).astype(np.float32)
    op = jax_layers.conv_transpose2d if transposed else jax_layers.conv2d
    x_j, w_j = jnp.asarray(x.transpose(0, 2, 3, 1)), jnp.asarray(w)
    y = jax.eval_shape(lambda a, b: op(a, b, stride, padding), x_j, w_j)
    return x, w, op, x_j, w_j, y, jnp.ones(y.shape, y.dtype)


def layers(ctx: Context, batch: int) -> list[Record]:
    """Forward + backward (input and kernel gradients) of each convolution of the step, JAX vs PyTorch."""
    import torch

    rng = np.random.default_rng(0)
    records = []
    for name, transposed, cin, cout, size, stride, padding in DCGAN_LAYERS:
        x, w, op, x_j, w_j, y, cot = _conv_case(rng, batch, transposed, cin, cout, size, stride, padding)
        start = time.perf_counter()
        fwd_bwd = jax.jit(lambda a, b: jax.vjp(lambda a_, b_: op(a_, b_, stride, padding), a, b)[1](cot)).lower(x_j, w_j).compile()
        compile_s = time.perf_counter() - start
        torch_op = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
        x_t = torch.tensor(x, requires_grad=True, device=ctx.torch_device)
        w_t = torch.tensor(w, requires_grad=True, device=ctx.torch_device)
        cot_t = torch.ones(tuple(np.asarray(y.shape)[[0, 3, 1, 2]]), device=ctx.torch_device)

        def torch_fwd_bwd():
            torch.autograd.grad(torch_op(x_t, w_t, stride=stride, padding=padding), (x_t, w_t), cot_t)
            _torch_sync(ctx.torch_device)

        times = interleaved_times({"jax": _blocking(lambda: fwd_bwd(x_j, w_j)), "torch": torch_fwd_bwd}, ctx.repeats)
        flops = 3.0 * 2 * batch * cin * cout * 16 * (size * size if transposed else y.shape[1] * y.shape[2])
        records.append(ctx.record(f"layer: {name}", "jax_jit", batch, times["jax"], compile_s, flops,
                                  _xla_flops(fwd_bwd), note="forward + input and kernel gradients"))
        records.append(ctx.record(f"layer: {name}", "torch_eager", batch, times["torch"], None, flops))
    return records


def _torch_conv_pass(ctx, transposed, stride, padding, mask):
    """One pass of PyTorch's convolution backward (the aten call autograd makes), restricted by ``mask``."""
    import torch

    def run(cot_t, x_t, w_t):
        torch.ops.aten.convolution_backward(cot_t, x_t, w_t, None, [stride] * 2, [padding] * 2, [1, 1], transposed,
                                            [0, 0], 1, mask)
        _torch_sync(ctx.torch_device)

    return run


def passes(ctx: Context, batch: int) -> list[Record]:
    """Each convolution of the step split into its three passes: forward, input gradient, kernel gradient.

    JAX: each pass jitted alone (the unused parts of the VJP are dead code, removed by XLA); PyTorch: the forward
    under ``no_grad`` and ``aten.convolution_backward`` with one gradient asked for, as autograd calls it.
    """
    import torch

    rng = np.random.default_rng(0)
    records = []
    for name, transposed, cin, cout, size, stride, padding in DCGAN_LAYERS:
        x, w, op, x_j, w_j, y, cot = _conv_case(rng, batch, transposed, cin, cout, size, stride, padding)
        jax_passes = {
            "forward": jax.jit(lambda a, b: op(a, b, stride, padding)),
            "input gradient": jax.jit(lambda a, b: jax.vjp(lambda a_: op(a_, b, stride, padding), a)[1](cot)[0]),
            "kernel gradient": jax.jit(lambda a, b: jax.vjp(lambda b_: op(a, b_, stride, padding), b)[1](cot)[0]),
        }
        torch_op = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
        x_t, w_t = torch.tensor(x, device=ctx.torch_device), torch.tensor(w, device=ctx.torch_device)
        cot_t = torch.ones(tuple(np.asarray(y.shape)[[0, 3, 1, 2]]), device=ctx.torch_device)

        def torch_forward():
            with torch.no_grad():
                torch_op(x_t, w_t, stride=stride, padding=padding)
            _torch_sync(ctx.torch_device)

        torch_passes = {
            "forward": torch_forward,
            "input gradient": lambda m=_torch_conv_pass(ctx, transposed, stride, padding, [True, False, False]): m(cot_t, x_t, w_t),
            "kernel gradient": lambda m=_torch_conv_pass(ctx, transposed, stride, padding, [False, True, False]): m(cot_t, x_t, w_t),
        }
        flops = 2.0 * batch * cin * cout * 16 * (size * size if transposed else y.shape[1] * y.shape[2])
        for which, jitted in jax_passes.items():
            start = time.perf_counter()
            compiled = jitted.lower(x_j, w_j).compile()
            compile_s = time.perf_counter() - start
            times = interleaved_times({"jax": _blocking(lambda c=compiled: c(x_j, w_j)), "torch": torch_passes[which]}, ctx.repeats)
            workload = f"pass: {name} · {which}"
            records.append(ctx.record(workload, "jax_jit", batch, times["jax"], compile_s, flops, _xla_flops(compiled)))
            records.append(ctx.record(workload, "torch_eager", batch, times["torch"], None, flops))
    return records


# The BatchNorm + activation pairs of the step (name, channels, spatial size, activation): the elementwise and
# reduction work between the convolutions.
DCGAN_GLUE = (
    ("G main.1-2 BatchNorm+ReLU 512@4×4", 512, 4, "relu"),
    ("G main.4-5 BatchNorm+ReLU 256@8×8", 256, 8, "relu"),
    ("G main.7-8 BatchNorm+ReLU 128@16×16", 128, 16, "relu"),
    ("G main.10-11 BatchNorm+ReLU 64@32×32", 64, 32, "relu"),
    ("D main.3-4 BatchNorm+LeakyReLU 128@16×16", 128, 16, "leaky_relu"),
    ("D main.6-7 BatchNorm+LeakyReLU 256@8×8", 256, 8, "leaky_relu"),
    ("D main.9-10 BatchNorm+LeakyReLU 512@4×4", 512, 4, "leaky_relu"),
)


def glue(ctx: Context, batch: int) -> list[Record]:
    """Training-mode BatchNorm (running statistics updated) + activation, forward and backward (input, weight
    and bias gradients), at each place of the step: this project's BatchNorm2d jitted against PyTorch's eager
    ``F.batch_norm``."""
    import torch
    import torch.nn.functional as F

    from functional_gan.layers import BatchNorm2d

    rng = np.random.default_rng(0)
    records = []
    for name, channels, size, activation in DCGAN_GLUE:
        x = rng.normal(size=(batch, channels, size, size)).astype(np.float32)
        module = BatchNorm2d(channels)
        x_j = jnp.asarray(x.transpose(0, 2, 3, 1))
        variables = module.init(jax.random.key(0), x_j)
        act = (lambda v: jax.nn.relu(v)) if activation == "relu" else (lambda v: jax.nn.leaky_relu(v, 0.2))

        def forward(params, x_, stats=variables["batch_stats"], act=act, module=module):
            y, updates = module.apply({"params": params, "batch_stats": stats}, x_, mutable=["batch_stats"])
            return act(y), updates

        def fwd_bwd(params, x_, forward=forward):
            out, pullback, updates = jax.vjp(forward, params, x_, has_aux=True)
            return pullback(jnp.ones_like(out)), updates

        start = time.perf_counter()
        compiled = jax.jit(fwd_bwd).lower(variables["params"], x_j).compile()
        compile_s = time.perf_counter() - start
        x_t = torch.tensor(x, requires_grad=True, device=ctx.torch_device)
        w_t = torch.tensor(np.asarray(variables["params"]["weight"]), requires_grad=True, device=ctx.torch_device)
        b_t = torch.zeros(channels, requires_grad=True, device=ctx.torch_device)
        running_mean, running_var = torch.zeros(channels, device=ctx.torch_device), torch.ones(channels, device=ctx.torch_device)
        torch_act = F.relu if activation == "relu" else (lambda v: F.leaky_relu(v, 0.2))

        def torch_fwd_bwd():
            y = torch_act(F.batch_norm(x_t, running_mean, running_var, w_t, b_t, training=True, momentum=0.1, eps=1e-5))
            torch.autograd.grad(y, (x_t, w_t, b_t), torch.ones_like(y))
            _torch_sync(ctx.torch_device)

        params = variables["params"]
        times = interleaved_times({"jax": _blocking(lambda c=compiled, p=params, a=x_j: c(p, a)), "torch": torch_fwd_bwd},
                                  ctx.repeats)
        workload = f"glue: {name}"
        records.append(ctx.record(workload, "jax_jit", batch, times["jax"], compile_s,
                                  note="forward + input, weight and bias gradients; running statistics updated"))
        records.append(ctx.record(workload, "torch_eager", batch, times["torch"]))
    return records


def startup(ctx: Context, repeats: int = 3) -> list[Record]:
    """Start-up of the command line, as a user meets it: wall time of whole processes.

    ``functional-gan --help`` (it imports no JAX); ``sample`` of a 64×64 run's checkpoint (the tutorial's
    widths) with an empty compilation cache (cold: every program compiled) and then with the cache it filled
    (warm: programs loaded, as a second ``sample`` or ``train`` with the same shapes does). The run is one
    training iteration on random images, made first in a temporary folder.
    """
    import shutil
    import subprocess
    import sys
    import tempfile

    cli = [sys.executable, "-m", "functional_gan.main"]
    records = []
    with tempfile.TemporaryDirectory(prefix="functional-gan-startup-") as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("FUNCTIONAL_GAN_NO_COMPILE_CACHE", "JAX_COMPILATION_CACHE_DIR")}
        env["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        run_folder = Path(tmp) / "run"

        def timed(args) -> float:
            start = time.perf_counter()
            done = subprocess.run(cli + args, env=env, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            if done.returncode != 0:
                raise RuntimeError(f"functional-gan {' '.join(args)} failed:\n{done.stderr[-2000:]}")
            return seconds

        timed(["train", "--data", "fake", "--steps", "1", "--batch-size", "16", "--out", str(run_folder)])
        help_times = [timed(["--help"]) for _ in range(repeats)]
        records.append(ctx.record("startup: functional-gan --help", "cli", 0, help_times, note="no JAX imported"))
        shutil.rmtree(Path(tmp) / "cache", ignore_errors=True)
        sample = ["sample", "--checkpoint", str(run_folder), "--out", str(Path(tmp) / "grid.png")]
        cold = [timed(sample)]
        warm = [timed(sample) for _ in range(repeats)]
        records.append(ctx.record("startup: sample 64 images, cold cache", "cli", 64, cold,
                                  note="64×64 run, ngf = ndf = 64; every program compiled"))
        records.append(ctx.record("startup: sample 64 images, warm cache", "cli", 64, warm,
                                  note="the same command again: programs loaded from the persistent compilation cache"))
    return records


# --- reporting ---------------------------------------------------------------------------------------


def _ms(value) -> str:
    return "—" if value is None else f"{value * 1e3:.1f}"


def ratio_to(records: list[Record], reference: str = "torch_eager") -> dict[tuple[str, int, str], float]:
    """time(framework) / time(reference) for each workload × batch (below 1: faster than the reference)."""
    base = {(r.workload, r.batch): r.median_s for r in records if r.framework == reference and r.median_s}
    return {(r.workload, r.batch, r.framework): r.median_s / base[(r.workload, r.batch)]
            for r in records if r.median_s and (r.workload, r.batch) in base}


def format_table(records: list[Record], markdown: bool = False) -> str:
    ratios = ratio_to(records)
    header = ["workload", "batch", "framework", "median ms", "min–max ms", "compile s", "GFLOP/s", "% of peak",
              "peak MB", "time / torch eager"]
    rows = []
    for r in records:
        rows.append([
            r.workload, str(r.batch), r.framework, _ms(r.median_s),
            "—" if r.min_s is None else f"{r.min_s * 1e3:.1f}–{r.max_s * 1e3:.1f}",
            "—" if r.compile_s is None else f"{r.compile_s:.2f}",
            "—" if r.flops_per_s is None else f"{r.flops_per_s / 1e9:.0f}",
            "—" if r.fraction_of_peak is None else f"{100 * r.fraction_of_peak:.0f}%",
            "—" if r.peak_memory_bytes is None else f"{r.peak_memory_bytes / 2**20:.0f}",
            f"{ratios[(r.workload, r.batch, r.framework)]:.2f}" if (r.workload, r.batch, r.framework) in ratios else "—",
        ])
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        notes = [f"- {r.workload} {r.framework}: {r.note}" for r in records if r.note and section(r) == "main"]
        return "\n".join(lines + ([""] + sorted(set(notes)) if notes else []))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    fmt = "  ".join("{:<%d}" % w if i < 3 else "{:>%d}" % w for i, w in enumerate(widths))
    return "\n".join([fmt.format(*header)] + [fmt.format(*row) for row in rows])


def header_lines(ctx: Context) -> list[str]:
    v = ctx.versions
    return [
        f"JAX {v['jax']} on {ctx.backend} ({ctx.jax_device}); PyTorch {v['torch']} on {ctx.torch_device}, "
        f"{v['threads']} threads; CPU: {v['cpu']}",
        f"XLA_FLAGS: {v['xla_flags'] or '(none)'}; transposed convolutions: {v['transposed_conv_form']} form",
        f"float32, TF32 off on both sides; medians of {ctx.repeats} interleaved repeats after warm-up; compile time apart",
    ]


def save_scaling_plot(records: list[Record], path: Path) -> Path:
    """Step time against batch, log-log, per framework, with the linear-cost line through JAX's batch-64 point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    steps = [r for r in records if r.workload == "dcgan_step" and r.median_s]
    for framework in sorted({r.framework for r in steps}):
        points = sorted((r.batch, r.median_s) for r in steps if r.framework == framework)
        ax.plot([b for b, _ in points], [t for _, t in points], "o-", label=framework)
    anchor = [r for r in steps if r.framework == "jax_jit" and r.batch == 64]
    if anchor:
        batches = np.array(sorted({r.batch for r in steps}))
        ax.plot(batches, anchor[0].median_s * batches / 64, "k--", linewidth=1, label="linear cost (through JAX at 64)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("seconds per training iteration")
    ax.set_title("DCGAN step (tutorial nets, 64×64): time against batch")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# The tables after the main one: the prefix of their workloads' names, and their headings.
SECTIONS = {
    "layer": "Per layer: forward + backward (input and kernel gradients)",
    "pass": "Per pass: each convolution's forward, input gradient and kernel gradient alone",
    "glue": "BatchNorm + activation between the convolutions: forward + backward",
    "startup": "Start-up of the command line: whole processes, wall time",
}


def section(record: Record) -> str:
    prefix = record.workload.split(":", 1)[0]
    return prefix if prefix in SECTIONS else "main"


def to_markdown(ctx: Context, records: list[Record], plot: Path | None, command: str) -> str:
    main = [r for r in records if section(r) == "main"]
    parts = [
        "# functional_gan benchmark\n",
        f"`{command}`\n",
        "\n".join(f"- {line}" for line in header_lines(ctx)) + "\n",
        "## Results\n",
        format_table(main, markdown=True) + "\n",
    ]
    for name, heading in SECTIONS.items():
        rows = [r for r in records if section(r) == name]
        if rows:
            batch = f" (batch {rows[0].batch})" if name != "startup" else ""
            notes = sorted({f"- {r.workload}: {r.note}" for r in rows if r.note and name == "startup"})
            parts += [f"## {heading}{batch}\n", format_table(rows, markdown=True) + "\n" + "".join(n + "\n" for n in notes)]
    if plot:
        parts.append(f"## Scaling\n\n![step time against batch]({plot.name})\n")
    parts.append("## Method\n\n" + " ".join(__doc__.split("\n\n")[2:]).replace("\n", " ") + "\n")
    return "\n".join(parts)


# --- the command ---------------------------------------------------------------------------------------


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true", help="batch 64 only, few repeats, no scaling sweep (1-2 minutes on 2 CPU cores)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                   help=f"DCGAN step batches (default: {' '.join(map(str, FULL_BATCHES))}; --quick: 64)")
    p.add_argument("--scaling", type=int, nargs="*", default=None,
                   help=f"batches of the scaling sweep, plotted (default: {' '.join(map(str, SCALING_BATCHES))}; --quick: none)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per framework (default 7; --quick 3)")
    p.add_argument("--scan-steps", type=int, default=SCAN_STEPS, help="steps per call for the lax.scan variant")
    p.add_argument("--no-torch-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--tf32", action="store_true",
                   help="GPUs: let both frameworks run float32 matmuls and convolutions with TF32 inputs (default: full "
                   "float32 on both; no effect on CPUs)")
    p.add_argument("--no-startup", action="store_true", help="leave out the command line's start-up (--help, sample cold and warm)")
    p.add_argument("--no-layers", action="store_true", help="leave the per-layer, per-pass and BatchNorm timings out")
    p.add_argument("--json", metavar="FILE", help="write one record per workload × framework × batch")
    p.add_argument("--markdown", metavar="FILE", help="write the tables, the method and the machine as Markdown")
    p.add_argument("--plot", metavar="FILE", help="scaling plot (PNG; default: beside --markdown or --json)")
    p.set_defaults(handler=run)


def run(args) -> int:
    from tqdm.auto import tqdm

    from functional_gan.errors import UserError, torch_side

    torch_side("torch", "the benchmark (it compares with PyTorch)")
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 7)
    batches = args.batch_sizes if args.batch_sizes is not None else ([64] if args.quick else list(FULL_BATCHES))
    scaling = args.scaling if args.scaling is not None else ([] if args.quick else list(SCALING_BATCHES))
    if not batches or min(batches + scaling + [repeats, args.scan_steps]) <= 0:
        raise UserError("batch sizes, repeats and --scan-steps must be positive")
    for target in (args.json, args.markdown, args.plot):  # unusable output paths fail now, not after the timings
        if target:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
    ctx = Context(repeats, with_torch_compile=not args.no_torch_compile, tf32=args.tf32)
    for line in header_lines(ctx):
        print(line)
    config = TUTORIAL
    jobs: list[tuple[str, Callable[[], list[Record]]]] = [("matmul peak", lambda: matmul_peak(ctx, "start"))]
    for batch in sorted(set(batches) | set(scaling)):
        jobs.append((f"DCGAN step, batch {batch}", lambda b=batch: dcgan_step(ctx, config, b, args.scan_steps)))
    jobs.append(("sampling 64 images", lambda: sampling(ctx, config)))
    jobs.append(("linear regression", lambda: linear_regression(ctx)))
    if not args.no_layers:
        jobs.append(("per-layer timings, batch 64", lambda: layers(ctx, 64)))
        jobs.append(("per-pass timings, batch 64", lambda: passes(ctx, 64)))
        jobs.append(("BatchNorm + activation, batch 64", lambda: glue(ctx, 64)))
    if not args.no_startup:
        jobs.append(("start-up of the command line", lambda: startup(ctx)))
    jobs.append(("matmul peak, again", lambda: matmul_peak(ctx, "end")))
    records: list[Record] = []
    with tqdm(jobs, desc="bench", unit="workload") as bar:
        for label, job in bar:
            bar.set_postfix_str(label)
            records += job()
    ctx.set_fractions_of_peak(records)
    print(format_table([r for r in records if section(r) == "main"]))
    for name, heading in SECTIONS.items():
        rows = [r for r in records if section(r) == name]
        if rows:
            print(f"\n{heading}:")
            print(format_table(rows))
    plot = None
    if len({r.batch for r in records if r.workload == "dcgan_step"}) > 1:
        target = args.plot or (str(Path(args.markdown or args.json).with_name("scaling.png")) if (args.markdown or args.json) else None)
        if target:
            plot = save_scaling_plot(records, Path(target))
            print(f"Wrote {plot}")
    command = "functional-gan bench " + " ".join(_argv_of(args))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([dataclasses.asdict(r) for r in records], indent=1) + "\n")
        print(f"Wrote {path}")
    if args.markdown:
        path = Path(args.markdown)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(to_markdown(ctx, records, plot, command))
        print(f"Wrote {path}")
    return 0


def _argv_of(args) -> list[str]:
    out = []
    for flag in ("quick", "no_torch_compile", "no_layers", "no_startup", "tf32"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    for flag in ("batch_sizes", "scaling", "repeats", "json", "markdown", "plot"):
        value = getattr(args, flag)
        if value is not None:
            out.append("--" + flag.replace("_", "-"))
            out += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    if args.scan_steps != SCAN_STEPS:
        out += ["--scan-steps", str(args.scan_steps)]
    return out
