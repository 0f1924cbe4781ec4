"""The divergence finder: where, inside one iteration, does the JAX port first leave PyTorch?

Both frameworks start every iteration from the *same* state (PyTorch's, loaded into JAX, Adam's
moments included) and the same batch and noise, and every intermediate of the tutorial's
iteration is compared in the order a person debugs a port:

1. forward: every layer's output of G, of D on the real batch, of D on ``fake.detach()``;
2. loss: ``errD`` (``errD_real + errD_fake``);
3. gradient: every D parameter's gradient;
4. update: every D parameter after ``optimizerD.step()``, then D's running statistics;
5. the G step, started from PyTorch's updated D (teacher forcing): every layer of D (updated) on
   ``fake``, ``errG``, G's gradients, G's updated parameters, G's running statistics.

The JAX side is the training step itself: the parts :func:`functional_gan.train.gan_step` is made of
(:func:`~functional_gan.train.generate`, :func:`~functional_gan.train.discriminator_update`,
:func:`~functional_gan.train.generator_update`), built from the project's pieces when the finder
runs, so a test can plant a fault in any of them and check that the finder names it.

Each quantity is judged by :func:`functional_gan.testing.judge.compare`, the same core as
``check-port``: the reference is PyTorch in float64. In float64 the port must agree within 1e-10 of
each tensor's scale; in float32 within k × PyTorch's own float32 error (the largest of three
float32 PyTorch runs of the same iteration: as it is, and with the batch's rows in two other orders).
An update is judged from the same gradients (PyTorch's Adam fed JAX's gradients from the same
moments), so Adam's lr-sized steps on near-zero gradients, which float32 rounding flips in PyTorch
as much as in JAX, are not a divergence. The first quantity out of tolerance is the divergence.
"""

from __future__ import annotations

import copy
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import torch

from functional_gan import state_dicts, losses, train
from functional_gan.config import TUTORIAL, TrainConfig
from functional_gan.pytorch import dcgan
from functional_gan.pytorch.precision import default_dtype
from functional_gan.replay import check_batches, config_from_state_dicts, load_batches
from functional_gan.testing.check import PERMUTED_RUNS
from functional_gan.testing.torch_side import step_with_gradients

from functional_gan.testing import judge

from . import reference_runs
from .common import state_from_snapshot

STAGES = ("forward", "loss", "gradient", "update", "running statistics")


@dataclasses.dataclass
class Entry:
    """One compared quantity of one iteration: the core's verdict (:class:`~.judge.Row`) and both sides' tensors."""

    stage: str  # one of STAGES
    network: str  # "G", "D" or "loss"
    name: str  # e.g. "D(real) main.2 output", "main.3.weight", "errD"
    row: judge.Row
    torch_values: np.ndarray
    jax_values: np.ndarray
    kinks: int = 0  # float32 gradients: activations on the other side of a ReLU's kink in the passes behind it

    @property
    def difference(self) -> float:
        """max |JAX − PyTorch| / max |PyTorch| (PyTorch in float64)."""
        return self.row.port_error

    @property
    def passed(self) -> bool:
        """Within tolerance, or a gradient behind a kink that float32 rounding crossed (chance, not the port)."""
        return self.row.passed or self.kinks > 0


@dataclasses.dataclass
class Divergence:
    step: int  # 1-based iteration
    entry: Entry
    before: list[Entry]  # everything compared before it in that iteration (all within tolerance)


# --- PyTorch: the tutorial's iteration, recording every intermediate -----------------------------


class _Recorder(dcgan.IterationHooks):
    """Hooks on the tutorial's own iteration (:func:`functional_gan.pytorch.dcgan.tutorial_iteration`) that record
    every intermediate: each layer's output per pass, errD, D's gradients and update, errG, G's gradients and update.
    ``d_after``: D's state_dict to continue from after its step (teacher forcing the G step)."""

    def __init__(self, nets, unpermute, d_after=None):
        self.record, self.current, self.unpermute, self.d_after = {}, None, unpermute, d_after
        self.handles = [m.register_forward_hook(self._layer(i)) for net in nets for i, m in enumerate(net.main)]

    def _layer(self, index):
        def save(_module, _inputs, output):  # a copy: the next ReLU is in place
            self.record[(self.current, index)] = self.unpermute(output.detach().double().numpy().copy())
        return save

    def before_pass(self, name):
        self.current = name

    def before_d_step(self, net_d, d):
        self.record["errD"] = d.err_d_real.item() + d.err_d_fake.item()
        self.record["D gradient"] = _gradients(net_d)

    def after_d_step(self, net_d):
        self.record["D after step"] = dcgan.state_dict_numpy(net_d)
        if self.d_after is not None:
            dcgan.load_state_dict_numpy(net_d, self.d_after)

    def before_g_step(self, net_g, err_g):
        self.record["errG"] = err_g.item()
        self.record["G gradient"] = _gradients(net_g)

    def after_g_step(self, net_g, net_d):
        self.record["G after step"] = dcgan.state_dict_numpy(net_g)
        self.record["D after iteration"] = dcgan.state_dict_numpy(net_d)

    def remove(self):
        for handle in self.handles:
            handle.remove()


