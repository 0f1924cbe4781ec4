"""From a checked port to converted weights: a PyTorch ``state_dict`` moved into the port with check-port's pairing,
checked, and written in the port's own API's format only if the port agrees with PyTorch on it.

``convert(spec, weights, out)`` (the command line's ``functional-gan convert SPEC.py --weights model.pth --out DIR``):

1. reads the ``state_dict`` (``.pt``/``.pth`` with ``torch.load(weights_only=True)``: a pickle that carries code is
   refused, never run; or ``.safetensors``) and checks it against ``torch_model()``: every key it lacks, every key
   it has that the model does not, every shape that differs, named;
2. checks the port with those weights as check-port does, in eval mode (``TRAIN = False``), float32, the compiled
   program, on the spec's example inputs: every paired layer's output and the output, within k × PyTorch's own
   float32 error;
3. only if it agrees, writes the port's weights as that API keeps them: an orbax checkpoint of the Linen variables
   (``{"params": ..., "batch_stats": ...}``) or of the NNX state (``nnx.to_pure_dict(nnx.state(model))``),
   ``eqx.tree_serialise_leaves`` of the Equinox ``(model, state)``, safetensors for a plain parameter tree; and
   ``converted.json`` beside it: the API, the pairing table, the verdict and its worst ratio, the versions, and the
   SHA-256 of every file written and of the weights read.

The folder is written whole or not at all: into a temporary folder beside ``out``, renamed into place when complete;
an existing non-empty ``out`` is refused unless ``overwrite``, and then replaced only by a complete folder. A port
that diverges writes nothing. :func:`load_converted` reads such a folder back (no PyTorch needed) after checking the
files' SHA-256.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from functional_gan.errors import UserError

if TYPE_CHECKING:
    from .report import Report
    from .spec import Spec

MANIFEST = "converted.json"
WEIGHTS = "weights"  # the folder (orbax) or file stem the weights are written to


class ConvertError(UserError):
    """Weights that cannot be converted or read back: the message says which file, key or shape, and why."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def read_weights(path: str | os.PathLike, model) -> dict:
    """The ``state_dict`` in ``path`` as tensors for ``model`` (a PyTorch module), or a :class:`ConvertError` naming
    every key missing or unexpected and every shape that differs.

    Args:
        path: a ``.safetensors`` file, or a file saved with ``torch.save`` (read with
            ``torch.load(weights_only=True)``).
        model: the PyTorch model the state_dict is for.

    Returns:
        {key: a CPU tensor in the dtype of the model's own entry}, one per key of the file.

    Raises:
        ConvertError: the file cannot be read as a state_dict, or its keys or shapes differ from ``model``'s.
    """
    import torch

    from functional_gan.state_dicts import CheckpointFormatError, load_state_dict_file

    try:
        arrays = load_state_dict_file(path)
    except CheckpointFormatError as error:
        raise ConvertError(str(error)) from error
    expected = model.state_dict()
    missing = [k for k in expected if k not in arrays]
    unexpected = [k for k in arrays if k not in expected]
    shapes = [f"{k}: the file has {tuple(np.shape(arrays[k]))}, the model {tuple(expected[k].shape)}"
              for k in expected if k in arrays and tuple(np.shape(arrays[k])) != tuple(expected[k].shape)]
    problems = []
    if missing:
        problems.append(f"{len(missing)} key(s) the model has and the file lacks: {', '.join(missing[:8])}"
                        + (" ..." if len(missing) > 8 else ""))
    if unexpected:
        problems.append(f"{len(unexpected)} key(s) in the file the model does not have: {', '.join(unexpected[:8])}"
                        + (" ..." if len(unexpected) > 8 else ""))
    if shapes:
        problems.append(f"{len(shapes)} shape(s) that differ: {'; '.join(shapes[:8])}" + (" ..." if len(shapes) > 8 else ""))
    if problems:
        raise ConvertError(f"{path}: the state_dict does not fit the spec's torch_model(): {'; '.join(problems)}")
    return {k: torch.from_numpy(np.array(v)).to(expected[k].dtype) for k, v in arrays.items()}


def _versions() -> dict[str, str]:
    from importlib import metadata

    found = {"python": platform.python_version()}
    for name in ("functional_gan", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "equinox", "torch",
                 "safetensors", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _flatten(tree, prefix: str = "") -> dict[str, np.ndarray]:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}/"))
        return out
    return {prefix[:-1]: np.asarray(tree)}


def _unflatten(flat: dict[str, np.ndarray]) -> dict:
    tree: dict = {}
    for name, value in flat.items():
        node = tree
        *parents, last = name.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


