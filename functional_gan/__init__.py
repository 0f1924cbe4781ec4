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
* the losses: :data:`LOSSES` (the tutorial's BCE pair, WGAN-GP) and :func:`losses_for`;
* the converters: :func:`state_dict_to_variables`, :func:`variables_to_state_dict`,
  :func:`load_state_dict_file` (``torch.load(weights_only=True)`` or safetensors), :func:`save_state_dict_file`.

Nothing here imports PyTorch; :mod:`functional_gan.pytorch`, :mod:`functional_gan.lessons`,
:mod:`functional_gan.comparisons` and :mod:`functional_gan.benchmarks` do, and need the torch extra.
"""

from functional_gan.config import TUTORIAL, TrainConfig, config_for_loss
from functional_gan.convert import load_state_dict_file, save_state_dict_file, state_dict_to_variables, variables_to_state_dict
from functional_gan.errors import UserError
from functional_gan.layers import BatchNorm2d, Conv2d, ConvTranspose2d, bce_loss, conv2d, conv_transpose2d
from functional_gan.losses import LOSSES, GANLoss, losses_for
from functional_gan.metrics import METRIC_NAMES, StepMetrics
from functional_gan.models import Critic, Discriminator, Generator
from functional_gan.train import GANState, gan_step, init_state, make_models, make_sampler, make_train_step

__all__ = [
    "TUTORIAL", "TrainConfig", "config_for_loss", "UserError",
    "GANState", "StepMetrics", "METRIC_NAMES", "gan_step", "init_state", "make_models", "make_sampler", "make_train_step",
    "Generator", "Discriminator", "Critic", "LOSSES", "GANLoss", "losses_for",
    "BatchNorm2d", "Conv2d", "ConvTranspose2d", "bce_loss", "conv2d", "conv_transpose2d",
    "load_state_dict_file", "save_state_dict_file", "state_dict_to_variables", "variables_to_state_dict",
]
