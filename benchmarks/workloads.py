"""The benchmark's workloads, each timed in JAX and PyTorch on the same work: the matmul peak, the DCGAN step,
sampling, the linear regression, each convolution of the step (whole and by pass), BatchNorm + activation, and
the command line's start-up. The layers come from the models themselves (:func:`network_layers`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from functional_gan.benchmarks.timing import (
    Context,
    Record,
    blocking,
    interleaved_times,
    jax_memory,
    torch_peak_memory,
    torch_sync,
    xla_flops,
)
from functional_gan.config import TrainConfig


# The GEMM shapes whose best rate, in either framework, is the run's measured peak: square products of two sizes, and
# the tall, narrow ones a convolution lowers to (many positions × few channels). A single 2048² product is not the
# fastest GEMM every CPU runs (on a 2-core Intel Xeon, PyTorch's 128→256 convolution ran at 119% of it).
PEAK_SHAPES = ((1024, 1024, 1024), (2048, 2048, 2048), (16384, 1024, 256), (16384, 256, 1024), (4096, 2048, 512))


def matmul_peak(ctx: Context, when: str, shapes=PEAK_SHAPES) -> list[Record]:
    """float32 matrix products of several shapes in each framework: the practical ceiling of the machine, the best
    rate any of them reaches (each shape's own row in the table)."""
    import torch

    records = []
    if ctx.backend == "cpu" and when == "start":
        from functional_gan.benchmarks import fma_peak

        try:
            ctx.fma_peak = fma_peak.measure(ctx.threads)
        except OSError as error:
            ctx.fma_peak = None
            print(f"bench: the CPU's FMA throughput is not measured ({error}); the peak is the best GEMM's")
    rng = np.random.default_rng(0)
    for m, k, n in shapes:
        a = jnp.asarray(rng.normal(size=(m, k)), jnp.float32)
        b = jnp.asarray(rng.normal(size=(k, n)), jnp.float32)
        jax_matmul = jax.jit(lambda x, y: x @ y)
        jax_matmul(a, b).block_until_ready()
        ta = torch.tensor(np.asarray(a), device=ctx.torch_device)
        tb = torch.tensor(np.asarray(b), device=ctx.torch_device)

        def torch_matmul(ta=ta, tb=tb):
            ta @ tb
            torch_sync(ctx.torch_device)

        times = interleaved_times({"jax": blocking(lambda a=a, b=b, f=jax_matmul: f(a, b)), "torch": torch_matmul},
                                  max(ctx.repeats, 5))
        flops = 2.0 * m * k * n
        label = f"matmul {m}×{k}·{k}×{n} ({when})"
        for name, ts in times.items():  # the run's best: a machine that slows down for a while does not lower it
            rate = flops / statistics.median(ts)
            if rate > ctx.peak.get(name, 0.0):
                ctx.peak[name], ctx.peak_at[name] = rate, label
        records += [ctx.record(label, "jax_jit", m, times["jax"], flops=flops),
                    ctx.record(label, "torch_eager", m, times["torch"], flops=flops)]
    return records


def conv_taps(size: int, kernel: int, stride: int, padding: int, transposed: bool) -> int:
    """Along one axis, the (output position, kernel tap) pairs that read a real input value (not padding): the
    multiply-adds the mathematics needs, per input and output channel. A convolution's and its transpose's are the
    same pairs (``size`` being the convolution's input, or the transposed convolution's output)."""
    if transposed:  # the transposed convolution of an input of ``size`` is the adjoint of a convolution of its output
        size = (size - 1) * stride - 2 * padding + kernel
    out = (size + 2 * padding - kernel) // stride + 1
    return sum(1 for o in range(out) for t in range(kernel) if 0 <= o * stride + t - padding < size)


def conv_flops(batch: int, cin: int, cout: int, size: int, kernel: int, stride: int, padding: int,
               transposed: bool) -> float:
    """FLOPs of one pass of the convolution (the forward, its input gradient or its kernel gradient: the same
    multiply-adds), 2 per multiply-add, padding's zeros not counted: the same number for both frameworks whatever
    form each computes it in."""
    return 2.0 * batch * cin * cout * conv_taps(size, kernel, stride, padding, transposed) ** 2


def dcgan_step(ctx: Context, config: TrainConfig, batch: int, scan_steps: int, workload: str = "dcgan_step") -> list[Record]:
    """One training iteration of the tutorial's DCGAN in each framework, on the same resident batch: the Linen step
    (jitted, and K of them in a scan), the NNX port (``nnx.jit`` on the objects, and split/merge around ``jax.jit``),
    PyTorch eager and torch.compile."""
    from functional_gan.pytorch import counting

    config = dataclasses.replace(config, batch_size=batch)
    real_NCHW = np.random.default_rng(0).uniform(-1, 1, (batch, config.nc, config.image_size, config.image_size))
    real_NCHW = real_NCHW.astype(np.float32)
    jax_runs, records = _jax_steps(ctx, config, real_NCHW, scan_steps)
    torch_runs, torch_records, torch_memory = _torch_steps(ctx, config, real_NCHW)
    times = interleaved_times({**jax_runs, **torch_runs}, ctx.repeats)
    torch_records["torch_eager"]["peak_memory_bytes"] = torch_memory()  # after the warm-up: Adam's states exist
    flops = float(counting.tutorial_iteration_flops(config, batch))
    out = []
    for framework, fields in {**records, **torch_records}.items():
        per_call = times.get(framework)
        if framework == "jax_scan" and per_call:
            per_call = [t / scan_steps for t in per_call]
        out.append(ctx.record(workload, framework, batch, per_call, flops=flops if per_call else None, **fields))
    return out


def _jax_steps(ctx: Context, config: TrainConfig, real_NCHW: np.ndarray, scan_steps: int):
    """The jitted training step, and K of them in one ``lax.scan``: {name: run}, {name: record fields}."""
    from functional_gan import nnx_dcgan
    from functional_gan.train import init_state, make_train_step, step_function

    real_NHWC = jax.device_put(jnp.asarray(real_NCHW.transpose(0, 2, 3, 1)))
    # K steps in one program: lax.scan of the training step itself over a stack of K resident batches, unrolled.
    # XLA:CPU runs the rolled form (a while loop around the step) far slower per step (measure: this workload with
    # `unroll=False` against the `jax_jit` row, e.g. `functional-gan bench --batch-sizes 16`).
    stacked = jax.device_put(jnp.broadcast_to(real_NHWC, (scan_steps, *real_NHWC.shape)))
    step = step_function(config)
    programs = {
        "jax_jit": (make_train_step(config), real_NHWC),  # XLA's convolutions (see CONV_ROWS)
        "jax_jit_onednn": (make_train_step(config), real_NHWC),  # oneDNN's, where the extra is installed
        "jax_scan": (jax.jit(lambda state, batches: jax.lax.scan(step, state, batches, unroll=True)), stacked),
        "nnx_split": (nnx_dcgan.make_train_step(config), real_NHWC),  # train --api nnx: the NNX step on the state
    }
    # The same step with BatchNorm in its previous form (reductions, JAX's own backward): the A/B of this round's
    # change, in the same run. The form is read when the step is traced.
    programs["jax_jit_bn_reductions"] = (make_train_step(config), real_NHWC)
    runs, records = {}, {}
    for name, (program, data) in programs.items():
        if name in CONV_ROWS and not _has_onednn(name):
            continue
        state = init_state(config)
        start = time.perf_counter()
        with _batchnorm_form("reductions" if name.endswith("bn_reductions") else None), _env(CONV_ENV, CONV_ROWS.get(name)):
            compiled = program.lower(state, data).compile()
        compile_s = time.perf_counter() - start
        holder = {"state": state}

        def run(compiled=compiled, holder=holder, data=data):
            holder["state"], metrics = compiled(holder["state"], data)
            return metrics

        runs[name] = blocking(run)
        records[name] = dict(compile_s=compile_s, xla_flops=xla_flops(compiled), peak_memory_bytes=jax_memory(compiled))
    records["jax_jit_bn_reductions"]["note"] = "the jitted step with BatchNorm as reductions (the form before)"
    for name, label in CONV_LABELS.items():
        if name in records:
            records[name]["note"] = label
    # Per step: XLA's count for one step stands for the scan's too.
    records["jax_scan"].update(xla_flops=records["jax_jit"]["xla_flops"],
                               note=f"{scan_steps} steps per call (lax.scan, unrolled); time per step")
    runs["nnx_jit"], records["nnx_jit"] = _nnx_jit_step(config, real_NHWC)
    return runs, records


# The JAX rows timed with each convolution library: "jax_jit" with XLA's own convolutions, "jax_jit_onednn" with
# oneDNN's through the FFI (functional_gan.onednn), when the onednn extra is installed; the other JAX rows run the
# default ($FUNCTIONAL_GAN_CONV, else oneDNN where installed). The variable is read when a program is traced.
CONV_ENV = "FUNCTIONAL_GAN_CONV"
CONV_ROWS = {"jax_jit": "xla", "jax_jit_onednn": "onednn"}
CONV_LABELS = {"jax_jit": "JAX (XLA's convolutions)", "jax_jit_onednn": "JAX (+ oneDNN's convolutions, through the FFI)"}


def _has_onednn(row: str) -> bool:
    """Whether the row can run: every row but the oneDNN one, which needs the onednn extra built and a CPU."""
    from functional_gan import onednn

    return CONV_ROWS.get(row) != "onednn" or (jax.default_backend() == "cpu" and onednn.available())


@contextlib.contextmanager
def _env(variable: str, value: str | None):
    """``$variable`` set to ``value`` while a program is traced (None: as it is)."""
    before = os.environ.get(variable)
    if value is not None:
        os.environ[variable] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = before


def _batchnorm_form(form: str | None):
    """$FUNCTIONAL_GAN_BATCHNORM set to ``form`` while a program is traced (None: as it is)."""
    from functional_gan.layers import BATCHNORM_FORM_ENV

    return _env(BATCHNORM_FORM_ENV, form)


def _conv_rows() -> dict[str, str]:
    """The JAX rows of the per-layer and per-pass tables this run can time: {framework: $FUNCTIONAL_GAN_CONV}."""
    return {row: conv for row, conv in CONV_ROWS.items() if _has_onednn(row)}


def _compiled_per_row(function, *args) -> tuple[dict, dict]:
    """``function`` jitted and compiled for ``args`` once per row of :func:`_conv_rows`, each traced under its
    convolution library: ({row: compiled}, {row: compile seconds}). Each row jits a function of its own: one jitted
    function would reuse the trace made under the other row's library."""
    compiled, compile_s = {}, {}
    for row, conv in _conv_rows().items():
        start = time.perf_counter()
        with _env(CONV_ENV, conv):
            compiled[row] = jax.jit(lambda *a, f=function: f(*a)).lower(*args).compile()
        compile_s[row] = time.perf_counter() - start
    return compiled, compile_s


def _nnx_jit_step(config: TrainConfig, real_NHWC: jax.Array):
    """The NNX port's step as its users write it: ``nnx.jit`` over the four objects, updated in place. Each call
    walks the objects' graph in Python before and after the compiled program (the cost the split/merge form, row
    ``nnx_split``, does not pay); compile time: the first call's."""
    from functional_gan import nnx_dcgan
    from functional_gan.train import init_state

    generator, discriminator = nnx_dcgan.from_linen(config, init_state(config))
    objects = (generator, discriminator, *nnx_dcgan.make_optimizers(config, generator, discriminator))
    step = nnx_dcgan.make_nnx_step(config)
    start = time.perf_counter()
    jax.block_until_ready(step(*objects, real_NHWC))
    return blocking(lambda: step(*objects, real_NHWC)), dict(compile_s=time.perf_counter() - start,
                                                               note="compile_s: the first call")


def _torch_steps(ctx: Context, config: TrainConfig, real_NCHW: np.ndarray):
    """The tutorial's iteration in PyTorch eager (and under ``torch.compile``): {name: run}, {name: record fields},
    and a function that measures the eager step's peak memory."""
    import torch

    from functional_gan.pytorch import dcgan

    device = ctx.torch_device
    net_g, net_d = dcgan.make_models(config)
    net_g, net_d = net_g.to(device), net_d.to(device)
    opt_g, opt_d = dcgan.make_optimizers(net_g, net_d, config)
    criterion = torch.nn.BCELoss()
    real_t = torch.from_numpy(real_NCHW).to(device)

    def torch_step(g=net_g, d=net_d):
        noise = torch.randn(real_t.shape[0], config.nz, 1, 1, device=device)
        dcgan.tutorial_iteration(g, d, opt_g, opt_d, criterion, real_t, noise)
        torch_sync(device)

    def memory() -> int:
        return torch_peak_memory(torch_step, device, list(net_g.parameters()) + list(net_d.parameters()) + [real_t])

    runs, records = {"torch_eager": torch_step}, {"torch_eager": {}}
    if not ctx.with_torch_compile:
        return runs, records, memory
    try:
        compiled_g, compiled_d = torch.compile(net_g), torch.compile(net_d)
        start = time.perf_counter()
        torch_step(compiled_g, compiled_d)
        records["torch_compile"] = dict(compile_s=time.perf_counter() - start, note="compile_s: the first call")
        runs["torch_compile"] = lambda: torch_step(compiled_g, compiled_d)
    except Exception as error:  # no C++ compiler, unsupported platform ...
        records["torch_compile"] = dict(note=f"torch.compile could not run: {type(error).__name__}: {str(error)[:200]}")
    return runs, records, memory


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
        torch_sync(ctx.torch_device)

    times = interleaved_times({"jax": blocking(lambda: sampler(state, noise)), "torch": torch_sample}, ctx.repeats)
    flops, _ = counting.count(torch_sample)
    return [ctx.record("sampling", "jax_jit", num, times["jax"], compile_s, float(flops), xla_flops(sampler), jax_memory(sampler)),
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
        {"jax": blocking(lambda: compiled(params)), "torch": lambda: torch_linreg.train_backward(data, dtype=torch.float32)},
        ctx.repeats,
    )
    note = "1000 epochs per call; FlopCounterMode counts no elementwise work, so no FLOPs"
    return [ctx.record("linreg_1000_epochs", "jax_jit", 80, times["jax"], compile_s, note=note + "; all epochs one lax.scan"),
            ctx.record("linreg_1000_epochs", "torch_eager", 80, times["torch"], note=note + "; backward() + no_grad update")]


class ConvLayer(NamedTuple):
    """One convolution of the step, as the model calls it."""

    name: str  # e.g. "G main.3 ConvT 512→256 4→8": the network, PyTorch's layer name, the op, channels and size
    transposed: bool
    cin: int
    cout: int
    size: int  # input height (= width)
    stride: int
    padding: int


class GlueLayer(NamedTuple):
    """A BatchNorm and the activation after it: the elementwise and reduction work between the convolutions."""

    name: str  # e.g. "G main.1-2 BatchNorm+ReLU 512@4×4"
    channels: int
    size: int
    activation: str  # "relu" (G) or "leaky_relu" (D)


def network_layers(config: TrainConfig) -> tuple[list[ConvLayer], list[GlueLayer]]:
    """The convolutions and BatchNorm + activation pairs of the config's G and D, in the order they run, read off
    the models by tracing them (``flax.linen.intercept_methods``; shapes only, nothing computed)."""
    import flax.linen as nn

    from functional_gan.layers import BatchNorm2d, Conv2d, ConvTranspose2d
    from functional_gan.train import make_models

    convs, glue_layers = [], []
    net = {}

    def interceptor(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        module = context.module
        if context.method_name != "__call__" or not isinstance(module, (Conv2d, ConvTranspose2d, BatchNorm2d)):
            return out
        index, size = int(module.name.removeprefix("main_")), args[0].shape[1]
        if isinstance(module, BatchNorm2d):
            act = ("ReLU", "relu") if net["name"] == "G" else ("LeakyReLU", "leaky_relu")
            glue_layers.append(GlueLayer(f"{net['name']} main.{index}-{index + 1} BatchNorm+{act[0]} "
                                         f"{module.num_features}@{size}×{size}", module.num_features, size, act[1]))
        else:
            transposed = isinstance(module, ConvTranspose2d)
            convs.append(ConvLayer(f"{net['name']} main.{index} {'ConvT' if transposed else 'Conv'} {module.in_channels}→"
                                   f"{module.out_channels} {size}→{out.shape[1]}", transposed, module.in_channels,
                                   module.out_channels, size, module.stride, module.padding))
        return out

    generator, discriminator = make_models(config)
    images = jax.ShapeDtypeStruct((1, config.image_size, config.image_size, config.nc), jnp.float32)
    with nn.intercept_methods(interceptor):
        net["name"] = "G"
        jax.eval_shape(generator.init, jax.random.key(0), jax.ShapeDtypeStruct((1, config.nz), jnp.float32))
        net["name"] = "D"
        jax.eval_shape(discriminator.init, jax.random.key(0), images)
    return convs, glue_layers


def _conv_case(rng, batch, transposed, cin, cout, size, stride, padding):
    """One convolution of the step at ``batch``: NCHW input and PyTorch-layout kernel (NumPy), this project's op,
    the JAX arrays (NHWC), the output's shape and a random output cotangent (NHWC), passed to each program as an
    argument: a constant cotangent is folded into the compiled program (an all-ones one made D's 64→128 input
    gradient 73 ms where the same pass of a cotangent given took 24 ms, two runs of one script on a 2-core Intel
    Xeon), and a pass measured so is not the pass a training step runs."""
    from functional_gan import layers as jax_layers

    x = rng.normal(size=(batch, cin, size, size)).astype(np.float32)
    w = (0.02 * rng.normal(size=(cin, cout, 4, 4) if transposed else (cout, cin, 4, 4))).astype(np.float32)
    op = jax_layers.conv_transpose2d if transposed else jax_layers.conv2d
    x_j, w_j = jnp.asarray(x.transpose(0, 2, 3, 1)), jnp.asarray(w)
    y = jax.eval_shape(lambda a, b: op(a, b, stride, padding), x_j, w_j)
    return x, w, op, x_j, w_j, y, jnp.asarray(rng.normal(size=y.shape), y.dtype)


def _forward_and_gradients(op, stride: int, padding: int):
    """``(x, w, dy) -> (y, dx, dw)``: the layer's three passes. The output is returned with the gradients: a VJP whose
    output is dropped loses its forward to dead-code elimination, and the row would time two passes of the three its
    FLOPs count (the per-layer rows of earlier runs did, up to 106% of the CPU's FMA throughput)."""

    def run(x, w, dy):
        y, pullback = jax.vjp(lambda a, b: op(a, b, stride, padding), x, w)
        return (y, *pullback(dy))

    return run


def layers(ctx: Context, config: TrainConfig, batch: int) -> list[Record]:
    """Forward + backward (input and kernel gradients) of each convolution of the step, JAX vs PyTorch."""
    import torch

    rng = np.random.default_rng(0)
    records = []
    for name, transposed, cin, cout, size, stride, padding in network_layers(config)[0]:
        x, w, op, x_j, w_j, y, cot = _conv_case(rng, batch, transposed, cin, cout, size, stride, padding)
        compiled, compile_s = _compiled_per_row(_forward_and_gradients(op, stride, padding), x_j, w_j, cot)
        torch_op = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
        x_t = torch.tensor(x, requires_grad=True, device=ctx.torch_device)
        w_t = torch.tensor(w, requires_grad=True, device=ctx.torch_device)
        cot_t = torch.tensor(np.asarray(cot).transpose(0, 3, 1, 2).copy(), device=ctx.torch_device)

        def torch_fwd_bwd():
            torch.autograd.grad(torch_op(x_t, w_t, stride=stride, padding=padding), (x_t, w_t), cot_t)
            torch_sync(ctx.torch_device)

        runs = {row: blocking(lambda c=c: c(x_j, w_j, cot)) for row, c in compiled.items()}
        times = interleaved_times({**runs, "torch": torch_fwd_bwd}, ctx.repeats)
        flops = 3.0 * conv_flops(batch, cin, cout, size, 4, stride, padding, transposed)
        for row, c in compiled.items():
            records.append(ctx.record(f"layer: {name}", row, batch, times[row], compile_s[row], flops, xla_flops(c),
                                      note="forward + input and kernel gradients"))
        records.append(ctx.record(f"layer: {name}", "torch_eager", batch, times["torch"], None, flops))
    return records


def _torch_conv_pass(ctx, transposed, stride, padding, mask):
    """One pass of PyTorch's convolution backward (the aten call autograd makes), restricted by ``mask``."""
    import torch

    def run(cot_t, x_t, w_t):
        torch.ops.aten.convolution_backward(cot_t, x_t, w_t, None, [stride] * 2, [padding] * 2, [1, 1], transposed,
                                            [0, 0], 1, mask)
        torch_sync(ctx.torch_device)

    return run


def passes(ctx: Context, config: TrainConfig, batch: int) -> list[Record]:
    """Each convolution of the step split into its three passes: forward, input gradient, kernel gradient.

    JAX: each pass jitted alone (the unused parts of the VJP are dead code, removed by XLA); PyTorch: the forward
    under ``no_grad`` and ``aten.convolution_backward`` with one gradient asked for, as autograd calls it.
    """
    import torch

    rng = np.random.default_rng(0)
    records = []
    for name, transposed, cin, cout, size, stride, padding in network_layers(config)[0]:
        x, w, op, x_j, w_j, y, cot = _conv_case(rng, batch, transposed, cin, cout, size, stride, padding)
        jax_passes = {  # plain functions, jitted once per row below (a jitted one would keep its first row's trace)
            "forward": lambda a, b, g: op(a, b, stride, padding),
            "input gradient": lambda a, b, g: jax.vjp(lambda a_: op(a_, b, stride, padding), a)[1](g)[0],
            "kernel gradient": lambda a, b, g: jax.vjp(lambda b_: op(a, b_, stride, padding), b)[1](g)[0],
        }
        torch_op = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
        x_t, w_t = torch.tensor(x, device=ctx.torch_device), torch.tensor(w, device=ctx.torch_device)
        cot_t = torch.tensor(np.asarray(cot).transpose(0, 3, 1, 2).copy(), device=ctx.torch_device)

        def torch_forward():
            with torch.no_grad():
                torch_op(x_t, w_t, stride=stride, padding=padding)
            torch_sync(ctx.torch_device)

        torch_passes = {
            "forward": torch_forward,
            "input gradient": lambda m=_torch_conv_pass(ctx, transposed, stride, padding, [True, False, False]): m(cot_t, x_t, w_t),
            "kernel gradient": lambda m=_torch_conv_pass(ctx, transposed, stride, padding, [False, True, False]): m(cot_t, x_t, w_t),
        }
        flops = conv_flops(batch, cin, cout, size, 4, stride, padding, transposed)
        for which, function in jax_passes.items():
            compiled, compile_s = _compiled_per_row(function, x_j, w_j, cot)
            runs = {row: blocking(lambda c=c: c(x_j, w_j, cot)) for row, c in compiled.items()}
            times = interleaved_times({**runs, "torch": torch_passes[which]}, ctx.repeats)
            workload = f"pass: {name} · {which}"
            for row, c in compiled.items():
                records.append(ctx.record(workload, row, batch, times[row], compile_s[row], flops, xla_flops(c)))
            records.append(ctx.record(workload, "torch_eager", batch, times["torch"], None, flops))
    return records


def glue(ctx: Context, config: TrainConfig, batch: int) -> list[Record]:
    """Training-mode BatchNorm (running statistics updated) + activation, forward and backward (input, weight
    and bias gradients), at each place of the step: this project's BatchNorm2d jitted against PyTorch's eager
    ``F.batch_norm``."""
    import torch
    import torch.nn.functional as F

    from functional_gan.layers import BatchNorm2d

    rng = np.random.default_rng(0)
    records = []
    for name, channels, size, activation in network_layers(config)[1]:
        x = rng.normal(size=(batch, channels, size, size)).astype(np.float32)
        module = BatchNorm2d(channels)
        x_j = jnp.asarray(x.transpose(0, 2, 3, 1))
        variables = module.init(jax.random.key(0), x_j)
        act = (lambda v: jax.nn.relu(v)) if activation == "relu" else (lambda v: jax.nn.leaky_relu(v, 0.2))

        def forward(params, x_, stats=variables["batch_stats"], act=act, module=module):
            y, updates = module.apply({"params": params, "batch_stats": stats}, x_, mutable=["batch_stats"])
            return act(y), updates

        def fwd_bwd(params, x_, cot_, forward=forward):  # the cotangent an argument: a constant one is folded in
            out, pullback, updates = jax.vjp(forward, params, x_, has_aux=True)
            return pullback(cot_), updates

        cot = jnp.asarray(rng.normal(size=x_j.shape), jnp.float32)
        start = time.perf_counter()
        compiled = jax.jit(fwd_bwd).lower(variables["params"], x_j, cot).compile()
        compile_s = time.perf_counter() - start
        with _batchnorm_form("reductions"):  # the previous form, for the A/B in the same run (a function of its
            # own: jit would reuse fwd_bwd's trace, made in the other form)
            before = jax.jit(lambda p, a, g, f=fwd_bwd: f(p, a, g)).lower(variables["params"], x_j, cot).compile()
        x_t = torch.tensor(x, requires_grad=True, device=ctx.torch_device)
        w_t = torch.tensor(np.asarray(variables["params"]["weight"]), requires_grad=True, device=ctx.torch_device)
        b_t = torch.zeros(channels, requires_grad=True, device=ctx.torch_device)
        running_mean, running_var = torch.zeros(channels, device=ctx.torch_device), torch.ones(channels, device=ctx.torch_device)
        torch_act = F.relu if activation == "relu" else (lambda v: F.leaky_relu(v, 0.2))
        cot_t = torch.tensor(np.asarray(cot).transpose(0, 3, 1, 2).copy(), device=ctx.torch_device)

        def torch_fwd_bwd():
            y = torch_act(F.batch_norm(x_t, running_mean, running_var, w_t, b_t, training=True, momentum=0.1, eps=1e-5))
            torch.autograd.grad(y, (x_t, w_t, b_t), cot_t)
            torch_sync(ctx.torch_device)

        params = variables["params"]
        times = interleaved_times({"jax": blocking(lambda c=compiled, p=params, a=x_j, g=cot: c(p, a, g)),
                                   "before": blocking(lambda c=before, p=params, a=x_j, g=cot: c(p, a, g)),
                                   "torch": torch_fwd_bwd},
                                  ctx.repeats)
        workload = f"glue: {name}"
        records.append(ctx.record(workload, "jax_jit", batch, times["jax"], compile_s,
                                  note="forward + input, weight and bias gradients; running statistics updated"))
        records.append(ctx.record(workload, "jax_jit_bn_reductions", batch, times["before"]))
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
