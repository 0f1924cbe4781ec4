"""What gets installed: a wheel that runs `compare` on its fixtures, and a JAX library free of torch."""

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

# The JAX library: the modules that must never import PyTorch or the layers above them: every module
# of the package's top folder but the command line, which imports everything.
JAX_LIBRARY = tuple(sorted(p.stem for p in (ROOT / "functional_gan").glob("*.py") if p.stem not in ("__init__", "main")))
ABOVE = ("functional_gan.pytorch", "functional_gan.lessons", "functional_gan.site", "functional_gan.comparisons", "functional_gan.benchmarks",
         "functional_gan.main", "functional_gan.cli", "functional_gan.testing")
# The installed package's modules: its own folder, and comparisons/ and benchmarks/ installed inside it.
FOLDERS = {"functional_gan": ROOT / "functional_gan", "functional_gan.comparisons": ROOT / "comparisons",
           "functional_gan.benchmarks": ROOT / "benchmarks"}


def _imports(nodes) -> set[str]:
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", JAX_LIBRARY)
def test_the_jax_library_imports_nothing_from_the_layers_above_it(module):
    tree = ast.parse((ROOT / "functional_gan" / f"{module}.py").read_text())
    anywhere = _imports(ast.walk(tree))
    assert not {name for name in anywhere if name.startswith(ABOVE)}, anywhere
    # torch itself only inside a function, where reading PyTorch's own file format needs it (convert's .pt files).
    at_module_level = _imports(tree.body)
    assert not {name for name in at_module_level if name == "torch" or name.startswith("torch.")}, at_module_level


def _import_graph() -> dict[str, set[str]]:
    """Every module of the package → the package's modules it imports, at module level or inside a function."""
    modules = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            modules[".".join([package, *parts])] = path

    def owner(name: str) -> str | None:
        name = name.replace("comparisons.", "functional_gan.comparisons.", 1) if name.startswith("comparisons.") else name
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                # `from package import submodule` is an arrow to the submodule; `from module import name`, to the module.
                targets |= {f"{base}.{a.name}" if owner(f"{base}.{a.name}") == f"{base}.{a.name}" else base
                            for a in node.names}
        graph[module] = {owner(t) for t in targets if owner(t) not in (None, module, "functional_gan")}
    return graph