def _write_weights(api: str, exported, folder: Path) -> str:
    """The port's weights written into ``folder`` in ``api``'s own format; returns the format's name."""
    if api in ("Flax Linen", "Flax NNX"):
        import orbax.checkpoint as ocp

        if api == "Flax NNX":
            from flax import nnx

            tree = nnx.to_pure_dict(nnx.state(exported))
        else:
            tree = exported
        tree = _plain(tree)
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save((folder / WEIGHTS).resolve(), tree)
        checkpointer.wait_until_finished()
        checkpointer.close()
        return "orbax (StandardCheckpointer) of " + ("nnx.to_pure_dict(nnx.state(model))" if api == "Flax NNX"
                                                     else "the Linen variables")
    if api == "Equinox":
        import equinox as eqx

        eqx.tree_serialise_leaves(folder / f"{WEIGHTS}.eqx", exported)
        return "eqx.tree_serialise_leaves of (model, state)"
    from safetensors.numpy import save_file

    flat = _flatten({"params": _plain(exported["params"]), **({"state": _plain(exported["state"])}
                                                              if exported.get("state") is not None else {})})
    save_file({k: np.ascontiguousarray(v) for k, v in flat.items()}, str(folder / f"{WEIGHTS}.safetensors"))
    return "safetensors of the parameter tree (keys params/... and state/...)"


