"""From a checked port to converted weights: ``functional-gan convert`` and ``check-port --save``.

Each model is trained a few steps in PyTorch (so that its weights and running statistics are not its
initialisation), its ``state_dict`` saved as users save it, converted, and read back in a fresh process in which
PyTorch cannot be imported; the port there must reproduce PyTorch's outputs on the example inputs within PyTorch's
own float32 error (k = 3, the check's criterion: ``|JAX − PyTorch64| ≤ 3 × max(|PyTorch32 − PyTorch64|, 4 ulps)``).
"""

import errno
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from functional_gan.testing.judge import compare
from functional_gan.main import main
from functional_gan.testing import ConvertError, load_converted, load_spec
from functional_gan.testing import convert as converting

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "port"


def _module(name: str):
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"convert_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _trained(name: str, folder: Path, steps: int = 3) -> tuple[Path, Path]:
    """The example's PyTorch model trained ``steps`` SGD steps (train mode: running statistics move) on random
    batches, its state_dict saved with torch.save; and PyTorch's eval-mode outputs on the example inputs in float32
    and float64 (an .npz)."""
    module = _module(name)
    torch.manual_seed(1)
    model = module.torch_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    (x,) = module.example_inputs()
    (target,) = module.example_targets()
    rng = np.random.default_rng(2)
    model.train()
    for _ in range(steps):
        batch = torch.from_numpy((x + rng.normal(0, 0.5, x.shape)).astype(np.float32))
        optimizer.zero_grad()
        module.torch_loss(model(batch), batch, torch.from_numpy(target)).backward()
        optimizer.step()
    weights = folder / f"{name}.pth"
    torch.save(model.state_dict(), weights)
    model.eval()
    with torch.no_grad():
        out32 = model(torch.from_numpy(x)).numpy()
        out64 = model.double()(torch.from_numpy(x).double()).numpy()
    expected = folder / f"{name}-expected.npz"
    np.savez(expected, x=x, out32=out32, out64=out64)
    return weights, expected


# Run in a fresh process: PyTorch made impossible to import (the spec file's PyTorch half is defined against a stub
# that is never called), the converted weights read back with load_converted, the port run on the example inputs.
_WITHOUT_TORCH = r"""
import importlib.util, json, sys, types
import numpy as np

class _Anything:
    def __init__(self, *args, **kwargs): pass
    def __call__(self, *args, **kwargs): return _Anything()
    def __getattr__(self, name): return _Anything

class _NoTorch(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything

for name in ("torch", "torch.nn", "torch.nn.functional"):
    sys.modules[name] = _NoTorch(name)
sys.modules["torch"].nn = sys.modules["torch.nn"]
sys.modules["torch.nn"].functional = sys.modules["torch.nn.functional"]

examples, name, folder, expected, result = sys.argv[1:6]
sys.path.insert(0, examples)
spec = importlib.util.spec_from_file_location("port", f"{examples}/{name}.py")
port = importlib.util.module_from_spec(spec)
spec.loader.exec_module(port)

import jax.numpy as jnp
from functional_gan.testing import load_converted

x = np.load(expected)["x"]
api = json.load(open(f"{folder}/converted.json"))["api"]
if api == "Flax Linen":
    variables = load_converted(folder)
    output = port.jax_model().apply(variables, jnp.asarray(np.moveaxis(x, 1, -1)))
elif api == "Flax NNX":
    model = load_converted(folder, port.jax_model())
    model.eval()
    output = model(jnp.asarray(np.moveaxis(x, 1, -1)))
else:
    import equinox as eqx, jax
    model = eqx.nn.inference_mode(load_converted(folder, port.jax_model()))
    output = jax.vmap(model)(jnp.asarray(x))
real_torch = [m for m in sys.modules if m.split(".")[0] == "torch" and not isinstance(sys.modules[m], _NoTorch)]
np.save(result, np.asarray(output))
print(json.dumps({"api": api, "real_torch_modules": real_torch}))
"""


def _reproduces(name: str, folder: Path, expected: Path, tmp_path: Path) -> dict:
    result = tmp_path / f"{name}-jax.npy"
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, str(EXAMPLES), name, str(folder), str(expected),
                           str(result)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["real_torch_modules"] == []
    reference = np.load(expected)
    row = compare("output", "output", np.load(result), reference["out64"], [reference["out32"]], "float32")
    assert row.passed, row  # within 3 × PyTorch's own float32 error (at least 4 ulps of the output's scale)
    return seen