def test_the_modules_import_each_other_without_a_circle():
    # Lazy imports inside functions count too: a circle through one is still a circle in the design.
    graph = _import_graph()
    assert {"functional_gan.cli.train", "functional_gan.benchmarks.report", "functional_gan.loop"} <= set(graph)
    done, path = set(), []

    def visit(module):
        if module in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(module):] + [module]))
        if module in done:
            return
        path.append(module)
        for target in sorted(graph[module]):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_a_training_step_runs_with_torch_unimportable(tmp_path):
    # A fresh interpreter in which `import torch` fails, as on a machine without the torch extra.
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nsys.modules['torch'] = None  # `import torch` raises ImportError\n")
    script = (
        "import jax.numpy as jnp, numpy as np\n"
        "from functional_gan import TrainConfig, init_state, make_train_step\n"
        "config = TrainConfig(batch_size=2, image_size=32, nz=4, ngf=2, ndf=2)\n"
        "state, metrics = make_train_step(config)(init_state(config), jnp.zeros((2, 32, 32, 3)))\n"
        "assert int(state.step) == 1 and np.isfinite(float(metrics.loss_d))\n"
        "import sys\nassert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
        "try:\n    import torch\nexcept ImportError:\n    print('torch unimportable; step ran')\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch unimportable; step ran" in out.stdout


def _built(dist: Path, *flags: str) -> Path:
    # From a clean copy of the source tree: setuptools leaves build/ and *.egg-info/ in the folder it builds, and
    # a later build reuses what they list (a module deleted or forgotten since would still ship); the copy also
    # keeps two test processes from building in the same folder at once.
    source = dist / "source"
    top_level_outputs = {".git", ".venv", ".venv312", "build", "runs", "site", ".cache", ".pytest_cache"}

    def ignore(folder, names):
        outputs = top_level_outputs if Path(folder) == ROOT else set()
        return [n for n in names if n in outputs or n == "__pycache__" or n.endswith(".egg-info")]

    shutil.copytree(ROOT, source, ignore=ignore)
    subprocess.run([sys.executable, "-m", "build", *flags, "--outdir", str(dist), str(source)],
                   check=True, capture_output=True, timeout=600)
    (path,) = dist.glob("functional_gan-*.whl")
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return _built(tmp_path_factory.mktemp("dist"), "--wheel")


def _installed_name(folder_name: str, relative: Path) -> str:
    return "/".join(["functional_gan", *([] if folder_name == "functional_gan" else [folder_name]), *relative.parts])


def expected_wheel_files() -> set[str]:
    """What the wheel must hold, read off the source tree: every .py file under the three folders and the data the
    code opens at run time (the recorded PyTorch runs in comparisons/fixtures/; the C and C++ sources compiled at
    first use), at their installed paths."""
    from functional_gan.comparisons import fixtures

    expected = set()
    for folder_name in ("functional_gan", "comparisons", "benchmarks"):
        folder = ROOT / folder_name
        expected |= {_installed_name(folder_name, p.relative_to(folder)) for suffix in ("py", "c", "cc")
                     for p in folder.rglob(f"*.{suffix}")}
    data = sorted(fixtures.FIXTURE_DIR.glob("*.npz"))
    assert data, "no recorded fixtures found in the source tree"
    return expected | {_installed_name("comparisons", p.relative_to(ROOT / "comparisons")) for p in data}


@pytest.mark.parametrize("route", ["wheel from the source tree", "wheel from the sdist"])
def test_the_wheel_ships_every_module_and_data_file_of_the_source_tree(route, tmp_path):
    # `python -m build` with no flag builds the sdist, then the wheel from the unpacked sdist (what pip does with an
    # sdist from PyPI); `--wheel` builds the wheel from the checkout.
    path = _built(tmp_path, *(["--wheel"] if route.startswith("wheel from the source") else []))
    names = {n for n in zipfile.ZipFile(path).namelist() if not n.split("/")[0].endswith(".dist-info")}
    missing = expected_wheel_files() - names
    assert not missing, f"the {route} leaves out {len(missing)} files: {sorted(missing)}"
    assert {n for n in names if n.endswith(".py")} <= expected_wheel_files()  # nothing from outside the three folders


def test_the_wheel_holds_one_package_with_its_fixtures_and_no_tests(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"functional_gan"}
    assert "functional_gan/comparisons/fixtures/dcgan_float64_100_steps.npz" in names
    assert "functional_gan/benchmarks/bench.py" in names
    assert not [name for name in names if Path(name).name.startswith("test_")]


def _fresh_environment(folder: Path, wheel: Path, torch: bool) -> Path:
    """A virtual environment that has never seen the checkout, with the wheel installed as users install it.

    Its dependencies (jax, flax, ... and torch where asked) are this test interpreter's site-packages, on its path
    through a plain path line in a .pth file: a path line puts the folder on ``sys.path`` but runs none of the .pth
    files inside it, so this project's editable install (a finder that a .pth file there installs) stays inactive.
    Without torch, a .pth line makes ``import torch`` fail, as on a machine without the torch extra."""
    import site
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, capture_output=True, timeout=120)
    python = folder / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    dependencies = [p for p in site.getsitepackages() if Path(p).is_dir()] or [sysconfig.get_path("purelib")]
    (purelib / "dependencies.pth").write_text("\n".join(dependencies) + "\n")
    if not torch:
        (purelib / "a_no_torch.pth").write_text("import sys; sys.modules['torch'] = None  # `import torch` raises ImportError\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=600, env=_clean_env())
    return folder / "bin"


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(bin_dir: Path, cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / "functional-gan"), *args], cwd=cwd, env=_clean_env(), capture_output=True,
                          text=True, timeout=timeout)


