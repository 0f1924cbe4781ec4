"""Where one DCGAN step spends its time: the top operations by time in JAX and in PyTorch, one run.

    python -m functional_gan.benchmarks.profile_step [--batch 64] [--steps 5] [--top 10] [--markdown FILE]

JAX: the tutorial's jitted step is compiled, run twice, then traced for ``--steps`` steps with
``jax.profiler``; the trace's events on XLA's CPU worker threads are summed per HLO operation (a
fusion, or a library call such as a convolution), each described from the compiled HLO (what it
computes, its output shape), and operations with the same description summed (the batch chunks of
one convolution are separate operations of one shape). PyTorch: the tutorial's eager iteration, run twice, then
``--steps`` iterations under ``torch.profiler`` (CPU activities, shapes recorded), its operators
ranked by self time (time in the operator itself, not in the operators it calls).

Times are per step and summed over threads: on 2 cores an operation's time can exceed its share of
the step's wall time, and the "share" column is of the busy time of all threads, not of the wall
time. The wall time of one step (median of the traced steps, clock read around each) is printed
beside it for scale. Profiling adds overhead to both sides; compare shapes of the two lists, not
single milliseconds.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import os
import re
import statistics
import sys
import tempfile
import time

import numpy as np

# Operations inside an XLA fusion that say what it does, heaviest first.
_HEAVY_OPS = ("convolution", "dot", "custom-call", "reduce-window", "select-and-scatter", "reduce", "scatter",
              "gather", "transpose", "concatenate", "pad", "slice")


@dataclasses.dataclass
class Row:
    framework: str
    name: str
    ms_per_step: float
    share: float  # of all threads' busy time in the profiled steps
    calls_per_step: float
    what: str


def _hlo_description(hlo: str, name: str) -> str:
    """What HLO instruction ``name`` computes: its kind and output shape, and for a fusion its heaviest inner ops."""
    found = re.search(r"\n\s*(?:ROOT )?%?" + re.escape(name) + r" = (\S+) ([\w-]+)\(([^\n]*)", hlo)
    if not found:
        return "?"
    shape, opcode, rest = found.groups()
    if opcode == "custom-call":
        target = re.search(r'custom_call_target="([^"]+)"', rest)
        return f"custom-call {target.group(1) if target else ''} → {shape}"
    if opcode != "fusion":
        return f"{opcode} → {shape}"
    called = re.search(r"calls=%?([\w.-]+)", rest)
    body = re.search(r"\n%?" + re.escape(called.group(1)) + r" [^{]*\{(.*?)\n\}", hlo, re.S) if called else None
    ops = re.findall(r"= (\S+) ([\w-]+)\(", body.group(1)) if body else []
    heavy = [(s, op) for s, op in ops if op in _HEAVY_OPS]
    heavy.sort(key=lambda item: _HEAVY_OPS.index(item[1]))
    inner = ", ".join(dict.fromkeys(f"{op} {s}" for s, op in heavy[:2])) or "elementwise"
    return f"fusion ({inner}) → {shape}"


def profile_jax(config, batch: int, steps: int) -> tuple[list[Row], float, float]:
    """(rows, wall ms per step, compile s) for the jitted step."""
    import jax

    from functional_gan.train import init_state, make_train_step

    state = init_state(config)
    real = jax.random.uniform(jax.random.key(1), (batch, config.image_size, config.image_size, config.nc),
                              minval=-1, maxval=1)
    start = time.perf_counter()
    step = make_train_step(config).lower(state, real).compile()
    compile_s = time.perf_counter() - start
    for _ in range(2):
        state, metrics = step(state, real)
    jax.block_until_ready(metrics)
    walls = []
    with tempfile.TemporaryDirectory(prefix="profile-step-") as folder:
        jax.profiler.start_trace(folder)
        for _ in range(steps):
            start = time.perf_counter()
            state, metrics = step(state, real)
            jax.block_until_ready(metrics)
            walls.append(time.perf_counter() - start)
        jax.profiler.stop_trace()
        data = jax.profiler.ProfileData.from_file(sorted(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True))[-1])
    hlo = step.as_text()
    totals, counts = collections.Counter(), collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_XLA"):  # XLA:CPU's worker threads
                continue
            for event in line.events:
                if re.match(r"^[\w.-]+$", event.name) and f"{event.name} = " in hlo:
                    totals[event.name] += event.duration_ns
                    counts[event.name] += 1
    # The batch chunks of one layer's convolution are separate HLO operations of the same kind and
    # shape: summed under their common description, they compare with PyTorch's one operator per shape.
    grouped, calls, names = collections.Counter(), collections.Counter(), {}
    for name, ns in totals.items():
        what = re.sub(r"\{[\d,]*\}", "", _hlo_description(hlo, name))
        grouped[what] += ns
        calls[what] += counts[name]
        names.setdefault(what, re.sub(r"\.\d+$", "", name))
    busy = sum(grouped.values()) or 1
    rows = [Row("jax", names[what], ns / 1e6 / steps, ns / busy, calls[what] / steps, what)
            for what, ns in grouped.most_common()]
    return rows, statistics.median(walls) * 1e3, compile_s


def profile_torch(config, batch: int, steps: int) -> tuple[list[Row], float]:
    """(rows, wall ms per step) for the tutorial's eager iteration."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from functional_gan.pytorch import dcgan

    net_g, net_d = dcgan.make_models(config)
    opt_g, opt_d = dcgan.make_optimizers(net_g, net_d, config)
    criterion = torch.nn.BCELoss()
    real = torch.from_numpy(np.random.default_rng(1).uniform(
        -1, 1, (batch, config.nc, config.image_size, config.image_size)).astype(np.float32))

    def iteration():
        dcgan.tutorial_iteration(net_g, net_d, opt_g, opt_d, criterion, real, torch.randn(batch, config.nz, 1, 1))

    for _ in range(2):
        iteration()
    walls = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            start = time.perf_counter()
            iteration()
            walls.append(time.perf_counter() - start)
    events = [e for e in prof.key_averages(group_by_input_shape=True) if e.self_cpu_time_total > 0]
    busy = sum(e.self_cpu_time_total for e in events) or 1
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    rows = [Row("pytorch", e.key, e.self_cpu_time_total / 1e3 / steps, e.self_cpu_time_total / busy, e.count / steps,
                "inputs " + " ".join(str(list(s)) for s in (e.input_shapes or [])[:2] if s))
            for e in events]
    return rows, statistics.median(walls) * 1e3


