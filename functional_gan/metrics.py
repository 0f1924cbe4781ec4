"""The tutorial's per-iteration statistics: one definition of their names and of the stats line."""

from __future__ import annotations

from typing import NamedTuple

import jax


class StepMetrics(NamedTuple):
    """``Loss_D``, ``Loss_G``, ``D(x)``, ``D(G(z))`` before and after D's update, as the tutorial prints them.

    PyTorch: the tutorial's ``errD.item()``, ``errG.item()``, ``D_x``, ``D_G_z1``, ``D_G_z2``.
    """

    loss_d: jax.Array
    loss_g: jax.Array
    d_x: jax.Array
    d_g_z1: jax.Array
    d_g_z2: jax.Array


METRIC_NAMES: tuple[str, ...] = StepMetrics._fields


def stats_line(epoch: int, num_epochs: int, index: int, per_epoch: int, values: dict[str, float],
               labels: tuple[str, str] = ("D(x)", "D(G(z))"), derived: dict | None = None) -> str:
    """The tutorial's progress line: ``[epoch/num_epochs][i/len(dataloader)]  Loss_D: ...``.

    ``labels`` name ``d_x`` and ``d_g_z1 / d_g_z2`` (a critic's are scores: ``C(x)``, ``C(G(z))``);
    ``derived`` adds metrics computed from the others (WGAN-GP's ``W ≈ C(x) − C(G(z))``). Both come from
    the loss's entry in :data:`functional_gan.losses.LOSSES`.
    """
    line = (f"[{epoch}/{num_epochs}][{index}/{per_epoch}]\tLoss_D: {values['loss_d']:.4f}\tLoss_G: {values['loss_g']:.4f}"
            f"\t{labels[0]}: {values['d_x']:.4f}\t{labels[1]}: {values['d_g_z1']:.4f} / {values['d_g_z2']:.4f}")
    return line + "".join(f"\t{label}: {fn(values):.4f}" for label, fn in (derived or {}).items())
