"""The benchmark's own logic (timings are measured by `functional-gan bench`, never asserted here)."""

import dataclasses
import types
from pathlib import Path

import numpy as np
import pytest

from functional_gan.benchmarks import report, timing, workloads
from functional_gan.config import TUTORIAL
from functional_gan.main import main


def _record(workload, framework, batch, median_s, flops=None):
    return timing.Record(workload, framework, "cpu", "cpu", batch, median_s, median_s, median_s, None, flops, None,
                         flops / median_s if flops else None, None, None, 3, {})


def test_ratios_are_time_over_pytorch_eager_per_workload_and_batch():
    records = [_record("dcgan_step", "jax_jit", 64, 0.5), _record("dcgan_step", "torch_eager", 64, 1.0),
               _record("dcgan_step", "jax_jit", 128, 3.0), _record("dcgan_step", "torch_eager", 128, 2.0)]
    ratios = report.ratio_to(records)
    assert ratios[("dcgan_step", 64, "jax_jit")] == 0.5 and ratios[("dcgan_step", 128, "jax_jit")] == 1.5
    table = report.format_table(records, markdown=True)
    assert table.splitlines()[0].startswith("| workload | batch | framework | median ms")
    assert "| 0.50 |" in table and "| 1.50 |" in table


def test_the_interleaved_timer_calls_every_function_in_turn_each_first_as_often():
    calls = []
    times = timing.interleaved_times({k: (lambda k=k: calls.append(k)) for k in "abc"}, repeats=3, warmup=1)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")  # the warm-up, then rotated rounds
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}


