"""The divergence finder: where, inside one iteration, does the JAX port first leave PyTorch?

Both frameworks start every iteration from the *same* state (PyTorch's, loaded into JAX, Adam's
moments included) and the same batch and noise, and every intermediate of the tutorial's
iteration is compared in the order a person debugs a port:

1. forward: every layer's output of G, of D on the real batch, of D on ``fake.detach()``;
2. loss: ``errD_real``, ``errD_fake``;
3. gradient: every D parameter's gradient;
4. update: every D parameter after ``optimizerD.step()``, then D's running statistics;
5. the G step: every layer of D (updated) on ``fake``, ``errG``, G's gradients, G's updated
   parameters, G's running statistics.

The first entry whose difference exceeds the tolerance is the divergence: its step, stage,
network and tensor, with values from both sides. Each entry's difference is ``max |JAX − PyTorch|``
over the tensor divided by ``max |PyTorch|`` (its scale; non-finite mismatches count as infinite).
Starting each step from PyTorch's state keeps an early small difference from masquerading as a
later large one (training amplifies rounding).

The JAX side is built from the project's own pieces (:func:`functional_gan.train.make_models`,
:func:`functional_gan.train.make_optimizer`, :mod:`functional_gan.losses`), looked up when the
finder runs, so a test can plant a fault in any of them and check that the finder names it.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch

from functional_gan import convert, losses, train
from functional_gan.config import TUTORIAL, TrainConfig
from functional_gan.pytorch import dcgan
from functional_gan.pytorch.precision import default_dtype, torch_dtype
from functional_gan.replay import check_batches, config_from_state_dicts, load_batches

from . import reference_runs
from .common import state_from_snapshot

STAGES = ("forward", "loss", "gradient", "update", "running statistics")
DEFAULT_TOLERANCE = {"float64": 1e-9, "float32": 1e-3}  # relative to each tensor's scale


@dataclasses.dataclass
class Entry:
    """One compared quantity of one iteration."""

    stage: str  # one of STAGES
    network: str  # "G", "D" or "loss"
    name: str  # e.g. "D(real) main.2 output", "main.3.weight", "errD_fake"
    difference: float  # max |JAX − PyTorch| / max |PyTorch|
    torch_values: np.ndarray
    jax_values: np.ndarray


@dataclasses.dataclass
class Divergence:
    step: int  # 1-based iteration
    entry: Entry
    before: list[Entry]  # everything compared before it in that iteration (all within tolerance)
    tolerance: float


def _difference(ours: np.ndarray, theirs: np.ndarray) -> float:
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    if ours.shape != theirs.shape:
        return float("inf")
    same_nonfinite = (ours == theirs) | (np.isnan(ours) & np.isnan(theirs))
    finite = np.isfinite(ours) & np.isfinite(theirs)
    if not np.all(finite | same_nonfinite):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = max(float(np.max(np.abs(theirs[finite]))), 1e-30)
    return float(np.max(np.abs(ours[finite] - theirs[finite]))) / scale


# --- PyTorch: the tutorial's iteration, recording every intermediate -----------------------------


def _torch_iteration(net_g, net_d, optimizer_g, optimizer_d, real, noise) -> dict:
    """The tutorial's iteration (as :func:`functional_gan.pytorch.dcgan.tutorial_iteration`), recorded."""
    record, current = {}, {"pass": None}

    def hook(index):
        def save(_module, _inputs, output):
            record[(current["pass"], index)] = output.detach().clone().numpy()  # clone: the next ReLU is in place
        return save

    handles = [m.register_forward_hook(hook(i)) for net in (net_g, net_d) for i, m in enumerate(net.main)]
    try:
        criterion = torch.nn.BCELoss()
        b_size = real.size(0)
        net_d.zero_grad()
        current["pass"] = "D(real)"
        err_d_real = criterion(net_d(real).view(-1), torch.full((b_size,), losses.REAL_LABEL, dtype=real.dtype))
        err_d_real.backward()
        current["pass"] = "G"
        fake = net_g(noise)
        current["pass"] = "D(fake.detach())"
        err_d_fake = criterion(net_d(fake.detach()).view(-1), torch.full((b_size,), losses.FAKE_LABEL, dtype=real.dtype))
        err_d_fake.backward()
        record["errD_real"], record["errD_fake"] = err_d_real.item(), err_d_fake.item()
        record["D gradient"] = {n: p.grad.detach().clone().numpy() for n, p in net_d.named_parameters()}
        optimizer_d.step()
        record["D after step"] = dcgan.state_dict_numpy(net_d)
        net_g.zero_grad()
        current["pass"] = "D updated (fake)"
        err_g = criterion(net_d(fake).view(-1), torch.full((b_size,), losses.REAL_LABEL, dtype=real.dtype))
        err_g.backward()
        record["errG"] = err_g.item()
        record["G gradient"] = {n: p.grad.detach().clone().numpy() for n, p in net_g.named_parameters()}
        optimizer_g.step()
        record["G after step"] = dcgan.state_dict_numpy(net_g)
        record["D after iteration"] = dcgan.state_dict_numpy(net_d)
    finally:
        for handle in handles:
            handle.remove()
    return record


