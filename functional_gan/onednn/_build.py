"""Building and loading the oneDNN handlers (``conv.cc``): found, compiled once into a cache, registered once.

The shared library is compiled at first use with the machine's C++ compiler against the headers of the jaxlib in use
(``jax.ffi.include_dir()``) and of the ``onednn-devel-cpu-gomp`` wheel, and linked to that wheel's ``libdnnl.so.3``.
Its cache folder is keyed by a hash of the source, the jaxlib and oneDNN versions, the library's folder and the
compiler, so a change to any of them builds anew and two environments never share a build. Concurrent first uses
(pytest-xdist workers, the processes of a multi-process run) take turns on a file lock; the library is written under
a temporary name and renamed into place, so a reader never sees half of it.

May import: the standard library, jax. Not the layers, nor anything of the project above them.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import importlib.metadata
import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

SOURCE = Path(__file__).with_name("conv.cc")
RUNTIME_PACKAGE = "onednn-cpu-gomp"  # libdnnl.so.3, oneDNN 3.2 on GNU OpenMP (PyPI's `onednn` has no CPU engine)
HEADERS_PACKAGE = "onednn-devel-cpu-gomp"
TARGETS = ("fg_onednn_conv_forward", "fg_onednn_conv_backward_data", "fg_onednn_conv_backward_weights")
CACHE_ENV = "FUNCTIONAL_GAN_CACHE"


class Unavailable(Exception):
    """oneDNN's convolution cannot be had in this process; the message is one line saying why and what to do."""


def _installed_file(package: str, suffix: str) -> Path | None:
    """The installed file of ``package`` whose path ends with ``suffix`` (None if the package or file is missing)."""
    try:
        files = importlib.metadata.files(package) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:  # recorded relative to site-packages: "../../libdnnl.so.3" for <prefix>/lib/libdnnl.so.3
        path = Path(file.locate()).resolve()
        if path.as_posix().endswith(suffix) and path.exists():
            return path
    return None


def locate() -> tuple[Path, Path, str]:
    """(the folder of libdnnl.so, the include folder, oneDNN's wheel version), or :class:`Unavailable`."""
    library = _installed_file(RUNTIME_PACKAGE, "lib/libdnnl.so.3")
    headers = _installed_file(HEADERS_PACKAGE, "include/oneapi/dnnl/dnnl.hpp")
    if library is None or headers is None:
        missing = " and ".join(p for p, f in ((RUNTIME_PACKAGE, library), (HEADERS_PACKAGE, headers)) if f is None)
        raise Unavailable(f"{missing} not installed: pip install 'functional-gan[onednn]'")
    return library.parent, headers.parent.parent.parent, importlib.metadata.version(RUNTIME_PACKAGE)


def cache_root() -> Path:
    """``$FUNCTIONAL_GAN_CACHE``, else ``$XDG_CACHE_HOME/functional_gan``, else ``~/.cache/functional_gan``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "functional_gan"


def _compiler() -> list[str]:
    compiler = shlex.split(os.environ.get("CXX", "")) or ["g++"]
    if shutil.which(compiler[0]) is None:
        raise Unavailable(f"no C++ compiler to build oneDNN's handlers ({compiler[0]} not found; set $CXX or install "
                          "g++)")
    return compiler


def build_command(library_dir: Path, include_dir: Path, output: Path) -> list[str]:
    import jax

    return [*_compiler(), "-O2", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden", "-w",
            f"-I{jax.ffi.include_dir()}", f"-I{include_dir}", str(SOURCE), "-o", str(output),
            f"-L{library_dir}", "-l:libdnnl.so.3", f"-Wl,-rpath,{library_dir}", "-Wl,--no-undefined"]


def _key(library_dir: Path, version: str, compiler: list[str]) -> str:
    import jaxlib

    digest = hashlib.sha256(SOURCE.read_bytes())
    for part in (jaxlib.__version__, version, str(library_dir), " ".join(compiler), sys.platform):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:16]


def build() -> Path:
    """The compiled library's path, built now if the cache lacks it (:class:`Unavailable` if it cannot be)."""
    library_dir, include_dir, version = locate()
    compiler = _compiler()
    folder = cache_root() / "onednn" / _key(library_dir, version, compiler)
    target = folder / "fg_onednn.so"
    if target.exists():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise Unavailable(f"cannot make the build folder {folder} ({error.strerror}); set ${CACHE_ENV}") from error
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait, then use its build
        if target.exists():
            return target
        partial = folder / f".fg_onednn.{os.getpid()}.so"
        command = build_command(library_dir, include_dir, partial)
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            log = folder / "build.log"
            log.write_text(shlex.join(command) + "\n\n" + result.stdout + result.stderr)
            partial.unlink(missing_ok=True)
            first = next((line for line in result.stderr.splitlines() if "error" in line), "see the log")
            raise Unavailable(f"building oneDNN's handlers failed ({first.strip()[:160]}); the whole log: {log}")
        os.replace(partial, target)
    return target


_lock = threading.Lock()
_loaded: ctypes.CDLL | None = None
_failure: Unavailable | None = None


def load() -> ctypes.CDLL:
    """The library, built if needed, loaded and its handlers registered with XLA: once per process. Raises
    :class:`Unavailable` (the same one again on later calls) where it cannot be had."""
    global _loaded, _failure
    with _lock:
        if _loaded is not None:
            return _loaded
        if _failure is not None:
            raise _failure
        try:
            library = ctypes.CDLL(str(build()))
        except Unavailable as error:
            _failure = error
            raise
        except OSError as error:  # a library that does not load (a damaged cache entry, a missing libgomp)
            _failure = Unavailable(f"loading oneDNN's handlers failed: {error}")
            raise _failure from error
        import jax

        for name in TARGETS:
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, name)), platform="cpu")
        _loaded = library
        return library
