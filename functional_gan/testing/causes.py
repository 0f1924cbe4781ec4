"""What a report says a departure's cause is: a known cause of a divergence read off the port (Flax's own BatchNorm,
a cut path to the input, the optimizer's settings probed on both sides), the gradients a mistake reaches unevenly,
the causes of precision findings verified by counterfactual runs, and the port's float32 islands named."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np
import torch

from .judge import EPS64, Row
from .torch_side import island_pattern

if TYPE_CHECKING:
    from .run import Run


def name_port_islands(run: Run, islands: dict, rows: list[Row]) -> None:
    """One note per island of the port: where its step narrows (the module, where the name stack says it), and the
    first layer whose output its error reaches (more than a thousand float64 ulps of the scale).

    Args:
        run: the check's :class:`.run.Run`; its ``notes`` take one line per island.
        islands: the port's islands, {module path of JAX's name stack: the narrow dtype's name}
            (:func:`.widen.islands`).
        rows: the rows judged up to the gradients; where an island's module is not named, the first forward row whose
            island noise exceeds a thousand float64 ulps of its scale is named instead.
    """
    shown = next((r.name for r in rows if r.key[0] == "forward" and (r.island_noise or 0.0) > 1e3 * EPS64), None)
    seen_at = f"; its error first shows at forward {shown}" if shown else ""
    for where, narrow in island_pattern(islands).items():
        named = where != "(the model itself)"  # Flax Linen names its modules in JAX's name stack; NNX and Equinox not
        run.notes.add(f"the port computes {f'its module {where}' if named else 'part of its step'} in {narrow} inside "
                      f"its float64 program (a cast or a dtype fixed there{'' if named else seen_at}): those rows and "
                      "what follows are judged against that island's own error (the same program with its casts "
                      "removed, beside it)")



FLAX_BATCHNORM = ("flax.linen.normalization.BatchNorm", "flax.nnx.nn.normalization.BatchNorm")



def known_causes(run: Run, rows: list[Row], other_rows: list[Row]) -> dict:
    """A known cause for divergences at a running statistic of Flax's own BatchNorm, read off the port's module.

    Args:
        run: the check's :class:`.run.Run`: its pairing and the port's module classes are read, and its spec's
            optimizers probed (:func:`optimizer_differences`).
        rows: the judged program's rows.
        other_rows: the other program's rows, whose divergences at an input's gradient or a buffer get hints too.

    Returns:
        {(stage, name): a known cause, in words} for the divergences it explains: an input's gradient (a path that only
        it takes cut or changed), a buffer of Flax's own BatchNorm, and, where ``rows`` diverge at updates alone, each
        of those updates with the optimizers' differences (where the probes find any).
    """
    modules = {p.torch_key: p.jax_path[:-1] for p in run.pairings}
    hints = {}
    for row in rows + other_rows:
        stage = row.stage
        if row.diverged and stage == "gradient" and row.name.startswith("(input"):
            hints[(stage, row.name)] = (
                "a path that only the input's gradient takes is cut or changed (every parameter's gradient before "
                "it agrees): a stop_gradient (PyTorch's .detach()) on a residual stream or a skip connection, or a "
                "custom gradient there")
        if row.diverged and stage == "buffer" and run.adapter.classes.get(modules.get(row.name)) in FLAX_BATCHNORM:
            hints[(stage, row.name)] = (
                "the port's module there is Flax's own BatchNorm, which weighs the old running average by its momentum "
                "(0.9 means PyTorch's 0.1) and keeps the biased batch variance, where PyTorch keeps the unbiased one; "
                "a port of PyTorch's BatchNorm writes its own (examples/port/resnet_basic.py: TorchBatchNorm)")
    updates = [r for r in rows if r.diverged and r.key[0] == "update"]
    if updates and not any(r.diverged for r in rows if r.key[0] in ("forward", "output", "loss", "gradient")):
        said = optimizer_differences(run)
        if said:
            for row in updates:
                hints[row.key] = "; ".join(said)
    return hints



def optimizer_differences(run: Run) -> list[str]:
    """Each side's optimizer stepped alone on the same made-up gradients, from fresh states, each probe telling one
    hyperparameter: a weight of 1 and a zero gradient (a decoupled weight decay: lr × weight_decay), a weight of 0 and
    a gradient of 1 (the step size: the learning rate), a gradient of 1e-8 beside it (Adam's ε: ``g / (|g| + ε)``),
    and the gradients 1, -2, 0.5 in turn (the momentum: SGD's or Adam's betas). What differs is said, in that order;
    nothing where either optimizer cannot be run so (one that needs more than a list of parameters).

    Args:
        run: the check's :class:`.run.Run`; its spec's ``torch_optimizer`` and ``jax_optimizer`` are built afresh for
            each probe (a float64 PyTorch weight, a float32 port's).

    Returns:
        One sentence per difference found: the learning rate, then the weight decay; where the learning rates agree, the
        epsilon, and the momentum where nothing else differs. Empty where nothing differs or a probe raised.
    """
    import optax

    def torch_steps(start, grads):
        weight = torch.nn.Parameter(torch.full((4,), start, dtype=torch.float64))
        optimizer = run.spec.torch_optimizer([weight])
        moves = []
        for g in grads:
            before = weight.detach().clone()
            weight.grad = torch.full_like(weight, g)
            optimizer.step()
            moves.append(float((weight.detach() - before)[0]))
        return moves

    def port_steps(start, grads):
        optimizer = run.spec.jax_optimizer()
        params = {"w": jnp.full(4, start, jnp.float32)}
        state = optimizer.init(params)
        moves = []
        for g in grads:
            updates, state = optimizer.update({"w": jnp.full(4, g, jnp.float32)}, state, params)
            params = optax.apply_updates(params, updates)
            moves.append(float(np.asarray(updates["w"])[0]))
        return moves

    try:
        probes = {name: (torch_steps(*probe), port_steps(*probe)) for name, probe in
                  {"decay": (1.0, [0.0]), "step": (0.0, [1.0]), "tiny": (0.0, [1e-8]),
                   "turns": (0.0, [1.0, -2.0, 0.5])}.items()}
    except Exception:
        return []

    def differ(a, b):
        return not math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-12)

    said = []
    (t_step,), (p_step,) = probes["step"]
    steps_differ = differ(t_step, p_step)
    if steps_differ:
        said.append(f"the optimizers' learning rates differ: with a gradient of 1 the first step moves a weight by "
                    f"{t_step:.3g} in PyTorch and {p_step:.3g} in the port")
    (t_decay,), (p_decay,) = probes["decay"]
    if t_step and p_step and differ(t_decay / t_step, p_decay / p_step):  # weight_decay itself, lr divided out
        said.append(f"the optimizers' weight decays differ: with zero gradients PyTorch's shrinks each weight by "
                    f"{-t_decay:.3g} of itself a step and the port's by {-p_decay:.3g} (lr × weight_decay; "
                    "torch.optim.AdamW's default weight_decay is 0.01, optax.adamw's 1e-4: give both the same)")
    if steps_differ:
        return said  # the probes below are read relative to the step size
    (t_tiny,), (p_tiny,) = probes["tiny"]
    if t_step and differ(t_tiny / t_step, p_tiny / p_step):
        said.append(f"the optimizers' epsilons differ: a gradient of 1e-8 moves a weight {t_tiny / t_step:.3g} as far "
                    f"as a gradient of 1 in PyTorch, {p_tiny / p_step:.3g} in the port (Adam's g / (√v̂ + ε): its eps, or "
                    "eps inside the square root, optax's eps_root)")
    t_turns, p_turns = probes["turns"]
    if not said and any(differ(a, b) for a, b in zip(t_turns[1:], p_turns[1:])):
        said.append(f"the optimizers' momenta differ: with the gradients 1, -2, 0.5 the steps are "
                    f"{', '.join(f'{m:.3g}' for m in t_turns)} in PyTorch and {', '.join(f'{m:.3g}' for m in p_turns)} "
                    "in the port, the first alike (SGD's momentum or dampening, Adam's betas)")
    return said



def lopsided_gradients(rows: list[Row], apart: float = 10.0) -> list[str]:
    """Where a divergence reaches the weight gradients of sibling layers (one parent module) unevenly, some ``apart``
    times further off than the nearest, a line saying so: the mistake lies on the far ones' path alone (queries' and
    keys' projections far worse than values': between them and the attention scores, a rotary embedding say).

    Args:
        rows: the judged rows; only the diverging gradients of weights (names ending in ``.weight``, with a parent
            module) are read.
        apart: how many times the nearest sibling's error a weight gradient's error must be to count as far.

    Returns:
        One sentence per parent module with three or more diverging weight gradients, some of them ``apart`` times
        further from PyTorch's than the nearest and at least two not.
    """
    groups: dict[str, list[Row]] = {}
    for row in rows:
        if row.diverged and row.key[0] == "gradient" and row.name.endswith(".weight") and row.name.count(".") >= 2:
            groups.setdefault(row.name.rsplit(".", 2)[0], []).append(row)
    lines = []
    for parent, siblings in groups.items():
        nearest = min(siblings, key=lambda r: r.port_error)
        far = [r for r in siblings if nearest.port_error > 0 and r.port_error >= apart * nearest.port_error]
        if len(siblings) >= 3 and far and len(far) < len(siblings) - 1:
            times = [r.port_error / nearest.port_error for r in far]
            names = " and ".join(r.name[len(parent) + 1:] for r in far)
            lines.append(f"among {parent}'s weight gradients, {names} {'is' if len(far) == 1 else 'are'} "
                         f"{min(times):.0f}–{max(times):.0f}× further from PyTorch's than "
                         f"{nearest.name[len(parent) + 1:]}: the mistake lies on their path alone (queries' and keys' "
                         "projections far worse than the values': between them and the attention scores, a rotary "
                         "embedding say; TAPS can give it rows)")
    return lines



def verified_causes(run: Run, rows: list[Row]) -> dict:
    """Per cause switched off (:attr:`Run.counterfactuals`): the judged rows beyond their allowance whose excess over
    it goes away without the cause, at least nine tenths of it ("fell"; the rest may have a cause of its own), and those
    whose excess stays ("stayed"), each ``(stage, name) → (ratio, ratio without)``.

    Args:
        run: the check's :class:`.run.Run`; its ``counterfactuals`` ({cause switched off: {(stage, name): the row
            without it}}) are read.
        rows: the judged program's rows.

    Returns:
        {the cause as the report names it (``"use_fast_variance=True"``, ``"optax's float32 bias corrections"``):
        {"fell": ..., "stayed": ...}}; empty where no counterfactual ran.
    """
    verified = {}
    for cause, counter in run.counterfactuals.items():
        label = {"use_fast_variance=False": "use_fast_variance=True",
                 "exact bias corrections": "optax's float32 bias corrections"}[cause]
        fell, stayed = {}, {}
        for row in rows:
            if row.passed or row.not_compared or row.key not in counter:
                continue
            after = counter[row.key]  # the excess over the allowance gone, or nine tenths of it
            gone = max(after.port_error - after.allowed, 0.0) <= 0.1 * (row.port_error - row.allowed)
            (fell if gone else stayed)[row.key] = (row.ratio, after.ratio)
        verified[label] = {"fell": fell, "stayed": stayed}
    return verified
