"""The benchmark's own logic (timings are measured by `functional-gan bench`, never asserted here)."""

import json

import pytest

from functional_gan.benchmarks import bench
from functional_gan.main import main


def _record(workload, framework, batch, median_s, flops=None):
    return bench.Record(workload, framework, "cpu", "cpu", batch, median_s, median_s, median_s, None, flops, None,
                        flops / median_s if flops else None, None, None, 3, {})


def test_ratios_are_time_over_pytorch_eager_per_workload_and_batch():
    records = [_record("dcgan_step", "jax_jit", 64, 0.5), _record("dcgan_step", "torch_eager", 64, 1.0),
               _record("dcgan_step", "jax_jit", 128, 3.0), _record("dcgan_step", "torch_eager", 128, 2.0)]
    ratios = bench.ratio_to(records)
    assert ratios[("dcgan_step", 64, "jax_jit")] == 0.5 and ratios[("dcgan_step", 128, "jax_jit")] == 1.5
    table = bench.format_table(records, markdown=True)
    assert table.splitlines()[0].startswith("| workload | batch | framework | median ms")
    assert "| 0.50 |" in table and "| 1.50 |" in table


def test_the_interleaved_timer_calls_every_function_in_turn():
    calls = []
    times = bench.interleaved_times({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1)
    assert calls == ["a", "b"] * 4 and {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}


def test_bench_rejects_bad_settings(capsys):
    assert main(["bench", "--repeats", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err


def test_linear_regression_workload_writes_records(tmp_path):
    ctx = bench.Context(repeats=2, with_torch_compile=False)
    records = bench.linear_regression(ctx)
    assert [r.framework for r in records] == ["jax_jit", "torch_eager"]
    assert all(r.median_s > 0 and r.min_s <= r.median_s <= r.max_s for r in records)
    path = tmp_path / "r.json"
    path.write_text(json.dumps([r.__dict__ for r in records]))
    fields = set(json.loads(path.read_text())[0])
    assert fields >= {"workload", "framework", "backend", "device", "batch", "median_s", "min_s", "max_s", "compile_s",
                      "flops", "flops_per_s", "fraction_of_peak", "peak_memory_bytes", "versions"}


def test_per_pass_and_batchnorm_workloads_time_both_frameworks_and_get_their_own_tables():
    ctx = bench.Context(repeats=1, with_torch_compile=False)
    records = bench.passes(ctx, 2) + bench.glue(ctx, 2)
    names = {(r.workload, r.framework) for r in records}
    for name, *_ in bench.DCGAN_LAYERS:
        for which in ("forward", "input gradient", "kernel gradient"):
            assert {(f"pass: {name} · {which}", "jax_jit"), (f"pass: {name} · {which}", "torch_eager")} <= names
    for name, *_ in bench.DCGAN_GLUE:
        assert {(f"glue: {name}", "jax_jit"), (f"glue: {name}", "torch_eager")} <= names
    assert all(r.median_s > 0 for r in records)
    markdown = bench.to_markdown(ctx, records, None, "functional-gan bench")
    assert "## Per pass: each convolution's forward, input gradient and kernel gradient alone (batch 2)" in markdown
    assert "## BatchNorm + activation between the convolutions: forward + backward (batch 2)" in markdown
    assert "## Results" in markdown and "pass: " not in markdown.split("## Per pass")[0]


@pytest.mark.slow  # about 35 s: a training run and four whole processes
def test_startup_runs_the_command_line_as_whole_processes_cold_then_warm():
    ctx = bench.Context(repeats=1, with_torch_compile=False)
    records = bench.startup(ctx, repeats=1)
    assert [r.workload for r in records] == ["startup: functional-gan --help", "startup: sample 64 images, cold cache",
                                              "startup: sample 64 images, warm cache"]
    assert all(r.framework == "cli" and r.repeats == 1 and r.median_s > 0 for r in records)
    markdown = bench.to_markdown(ctx, records, None, "functional-gan bench")
    assert "## Start-up of the command line: whole processes, wall time\n" in markdown
    assert "programs loaded from the persistent compilation cache" in markdown