# --- JAX: the same iteration from the project's pieces ------------------------------------------


def _captured(model, variables, x):
    """(output, updated batch_stats, {module index: output NCHW}) of one training-mode forward."""
    out, updates = model.apply(variables, x, mutable=["batch_stats", "intermediates"], capture_intermediates=True)
    layers = {}
    for name, value in updates["intermediates"].items():
        if name.startswith("main_"):
            array = np.asarray(value["__call__"][0])
            layers[int(name.removeprefix("main_"))] = array.transpose(0, 3, 1, 2) if array.ndim == 4 else array
    return out, updates["batch_stats"], layers


def _jax_iteration(config: TrainConfig, state: train.GANState, real_NHWC, noise_NZ) -> dict:
    generator, discriminator = train.make_models(config)
    optimizer = train.make_optimizer(config)
    loss_pair = losses.losses_for(config)
    record = {}
    g_vars = {"params": state.generator_params, "batch_stats": state.generator_batch_stats}
    fake, g_stats, record["G"] = _captured(generator, g_vars, noise_NZ)
    d_vars = {"params": state.discriminator_params, "batch_stats": state.discriminator_batch_stats}
    out_real, d_stats, record["D(real)"] = _captured(discriminator, d_vars, real_NHWC)
    out_fake, _, record["D(fake.detach())"] = _captured(discriminator, {**d_vars, "batch_stats": d_stats}, fake)
    record["errD_real"] = float(losses.bce_loss(out_real, jnp.full(out_real.shape, losses.REAL_LABEL, out_real.dtype)))
    record["errD_fake"] = float(losses.bce_loss(out_fake, jnp.full(out_fake.shape, losses.FAKE_LABEL, out_fake.dtype)))
    (_, (d_stats, _, _)), d_grads = jax.value_and_grad(loss_pair.discriminator, argnums=1, has_aux=True)(
        discriminator, state.discriminator_params, state.discriminator_batch_stats, real_NHWC, fake
    )
    record["D gradient"] = convert.variables_to_state_dict(d_grads, {})
    updates, _ = optimizer.update(d_grads, state.discriminator_opt_state, state.discriminator_params)
    d_params = optax.apply_updates(state.discriminator_params, updates)
    record["D after step"] = convert.variables_to_state_dict(d_params, d_stats)
    _, _, record["D updated (fake)"] = _captured(discriminator, {"params": d_params, "batch_stats": d_stats}, fake)

    def generate(params):
        return generator.apply({"params": params, "batch_stats": state.generator_batch_stats}, noise_NZ, mutable=["batch_stats"])[0]

    _, generator_vjp = jax.vjp(generate, state.generator_params)
    (err_g, (d_stats, _)), fake_cotangent = jax.value_and_grad(loss_pair.generator, argnums=3, has_aux=True)(
        discriminator, d_params, d_stats, fake
    )
    record["errG"] = float(err_g)
    (g_grads,) = generator_vjp(fake_cotangent)
    record["G gradient"] = convert.variables_to_state_dict(g_grads, {})
    updates, _ = optimizer.update(g_grads, state.generator_opt_state, state.generator_params)
    g_params = optax.apply_updates(state.generator_params, updates)
    record["G after step"] = convert.variables_to_state_dict(g_params, g_stats)
    record["D after iteration"] = convert.variables_to_state_dict(d_params, d_stats)
    return record


def _entries(torch_record: dict, jax_record: dict) -> list[Entry]:
    """Every compared quantity of one iteration, in debugging order."""
    entries = []

    def add(stage, network, name, theirs, ours):
        entries.append(Entry(stage, network, name, _difference(ours, theirs), np.asarray(theirs), np.asarray(ours)))

    def forward(pass_name, network):
        for index in sorted(jax_record[pass_name]):
            add("forward", network, f"{pass_name} main.{index} output", torch_record[(pass_name, index)], jax_record[pass_name][index])

    forward("G", "G")
    forward("D(real)", "D")
    forward("D(fake.detach())", "D")
    for name in ("errD_real", "errD_fake"):
        add("loss", "loss", name, torch_record[name], jax_record[name])
    for key, value in torch_record["D gradient"].items():
        add("gradient", "D", key, value, jax_record["D gradient"][key])
    parameters = [k for k in torch_record["D gradient"]]
    for key in parameters:
        add("update", "D", key, torch_record["D after step"][key], jax_record["D after step"][key])
    for key, value in torch_record["D after step"].items():
        if key not in parameters:
            add("running statistics", "D", key + " (after the D step)", value, jax_record["D after step"][key])
    forward("D updated (fake)", "D")
    add("loss", "loss", "errG", torch_record["errG"], jax_record["errG"])
    for key, value in torch_record["G gradient"].items():
        add("gradient", "G", key, value, jax_record["G gradient"][key])
    for key in torch_record["G gradient"]:
        add("update", "G", key, torch_record["G after step"][key], jax_record["G after step"][key])
    for network, record_name in (("G", "G after step"), ("D", "D after iteration")):
        for key, value in torch_record[record_name].items():
            if key not in torch_record[f"{network} gradient"]:
                add("running statistics", network, key, value, jax_record[record_name][key])
    return entries


