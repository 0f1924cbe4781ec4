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


def stats_line(epoch: int, num_epochs: int, index: int, per_epoch: int, values: dict[str, float], critic: bool = False) -> str:
    """The tutorial's progress line: ``[epoch/num_epochs][i/len(dataloader)]  Loss_D: ...``.

    ``critic``: a WGAN critic's outputs are scores, not probabilities: ``C(x)``, ``C(G(z))``, and
    the critic's estimate of the Wasserstein distance, ``W ≈ C(x) − C(G(z))`` (before its update).
    """
    if critic:
        return (
            f"[{epoch}/{num_epochs}][{index}/{per_epoch}]\tLoss_D: {values['loss_d']:.4f}\tLoss_G: {values['loss_g']:.4f}"
            f"\tC(x): {values['d_x']:.4f}\tC(G(z)): {values['d_g_z1']:.4f} / {values['d_g_z2']:.4f}"
            f"\tW: {values['d_x'] - values['d_g_z1']:.4f}"
        )
    return (
        f"[{epoch}/{num_epochs}][{index}/{per_epoch}]\tLoss_D: {values['loss_d']:.4f}\tLoss_G: {values['loss_g']:.4f}"
        f"\tD(x): {values['d_x']:.4f}\tD(G(z)): {values['d_g_z1']:.4f} / {values['d_g_z2']:.4f}"
    )
