"""A check's set-up, its first phase: the spec's pieces built on both sides, the port adapted to one form and its
weights paired with PyTorch's, PyTorch's runs made ready (the float64 reference, and the runs that measure PyTorch's
own error); what it makes is a :class:`.run.Run`."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import torch

from functional_gan.errors import UserError

from . import apis
from .memory import MemoryPolicy, estimate, estimate_before_building, parameter_count
from .pairing import all_filled, default_from_jax, default_to_jax, shapes_of_paired, tied_tensors, transfer
from .run import PERMUTED_RUNS, Run
from .spec import Spec, SpecError, differentiated_inputs
from .torch_side import make_torch_side, other_layout, side_dtype


def prepare(spec: Spec, dtype: str, k: float, seed: int, programs: tuple[str, ...], torch_state: dict | None = None,
             memory: MemoryPolicy | None = None) -> Run:
    """The spec's pieces built, the port adapted and paired with the PyTorch model, PyTorch's runs set up.

    Args:
        spec: the check's :class:`.spec.Spec`.
        dtype: ``"float32"`` or ``"float64"``.
        k: the allowance, in multiples of PyTorch's own error.
        seed: PyTorch's seed for ``torch_model()`` (and the port's own initialisation, where a leaf is left unpaired).
        programs: the JAX programs the check runs (``"jit"``, ``"eager"``).
        torch_state: a ``state_dict`` loaded into ``torch_model()`` instead of its seeded initialisation, or None.
        memory: the check's :class:`.memory.MemoryPolicy` (its ``limit``: a check estimated beyond it is not started).

    Returns:
        The :class:`.run.Run`: both sides built, the pairing, the PyTorch runs that measure its own error ready.

    Raises:
        SpecError: a missing piece of the spec, the spec's or the port's code failed, weights that do not pair,
            ``INPUT_GRADIENTS`` without a loss or a floating-point input, or a check estimated beyond the memory limit.
    """
    if spec.torch_model is None or spec.example_inputs is None or (
            spec.jax_model is None and (spec.jax_params is None or spec.jax_apply is None)):
        raise SpecError("a spec needs torch_model, example_inputs, and jax_model or jax_params with jax_apply")
    # the size known before anything is built, where the model builds on the meta device (else once it is built)
    memory = memory or MemoryPolicy()
    memory_limit = memory.limit
    size = estimate_before_building(spec.torch_model, dtype) if memory_limit is not None else None
    if size is not None and size.whole > memory_limit:
        raise SpecError(size.message(memory_limit))
    torch.manual_seed(seed)
    try:
        inputs = tuple(np.asarray(x) for x in spec.example_inputs())
        targets = tuple(np.asarray(x) for x in spec.example_targets()) if spec.example_targets else ()
        reference_model = spec.torch_model()
    except Exception as error:
        raise SpecError(f"the spec's torch_model()/example_inputs() failed: {type(error).__name__}: {error}") from error
    if memory_limit is not None and size is None:  # a model the meta device cannot build: measured built
        size = estimate(reference_model, dtype)
        if size.whole > memory_limit:
            raise SpecError(size.message(memory_limit))
    if torch_state is not None:
        reference_model.load_state_dict(torch_state)
    state = reference_model.state_dict()  # each model built loads it; the first build is let go after pairing
    jax_dtype = jnp.float64 if dtype == "float64" else jnp.float32

    def on_jax(arrays):  # None (an argument the port takes empty: cache=None) passes as it is
        return tuple(x if x is None else jnp.asarray(x, jax_dtype) if np.asarray(x).dtype.kind == "f"
                     else jnp.asarray(x) for x in arrays)

    def jax_inputs(channels_last: bool) -> tuple:
        to_jax = spec.to_jax or (default_to_jax if channels_last else lambda *a: tuple(np.asarray(x) for x in a))
        try:
            moved = to_jax(*inputs)
        except Exception as error:
            words = spec.words()
            raise SpecError(f"the spec's {words['to_jax']} failed on {words['to_jax_on']}: {type(error).__name__}: "
                            f"{error}") from error
        try:
            return on_jax(moved)
        except (TypeError, ValueError) as error:
            raise SpecError(f"the spec's {spec.words()['to_jax']} gave something that is not an array nor None "
                            f"({error}): it must return a tuple of arrays, one per argument of the port") from error

    if spec.input_gradients:
        words = spec.words()
        floats = [i for i in differentiated_inputs(spec, inputs)]
        moved = spec.to_jax(*inputs) if spec.to_jax is not None else None
        if not floats or spec.torch_loss is None:
            raise SpecError(f"{words['input_gradients']} needs a floating-point input and a loss (torch_loss, "
                            "jax_loss): the gradient compared is the loss's")
        if moved is not None and ((len(moved) != len(inputs) and spec.positional is None)
                                  or any(i >= len(moved) or np.asarray(moved[i]).dtype.kind != "f" for i in floats)):
            raise SpecError(f"{words['input_gradients']} pairs the inputs by position: {words['to_jax']} must give "
                            "one array per input, the floating-point ones in the same places")
    try:
        adapter = apis.adapter_for(spec, jax_inputs, seed)
    except UserError as error:
        raise SpecError(str(error)) from error
    from_jax = spec.from_jax or (default_from_jax if adapter.channels_last else np.asarray)
    pairings = transfer(reference_model, adapter.variables, spec.param_map, adapter.kinds)
    if adapter.materialise is not None and not all_filled(adapter.variables, pairings):  # the port's own values used
        adapter.variables = adapter.materialise()
    adapter.variables = shapes_of_paired(adapter.variables, pairings)
    tied = tied_tensors(reference_model)
    layer_paths = {p.torch_key.rsplit(".", 1)[0] if "." in p.torch_key else "": p.layer for p in pairings}
    layer_paths.update(scanned_layers(reference_model, pairings, layer_paths))
    # PyTorch's own error in the dtype checked: in float32 the float32 run, and the same twice with the batch's
    # samples in other orders (the reductions over the batch sum in other orders; outputs are put back in order);
    # in float64 the two float64 runs in other orders, and one with its weights and images in other memory layouts
    # (other_layout): a computation without a reduction over the batch (a Linear in eval mode) sums in the same order
    # however the batch is ordered, and in another order in another layout. The largest of their errors counts.
    # One model per role, not per run (a model of 124M parameters is 1 GB in float64): the reference, whose parameters
    # and buffers every run starts each step from; a working model per dtype that each other run and each optimizer
    # fed the port's gradients loads its start into before it computes; float64's other memory layout.
    ref = make_torch_side(spec, torch.float64, state)
    working = {torch.float64: None, torch.float32: None}

    def work(torch_dtype):
        if working[torch_dtype] is None:
            working[torch_dtype] = make_torch_side(spec, torch_dtype, state)[0]
        return working[torch_dtype]

    sides = {"ref": ref}
    batch = {np.shape(x)[0] for x in (*inputs, *targets) if np.ndim(x) > 0}
    permutations = {}
    short = "t32" if dtype == "float32" else "t64"
    if dtype == "float32":
        sides["t32"] = (work(torch.float32), None)
    if len(batch) == 1 and (size := batch.pop()) > 1:
        for variant in range(PERMUTED_RUNS):
            permutations[f"{short}-permuted-{variant}"] = np.random.default_rng([seed, variant]).permutation(size)
            sides[f"{short}-permuted-{variant}"] = (work(side_dtype(short)), None)
    if dtype == "float64":
        sides["t64-layout"] = (other_layout(make_torch_side(spec, torch.float64, state)[0]), None)
        sides["t64-moved"] = (work(torch.float64), None)
        sides["t64-blocked"] = (work(torch.float64), None)  # its matrix products' long sums in blocks (BlockedSums)
        # PyTorch's float32 error times eps₆₄/eps₃₂: its float64 error where the variants above share its roundings
        # (a long sum's partial sums round alike however its inputs are ordered or moved by an ulp)
        sides["t32-scaled"] = (work(torch.float32), None)
    # The update stage is judged from the same gradients: PyTorch's optimizer (float64, and float32 for its
    # own noise) fed JAX's gradients, its state evolving with them as optax's does. Judged from each
    # framework's own gradients instead, Adam's lr-sized steps on near-zero gradients make the
    # comparison a matter of chance.
    # Each is an optimizer of its own (its state) over the working model of its dtype, built when it is first fed
    # (fed_optimizer): float32's float64 working model then exists only for the update stage, and is let go after the last.
    shadows = {program: ({"ref": None, short: None} if spec.jax_optimizer is not None else {}) for program in programs}
    run = Run(spec, dtype, k, inputs, targets, jax_inputs(adapter.channels_last), on_jax(targets), from_jax, adapter,
               pairings, layer_paths, {}, sides, permutations, shadows, tied=tied, working=working, make_working=work,
               memory=memory, parameter_bytes=4 * parameter_count(reference_model))
    paths = {p.torch_key: "/".join(p.jax_path) for p in pairings}
    for later, first in tied.items():
        if later in paths:  # the port keeps a copy of its own where PyTorch uses one tensor twice
            run.notes.add(f"PyTorch's {later} is {first}: one tensor, whose gradient is the sum over both its uses and "
                          f"which one update moves; the port keeps two arrays ({paths[first]} and {paths[later]}), each "
                          "given PyTorch's values, each with the gradient of its own use alone: trained so, they part "
                          "(an untied model; the copy's update differs for that reason, not the optimizer's). A port of "
                          "the tie uses one array in both places (Flax: nn.Embed.attend).")
    return run


def scanned_layers(model, pairings, layer_paths: dict) -> dict[str, tuple[str, ...]]:
    """The rows of a scanned stack's layers themselves: each PyTorch module with no parameters of its own whose
    parameters are all slice ``k`` of leaves stacked under one module of the port (``nnx.scan``, ``lax.scan`` over a
    stacked Equinox module, Linen's ``nn.scan``) is that module's call ``k`` in the scan, ``(*module, "#k")``: its own
    output is a row (``layers.2`` beside ``layers.2.fc``), so that a mistake in a function of the layer after its last
    parametrised module is named at the layer, not one layer late.

    Args:
        model: PyTorch's model.
        pairings: the weights' pairing.
        layer_paths: the rows known already (PyTorch module → the port's layer path); their paths are not taken again.

    Returns:
        {PyTorch module name: the port's layer path} for the layers found.
    """
    taken = set(layer_paths.values())
    found = {}
    for name, _ in model.named_modules():
        if not name or name in layer_paths:
            continue
        under = [p for p in pairings if p.torch_key.startswith(name + ".")]
        if not under or any(p.index is None for p in under) or len({p.index for p in under}) != 1:
            continue
        prefix = tuple(os.path.commonprefix([p.jax_path[:-1] for p in under]))  # the stacked module below them all
        path = (*prefix, f"#{under[0].index}")
        if prefix and path not in taken:
            found[name] = path
            taken.add(path)
    return found

