"""``functional-gan bench``: JAX and PyTorch timed on the same work, side by side in one run.

Workloads: one DCGAN training iteration (the tutorial's nets, 64×64, the batch resident on the
device, and tiny nets whose step time is mostly each call's own cost), sampling 64 images from G,
the book's linear regression (1000 epochs), and the per-layer forward+backward times that show
where a step's time goes.

Frameworks: JAX ``jit`` of the Linen step (one step per call, and K steps in one ``lax.scan``),
the Flax NNX port (``nnx.jit`` on its objects, and split/merge around ``jax.jit`` as
``train --api nnx`` runs it), PyTorch eager and ``torch.compile`` (skipped with a note where it
cannot run).

Method: warm-up calls first; ``block_until_ready`` / ``cuda.synchronize`` before every clock
read; the frameworks' calls interleaved (A B A B ...) so that a change in machine load hits all
alike; median, min and max over the repeats; compile time measured apart; PyTorch given as many
threads as XLA's CPU client uses; float32 with TF32 off on both sides on GPUs. FLOPs follow
``torch.utils.flop_counter.FlopCounterMode`` (2 per multiply-add, convolutions and matmuls) for
the tutorial's own iteration, for both frameworks; XLA's cost analysis of the JAX step is
reported beside it (it skips padding and counts the work JAX actually does). A convolution's pass
counts the multiply-adds its mathematics needs (padding's zeros not counted), the same for both
frameworks whatever form each computes it in. The fraction of peak is against the machine's measured
peak: the best rate of float32 GEMMs of several shapes (square, and the tall, narrow ones convolutions
lower to) in either framework, at the start and the end of the same run; the CPU's theoretical FMA
throughput is printed beside it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from functional_gan.benchmarks import report, workloads
from functional_gan.benchmarks.timing import Context, Record
from functional_gan.config import TUTORIAL, TrainConfig

FULL_BATCHES = (64, 128)  # the DCGAN step's batches (the command line's default)
SCALING_BATCHES = (16, 32, 64, 128, 256)  # the scaling sweep's
SCAN_STEPS = 4  # steps per call of the unrolled lax.scan variant
LAYER_BATCH = 64  # the batch of the per-layer, per-pass and BatchNorm timings
# Nets so small (32×32, nz 8, widths 4, batch 4) that a step's time is mostly what each call costs around the
# compiled program: the frameworks' dispatch, and the NNX objects' graph walked in Python.
TINY_NETS = dataclasses.replace(TUTORIAL, image_size=32, nz=8, ngf=4, ndf=4, batch_size=4)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one ``bench`` run measures: the command line's flags, resolved."""

    batches: tuple[int, ...]  # DCGAN step batches, the scaling sweep's included
    repeats: int
    scan_steps: int = SCAN_STEPS
    torch_compile: bool = True
    tf32: bool = False
    layers: bool = True  # the per-layer, per-pass and BatchNorm timings
    startup: bool = True  # the command line's start-up, as whole processes
    config: TrainConfig = TUTORIAL


def workload_list(ctx: Context, plan: Plan) -> list[tuple[str, Callable[[], list[Record]]]]:
    """The run's workloads in order, each a label and a function returning its records."""
    config = plan.config
    jobs = [("matmul peak", lambda: workloads.matmul_peak(ctx, "start"))]
    for batch in plan.batches:
        jobs.append((f"DCGAN step, batch {batch}", lambda b=batch: workloads.dcgan_step(ctx, config, b, plan.scan_steps)))
    jobs.append(("DCGAN step, tiny nets", lambda: workloads.dcgan_step(ctx, TINY_NETS, TINY_NETS.batch_size, plan.scan_steps,
                                                                        "dcgan_step (tiny nets: per-call cost)")))
    jobs.append(("sampling 64 images", lambda: workloads.sampling(ctx, config)))
    jobs.append(("linear regression", lambda: workloads.linear_regression(ctx)))
    if plan.layers:
        jobs.append((f"per-layer timings, batch {LAYER_BATCH}", lambda: workloads.layers(ctx, config, LAYER_BATCH)))
        jobs.append((f"per-pass timings, batch {LAYER_BATCH}", lambda: workloads.passes(ctx, config, LAYER_BATCH)))
        jobs.append((f"BatchNorm + activation, batch {LAYER_BATCH}", lambda: workloads.glue(ctx, config, LAYER_BATCH)))
    if plan.startup:
        jobs.append(("start-up of the command line", lambda: workloads.startup(ctx)))
    jobs.append(("matmul peak, again", lambda: workloads.matmul_peak(ctx, "end")))
    return jobs


def run(plan: Plan, print_fn: Callable[[str], None] = print) -> tuple[Context, list[Record]]:
    """Measure the plan's workloads, one after another, alone on the machine; the context and the records."""
    from functional_gan.progress import progress_bar

    ctx = Context(plan.repeats, with_torch_compile=plan.torch_compile, tf32=plan.tf32)
    for line in report.header_lines(ctx):
        print_fn(line)
    records: list[Record] = []
    jobs = workload_list(ctx, plan)
    with progress_bar(total=len(jobs), desc="bench", unit="workload") as bar:
        for label, job in jobs:
            bar.set_postfix_str(label)
            records += job()
            bar.update(1)
    ctx.set_fractions_of_peak(records)
    return ctx, records


def method() -> str:
    """The method, for the Markdown page: this module's documentation after its first two paragraphs."""
    return " ".join(__doc__.split("\n\n")[2:]).replace("\n", " ")