def _parameters(net) -> dict[str, np.ndarray]:
    return {n: p.detach().double().numpy().copy() for n, p in net.named_parameters()}


def _gradients(net) -> dict[str, np.ndarray]:
    return {n: p.grad.detach().double().numpy().copy() for n, p in net.named_parameters()}


def _torch_iteration(net_g, net_d, optimizer_g, optimizer_d, real, noise, order=None, d_after=None,
                     channels_last: bool = False) -> dict:
    """The tutorial's iteration (:func:`functional_gan.pytorch.dcgan.tutorial_iteration` itself), recorded.

    ``order``: the batch's rows go in that order, and every per-row output is put back in the original
    order. ``d_after``: D's state_dict to continue from after its step (teacher forcing the G step).
    ``channels_last``: the models and inputs in PyTorch's NHWC memory format (other convolution kernels).
    """
    inverse = None if order is None else np.argsort(order)
    if order is not None:
        real, noise = real[torch.as_tensor(order)], noise[torch.as_tensor(order)]
    if channels_last:
        for net in (net_g, net_d):
            net.to(memory_format=torch.channels_last)
        real, noise = (x.contiguous(memory_format=torch.channels_last) for x in (real, noise))

    def unpermute(array):
        return array if inverse is None or array.ndim == 0 or array.shape[0] != len(inverse) else array[inverse]

    recorder = _Recorder((net_g, net_d), unpermute, d_after)
    try:
        dcgan.tutorial_iteration(net_g, net_d, optimizer_g, optimizer_d, torch.nn.BCELoss(), real, noise, hooks=recorder)
    finally:
        recorder.remove()
    return recorder.record


def _clone(config, net_g, net_d, optimizer_g, optimizer_d, dtype):
    """Fresh models and optimizers in ``dtype`` holding the given ones' state (weights, buffers, Adam's moments)."""
    g, d = dcgan.make_models(config, dtype=dtype)
    g.load_state_dict(net_g.state_dict())
    d.load_state_dict(net_d.state_dict())
    opt_g, opt_d = dcgan.make_optimizers(g, d, config)
    opt_g.load_state_dict(copy.deepcopy(optimizer_g.state_dict()))  # cast to the parameters' dtype by PyTorch
    opt_d.load_state_dict(copy.deepcopy(optimizer_d.state_dict()))
    return g, d, opt_g, opt_d


# --- JAX: the training step's own parts -------------------------------------------------------------


def _captured(model, variables, x):
    """({module index: output NCHW}, the updated batch_stats) of one training-mode forward."""
    _, updates = model.apply(variables, x, mutable=["batch_stats", "intermediates"], capture_intermediates=True)
    layers = {}
    for name, value in updates["intermediates"].items():
        if name.startswith("main_"):
            array = value["__call__"][0]
            layers[int(name.removeprefix("main_"))] = array.transpose(0, 3, 1, 2) if array.ndim == 4 else array
    return layers, updates["batch_stats"]


