"""Does an opt-in XLA:CPU flag make the DCGAN step faster? A same-run A/B of flag sets.

    python -m functional_gan.benchmarks.xla_flags [--batch 64] [--rounds 3] [--steps 5]

XLA_FLAGS must be set before jax starts, so each measurement is a fresh process; the flag sets
take turns (round 1: A B C, round 2: A B C, ...) so that a change in machine load hits all alike.
Each process compiles the tutorial's step, runs warm-up steps, then reports the median of
``--steps`` timed steps. The script prints the median over rounds and the ratio to no flags.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

FLAG_SETS = {
    "none": "",
    "ynn convolutions": "--xla_cpu_experimental_ynn_fusion_type=+individual_convolution",
    "onednn custom call": "--xla_cpu_experimental_onednn_custom_call=true",
}

_CHILD = """
import dataclasses, json, statistics, sys, time
import jax, jax.numpy as jnp
from functional_gan.config import TUTORIAL
from functional_gan.train import init_state, make_train_step
batch, steps = int(sys.argv[1]), int(sys.argv[2])
config = dataclasses.replace(TUTORIAL, batch_size=batch)
state = init_state(config)
real = jax.random.uniform(jax.random.key(1), (batch, 64, 64, 3), minval=-1, maxval=1)
step = make_train_step(config).lower(state, real).compile()
hlo = step.as_text()
for _ in range(2):
    state, metrics = step(state, real); jax.block_until_ready(metrics)
times = []
for _ in range(steps):
    start = time.perf_counter(); state, metrics = step(state, real); jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
print(json.dumps({"median_s": statistics.median(times), "ynn": hlo.count("__ynn"), "onednn": hlo.count("onednn")}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64, help="batch size of the step")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of A B C ...")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per process")
    args = parser.parse_args(argv)
    results: dict[str, list[dict]] = {name: [] for name in FLAG_SETS}
    for round_ in range(args.rounds):
        for name, flags in FLAG_SETS.items():
            env = {**os.environ, "XLA_FLAGS": flags}
            out = subprocess.run([sys.executable, "-c", _CHILD, str(args.batch), str(args.steps)], env=env,
                                 capture_output=True, text=True, check=True)
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {round_ + 1}, {name}: {results[name][-1]['median_s'] * 1e3:.0f} ms", flush=True)
    base = statistics.median(r["median_s"] for r in results["none"])
    print(f"\nDCGAN step, batch {args.batch}, median over {args.rounds} rounds:")
    for name, runs in results.items():
        median = statistics.median(r["median_s"] for r in runs)
        print(f"  {name:20s} {median * 1e3:7.0f} ms  ×{median / base:.2f} of no flags  "
              f"(library ops in the HLO: ynn {runs[0]['ynn']}, onednn {runs[0]['onednn']})  XLA_FLAGS={FLAG_SETS[name]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