def find_divergence(
    generator_sd: dict, discriminator_sd: dict, real_NCHW: np.ndarray, noise_NCHW: np.ndarray,
    dtype: str = "float64", tolerance: float | None = None, optimizer: TrainConfig = TUTORIAL,
) -> tuple[Divergence | None, list[list[Entry]]]:
    """Run both frameworks iteration by iteration from PyTorch's state; return the first divergence (or None).

    Also returns every iteration's entries (up to the divergent one), for a report.
    """
    tolerance = DEFAULT_TOLERANCE[dtype] if tolerance is None else tolerance
    real_NCHW, noise_NCHW = np.asarray(real_NCHW), np.asarray(noise_NCHW)
    config = config_from_state_dicts(generator_sd, discriminator_sd, real_NCHW.shape[1] if real_NCHW.ndim == 5 else 1, optimizer)
    check_batches(real_NCHW, noise_NCHW, config)
    tdtype, history = torch_dtype(dtype), []
    with default_dtype(tdtype), jax.enable_x64(dtype == "float64"):
        jdtype = jnp.float64 if dtype == "float64" else jnp.float32
        net_g, net_d = dcgan.make_models(config, dtype=tdtype)
        dcgan.load_state_dict_numpy(net_g, generator_sd)
        dcgan.load_state_dict_numpy(net_d, discriminator_sd)
        optimizer_g, optimizer_d = dcgan.make_optimizers(net_g, net_d, config)
        for t in range(real_NCHW.shape[0]):
            snapshot = reference_runs.snapshot(net_g, net_d, optimizer_g, optimizer_d)
            state = state_from_snapshot(config, snapshot, jdtype)
            real = torch.as_tensor(real_NCHW[t], dtype=tdtype)
            noise = torch.as_tensor(noise_NCHW[t], dtype=tdtype)
            torch_record = _torch_iteration(net_g, net_d, optimizer_g, optimizer_d, real, noise)
            jax_record = _jax_iteration(
                config, state, jnp.asarray(real_NCHW[t].transpose(0, 2, 3, 1), jdtype), jnp.asarray(noise_NCHW[t, :, :, 0, 0], jdtype)
            )
            entries = _entries(torch_record, jax_record)
            for i, entry in enumerate(entries):
                if not entry.difference <= tolerance:
                    history.append(entries[: i + 1])
                    return Divergence(t + 1, entry, entries[:i], tolerance), history
            history.append(entries)
    return None, history


def _values(array: np.ndarray, count: int = 6) -> str:
    flat = np.asarray(array, np.float64).reshape(-1)
    return np.array2string(flat[:count], precision=10, separator=", ") + (f" … ({flat.size} values)" if flat.size > count else "")


def format_divergence(divergence: Divergence | None, history: list[list[Entry]], dtype: str, tolerance: float) -> str:
    """A report a person reads top to bottom: the verdict, the divergent tensor's values, the step's table."""
    if divergence is None:
        worst = max((e for entries in history for e in entries), key=lambda e: e.difference)
        return (f"No divergence in {len(history)} iteration(s) ({dtype}, tolerance {tolerance:g} of each tensor's scale); "
                f"the largest difference: {worst.difference:.2e} ({worst.stage}, {worst.network} {worst.name}).")
    e = divergence.entry
    lines = [
        f"First divergence: iteration {divergence.step}, stage '{e.stage}', {e.network} {e.name}",
        f"  max |JAX − PyTorch| / max |PyTorch| = {e.difference:.3e} > tolerance {tolerance:g} ({dtype})",
        f"  PyTorch: {_values(e.torch_values)}",
        f"  JAX:     {_values(e.jax_values)}",
        f"  Before it, in iteration {divergence.step}, {len(divergence.before)} quantities agreed "
        f"(largest {max((b.difference for b in divergence.before), default=0.0):.1e}):",
        "  stage               network  quantity                                   difference",
    ]
    for entry in divergence.before + [e]:
        lines.append(f"  {entry.stage:<19} {entry.network:<8} {entry.name:<42} {entry.difference:.2e}")
    return "\n".join(lines)


def diverge_files(generator: str | os.PathLike, discriminator: str | os.PathLike, batches: str | os.PathLike,
                  dtype: str = "float64", tolerance: float | None = None, optimizer: TrainConfig = TUTORIAL):
    """:func:`find_divergence` on files (the tutorial's state_dicts, an .npz of batches, as ``replay`` reads)."""
    generator_sd = convert.load_state_dict_file(generator)
    discriminator_sd = convert.load_state_dict_file(discriminator)
    real, noise = load_batches(batches)
    return find_divergence(generator_sd, discriminator_sd, real, noise, dtype, tolerance, optimizer)
