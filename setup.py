"""Package discovery that cannot forget a module (the rest of the metadata is in pyproject.toml).

The repository keeps ``comparisons/`` and ``benchmarks/`` at its top, as the design card lays it out; the wheel
installs them inside the package's namespace (``functional_gan.comparisons``, ``functional_gan.benchmarks``), so it
has one top-level package. pyproject.toml alone can either list packages by hand (which forgot
``functional_gan.cli`` once) or find them under one root with their folder names; here each root is searched with
``find_packages`` and its subpackages are renamed under the root's installed name.
"""

from setuptools import find_packages, setup

# installed name → folder in the repository
ROOTS = {"functional_gan": "functional_gan", "functional_gan.comparisons": "comparisons",
         "functional_gan.benchmarks": "benchmarks"}

packages = []
for name, folder in ROOTS.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=sorted(set(packages)), package_dir=ROOTS)
