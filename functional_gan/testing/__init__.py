"""Check a JAX port of a PyTorch model against PyTorch: ``functional-gan check-port`` as a library.

    from functional_gan.testing import assert_port

    def test_my_port_agrees_with_pytorch():
        assert_port("tests/port_spec.py")

The way ``numpy.testing`` and ``torch.testing`` read. The pieces, one concern each:

* :mod:`.spec`: what a spec file defines, read into a :class:`Spec`;
* :mod:`.pairing`: each PyTorch tensor paired with a leaf of the port, and the layouts between them;
* :mod:`.apis`: the port's API (Flax Linen, Flax NNX, Equinox, plain functions) seen as one form; :func:`tap`;
* :mod:`.torch_side` and :mod:`.jax_side`: one step of each framework;
* :mod:`.check`: the check itself (:func:`check_port`, :func:`assert_port`);
* :mod:`.report`: its rows, verdict and forms (text, Markdown, JSON).

Needs the torch extra (and equinox for Equinox ports); :mod:`.apis` alone imports no PyTorch.
"""

from .apis import tap
from .check import PERMUTED_RUNS, assert_port, check_port
from .pairing import Pairing, transfer
from .report import PROGRAMS, Report
from .spec import PortDtypeError, Spec, SpecError, load_spec, spec_from_module

__all__ = ["assert_port", "check_port", "load_spec", "spec_from_module", "Spec", "SpecError", "PortDtypeError",
           "Report", "Pairing", "transfer", "tap", "PROGRAMS", "PERMUTED_RUNS"]