def markdown(jax_rows, torch_rows, top: int, header: str) -> str:
    lines = [header, ""]
    for title, rows in (("JAX (XLA:CPU), per kind of HLO operation and shape", jax_rows), ("PyTorch eager, per operator (self time)", torch_rows)):
        lines += [f"**{title}**", "", "| # | operation | ms / step | share of busy time | calls / step | what |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {i} | `{r.name[:48]}` | {r.ms_per_step:.1f} | {100 * r.share:.1f}% | {r.calls_per_step:g} | `{r.what[:110]}` |"
                  for i, r in enumerate(rows[:top], 1)]
        covered = sum(r.share for r in rows[:top])
        lines += ["", f"The top {top} hold {100 * covered:.0f}% of the busy time ({len(rows)} operations in all).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64, help="batch size of the step (default 64)")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps per framework (default 5)")
    parser.add_argument("--top", type=int, default=10, help="operations listed per framework (default 10)")
    parser.add_argument("--markdown", help="also write the tables to this Markdown file")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.steps < 1 or args.top < 1:
        parser.error("--batch, --steps and --top must be positive")

    import jax
    import torch

    from functional_gan.config import TUTORIAL

    config = dataclasses.replace(TUTORIAL, batch_size=args.batch)
    torch.set_num_threads(os.cpu_count() or 1)  # the threads XLA:CPU uses, as bench pins them
    jax_rows, jax_wall, compile_s = profile_jax(config, args.batch, args.steps)
    torch_rows, torch_wall = profile_torch(config, args.batch, args.steps)
    header = (f"One DCGAN step (the tutorial's nets, 64×64, batch {args.batch}, float32), {args.steps} profiled steps "
              f"each, jax {jax.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads: "
              f"JAX {jax_wall:.0f} ms per step under the profiler (compile {compile_s:.1f} s), "
              f"PyTorch eager {torch_wall:.0f} ms.")
    text = markdown(jax_rows, torch_rows, args.top, header)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