def _jax_iteration(config: TrainConfig):
    """A jitted function of (state, real, noise, PyTorch's updated D) running the step's parts, recording each one."""
    generator, discriminator = train.make_models(config)
    optimizer = train.make_optimizer(config)
    loss_pair = losses.losses_for(config)

    def iteration(state: train.GANState, real_NHWC, noise_NZ, d_params_after, d_stats_after):
        record = {}
        g_vars = {"params": state.generator_params, "batch_stats": state.generator_batch_stats}
        d_vars = {"params": state.discriminator_params, "batch_stats": state.discriminator_batch_stats}
        record["G"], _ = _captured(generator, g_vars, noise_NZ)
        fake, generator_vjp, g_stats = train.generate(generator, state, noise_NZ)
        d = train.discriminator_update(discriminator, optimizer, loss_pair, state, real_NHWC, fake)
        record["D(real)"], stats_after_real = _captured(discriminator, d_vars, real_NHWC)
        record["D(fake.detach())"], _ = _captured(discriminator, {**d_vars, "batch_stats": stats_after_real},
                                                  jax.lax.stop_gradient(fake))
        record.update(errD=d.loss, d_grads=d.grads, d_params=d.params, d_stats=d.batch_stats)
        # The G step from PyTorch's updated D (teacher forcing): a difference in D's update, judged above,
        # does not reach it.
        record["D updated (fake)"], _ = _captured(discriminator, {"params": d_params_after, "batch_stats": d_stats_after}, fake)
        g = train.generator_update(discriminator, optimizer, loss_pair, state, d_params_after, d_stats_after, fake, generator_vjp)
        record.update(errG=g.loss, g_grads=g.grads, g_params=g.params, g_stats=g_stats, d_stats_final=g.discriminator_batch_stats)
        return record

    return jax.jit(iteration)


def _kinks(ref: dict, ours: dict, pass_name: str, before_activation: set[int]) -> int:
    """How many inputs of the pass's ReLU/LeakyReLU layers are on the other side of 0 in JAX than in PyTorch float64.

    A ReLU's derivative jumps at 0: where float32 rounding moves a value across it, every gradient
    behind that layer takes the other branch, by chance (PyTorch's own float32 runs cross other kinks, or none).
    """
    return sum(int(np.count_nonzero((np.asarray(ours[pass_name][i]) > 0) != (ref[(pass_name, i)] > 0)))
               for i in before_activation if i in ours[pass_name])


def _entries(ref: dict, noisy: list[dict], ours: dict, shadow_updates: dict, dtype: str, k: float,
             tolerance: float | None, before_activation: dict[str, set[int]] | None = None) -> list[Entry]:
    """Every compared quantity of one iteration, in debugging order."""
    entries = []
    kinks = {"D": 0, "G": 0}
    if dtype == "float32" and before_activation:
        kinks["D"] = sum(_kinks(ref, ours, p, before_activation["D"]) for p in ("D(real)", "D(fake.detach())"))
        kinks["G"] = _kinks(ref, ours, "G", before_activation["G"]) + _kinks(ref, ours, "D updated (fake)", before_activation["D"])

    def add(stage, network, name, theirs, mine, pick, shadow=None):
        noisy_values = [shadow] if shadow is not None else [pick(side) for side in noisy]
        row = judge.compare(stage, name, mine, theirs, noisy_values, dtype, k, tolerance)
        crossed = kinks[network] if stage == "gradient" and not row.passed else 0
        entries.append(Entry(stage, network, name, row, np.asarray(theirs), np.asarray(mine), crossed))

    def forward(pass_name, network):
        for index in sorted(ours[pass_name]):
            add("forward", network, f"{pass_name} main.{index} output", ref[(pass_name, index)], ours[pass_name][index],
                lambda side, key=(pass_name, index): side[key])

    def statistics(network, record_name, our_stats, suffix=""):
        for key, value in ref[record_name].items():
            if key not in ref[f"{network} gradient"] and not key.endswith("num_batches_tracked"):
                add("running statistics", network, key + suffix, value, our_stats[key],
                    lambda side, key=key: side[record_name][key])

    forward("G", "G")
    forward("D(real)", "D")
    forward("D(fake.detach())", "D")
    def network_step(network, loss_name):  # the loss, every gradient, every update (from the same gradients)
        add("loss", "loss", loss_name, ref[loss_name], ours[loss_name], lambda side: side[loss_name])
        # shadow_updates[network]: PyTorch float64's update, then float32's (in float32 runs) from the same gradients
        gradients, after, updates = f"{network} gradient", f"{network} after step", shadow_updates[network]
        for key, value in ref[gradients].items():
            add("gradient", network, key, value, ours[gradients][key], lambda side, key=key: side[gradients][key])
        for key in ref[gradients]:
            add("update", network, key, updates[0][key], ours[after][key], None, updates[-1][key])

    network_step("D", "errD")
    statistics("D", "D after step", ours["D after step"], " (after the D step)")
    forward("D updated (fake)", "D")
    network_step("G", "errG")
    statistics("G", "G after step", ours["G after step"])
    statistics("D", "D after iteration", ours["D after iteration"])
    return entries


