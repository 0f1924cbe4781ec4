"""What gets installed: a wheel that runs `compare` on its fixtures, and a JAX library free of torch."""

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The JAX library: the modules that must never import PyTorch or the layers above them: every module
# of the package's top folder but the command line, which imports everything.
JAX_LIBRARY = tuple(sorted(p.stem for p in (ROOT / "functional_gan").glob("*.py") if p.stem not in ("__init__", "main")))
ABOVE = ("functional_gan.pytorch", "functional_gan.lessons", "functional_gan.site", "functional_gan.comparisons", "functional_gan.benchmarks",
         "functional_gan.main", "functional_gan.cli")
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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    (path,) = dist.glob("functional_gan-*.whl")
    return path


def test_the_wheel_holds_one_package_with_its_fixtures_and_no_tests(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"functional_gan"}
    assert "functional_gan/comparisons/fixtures/dcgan_float64_100_steps.npz" in names
    assert "functional_gan/benchmarks/bench.py" in names
    assert not [name for name in names if Path(name).name.startswith("test_")]


def test_a_wheel_install_runs_compare_on_its_recorded_fixtures(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    # Run from an empty folder with only the installed copy on the path (not this checkout).
    script = (
        "import sys, functional_gan\n"
        f"assert functional_gan.__file__.startswith({str(site)!r}), functional_gan.__file__\n"
        "from functional_gan.main import main\n"
        "sys.exit(main(['compare', '--skip-quality', '--only', 'fixtures', '--out', 'report']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = (tmp_path / "report" / "report.md").read_text()
    assert "vs recorded PyTorch run (dcgan_float64_100_steps.npz)" in report and "**FAIL**" not in report
    assert "3 passed, 0 failed" in out.stdout