@pytest.mark.parametrize("name, api", [("mnist_cnn", "Flax Linen"),
                                       pytest.param("resnet18_nnx", "Flax NNX", marks=pytest.mark.slow),  # 22 s
                                       pytest.param("mnist_cnn_equinox", "Equinox", marks=pytest.mark.slow)])
def test_converted_weights_reproduce_pytorch_in_a_process_without_torch(name, api, tmp_path, capsys):
    weights, expected = _trained(name, tmp_path)
    out = tmp_path / "converted"
    assert main(["convert", str(EXAMPLES / f"{name}.py"), "--weights", str(weights), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"Wrote {out}" in printed and "Agreement" in printed
    record = json.loads((out / "converted.json").read_text())
    assert record["api"] == api and record["verdict"]["exit_status"] == 0
    assert record["verdict"]["mode"] == "eval (TRAIN = False)" and record["verdict"]["programs"] == ["jit"]
    assert record["weights"]["sha256"] == converting._sha256(weights)
    assert record["files"] and all(len(digest) == 64 for digest in record["files"].values())
    assert {"jax", "flax", "torch"} <= set(record["versions"])
    assert [row["torch"] for row in record["pairing"]][:2] == ["conv1.weight", "conv1.bias" if "mnist" in name
                                                                else "bn1.weight"]
    assert _reproduces(name, out, expected, tmp_path)["api"] == api


def test_a_port_with_a_planted_mistake_writes_nothing_and_names_it(tmp_path, capsys, monkeypatch):
    weights, _ = _trained("mnist_cnn", tmp_path, steps=1)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    (tmp_path / "wrong.py").write_text("import mnist_cnn\nfrom mnist_cnn import *\nmnist_cnn.MISTAKE = 'flatten-nhwc'\n")
    out = tmp_path / "converted"
    assert main(["convert", str(tmp_path / "wrong.py"), "--weights", str(weights), "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "First divergence: forward, fc1" in printed and f"Nothing written to {out}" in printed
    assert not out.exists() and not list(tmp_path.glob(".converted*"))


def test_weights_that_do_not_fit_are_named_key_by_key_and_nothing_is_written(tmp_path, capsys):
    weights, _ = _trained("mnist_cnn", tmp_path, steps=1)
    state = torch.load(weights, weights_only=True)
    state.pop("fc2.bias")
    state["fc3.weight"] = torch.zeros(2, 2)
    state["conv1.weight"] = torch.zeros(32, 1, 5, 5)
    torch.save(state, tmp_path / "wrong.pth")
    out = tmp_path / "converted"
    assert main(["convert", str(EXAMPLES / "mnist_cnn.py"), "--weights", str(tmp_path / "wrong.pth"), "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err
    assert "1 key(s) the model has and the file lacks: fc2.bias" in err
    assert "1 key(s) in the file the model does not have: fc3.weight" in err
    assert "conv1.weight: the file has (32, 1, 5, 5), the model (32, 1, 3, 3)" in err
    assert not out.exists()


class _Payload:
    def __reduce__(self):
        return (Path.touch, (Path(_Payload.marker),))


def test_an_untrusted_pickle_is_refused_and_never_run(tmp_path, capsys):
    _Payload.marker = str(tmp_path / "ran")
    torch.save({"conv1.weight": torch.zeros(1), "payload": _Payload()}, tmp_path / "evil.pth")
    assert main(["convert", str(EXAMPLES / "mnist_cnn.py"), "--weights", str(tmp_path / "evil.pth"), "--out",
                 str(tmp_path / "out")]) == 2
    assert "a pickle carrying code, which is never unpickled" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out").exists()


def test_an_existing_folder_is_refused_unless_overwrite_and_a_full_disk_leaves_it_as_it_was(tmp_path, capsys,
                                                                                          monkeypatch):
    weights, _ = _trained("mnist_cnn", tmp_path, steps=1)
    out = tmp_path / "converted"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    command = ["convert", str(EXAMPLES / "mnist_cnn.py"), "--weights", str(weights), "--out", str(out)]
    assert main(command) == 2
    assert "exists and is not empty: nothing written (pass --overwrite to replace it)" in capsys.readouterr().err
    assert (out / "mine.txt").read_text() == "keep me"

    def full_disk(api, exported, folder):  # the weights half written, then the disk is full
        (folder / "weights").mkdir()
        (folder / "weights" / "part").write_bytes(b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(converting, "_write_weights", full_disk)
    with pytest.raises(OSError, match="No space left"):
        main([*command, "--overwrite"])
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]  # the old folder, as it was
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left
    monkeypatch.undo()
    assert main([*command, "--overwrite"]) == 0
    assert not (out / "mine.txt").exists() and (out / "converted.json").is_file()


def test_overwrite_replaces_a_file_and_leaves_no_copy_of_it_behind(tmp_path, monkeypatch):
    """--overwrite where ``out`` is a file: the file is moved aside, the folder put in its place, the file then deleted
    (it was left as a hidden ``.NAME.previous-PID`` file)."""
    out = tmp_path / "converted"
    out.write_text("an old file")

    def weights(api, exported, folder):
        (folder / "weights.bin").write_bytes(b"\1" * 10)
        return "bytes"

    monkeypatch.setattr(converting, "_write_weights", weights)
    assert converting.write_converted(out, "plain function", None, {}, overwrite=True) == out
    assert out.is_dir() and json.loads((out / "converted.json").read_text())["format"] == "bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["converted"]


def test_a_changed_file_is_refused_when_read_back(tmp_path):
    weights, _ = _trained("mnist_cnn", tmp_path, steps=1)
    out = tmp_path / "converted"
    report, written = converting.convert(load_spec(EXAMPLES / "mnist_cnn.py"), weights, out)
    assert written == out and report.exit_status() == 0
    variables = load_converted(out)
    assert set(variables) == {"params"} and variables["params"]["Conv_0"]["kernel"].shape == (3, 3, 1, 32)
    name = next(iter(json.loads((out / "converted.json").read_text())["files"]))
    with open(out / name, "ab") as file:
        file.write(b"\0")
    with pytest.raises(ConvertError, match="does not match its SHA-256"):
        load_converted(out)


def test_check_port_save_writes_the_weights_it_checked(tmp_path, capsys):
    out = tmp_path / "saved"
    assert main(["check-port", str(EXAMPLES / "mnist_cnn.py"), "--program", "jit", "--save", str(out)]) == 0
    assert f"Wrote the port's weights to {out}" in capsys.readouterr().out
    record = json.loads((out / "converted.json").read_text())
    assert record["weights"]["path"] is None and record["verdict"]["programs"] == ["jit"]
    module = _module("mnist_cnn")
    torch.manual_seed(0)  # the check's seed: torch_model()'s own initialisation is what was moved
    model = module.torch_model()
    kernel = load_converted(out)["params"]["Dense_0"]["kernel"]
    np.testing.assert_array_equal(kernel, model.fc1.weight.detach().numpy().T)


def test_a_plain_function_port_is_written_as_safetensors_from_safetensors_weights(tmp_path):
    """A port of plain functions gets its parameter tree back (safetensors, keys params/...); the weights may come as
    .safetensors too."""
    from safetensors.torch import save_file

    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp_path / "net.safetensors"))
    (tmp_path / "spec.py").write_text(
        "import numpy as np, torch, jax.numpy as jnp\n"
        "def torch_model():\n    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))\n"
        "def jax_params():\n    return {'0': {'weight': np.zeros((4, 5)), 'bias': np.zeros(4)},\n"
        "            '2': {'weight': np.zeros((2, 4)), 'bias': np.zeros(2)}}\n"
        "def jax_apply(p, x):\n    h = jnp.tanh(x @ p['0']['weight'].T + p['0']['bias'])\n"
        "    return h @ p['2']['weight'].T + p['2']['bias']\n"
        "def example_inputs():\n    return (np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32),)\n")
    report, out = converting.convert(load_spec(tmp_path / "spec.py"), tmp_path / "net.safetensors", tmp_path / "out")
    assert report.exit_status() == 0 and (out / "weights.safetensors").is_file()
    tree = load_converted(out)
    np.testing.assert_array_equal(tree["params"]["2"]["weight"], net[2].weight.detach().numpy())
    assert json.loads((out / "converted.json").read_text())["format"].startswith("safetensors")