def find_divergence(
    generator_sd: dict, discriminator_sd: dict, real_NCHW: np.ndarray, noise_NCHW: np.ndarray,
    dtype: str = "float64", tolerance: float | None = None, settings: TrainConfig = TUTORIAL, k: float = judge.DEFAULT_K,
) -> tuple[Divergence | None, list[list[Entry]]]:
    """Run both frameworks iteration by iteration from PyTorch's state; return the first divergence (or None).

    ``tolerance``: a fixed one instead of the core's (1e-10 of each tensor's scale in float64; k × PyTorch's
    own float32 error in float32). Also returns every iteration's entries (up to the divergent one).
    """
    real_NCHW, noise_NCHW = np.asarray(real_NCHW), np.asarray(noise_NCHW)
    config = config_from_state_dicts(generator_sd, discriminator_sd, real_NCHW.shape[1] if real_NCHW.ndim == 5 else 1, settings)
    check_batches(real_NCHW, noise_NCHW, config)
    history = []
    float32 = dtype == "float32"
    # Full float32 on GPUs/TPUs (no TF32 or bf16 passes; no effect on CPUs), as PyTorch's side on the CPU computes.
    with default_dtype(torch.float64), jax.enable_x64(True), jax.default_matmul_precision("highest"):
        jdtype = jnp.float32 if float32 else jnp.float64
        net_g, net_d = dcgan.make_models(config, dtype=torch.float64)
        dcgan.load_state_dict_numpy(net_g, generator_sd)
        dcgan.load_state_dict_numpy(net_d, discriminator_sd)
        optimizer_g, optimizer_d = dcgan.make_optimizers(net_g, net_d, config)
        jax_iteration = _jax_iteration(config)
        batch = real_NCHW.shape[1]
        activations = (torch.nn.ReLU, torch.nn.LeakyReLU)
        before_activation = {name: {i for i in range(len(net.main) - 1) if isinstance(net.main[i + 1], activations)}
                             for name, net in (("G", net_g), ("D", net_d))}
        for t in range(real_NCHW.shape[0]):
            start = (net_g, net_d, optimizer_g, optimizer_d)
            snapshot = reference_runs.snapshot(*start)
            state = state_from_snapshot(config, snapshot, jdtype)
            # Shadows: PyTorch's optimizers at this iteration's start, to be fed JAX's gradients.
            shadows = [_clone(config, *start, torch.float64)] + ([_clone(config, *start, torch.float32)] if float32 else [])
            noisy_sides = []
            if float32 and tolerance is None:
                orders = [None] + [np.random.default_rng([t, variant]).permutation(batch) for variant in range(PERMUTED_RUNS)]
                noisy_sides = [(_clone(config, *start, torch.float32), order, False) for order in orders]
                noisy_sides.append((_clone(config, *start, torch.float32), None, True))
            real = torch.as_tensor(real_NCHW[t], dtype=torch.float64)
            noise = torch.as_tensor(noise_NCHW[t], dtype=torch.float64)
            ref = _torch_iteration(*start, real, noise)
            noisy = [_torch_iteration(*side, real.float(), noise.float(), order, ref["D after step"], channels_last)
                     for side, order, channels_last in noisy_sides]
            d_after = state_dicts.state_dict_to_variables(ref["D after step"])
            cast = lambda tree: jax.tree_util.tree_map(lambda a: jnp.asarray(a, jdtype), tree)  # noqa: E731
            record = jax.device_get(jax_iteration(
                state, jnp.asarray(real_NCHW[t].transpose(0, 2, 3, 1), jdtype), jnp.asarray(noise_NCHW[t, :, :, 0, 0], jdtype),
                cast(d_after["params"]), cast(d_after["batch_stats"]),
            ))
            ours = {name: record[name] for name in ("G", "D(real)", "D(fake.detach())", "D updated (fake)")}
            ours.update(
                errD=float(record["errD"]), errG=float(record["errG"]),
                **{"D gradient": state_dicts.variables_to_state_dict(record["d_grads"], {}),
                   "G gradient": state_dicts.variables_to_state_dict(record["g_grads"], {}),
                   "D after step": state_dicts.variables_to_state_dict(record["d_params"], record["d_stats"]),
                   "G after step": state_dicts.variables_to_state_dict(record["g_params"], record["g_stats"]),
                   "D after iteration": state_dicts.variables_to_state_dict(record["d_params"], record["d_stats_final"])},
            )
            shadow_updates = {
                "D": [_parameters(step_with_gradients(s[1], s[3], ours["D gradient"])) for s in shadows],
                "G": [_parameters(step_with_gradients(s[0], s[2], ours["G gradient"])) for s in shadows],
            }
            entries = _entries(ref, noisy, ours, shadow_updates, dtype, k, tolerance, before_activation)
            for i, entry in enumerate(entries):
                if not entry.passed:
                    history.append(entries[: i + 1])
                    return Divergence(t + 1, entry, entries[:i]), history
            history.append(entries)
    return None, history