def _plain(tree):
    """Nested dicts of NumPy arrays (orbax and safetensors take those; keys as strings)."""
    import jax

    if isinstance(tree, dict) or hasattr(tree, "items"):
        return {str(k): _plain(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return {str(i): _plain(v) for i, v in enumerate(tree)}
    return np.asarray(jax.device_get(tree))


def write_converted(out: str | os.PathLike, api: str, exported, record: dict, overwrite: bool = False) -> Path:
    """The folder ``out``: the weights in ``api``'s format and ``converted.json`` (``record`` with the files'
    SHA-256 added). Written into a temporary folder beside it and renamed into place: whatever fails on the way
    (a full disk), ``out`` is as it was.

    Args:
        out: the folder to write.
        api: the port's API as the report names it (``"Flax Linen"``, ``"Flax NNX"``, ``"Equinox"``; any other is
            written as a plain parameter tree, ``{"params": ..., "state": ...}``, to safetensors).
        exported: the port holding the weights, as its API keeps it (the report's ``converted``).
        record: what ``converted.json`` says besides the files (:func:`record_of`); ``format`` and ``files`` are added.
        overwrite: replace an existing non-empty ``out``.

    Returns:
        ``out``, as a :class:`~pathlib.Path`.

    Raises:
        ConvertError: ``out`` exists and is not an empty folder, and ``overwrite`` is False.
    """
    out = Path(out)
    refuse_existing(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.parent / f".{out.name}.converting-{os.getpid()}"
    previous = out.parent / f".{out.name}.previous-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        temporary.mkdir()
        record = {**record, "format": _write_weights(api, exported, temporary)}
        record["files"] = {str(p.relative_to(temporary)): _sha256(p) for p in _files(temporary)}
        (temporary / MANIFEST).write_text(json.dumps(record, indent=1, default=float) + "\n")
        if out.exists():
            os.replace(out, previous)
        os.replace(temporary, out)
    except BaseException:
        if previous.exists() and not out.exists():
            os.replace(previous, out)
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    if previous.is_dir():
        shutil.rmtree(previous, ignore_errors=True)
    else:  # --overwrite of a file
        previous.unlink(missing_ok=True)
    return out


def convert(spec: Spec, weights: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False,
            k: float | None = None, allow_precision: bool = False) -> tuple[Report, Path | None]:
    """Convert ``weights`` for ``spec``'s port, after checking the port with them (see the module's docstring).

    Args:
        spec: the port's :class:`.spec.Spec`, as for :func:`.check.check_port` (checked in eval mode, no loss).
        weights: a PyTorch checkpoint file (a state_dict, read with ``torch.load(weights_only=True)``; a safetensors
            file also reads).
        out: the folder to write.
        overwrite: replace an existing ``out``.
        k: the check's allowance (default 3).
        allow_precision: write where the check finds precision findings alone.

    Returns:
        ``(report, folder)``: the check's :class:`.report.Report`, and the folder written, or None where the port
            does not agree (nothing written).

    Raises:
        SpecError: as :func:`.check.check_port`'s.
        ConvertError: ``out`` exists (without ``overwrite``), or ``weights`` cannot be read or do not fit the model.
    """
    from .judge import DEFAULT_K

    from .check import check_port
    from .spec import SpecError

    refuse_existing(out, overwrite)
    try:
        model = spec.torch_model()
    except Exception as error:
        raise SpecError(f"the spec's torch_model() failed: {type(error).__name__}: {error}") from error
    state = read_weights(weights, model)
    eval_spec = dataclasses.replace(spec, train=False, torch_loss=None, jax_loss=None, torch_optimizer=None,
                                    jax_optimizer=None)
    report = check_port(eval_spec, "float32", 1, DEFAULT_K if k is None else k, programs=("jit",), torch_state=state,
                        export=True, allow_precision=allow_precision)
    if report.exit_status() != 0:
        return report, None
    return report, write_converted(out, report.api, report.converted, record_of(report, spec, weights), overwrite)


def refuse_existing(out: str | os.PathLike, overwrite: bool) -> None:
    """A :class:`ConvertError` if ``out`` exists and is not an empty folder, unless ``overwrite``.

    Args:
        out: the folder to be written.
        overwrite: an existing ``out`` may be replaced.

    Raises:
        ConvertError: ``out`` exists (a file, or a folder with anything in it) and ``overwrite`` is False.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ConvertError(f"{out} exists and is not empty: nothing written (pass --overwrite to replace it)")


def record_of(report, spec, weights: str | os.PathLike | None) -> dict:
    """What ``converted.json`` says besides the files: the API, the spec, the weights read and their SHA-256, the
    pairing table, the verdict with its worst ratio to PyTorch's own error, the versions.

    Args:
        report: the check's :class:`.report.Report`.
        spec: the :class:`.spec.Spec` checked (its ``name`` is recorded).
        weights: the weights file read (its SHA-256 is taken), or None where ``torch_model()``'s own initialisation is
            converted.

    Returns:
        A JSON-ready dict: ``api``, ``spec``, ``weights``, ``pairing``, ``tied``, ``verdict`` and ``versions``.
    """
    ratios = [r.ratio for r in report.rows if r.ratio is not None]
    worst = max(ratios) if ratios else None
    return {
        "api": report.api, "spec": str(spec.name),
        "weights": ({"path": str(weights), "sha256": _sha256(Path(weights))} if weights else
                    {"path": None, "note": "torch_model()'s own initialisation (no --weights)"}),
        "pairing": [{"torch": p.torch_key, "port": p.jax_name, "transform": p.transform} for p in report.pairings],
        "tied": report.tied,
        "verdict": {"exit_status": report.exit_status(), "quantities": len(report.rows), "dtype": report.dtype,
                    "mode": "training (TRAIN = True)" if report.train else "eval (TRAIN = False)",
                    "programs": list(report.programs), "steps": report.steps, "k": report.k, "worst_ratio": worst,
                    "worst_at": None if worst is None else next(f"{r.label}, {r.name}" for r in report.rows
                                                                if r.ratio == worst),
                    "precision_findings": len(report.precision_findings)},
        "versions": _versions(),
    }


def load_converted(folder: str | os.PathLike, template: Any = None, verify: bool = True) -> Any:
    """The weights :func:`convert` wrote, read back without PyTorch.

    Args:
        folder: the folder :func:`convert` (``functional-gan convert``) wrote.
        template: Flax NNX: an NNX model of the same structure (``jax_model()``, or ``nnx.eval_shape`` of it);
            Equinox: the ``(model, state)`` pair (or the model) as ``jax_model()`` makes it; Linen and plain
            functions: not needed.
        verify: check every file's SHA-256 against ``converted.json`` first.

    Returns:
        The weights in the port's own form: for Flax Linen the variables dict, for ``model.apply(variables, x)``;
            for NNX ``template`` with the converted state; for Equinox the same structure as ``template``, filled;
            for plain functions ``{"params": ..., "state": ...}``.

    Raises:
        ConvertError: no ``converted.json`` there (or a damaged one), a file missing or changed since it was written,
            or no ``template`` where the API needs one; nothing is loaded then.
    """
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        raise ConvertError(f"{folder} has no {MANIFEST}: not a folder written by functional-gan convert")
    try:
        record = json.loads(manifest.read_text())
        api, files = record["api"], record["files"]
    except (ValueError, KeyError, TypeError) as error:
        raise ConvertError(f"{manifest} is damaged: {type(error).__name__}: {error}") from error
    if verify:
        for name, digest in files.items():
            path = folder / name
            if not path.is_file():
                raise ConvertError(f"{folder}: {name} is missing (listed in {MANIFEST})")
            if _sha256(path) != digest:
                raise ConvertError(f"{folder}: {name} does not match its SHA-256 in {MANIFEST} (changed or damaged)")
    if api in ("Flax Linen", "Flax NNX"):
        import orbax.checkpoint as ocp

        checkpointer = ocp.StandardCheckpointer()
        try:
            tree = checkpointer.restore((folder / WEIGHTS).resolve())
        finally:
            checkpointer.close()
        tree = _plain(tree)
        if api == "Flax Linen":
            return tree
        from flax import nnx

        if template is None:
            raise ConvertError("an NNX port's weights are read into a model: pass template=jax_model() (or "
                               "nnx.eval_shape(jax_model))")
        graphdef, state = nnx.split(template)
        nnx.replace_by_pure_dict(state, tree)
        return nnx.merge(graphdef, state)
    if api == "Equinox":
        import equinox as eqx

        if template is None:
            raise ConvertError("an Equinox port's weights are read into its structure: pass template=jax_model() "
                               "(the model, or (model, state) from eqx.nn.make_with_state)")
        pair = template if isinstance(template, tuple) else (template, None)
        filled = eqx.tree_deserialise_leaves(folder / f"{WEIGHTS}.eqx", pair)
        return filled if isinstance(template, tuple) else filled[0]
    from safetensors.numpy import load_file

    return _unflatten(dict(load_file(str(folder / f"{WEIGHTS}.safetensors"))))


__all__ = ["ConvertError", "convert", "load_converted", "read_weights", "record_of", "refuse_existing", "write_converted"]