def test_the_installed_wheel_starts_every_command_and_trains_without_torch(wheel, tmp_path):
    bin_dir = _fresh_environment(tmp_path / "venv", wheel, torch=False)
    work = tmp_path / "work"  # outside the repository
    work.mkdir()
    script = ("import functional_gan, json, sys; print(functional_gan.__file__); "
              "print(json.dumps([p for p in sys.path if p and __import__('os').path.exists(p + '/functional_gan')]))")
    where = subprocess.run([str(bin_dir / "python"), "-c", script], cwd=work, env=_clean_env(), capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert where[0].startswith(str(tmp_path / "venv")), where
    # The installed copy is the only functional_gan any folder on the path holds: the checkout is not on it.
    assert json.loads(where[1]) == [str(Path(where[0]).parents[1])], where
    out = _run(bin_dir, work, "--help")
    assert out.returncode == 0 and "check-port" in out.stdout, out.stderr[-2000:]
    for command in ("train", "compare", "check-port", "convert", "lessons", "bench", "docs", "sample", "diverge"):
        out = _run(bin_dir, work, command, "--help")
        assert out.returncode == 0 and f"usage: functional-gan {command}" in out.stdout, (command, out.stderr[-2000:])
    out = _run(bin_dir, work, "train", "--data", "fake", "--steps", "2", "--batch-size", "4", "--image-size", "32",
               "--nz", "8", "--ngf", "4", "--ndf", "4", "--out", "run")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    metrics = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(np.isfinite(m["loss_d"]) for m in metrics), metrics
    # A command that needs PyTorch says so in one line.
    out = _run(bin_dir, work, "check-port", str(ROOT / "examples" / "port" / "mnist_cnn.py"))
    assert out.returncode == 2 and "torch" in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    # Converted weights (written here, with PyTorch) read back by the installed package, without it.
    from functional_gan.testing import convert

    folder = convert.write_converted(tmp_path / "converted", "Flax Linen",
                                     {"params": {"Dense_0": {"kernel": np.eye(3, dtype=np.float32)}}}, {"api": "Flax Linen"})
    script = ("from functional_gan.testing import load_converted; import sys; "
              f"v = load_converted({str(folder)!r}); assert 'torch' not in [m.split('.')[0] for m in sys.modules "
              "if sys.modules[m] is not None]; print(v['params']['Dense_0']['kernel'].sum())")
    read = subprocess.run([str(bin_dir / "python"), "-c", script], cwd=work, env=_clean_env(), capture_output=True,
                          text=True, timeout=300)
    assert read.returncode == 0 and read.stdout.strip() == "3.0", read.stderr[-2000:]


@pytest.mark.slow  # the module-list test and the torch-free commands above stay in the default suite
def test_the_installed_wheel_with_torch_runs_compare_and_check_port(wheel, tmp_path):
    bin_dir = _fresh_environment(tmp_path / "venv", wheel, torch=True)
    work = tmp_path / "work"
    work.mkdir()
    out = _run(bin_dir, work, "compare", "--skip-quality", "--only", "fixtures", "--out", "report")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = (work / "report" / "report.md").read_text()
    assert "vs recorded PyTorch run (dcgan_float64_100_steps.npz)" in report and "**FAIL**" not in report
    assert "3 passed, 0 failed" in out.stdout
    # A spec copied out of the checkout, as a user's own file would be.
    shutil.copy(ROOT / "examples" / "port" / "mnist_cnn.py", work / "my_port.py")
    out = _run(bin_dir, work, "check-port", "my_port.py", "--program", "jit")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "agree" in out.stdout.lower(), out.stdout[-3000:]


def test_the_layout_page_names_every_module_room_benchmark_and_example_spec():
    """docs/layout.md checked against the tree: every module of the package's top folder, every subpackage and its
    modules, every module under benchmarks/ and every example spec is named there."""
    text = (ROOT / "docs" / "layout.md").read_text()
    names = [p.name for p in (ROOT / "functional_gan").glob("*.py") if p.name != "__init__.py"]
    names += [p.name + "/" for p in (ROOT / "functional_gan").iterdir() if (p / "__init__.py").exists()]
    names += [p.name for p in (ROOT / "functional_gan").glob("*/*.*") if p.suffix in (".py", ".cc")
              and p.name != "__init__.py"]  # each room's modules
    names += [p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py"]
    names += [p.name for p in (ROOT / "examples" / "port").glob("*.py")]
    missing = [name for name in names if name not in text]
    assert not missing, f"docs/layout.md does not name {missing}"