def _values(array: np.ndarray, count: int = 6) -> str:
    flat = np.asarray(array, np.float64).reshape(-1)
    return np.array2string(flat[:count], precision=10, separator=", ", max_line_width=10**6) + (f" … ({flat.size} values)" if flat.size > count else "")


def _criterion(dtype: str, tolerance: float | None, k: float) -> str:
    if tolerance is not None:
        return f"a fixed tolerance of {tolerance:g} of each tensor's scale"
    if dtype == "float64":
        return f"{judge.FLOAT64_TOLERANCE:g} of each tensor's scale"
    return f"{k:g} × PyTorch's own float32 error (at least {judge.ULPS} ulps), relative to each tensor's scale"


def format_divergence(divergence: Divergence | None, history: list[list[Entry]], dtype: str,
                      tolerance: float | None = None, k: float = judge.DEFAULT_K) -> str:
    """A report a person reads top to bottom: the verdict, the divergent tensor's values, the step's table."""
    criterion = _criterion(dtype, tolerance, k)
    noise_column = dtype == "float32"
    header = "  stage               network  quantity                                   error     " + (
        "PyTorch32  allowed" if noise_column else "allowed")

    def line(entry: Entry) -> str:
        r = entry.row
        noise = (f"{r.noise:.2e}  " if r.noise is not None else "—" + " " * 8) if noise_column else ""
        kink = f"  (chance: {entry.kinks} ReLU input(s) crossed 0)" if entry.kinks else ""
        return f"  {entry.stage:<19} {entry.network:<8} {entry.name:<42} {entry.difference:.2e}  {noise}{r.allowed:.2e}{kink}"

    if divergence is None:
        everything = [e for entries in history for e in entries]
        by_chance = [e for e in everything if e.kinks]
        worst = max(everything, key=lambda e: e.difference)
        closest = max((e for e in everything if not e.kinks), key=lambda e: e.difference / e.row.allowed if e.row.allowed else 0.0)
        return (f"No divergence in {len(history)} iteration(s) ({dtype}; criterion: {criterion}); "
                f"the largest difference: {worst.difference:.2e} ({worst.stage}, {worst.network} {worst.name}); "
                f"the closest to its limit: {closest.difference:.2e} of {closest.row.allowed:.2e} allowed "
                f"({closest.stage}, {closest.network} {closest.name})."
                + (f" {len(by_chance)} gradient(s) beyond the criterion were behind ReLU inputs that float32 rounding "
                   "moved across 0 (the derivative's jump: chance, not the port): "
                   + "; ".join(f"{e.network} {e.name} {e.difference:.2e}, {e.kinks} crossing(s)" for e in by_chance[:5])
                   if by_chance else ""))
    e = divergence.entry
    noise = f"; PyTorch float32's own error {e.row.noise:.3e}" if e.row.noise is not None else ""
    lines = [
        f"First divergence: iteration {divergence.step}, stage '{e.stage}', {e.network} {e.name}",
        f"  max |JAX − PyTorch| / max |PyTorch| = {e.difference:.3e} > allowed {e.row.allowed:.3g} ({dtype}{noise})",
        f"  PyTorch: {_values(e.torch_values)}",
        f"  JAX:     {_values(e.jax_values)}",
        f"  Before it, in iteration {divergence.step}, {len(divergence.before)} quantities agreed "
        f"(largest {max((b.difference for b in divergence.before), default=0.0):.1e}); criterion: {criterion}",
        header,
    ]
    lines += [line(entry) for entry in divergence.before + [e]]
    return "\n".join(lines)


def diverge_files(generator: str | os.PathLike, discriminator: str | os.PathLike, batches: str | os.PathLike,
                  dtype: str = "float64", tolerance: float | None = None, settings: TrainConfig = TUTORIAL,
                  k: float = judge.DEFAULT_K):
    """:func:`find_divergence` on files (the tutorial's state_dicts, an .npz of batches, as ``replay`` reads)."""
    generator_sd = state_dicts.load_state_dict_file(generator)
    discriminator_sd = state_dicts.load_state_dict_file(discriminator)
    real, noise = load_batches(batches)
    return find_divergence(generator_sd, discriminator_sd, real, noise, dtype, tolerance, settings, k)
