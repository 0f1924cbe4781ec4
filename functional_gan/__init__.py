"""functional_gan: PyTorch's autograd examples rewritten with JAX's functional autodiff.

What a user imports, each named after (or documented with) its PyTorch counterpart:

* the step: :func:`gan_step` (one iteration of the DCGAN tutorial's loop), :func:`make_train_step`
  (it, jitted, noise drawn inside), :class:`GANState` (netG, netD and both Adams as one pytree),
  :func:`init_state` (the tutorial's ``weights_init`` and fresh Adams), :class:`StepMetrics`;
* the config: :class:`TrainConfig` (a frozen dataclass), :data:`TUTORIAL`, the tutorial's settings, and
  :func:`config_for_loss` (a loss's own defaults, e.g. WGAN-GP's);
* the models: :class:`Generator`, :class:`Discriminator` (``self.main`` layer names kept), WGAN-GP's
  :class:`Critic` and :func:`make_models`;
* the layers with PyTorch's semantics: :func:`conv2d`, :func:`conv_transpose2d`, :class:`Conv2d`,
  :class:`ConvTranspose2d`, :class:`BatchNorm2d`, :func:`bce_loss`;
* the losses: :data:`LOSSES` (the tutorial's BCE pair, WGAN-GP, the hinge loss) and :func:`losses_for`;
* the converters: :func:`state_dict_to_variables`, :func:`variables_to_state_dict`,
  :func:`load_state_dict_file` (``torch.load(weights_only=True)`` or safetensors), :func:`save_state_dict_file`.

Nothing here imports PyTorch; :mod:`functional_gan.pytorch`, :mod:`functional_gan.lessons`,
:mod:`functional_gan.comparisons` and :mod:`functional_gan.benchmarks` do, and need the torch extra.
"""

# Before anything of the package touches JAX: on a jaxlib known to miscompile (0.10.2 on the CPU), XLA's workaround
# flag goes into XLA_FLAGS (see functional_gan.xla_guard); every process the project starts imports this first.
from functional_gan import xla_guard as _xla_guard

_xla_guard.guard()

# Imported on first use (PEP 562), so that ``import functional_gan`` and the command line's ``--help`` do not
# load JAX; ``from functional_gan import gan_step`` works as before.
_WHERE = {
    "config": ("TUTORIAL", "TrainConfig"),
    "state_dicts": ("load_state_dict_file", "save_state_dict_file", "state_dict_to_variables", "variables_to_state_dict"),
    "errors": ("UserError",),
    "layers": ("BatchNorm2d", "Conv2d", "ConvTranspose2d", "bce_loss", "conv2d", "conv_transpose2d"),
    "losses": ("LOSSES", "GANLoss", "config_for_loss", "losses_for"),
    "metrics": ("METRIC_NAMES", "StepMetrics"),
    "models": ("Critic", "Discriminator", "Generator"),
    "train": ("GANState", "gan_step", "init_state", "make_models", "make_sampler", "make_train_step"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'functional_gan' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"functional_gan.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = [
    "TUTORIAL", "TrainConfig", "config_for_loss", "UserError",
    "GANState", "StepMetrics", "METRIC_NAMES", "gan_step", "init_state", "make_models", "make_sampler", "make_train_step",
    "Generator", "Discriminator", "Critic", "LOSSES", "GANLoss", "losses_for",
    "BatchNorm2d", "Conv2d", "ConvTranspose2d", "bce_loss", "conv2d", "conv_transpose2d",
    "load_state_dict_file", "save_state_dict_file", "state_dict_to_variables", "variables_to_state_dict",
]
