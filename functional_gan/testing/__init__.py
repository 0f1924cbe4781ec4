"""Check a JAX port of a PyTorch model against PyTorch: ``functional-gan check-port`` as a library.

    from functional_gan.testing import assert_port

    def test_my_port_agrees_with_pytorch():
        assert_port("tests/port_spec.py")

The way ``numpy.testing`` and ``torch.testing`` read. The pieces, one concern each:

* :mod:`.spec`: what a spec file defines, read into a :class:`Spec` (each entry documented on its field);
* :mod:`.check`: the check itself (:func:`check_port`), its phases in order; :mod:`.asserting`: :func:`assert_port`,
  for test suites;
* :mod:`.run`: what one check holds; :mod:`.prepare`: its set-up, both sides built and the weights paired;
* :mod:`.pairing`: each PyTorch tensor paired with a leaf of the port, and the layouts between them;
* :mod:`.apis`: the port's API (Flax Linen, Flax NNX, Equinox, plain functions) seen as one form; :func:`tap`;
* :mod:`.torch_side`: PyTorch's runs of a step (the float64 reference and those that measure its own error) and its
  optimizers fed the port's gradients; :mod:`.jax_side`: the port's step as a pure function, as each program runs
  it, and its variants that measure the port's own error;
* :mod:`.quantities`: what is compared, in debugging order, each quantity judged;
* :mod:`.judge`: the one criterion, a quantity against its float64 reference, and :class:`Verdict`, what a row means
  (torch-free: the comparison suite imports it too);
* :mod:`.report`: the rows, the outcome and the forms (text, Markdown, JSON); :mod:`.reference`: the docs' reference
  tables, generated from the code;
* :mod:`.causes`: what a departure's cause is (known causes, causes verified by rerunning without them);
  :mod:`.precision`: a precision finding's likely causes;
* :mod:`.widen`: a port's float32 islands found in its program, and the program with them computed in float64;
* :mod:`.taps`: rows inside a layer, from functions the spec names on each side (``TAPS``);
* :mod:`.convert`: a PyTorch ``state_dict`` converted into the port's weights, checked first
  (:func:`.convert.convert`), and read back (:func:`load_converted`);
* :mod:`.blocks`: the check one block at a time (:func:`check_by_block`), for models whose whole check does not fit;
  :mod:`.outside`: its check of the rest of the model, each block replaced by a stand-in;
* :mod:`.memory`: the check's resident memory phase by phase, its size estimated before it runs, and
  :class:`MemoryPolicy`, what it holds and what it parks.

Needs the torch extra (and equinox for Equinox ports), except :func:`load_converted` and :func:`tap`: the names are
imported when first used, so that reading converted weights back needs no PyTorch.
"""

import importlib

_WHERE = {"tap": "apis", "PERMUTED_RUNS": "check", "assert_port": "asserting", "check_port": "check",
          "Pairing": "pairing", "transfer": "pairing", "PROGRAMS": "report", "Report": "report",
          "PortDtypeError": "spec", "Spec": "spec", "SpecError": "spec", "load_spec": "spec",
          "spec_from_module": "spec", "load_converted": "convert", "ConvertError": "convert",
          "check_by_block": "blocks", "BlockReport": "blocks", "Verdict": "judge", "MemoryPolicy": "memory"}

__all__ = ["assert_port", "check_port", "load_spec", "spec_from_module", "Spec", "SpecError", "PortDtypeError",
           "Report", "Pairing", "transfer", "tap", "PROGRAMS", "PERMUTED_RUNS", "load_converted", "ConvertError",
           "check_by_block", "BlockReport", "Verdict", "MemoryPolicy"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