def test_bench_rejects_bad_settings(capsys):
    assert main(["bench", "--repeats", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err


def test_bench_check_port_runs_the_memory_benchmark_rows_for_the_example_asked(monkeypatch, tmp_path, capsys):
    from functional_gan.benchmarks import check_port_memory

    calls = []
    monkeypatch.setattr(check_port_memory, "main", lambda argv: calls.append(argv) or 0)
    assert main(["bench", "--check-port", "gpt2.py", "--json", str(tmp_path / "out" / "x.json")]) == 0
    assert main(["bench", "--check-port", "--quick"]) == 0
    assert main(["bench", "--check-port", "examples/port/resnet50_nnx.py"]) == 0  # a path names its example
    assert calls == [["--out", str(tmp_path / "out"), "--only", "gpt2.py"], ["--out", "benchmarks/results", "--quick"],
                     ["--out", "benchmarks/results", "--only", "resnet50_nnx.py"]]
    assert main(["bench", "--check-port", "gtp2.py"]) == 2
    assert "no such example; the examples measured: gpt2.py, mnist_cnn_nnx.py, resnet50.py" in capsys.readouterr().err
    monkeypatch.setattr(check_port_memory, "EXAMPLES", tmp_path / "nowhere")
    assert main(["bench", "--check-port"]) == 2
    assert "which the installed package does not hold" in capsys.readouterr().err and len(calls) == 3


def test_the_header_says_whether_tf32_was_allowed():
    ctx = types.SimpleNamespace(backend="cpu", jax_device="TFRT_CPU_0", torch_device="cpu", repeats=3, tf32=False,
                                versions={"jax": "j", "torch": "t", "threads": 2, "cpu": "c", "xla_flags": "",
                                          "transposed_conv_form": "subpixel"})
    assert "TF32 off on both sides" in report.header_lines(ctx)[2]
    ctx.tf32 = True
    assert "TF32 allowed on both sides" in report.header_lines(ctx)[2] and "off" not in report.header_lines(ctx)[2]


def test_linear_regression_workload_writes_records_the_json_writer_keeps(tmp_path):
    ctx = timing.Context(repeats=2, with_torch_compile=False)
    records = workloads.linear_regression(ctx)
    assert [r.framework for r in records] == ["jax_jit", "torch_eager"]
    assert all(r.median_s > 0 and r.min_s <= r.median_s <= r.max_s for r in records)
    path = report.write_json(records, tmp_path / "out" / "r.json")
    assert report.read_json(path) == records  # every field, the versions included, back as written
    assert {f.name for f in dataclasses.fields(timing.Record)} >= {
        "workload", "framework", "backend", "device", "batch", "median_s", "min_s", "max_s", "compile_s", "flops",
        "flops_per_s", "fraction_of_peak", "peak_memory_bytes", "versions"}


def test_the_layer_table_is_the_tutorials_networks_as_pytorch_builds_them():
    import torch

    from functional_gan.pytorch import dcgan

    convs, glue = workloads.network_layers(TUTORIAL)
    expected, inputs = [], {}
    net_g, net_d = dcgan.make_models(TUTORIAL)
    def input_size(key):
        def hook(_module, args, _output):
            inputs[key] = args[0].shape[-1]  # returns None: the output stays as it is
        return hook

    for label, net in (("G", net_g), ("D", net_d)):
        for index, module in enumerate(net.main):
            module.register_forward_hook(input_size((label, index)))
    with torch.no_grad():
        net_d(net_g(torch.zeros(1, TUTORIAL.nz, 1, 1)))
    for label, net in (("G", net_g), ("D", net_d)):
        for index, module in enumerate(net.main):
            if isinstance(module, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)):
                expected.append((label, index, isinstance(module, torch.nn.ConvTranspose2d), module.in_channels,
                                 module.out_channels, inputs[(label, index)], module.stride[0], module.padding[0]))
    assert [(c.name.split()[0], int(c.name.split()[1].removeprefix("main.")), *c[1:]) for c in convs] == expected
    assert convs[0].name == "G main.0 ConvT 100→512 1→4" and convs[-1].name == "D main.11 Conv 512→1 4→1"
    batch_norms = [(label, index, module.num_features) for label, net in (("G", net_g), ("D", net_d))
                   for index, module in enumerate(net.main) if isinstance(module, torch.nn.BatchNorm2d)]
    assert [(g.name.split()[0], g.name.split()[1], g.channels) for g in glue] == [
        (label, f"main.{index}-{index + 1}", channels) for label, index, channels in batch_norms]
    assert {g.activation for g in glue if g.name.startswith("G")} == {"relu"}
    assert {g.activation for g in glue if g.name.startswith("D")} == {"leaky_relu"}


def test_per_pass_and_batchnorm_workloads_time_both_frameworks_and_get_their_own_tables():
    ctx = timing.Context(repeats=1, with_torch_compile=False)
    records = workloads.passes(ctx, TUTORIAL, 2) + workloads.glue(ctx, TUTORIAL, 2)
    names = {(r.workload, r.framework) for r in records}
    convs, glue = workloads.network_layers(TUTORIAL)
    for layer in convs:  # XLA's convolutions, oneDNN's (the onednn extra, installed with the test extra), PyTorch
        for which in ("forward", "input gradient", "kernel gradient"):
            assert {(f"pass: {layer.name} · {which}", f) for f in ("jax_jit", "jax_jit_onednn", "torch_eager")} <= names
    for layer in glue:  # this round's BatchNorm, the form before it (same run), PyTorch
        assert {(f"glue: {layer.name}", f) for f in ("jax_jit", "jax_jit_bn_reductions", "torch_eager")} <= names
    assert all(r.median_s > 0 for r in records)
    markdown = report.to_markdown(ctx, records, None, "functional-gan bench")
    assert "## Per pass: each convolution's forward, input gradient and kernel gradient alone (batch 2)" in markdown
    assert "## BatchNorm + activation between the convolutions: forward + backward (batch 2)" in markdown
    assert "## Results" in markdown and "pass: " not in markdown.split("## Per pass")[0]


@pytest.mark.slow  # about 35 s: a training run and four whole processes
def test_startup_runs_the_command_line_as_whole_processes_cold_then_warm():
    ctx = timing.Context(repeats=1, with_torch_compile=False)
    records = workloads.startup(ctx, repeats=1)
    assert [r.workload for r in records] == ["startup: functional-gan --help", "startup: sample 64 images, cold cache",
                                              "startup: sample 64 images, warm cache"]
    assert all(r.framework == "cli" and r.repeats == 1 and r.median_s > 0 for r in records)
    markdown = report.to_markdown(ctx, records, None, "functional-gan bench")
    assert "## Start-up of the command line: whole processes, wall time\n" in markdown
    assert "programs loaded from the persistent compilation cache" in markdown


def test_the_step_profile_ranks_convolutions_on_both_sides_and_shares_add_up():
    from functional_gan.benchmarks import profile_step

    from tests.helpers import tiny

    config = tiny()
    jax_rows, jax_wall_ms, compile_s = profile_step.profile_jax(config, config.batch_size, steps=1)
    torch_rows, torch_wall_ms = profile_step.profile_torch(config, config.batch_size, steps=1)
    for rows in (jax_rows, torch_rows):
        assert rows and sum(r.share for r in rows) == pytest.approx(1.0)
        assert [r.ms_per_step for r in rows] == sorted((r.ms_per_step for r in rows), reverse=True)
    # Every layer of both nets is a convolution: the compiled step's and the eager iteration's must show them.
    assert any("convolution" in r.what for r in jax_rows), [r.what for r in jax_rows[:10]]
    assert any("convolution" in r.name for r in torch_rows), [r.name for r in torch_rows[:10]]
    assert jax_wall_ms > 0 and torch_wall_ms > 0 and compile_s > 0
    text = profile_step.markdown(jax_rows, torch_rows, 3, "header")
    ranks = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ") and "`" in line]
    assert ranks == ["1", "2", "3"] * 2 and text.count("The top 3 hold") == 2


@pytest.mark.slow  # about 26 s: six step programs compiled and timed
def test_the_step_workload_times_linen_nnx_and_pytorch_and_the_plan_has_the_per_call_row():
    """The DCGAN step rows of every framework, NNX's two forms included, from one interleaved timing; the plan runs
    the tiny-nets step (whose time is mostly each call's own cost) beside the tutorial-sized ones."""
    from functional_gan.benchmarks import bench

    ctx = timing.Context(repeats=1, with_torch_compile=False)
    records = workloads.dcgan_step(ctx, bench.TINY_NETS, 4, 2, "dcgan_step (tiny nets: per-call cost)")
    assert [r.framework for r in records] == ["jax_jit", "jax_jit_onednn", "jax_scan", "nnx_split",
                                              "jax_jit_bn_reductions", "nnx_jit", "torch_eager"]
    assert all(r.median_s > 0 and r.workload == "dcgan_step (tiny nets: per-call cost)" for r in records)
    assert all(r.compile_s > 0 for r in records[:6]) and records[3].xla_flops == records[0].xla_flops
    assert records[0].note == "JAX (XLA's convolutions)" and "oneDNN" in records[1].note
    labels = [label for label, _ in bench.workload_list(ctx, bench.Plan((64,), 1))]
    assert labels[:3] == ["matmul peak", "DCGAN step, batch 64", "DCGAN step, tiny nets"]


@pytest.mark.slow  # about 30 s: both frameworks train a few iterations at the quality size
def test_the_training_run_beside_pytorch_prints_both_frameworks_metrics(capsys):
    from functional_gan.benchmarks import training_beside_pytorch

    assert training_beside_pytorch.main(["--steps", "4", "--every", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()]
    rows = [row for row in rows if len(row) == 9 and row[0].isdigit()]  # iteration, then 4 metrics × 2 frameworks
    assert [row[0] for row in rows] == ["2", "4"]
    values = np.array([[float(v) for v in row[1:]] for row in rows])
    assert np.all(np.isfinite(values))
    # The same weights and batches: the first iterations agree to float32's rounding (D(x) and D(G(z)) of both)
    np.testing.assert_allclose(values[0, 4], values[0, 5], rtol=1e-3)
    assert "mean loss_d over the last 2 iterations: PyTorch" in out


@pytest.mark.parametrize("size, stride, padding, transposed", [
    (64, 2, 1, False), (8, 2, 1, False), (4, 1, 0, False), (1, 1, 0, True), (4, 2, 1, True), (32, 2, 1, True)])
def test_a_convolutions_flops_count_the_taps_that_read_real_input(size, stride, padding, transposed):
    """The multiply-adds a convolution's mathematics needs, per axis: PyTorch's convolution of ones by ones sums, at
    each output, the taps that land on the input (padding's zeros add nothing); a transposed convolution's are its
    adjoint's, the convolution of its output."""
    import torch

    from functional_gan.benchmarks.workloads import conv_flops, conv_taps

    length = (size - 1) * stride - 2 * padding + 4 if transposed else size
    ones = torch.nn.functional.conv1d(torch.ones(1, 1, length, dtype=torch.float64),
                                      torch.ones(1, 1, 4, dtype=torch.float64), stride=stride, padding=padding)
    assert conv_taps(size, 4, stride, padding, transposed) == int(ones.sum())
    assert conv_flops(2, 3, 5, size, 4, stride, padding, transposed) == 2 * 2 * 3 * 5 * int(ones.sum()) ** 2


def test_the_theoretical_peak_is_read_off_the_cpus_description():
    from functional_gan.benchmarks.timing import theoretical_peak

    peak, how = theoretical_peak()
    if peak is None:  # not Linux: said why
        assert how
    else:
        assert peak > 1e9 and "GFLOP/s" in how and "FMA" in how


def test_the_machine_peak_is_the_larger_of_the_best_gemm_and_the_cpus_measured_fma_throughput(capsys):
    """A GEMM's rate is not the machine's peak on every CPU (oneDNN's convolutions ran above the best GEMM on an AMD
    EPYC): the fractions of peak divide by the CPU's FMA throughput where it is the larger."""
    from functional_gan.benchmarks import fma_peak

    rate, how = fma_peak.measure(threads=1, seconds=0.05, repeats=1)
    assert rate > 1e9 and "float32 FMAs on registers alone" in how and "1 threads" in how
    ctx = timing.Context(repeats=1, with_torch_compile=False)
    ctx.peak, ctx.peak_at = {"jax": 2 * rate, "torch_eager": rate}, {"jax": "matmul a", "torch_eager": "matmul b"}
    ctx.fma_peak = (rate, how)
    assert ctx.machine_peak() == 2 * rate  # the GEMM above it stays the peak
    ctx.fma_peak = (4 * rate, how)
    row = _record("layer: x", "jax_jit_onednn", 64, 1.0)
    row.flops_per_s = 3 * rate
    ctx.set_fractions_of_peak([row])
    assert ctx.machine_peak() == 4 * rate and row.fraction_of_peak == pytest.approx(0.75)
    lines = report.peak_lines(ctx, [row])
    assert any(line.startswith("Measured FMA throughput of the CPU:") and "the peak the fractions divide by" in line
               for line in lines)
    assert not any(line.startswith("Above the measured peak") for line in lines)


BENCHMARK_MODULES = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py")
                           if p.stem != "__init__")


@pytest.mark.parametrize("name", [m for m in BENCHMARK_MODULES if m not in ("bench", "report", "timing", "workloads")])
def test_every_benchmark_module_imports_and_its_command_answers_help(name, capsys):
    """Each module under benchmarks/ imports (from the installed namespace) and, where it is a command of its own,
    answers ``--help``; the table's modules (bench, report, timing, workloads) are run by the tests above."""
    import importlib

    module = importlib.import_module(f"functional_gan.benchmarks.{name}")
    if hasattr(module, "main"):
        with pytest.raises(SystemExit) as stopped:
            module.main(["--help"])
        assert stopped.value.code == 0 and "usage:" in capsys.readouterr().out


def test_detection_power_refuses_with_one_line_where_the_corpus_is_not_there(monkeypatch, tmp_path, capsys):
    from functional_gan.benchmarks import detection_power

    monkeypatch.setattr(detection_power, "CORPUS", tmp_path / "tests" / "corpus")
    with pytest.raises(SystemExit) as stopped:
        detection_power.main(["--out", str(tmp_path)])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run it from a clone" in err
