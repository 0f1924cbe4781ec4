"""check-port's time and peak resident memory on example ports, each check a process of its own, one at a time.

    python -m functional_gan.benchmarks.check_port_memory [--out benchmarks/results] [--quick]

For each spec and program choice: the wall time and the process's peak resident set (``ru_maxrss`` of the child,
what ``/usr/bin/time -v`` prints as "Maximum resident set size"), and the check's own phase table (``--memory``:
the resident memory at the end of each phase and the peak so far, read from ``/proc/self/status``). Writes
``check-port-memory.json`` and ``.md`` to ``--out``. Run it alone on the machine: the times depend on the load, the
memory does not. ``--quick`` checks the MNIST example only; ``--only gpt2.py`` one example's checks (the GPT-2 ones take
about 2 minutes each and up to 12 GiB).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "port"
CHECKS = [  # (spec, what it is, extra flags)
    ("mnist_cnn_nnx.py", "pytorch/examples' MNIST Net, Flax NNX, 1.2M parameters, Adadelta", ()),
    ("resnet50_nnx.py", "torchvision's ResNet-50 (25.6M parameters), Flax NNX, SGD with momentum, training mode, "
                        "batch 4 of 32 × 32", ()),
    ("resnet50_nnx.py", "the same, the compiled program only", ("--program", "jit")),
    ("resnet50.py", "ResNet-50 with a CIFAR stem (the first stage at 32 × 32: activations 16 times torchvision's), "
                    "Linen, 23.5M parameters, SGD with momentum, training mode, batch 4 of 32 × 32", ()),
    ("resnet50.py", "the same, the compiled program only", ("--program", "jit")),
    ("gpt2.py", "GPT-2 small (nanoGPT, 124M parameters, tied embedding), Linen with nn.scan, AdamW, 2 × 64 tokens",
     ("--program", "jit")),
    ("gpt2.py", "the same, block by block (12 blocks)", ("--program", "jit", "--by-block")),
    ("gpt2.py", "the same, both programs", ()),
    ("gpt2.py", "the same, block by block, both programs", ("--by-block",)),
    ("gpt2.py", "the same in float64, the compiled program", ("--dtype", "float64", "--program", "jit")),
    ("gpt2.py", "the same in float64, both programs", ("--dtype", "float64")),
    ("gpt2.py", "the same in float64, block by block, both programs", ("--dtype", "float64", "--by-block")),
]


def measure(spec: Path, flags: tuple[str, ...]) -> dict:
    """One check in a process of its own: its exit status, wall time, peak resident memory and phase table."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [sys.executable, "-m", "functional_gan.main", "check-port", str(spec), "--memory",
                   "--json", str(report), *flags]
        out_file, err_file = Path(folder) / "out.txt", Path(folder) / "err.txt"
        start = time.perf_counter()
        with open(out_file, "w") as stdout, open(err_file, "w") as stderr:  # files: a pipe would fill and stall it
            process = subprocess.Popen(command, stdout=stdout, stderr=stderr)
            _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        out, err = out_file.read_text(), err_file.read_text()
        code = os.waitstatus_to_exitcode(status)
        if code not in (0, 1, 3):
            raise RuntimeError(f"check-port {spec.name} {' '.join(flags)} exited {code}:\n{err[-2000:]}")
        peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        data = json.loads(report.read_text())
        rows = data["rows"] if "rows" in data else [row for block in data["blocks"] for row in block["rows"]]
    phases = out[out.index("Memory (resident"):].strip() if "Memory (resident" in out else ""
    return {"spec": spec.name, "flags": list(flags), "exit_status": code, "wall_s": round(wall, 1),
            "peak_gib": round(peak / 1024 ** 3, 2), "quantities": len(rows), "phases": phases}


def markdown(results: list[dict], machine: str) -> str:
    lines = ["# check-port: time and peak memory", "", f"Machine: {machine}. One check at a time, each its own "
             "process; peak = the process's maximum resident set (`ru_maxrss`).", "",
             "| check | flags | quantities | exit | wall | peak resident |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['spec']} | {' '.join(r['flags']) or 'both programs'} | {r['quantities']} | "
                     f"{r['exit_status']} | {r['wall_s']} s | {r['peak_gib']} GiB |")
    for r in results:
        if r["phases"]:
            lines += ["", f"## {r['spec']} {' '.join(r['flags']) or '(both programs)'}", "", "```text", r["phases"],
                      "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results",
                        help="folder for check-port-memory.json and .md (with --only: check-port-memory-SPEC.*)")
    parser.add_argument("--quick", action="store_true", help="the MNIST example only")
    parser.add_argument("--only", metavar="SPEC", help="the checks of this example only (gpt2.py, resnet50.py, ...)")
    args = parser.parse_args(argv)
    checks = CHECKS[:1] if args.quick else CHECKS
    if args.only:
        checks = [c for c in checks if c[0] == args.only]
        if not checks:
            parser.error(f"--only: no check of {args.only!r}; the examples: {sorted({c[0] for c in CHECKS})}")
    results = []
    for spec, what, flags in checks:
        print(f"check-port {spec} {' '.join(flags)} ...", flush=True)
        result = {**measure(EXAMPLES / spec, tuple(flags)), "what": what}
        print(f"  {result['wall_s']} s, peak {result['peak_gib']} GiB, exit {result['exit_status']}", flush=True)
        results.append(result)
    cpu = next((re.sub(r"\s+", " ", line.split(":", 1)[1]).strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), platform.processor()) \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    machine = f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "check-port-memory" + (f"-{Path(args.only).stem}" if args.only else "")
    (out / f"{name}.json").write_text(json.dumps({"machine": machine, "results": results}, indent=1) + "\n")
    (out / f"{name}.md").write_text(markdown(results, machine))
    print(f"Wrote {out / f'{name}.json'} and {out / f'{name}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
