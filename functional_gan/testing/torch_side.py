"""The PyTorch side of a check: the models (float64 reference, float32 and its batch-permuted twins), one step with
every paired layer's output recorded, and PyTorch's optimizer fed the port's gradients."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import jax
import numpy as np
import torch

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .judge import EPS64, FLOAT32_TO_64, ISLAND_FLOOR, Measured, relative_error
from .memory import LIBC, trim
from .pairing import Pairing, torch_in_flax_layout
from .spec import Spec, call_loss, layer_output, select_output
from .taps import ModuleStack, TorchTaps, as_array

if TYPE_CHECKING:
    from .run import Run


def make_torch_side(spec: Spec, dtype: torch.dtype, state: dict | None):
    """One PyTorch side of the check: ``torch_model()`` built (under PyTorch's random state as it is), ``state`` loaded,
    converted to ``dtype``, in the spec's mode (``TRAIN``), with its optimizer.

    Args:
        spec: the spec.
        dtype: the side's dtype (``torch.float32``, ``torch.float64``).
        state: a state_dict loaded before the conversion, or None: the model's own initialisation.

    Returns:
        ``(model, optimizer)``; the optimizer None where the spec has none.
    """
    model = spec.torch_model()
    if state is not None:
        model.load_state_dict(state)
    model = model.to(dtype)
    model.train(spec.train)
    optimizer = spec.torch_optimizer(model.parameters()) if spec.torch_optimizer else None
    return model, optimizer


def other_layout(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with the same values in other memory layouts: matrices column-major, 4-D and 5-D weights
    channels-last. PyTorch's kernels then take other paths and sum in other orders (the same Linear in float64 differs
    by about 12 ulps of its scale between a row-major and a column-major weight of 9216 columns).

    Args:
        model: a PyTorch model, changed in place.

    Returns:
        ``model``.
    """
    for parameter in model.parameters():
        if parameter.ndim == 2:
            parameter.data = parameter.data.t().contiguous().t()
        elif parameter.ndim in (4, 5):
            fmt = torch.channels_last if parameter.ndim == 4 else torch.channels_last_3d
            parameter.data = parameter.data.contiguous(memory_format=fmt)
    return model


_NARROWING_METHODS = {torch.Tensor.float: torch.float32, torch.Tensor.half: torch.float16,
                      torch.Tensor.bfloat16: torch.bfloat16}


class Islands(TorchFunctionMode):
    """A PyTorch run's lower-precision islands: where an operation makes a floating-point tensor narrower than
    ``wide`` from a ``wide`` one (transformers' ``LlamaRMSNorm`` computes in float32 whatever the model's dtype:
    ``hidden_states.to(torch.float32)``), by the innermost module of ``model`` running it. With ``widen``, the
    narrowing is removed instead: a narrower floating dtype asked for (``.to(torch.float32)``, ``.float()``,
    ``dtype=torch.float32``) is ``wide``, so the run is the model without its islands. ``found``: {module name: the
    narrow dtype's name}, in the order met."""

    def __init__(self, model: torch.nn.Module, wide: torch.dtype, widen: bool = False):
        super().__init__()
        self.wide, self.widen = wide, widen
        self.found: dict[str, str] = {}
        self.modules = ModuleStack(model)

    def __enter__(self):
        self.modules.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        self.modules.__exit__(*exc)
        return super().__exit__(*exc)

    def _narrow(self, value) -> bool:
        return isinstance(value, torch.dtype) and value.is_floating_point and value.itemsize < self.wide.itemsize

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        wide_in = any(isinstance(a, torch.Tensor) and a.dtype == self.wide for a in args)
        if self.widen:  # every narrower floating dtype asked for is the wide one, and mixed operands widened
            if func in _NARROWING_METHODS:
                if wide_in:
                    self._record(_NARROWING_METHODS[func])
                return args[0].to(self.wide)
            if any(self._narrow(a) for a in (*args, *kwargs.values())):
                if wide_in:
                    self._record(next(a for a in (*args, *kwargs.values()) if self._narrow(a)))
                args = tuple(self.wide if self._narrow(a) else a for a in args)
                kwargs = {k: self.wide if self._narrow(v) else v for k, v in kwargs.items()}
            if any(self._wide_tensor(a) for a in args):
                args = tuple(self._widened(a) for a in args)
        out = func(*args, **kwargs)
        if not self.widen and wide_in and isinstance(out, torch.Tensor) and self._narrow(out.dtype):
            self._record(out.dtype)
        return out

    def _wide_tensor(self, a) -> bool:
        if isinstance(a, (list, tuple)):
            return any(self._wide_tensor(b) for b in a)
        return isinstance(a, torch.Tensor) and a.dtype == self.wide

    def _widened(self, a):
        if isinstance(a, (list, tuple)):
            return type(a)(self._widened(b) for b in a)
        if isinstance(a, torch.Tensor) and self._narrow(a.dtype):
            return a.to(self.wide)
        return a

    def _record(self, dtype: torch.dtype) -> None:
        self.found.setdefault(self.modules.current, str(dtype).removeprefix("torch."))


class BlockedSums(TorchDispatchMode):
    """PyTorch's float64 matrix products (``mm``, ``addmm``, ``bmm``, ``baddbmm``, forward and backward) with their
    long sums taken in blocks of ``block`` terms, the blocks' products added one after another: the same mathematics
    summed in another order. On this project's CPUs PyTorch's float64 matrix product errs far more over a long sum
    than its float32 one scaled by eps₆₄/eps₃₂: GPT-2's output layer backward (a sum over 50,257 vocabulary entries)
    1.3e-14 of the scale against 1.1e-15 (JAX's, XLA's Eigen kernels: 7.8e-16), measured against an 80-bit sum; its
    other variants (batch orders, layouts, one-ulp moves) share that sum's roundings and do not see it. The blocked run
    differs from the plain one by about that error: PyTorch64's own, measured."""

    def __init__(self, block: int = 256):
        super().__init__()
        self.block = block

    def _mm(self, mm, a, b):
        k = a.shape[-1]
        out = mm(a[..., :self.block], b[..., :self.block, :])
        for start in range(self.block, k, self.block):
            out = out + mm(a[..., start:start + self.block], b[..., start:start + self.block, :])
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        long = [a for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.float64 and a.ndim >= 2]
        if func in (aten.mm.default, aten.bmm.default) and long and args[0].shape[-1] > self.block:
            return self._mm(func, *args)
        if func in (aten.addmm.default, aten.baddbmm.default) and long and args[1].shape[-1] > self.block:
            product = self._mm(aten.mm.default if func is aten.addmm.default else aten.bmm.default, args[1], args[2])
            return kwargs.get("beta", 1) * args[0] + kwargs.get("alpha", 1) * product
        return func(*args, **kwargs)


def island_pattern(found: dict[str, str]) -> dict[str, str]:
    """Module names with their indices in a stack as ``*`` (``model.layers.0.input_layernorm`` and ``…1…`` read as one
    ``model.layers.*.input_layernorm``), each with its narrow dtype, in the order first met.

    Args:
        found: {module name: the narrow dtype's name} (:attr:`Islands.found`, or :func:`.widen.islands`'s paths).

    Returns:
        {pattern: the narrow dtype's name}, ``"(the model itself)"`` for the empty name.
    """
    patterns: dict[str, str] = {}
    for name, narrow in found.items():
        patterns.setdefault(re.sub(r"(?<=[./])\d+(?=[./]|$)", "*", name) if name else "(the model itself)", narrow)
    return patterns


def run_torch_step(spec: Spec, model, optimizer, inputs, targets, dtype, record_layers: dict[str, str],
                permutation: np.ndarray | None = None, layout: bool = False, sink=None, mode=None):
    """One forward (with each paired layer's output), loss, backward, optimizer step. Returns what it saw.

    With ``permutation`` the samples go in that order and every output is put back in the original order. With
    ``sink``, each layer's output (float64, in order) goes to ``sink(name, output)`` as it is computed instead of
    being kept. ``mode``: a mode the forward, the loss and the backward run in (:class:`Islands`,
    :class:`BlockedSums`).

    Args:
        spec: the spec (its ``OUTPUT``, loss, ``INPUT_GRADIENTS``, ``positional`` and ``TAPS`` are read).
        model: the PyTorch model.
        optimizer: the model's optimizer, stepped after the backward; None: no step (the gradients are computed all the
            same, from none).
        inputs: the inputs (NumPy arrays); floating-point ones in ``dtype``.
        targets: the targets, converted as the inputs are.
        dtype: the run's floating-point dtype (``torch.float32``, ``torch.float64``).
        record_layers: the names of the modules whose outputs are recorded (their first call's).
        permutation: the order of the samples along the first axis, or None.
        layout: 4-D floating-point inputs channels-last in memory (:func:`other_layout`'s run).
        sink: ``sink(name, output)`` takes each layer's output instead of the result, or None.
        mode: a mode the forward, the loss and the backward run in, or None.

    Returns:
        A dict: ``layers`` (PyTorch name → float64 array, the tapped functions' rows included; empty with ``sink``),
        ``output`` (float64), ``tap_paths`` (each tapped row's path among the port's outputs); with a loss, ``loss`` (a
        float) and, with ``INPUT_GRADIENTS``, ``input_grads`` by position. The parameters' gradients stay on the model.
    """
    if permutation is not None:
        inputs = tuple(np.asarray(x)[permutation] for x in inputs)
        targets = tuple(np.asarray(x)[permutation] for x in targets)
        inverse = np.argsort(permutation)
    unpermute = (lambda a: a[inverse] if a.ndim and a.shape[0] == len(inverse) else a) if permutation is not None \
        else (lambda a: a)
    outputs, handles = {}, []

    def recorder(name):
        def hook(_module, _inputs, out):  # returns None: the module's output is left as it is
            out = layer_output(out)  # a tuple's first tensor (nn.LSTM, nn.MultiheadAttention)
            if out is None:
                return
            # a copy: a later in-place op (ReLU(inplace=True), +=) must not change what was recorded
            if sink is not None:
                if name not in outputs:
                    outputs[name] = None
                    sink(name, unpermute(out.detach().double().cpu().numpy()))
                return
            outputs.setdefault(name, unpermute(out.detach().double().cpu().numpy().copy()))
        return hook

    for name, module in model.named_modules():
        if name in record_layers:
            handles.append(module.register_forward_hook(recorder(name)))

    def on_torch(arrays):
        return [torch.as_tensor(np.asarray(x)).to(dtype) if np.asarray(x).dtype.kind == "f" else torch.as_tensor(np.asarray(x))
                for x in arrays]

    tensors, target_tensors = on_torch(inputs), on_torch(targets)
    if layout:  # images channels-last too, as other_layout's weights
        tensors = [t.contiguous(memory_format=torch.channels_last) if t.ndim == 4 and t.is_floating_point() else t
                   for t in tensors]
    if optimizer is not None:
        optimizer.zero_grad()
    else:  # a model run without its optimizer (or a spec without one) starts from no gradients all the same
        model.zero_grad(set_to_none=True)
    leaves = {}
    if spec.input_gradients and spec.torch_loss is not None:  # the floating-point inputs differentiated, by position
        limit = len(tensors) if spec.positional is None else spec.positional  # --by-block: the positional ones
        leaves = {i: t.detach().requires_grad_(True) for i, t in enumerate(tensors[:limit]) if t.is_floating_point()}
        # the model takes a copy (an exact one, whose gradient is the leaf's): a module that changes its input in
        # place may, as without INPUT_GRADIENTS
        tensors = [leaves[i].clone() if i in leaves else t for i, t in enumerate(tensors)]
    def emit(row, value):  # a tapped function's output (taps.py), as a layer's
        if sink is not None:
            if row not in outputs:
                outputs[row] = None
                sink(row, unpermute(as_array(value)))
            return
        outputs.setdefault(row, unpermute(as_array(value)))

    tapped = TorchTaps(model, emit) if spec.taps else contextlib.nullcontext()
    with mode if mode is not None else contextlib.nullcontext(), tapped:
        output = select_output(model(*tensors), spec.output, "PyTorch's model")
    for h in handles:
        h.remove()
    seen = {"layers": outputs if sink is None else {}, "output": unpermute(output.detach().double().cpu().numpy().copy()),
            "tap_paths": tapped.paths if spec.taps else {}}
    if spec.torch_loss is not None:
        with mode if mode is not None else contextlib.nullcontext():
            loss = call_loss(spec.torch_loss, "torch_loss", output, tensors, target_tensors)
            seen["loss"] = float(loss.detach())
            loss.backward()
        if leaves:
            seen["input_grads"] = {i: unpermute((torch.zeros_like(t) if t.grad is None else t.grad).detach().double()
                                               .cpu().numpy().copy()) for i, t in leaves.items()}
        if optimizer is not None:
            optimizer.step()
    return seen


class _ByName(Mapping):
    """Per PyTorch parameter name (the pairing's), a value converted when it is read, not all at once (a model of 124M
    parameters is 1 GB in float64)."""

    def __init__(self, pairings: list[Pairing]):
        self.pairings = {p.torch_key: p for p in pairings if p.collection == "params"}

    def __iter__(self):
        return iter(self.pairings)

    def __len__(self):
        return len(self.pairings)


class _Gradients(_ByName):
    """The port's gradients in PyTorch's layout."""

    def __init__(self, pairings: list[Pairing], jax_grads):
        super().__init__(pairings)
        self.jax_grads = jax_grads

    def __getitem__(self, name):
        p = self.pairings[name]
        return p.to_torch(np.asarray(p.leaf(self.jax_grads), np.float64))


class ParamsOf(_ByName):
    """A model's paired parameters in the port's layout, float64."""

    def __init__(self, model: torch.nn.Module, pairings: list[Pairing]):
        super().__init__(pairings)
        self.tensors = dict(model.named_parameters(remove_duplicate=False))

    def __getitem__(self, name):
        p = self.pairings[name]
        return np.array(p.to_jax(self.tensors[name].detach().cpu().double().numpy()), np.float64)


def load_into(model: torch.nn.Module, state: dict) -> None:
    """``model.load_state_dict(state)`` tensor by tensor, each converted to the model's dtype as it is copied (no copy
    of the whole state in that dtype first).

    Args:
        model: the PyTorch model.
        state: a state_dict with exactly the model's keys.

    Raises:
        KeyError: the keys of ``state`` and the model's differ (the first three named).
    """
    own = model.state_dict()
    missing = set(own) ^ set(state)
    if missing:
        raise KeyError(f"the state and the model differ in {sorted(missing)[:3]}")
    with torch.no_grad():
        for key, tensor in own.items():
            tensor.copy_(state[key])


CHUNK = 1 << 24  # elements of parameters stepped at a time by fed_update (128 MB of float64 gradients)


def step_with_gradients(model: torch.nn.Module, optimizer, gradients, start: dict | None = None,
                        chunk: float = float("inf"), last: bool = False) -> torch.nn.Module:
    """One PyTorch optimizer step with the given gradients (by parameter name, PyTorch's layout), from the
    parameters ``start`` (a state_dict) when given: PyTorch's optimizer fed another framework's gradients.
    Returns ``model``, updated.

    With a finite ``chunk`` the step is taken a few parameters at a time (``chunk`` elements): each group's gradients
    are given, the optimizer steps (PyTorch's optimizers step only the parameters that have a gradient, each with a
    state of its own), and the gradients are let go, with the group's optimizer state after the ``last`` step. Every
    parameter is stepped once, as one step over all of them would; what is held at once is a group's gradients and
    state, not the model's (3 GB for AdamW over 124M parameters in float64). An optimizer from outside ``torch.optim``
    steps every parameter at once (its step may couple them).

    Args:
        model: the PyTorch model whose parameters are stepped.
        optimizer: its optimizer, over ``model``'s parameters.
        gradients: {parameter name: gradient}, arrays in PyTorch's layout, read one at a time; a parameter without one
            is not stepped.
        start: a state_dict loaded first (:func:`load_into`), or None: the model's parameters as they are.
        chunk: elements of parameters stepped at a time (infinite: all at once).
        last: the check's last step: each stepped parameter's optimizer state is let go.

    Returns:
        ``model``, updated.
    """
    if start is not None:
        load_into(model, start)
    optimizer.zero_grad()
    if not type(optimizer).__module__.startswith("torch.optim"):  # an optimizer of one's own may couple parameters
        chunk = float("inf")
    dtype = next(model.parameters()).dtype
    stepped = [(name, parameter) for name, parameter in model.named_parameters() if name in gradients]
    group, size = [], 0
    for index, (name, parameter) in enumerate(stepped):
        parameter.grad = torch.tensor(np.asarray(gradients[name]), dtype=dtype)  # one copy
        group.append(parameter)
        size += parameter.numel()
        if size >= chunk or index == len(stepped) - 1:
            trim()  # the last group's temporaries handed back before this one's (a 50,257 × 768 embedding's: 1 GB)
            optimizer.step()
            for done in group:
                done.grad = None
                if last:
                    optimizer.state.pop(done, None)
            group, size = [], 0
    return model


def fed_update(model, optimizer, start: dict, pairings: list[Pairing], jax_grads, last: bool,
               chunk: int = CHUNK) -> ParamsOf:
    """PyTorch's optimizer step from ``start`` with the port's gradients, ``chunk`` elements of parameters at a time
    (see :func:`step_with_gradients`); the parameters after it in the port's layout, read from the model when asked
    for.

    Args:
        model: the PyTorch model stepped.
        optimizer: its optimizer.
        start: the state_dict the step starts from.
        pairings: the check's pairing (each parameter's leaf of the port, and the layout change).
        jax_grads: the port's gradients, as its pytree.
        last: the check's last step, as for :func:`step_with_gradients`.
        chunk: elements of parameters stepped at a time.

    Returns:
        A :class:`ParamsOf`: the parameters after the step by PyTorch name, float64 in the port's layout, read from
        ``model`` when asked for.
    """
    step_with_gradients(model, optimizer, _Gradients(pairings, jax_grads), start, chunk, last)
    return ParamsOf(model, pairings)


class Parked:
    """PyTorch tensors' memory written to a temporary file on disk and handed back to the system while something else
    runs, and read back into it when that ends: the tensors, and every view and NumPy array of their memory, are the
    same objects at the same addresses, with the same values after. ``with Parked(tensors):`` around code that reads
    none of them: PyTorch64's reference model while the port's programs run (1 GB on a model of 124M parameters in
    float64). While parked their memory reads as zeros.

    The memory is handed back with ``madvise(MADV_DONTNEED)`` on the whole pages inside each tensor's storage (Linux:
    such pages of private anonymous memory are dropped, and read as zeros until written again); elsewhere, or where
    the C library cannot be loaded, nothing is parked."""

    def __init__(self, tensors):
        seen, self.storages = set(), []
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.data_ptr() in seen or storage.device.type != "cpu" or storage.nbytes() < 2 * _PAGE:
                continue
            seen.add(storage.data_ptr())
            self.storages.append((storage.data_ptr(), storage.nbytes(), storage))  # the storage kept alive with it
        if _MADVISE is None:  # nothing can be handed back
            self.storages = []
        self.nbytes = sum(size for _, size, _ in self.storages)

    def __enter__(self):
        import tempfile

        self.file = tempfile.TemporaryFile(prefix="check-port-parked-")
        try:
            for address, size, _ in self.storages:
                self.file.write(_buffer(address, size))
            self.file.flush()
        except BaseException:  # a full disk: nothing let go, nothing lost
            self.file.close()
            raise
        for address, size, _ in self.storages:
            start = -(-address // _PAGE) * _PAGE
            end = (address + size) // _PAGE * _PAGE
            if end > start:
                _MADVISE(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED)
        return self

    def __exit__(self, *exc):
        try:
            self.file.seek(0)
            for address, size, _ in self.storages:
                if self.file.readinto(_buffer(address, size)) != size:
                    raise OSError("check-port: PyTorch's tensors parked on disk could not be read back from their "
                                  "temporary file")
        finally:
            self.file.close()
        return False


def _buffer(address: int, size: int):
    """``size`` bytes of memory at ``address`` as a writable buffer (no copy)."""
    return (ctypes.c_char * size).from_address(address)


def _madvise():
    """The C library's ``madvise`` (Linux), or None."""
    function = getattr(LIBC, "madvise", None) if sys.platform.startswith("linux") else None
    if function is not None:
        function.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        function.restype = ctypes.c_int
    return function


_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4  # Linux's value (asm-generic/mman-common.h)
_MADVISE = _madvise()


def side_dtype(side: str) -> torch.dtype:
    """A PyTorch side's dtype by its name: "ref" and "t64…" float64, "t32…" float32.

    Args:
        side: a PyTorch side's name (``"ref"``, ``"t32"``, ``"t64-moved"``, ``"t32-permuted-1"``, ...).

    Returns:
        ``torch.float32`` where the name starts with ``"t32"``, else ``torch.float64``.
    """
    return torch.float32 if side.startswith("t32") else torch.float64



def one_ulp(tensor: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """``tensor`` in float64 with each element moved by one ulp (relative eps), up or down at random.

    Args:
        tensor: a floating-point tensor.
        rng: the generator that draws each element's direction.

    Returns:
        A new float64 tensor.
    """
    wide = tensor.to(torch.float64)
    signs = np.asarray(rng.choice([-1.0, 1.0], size=tuple(wide.shape)))  # an array for a 0-d tensor too
    return wide * (1 + torch.from_numpy(signs) * float(np.finfo(np.float64).eps))



def ulp_signs(shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """The directions :func:`one_ulp` draws for an array of ``shape`` (the same draws from the same ``rng``), kept as
    int8: an eighth of the memory of the moved array, which :class:`Moved` makes when it is read.

    Args:
        shape: the array's shape.
        rng: the generator that draws the directions.

    Returns:
        An int8 array of -1 and 1.
    """
    return np.asarray(rng.choice(np.array([-1, 1], np.int8), size=tuple(shape)))  # an array for shape () too



def moved_by(value, signs: np.ndarray) -> torch.Tensor:
    """``value`` in float64 moved by one ulp in the directions ``signs``: :func:`one_ulp`'s arithmetic, number for
    number (the factor 1 ± eps made in place, then one product).

    Args:
        value: a tensor or an array.
        signs: the directions, of ``value``'s shape (:func:`ulp_signs`).

    Returns:
        A new float64 tensor.
    """
    factor = np.array(signs, np.float64)  # a 0-d array, not a NumPy scalar, for a parameter of no axes
    factor *= float(np.finfo(np.float64).eps)
    factor += 1
    if torch.is_tensor(value):
        return value.to(torch.float64) * torch.from_numpy(factor)
    # IEEE products: the same numbers as torch's (np.multiply with out=: a 0-d product stays an array)
    return torch.from_numpy(np.multiply(np.asarray(value, np.float64), factor, out=np.empty_like(factor)))



class Moved:
    """An array moved by one ulp when it is read (``np.asarray``), from its directions drawn beforehand: an optimizer
    fed moved gradients holds one moved array at a time, not a moved copy of every gradient (1 GB for 124M parameters
    in float64)."""

    def __init__(self, value, signs: np.ndarray):
        self.value, self.signs = value, signs
        self.shape = np.shape(value)

    def __getitem__(self, index):  # a stacked leaf's slice: the slice moved (an elementwise product)
        return Moved(np.asarray(self.value)[index], self.signs[index])

    def __array__(self, dtype=None, copy=None):
        moved = moved_by(self.value, self.signs).numpy()
        return moved if dtype is None else moved.astype(dtype)



class MovedState(dict):
    """A state_dict whose floating-point tensors are moved by one ulp as :func:`.torch_side.load_into` reads each."""

    def __init__(self, state: dict, signs: dict):
        super().__init__(state)
        self.signs = signs

    def __getitem__(self, key):
        value = super().__getitem__(key)
        return moved_by(value, self.signs[key]) if key in self.signs else value



def recomputed_gradients(run: Run) -> dict:
    """PyTorch64's gradients of the last step computed again, as the reference computed them (the same start, inputs
    and random state: the same bits), in the port's layout: held while they are compared, not while the port runs.

    Args:
        run: the check's :class:`.run.Run` (its reference model, inputs, targets and ``reference_rng``).

    Returns:
        {PyTorch parameter name: its gradient, float64 in the port's layout}; the model's own gradients are let go.
    """
    model = run.sides["ref"][0]
    with torch.random.fork_rng(devices=[]):
        torch.random.set_rng_state(run.reference_rng)
        run_torch_step(run.spec, model, None, run.inputs, run.targets, torch.float64, {})
    return torch_in_flax_layout(model, run.pairings, "grad", release=True)



# A batch-permuted PyTorch run's error on a quantity may be at most this many times the error of the runs that keep
# the batch in order (at least a few ulps): reordering the samples changes only the order of the batch's sums, whose
# rounding is of the plain run's size. An error far beyond it is not rounding (a batch axis the run could not put
# back): the quantity is judged against the other runs, and a note says so. The rule: an allowance never exceeds what
# rounding can explain.
PLAUSIBLE_PERMUTED = 64.0


def unpermuted_error(value, reference, permutation: np.ndarray) -> Measured:
    """A batch-permuted run's error on one quantity, every axis that carries the batch put back in order.

    :func:`run_torch_step` puts the first axis back where it has the batch's length. A quantity with the batch on
    more than one axis (CLIP's batch × batch logits) or on another axis ((T, B, H) of a recurrent layer) needs its
    other axes of that length put back too, and an axis of that length may not be the batch (a hidden size equal to
    it). Each way of putting back the axes of the batch's length is tried (at most 4 such axes), the smallest error
    kept: the right one differs from the float64 reference by rounding, a wrong one by the values themselves.

    Args:
        value: the permuted run's value, its first axis put back where it has the batch's length.
        reference: PyTorch64's value.
        permutation: the order the run's samples went in.

    Returns:
        The smallest error, as a :class:`.judge.Measured`.
    """
    value = np.asarray(value)
    n = len(permutation)
    axes = [axis for axis in range(value.ndim) if value.shape[axis] == n][:4]
    if len(axes) <= 1 and (not axes or axes[0] == 0):  # the batch on the first axis alone, put back already
        return relative_error(value, reference)
    inverse = np.argsort(permutation)
    raw = value[permutation] if value.shape[0] == n else value  # as the permuted run gave it
    best = None
    for chosen in range(1 << len(axes)):
        candidate = raw
        for bit, axis in enumerate(axes):
            if chosen >> bit & 1:
                candidate = np.take(candidate, inverse, axis=axis)
        error = relative_error(candidate, reference)
        best = error if best is None else min(best, error)
    return best


def pytorch_step(run: Run, last: bool) -> tuple[dict, dict]:
    """Every PyTorch side runs one step from PyTorch64's state; returns what the reference saw (``"ref"``), the other
    runs' largest errors against it (``"noise"``: PyTorch's own error in the dtype, quantity by quantity, each run
    compared as soon as it is done and let go), and that starting state. The reference's optimizer steps (its
    parameters start the next step) unless this is the ``last`` step.

    Args:
        run: the check's :class:`.run.Run`. At the first step PyTorch64's islands are found (``run.torch_islands``, and
            where it has some a ``"t64-wide"`` side is added, with notes); the tapped rows' paths join ``layer_paths``.
        last: the check's last step.

    Returns:
        ``(seen, params_state)``: ``seen`` is ``{"ref": the reference's run (:func:`run_torch_step`'s, with ``grads`` in
        the port's layout and ``after``, the buffers after the step), "noise": PyTorch's own error per quantity, as
        :class:`.judge.Measured`}; ``params_state`` is PyTorch64's state_dict as the step started (the parameters not
        copied at the last step).
    """
    start = run.sides["ref"][0]  # teacher forcing: every side starts the step from PyTorch64's parameters and buffers
    # a copy of what the reference's step changes: its buffers (running statistics), and its parameters where its
    # optimizer steps; at the last step the parameters are read as they are (a model of 124M parameters: 1 GB in float64)
    fixed = {name for name, _ in start.named_parameters(remove_duplicate=False)} if last else set()
    params_state = {k: v.detach() if k in fixed else v.detach().clone() for k, v in start.state_dict().items()}
    moves = np.random.default_rng(len(run.pairings))
    stats = [p for p in run.pairings if p.collection == "batch_stats"]

    def inputs_of(name):
        if name != "t64-moved":
            return run.inputs
        return tuple(one_ulp(torch.from_numpy(np.array(x)), moves).numpy() if np.asarray(x).dtype.kind == "f" else x
                     for x in run.inputs)

    noise = {"layers": {}, "grads": {}, "after": {}, "input_grads": {}, "output": Measured(0.0), "loss": Measured(0.0)}
    # the batch-permuted runs' errors apart, joined to the others' at the end where rounding can explain them
    permuted = {"layers": {}, "grads": {}, "after": {}, "input_grads": {}, "output": Measured(0.0),
                "loss": Measured(0.0)}

    def error_of(name, value, reference) -> Measured:  # a float32 run in a float64 check: scaled to float64's roundoff
        if name in run.permutations:
            return unpermuted_error(value, reference, run.permutations[name])
        error = relative_error(value, reference)
        if name == "t64-wide" and float(error) > 1e3 * EPS64:
            # A row a float32 island reaches carries float32 rounding: of the island's results, which the run without
            # its casts measures, and of constants the model made in float32 before the check widened it (transformers'
            # rotary frequencies, a float32 buffer at init), which that run cannot widen back. Such a row's PyTorch
            # noise is at least one float32 ulp of its scale (the rotary tables of a float64 Llama: 1.35e-7 of their
            # scale from a port that computes them in float64, against 4.3e-8 measured without the casts).
            error = max(error, Measured(ISLAND_FLOOR))
        return Measured(error * FLOAT32_TO_64) if name == "t32-scaled" else error

    def step_of(name, model, opt):
        islands = mode = None
        if name == "ref" and run.torch_islands is None:  # PyTorch64's own islands, found at its first step
            islands = mode = Islands(model, torch.float64)
        elif name == "t64-wide":
            mode = Islands(model, torch.float64, widen=True)
        elif name == "t64-blocked":
            mode = BlockedSums()
        sink = None
        if name != "ref":  # each layer's output measured against the reference's as it comes, not kept
            into = permuted if name in run.permutations else noise

            def sink(layer, value):
                into["layers"][layer] = max(into["layers"].get(layer, Measured(0.0)),
                                            error_of(name, value, ref["layers"][layer]))
        seen = run_torch_step(run.spec, model, opt, inputs_of(name), run.targets, side_dtype(name), run.layer_paths,
                           run.permutations.get(name), layout=name == "t64-layout", sink=sink, mode=mode)
        if name == "ref":  # a tapped function's rows (TAPS), paired with the port's values in order
            run.layer_paths.update(seen.pop("tap_paths", {}))
        if name == "ref" and run.torch_islands is None:
            run.torch_islands = islands.found
            if islands.found and run.make_working is not None:
                # the island's own error: PyTorch64 with its casts removed beside it, in every row's PyTorch noise
                run.sides["t64-wide"] = (run.make_working(torch.float64), None)
                for where, narrow in island_pattern(islands.found).items():
                    run.notes.add(f"PyTorch computes {where} in {narrow} inside its float64 model (a cast there): those "
                                  f"rows and what follows are judged against that island's own error (PyTorch64 with "
                                  f"its casts removed, beside it)")
        seen["grads"] = torch_in_flax_layout(model, run.pairings, "grad", release=True)
        seen["after"] = torch_in_flax_layout(model, stats)  # the buffers (the parameters' updates are judged fed)
        return seen

    ref_model, ref_optimizer = run.sides["ref"]
    run.reference_rng = torch.random.get_rng_state()  # for recomputed_gradients
    ref = step_of("ref", ref_model, None if last else ref_optimizer)
    for name, (model, _) in run.sides.items():
        if name == "ref":
            continue
        # copied into the parameters as they are laid out, each converted to the run's dtype as it is copied
        state = params_state
        if name == "t64-moved":
            state = {k: one_ulp(v, moves) if v.is_floating_point() else v for k, v in params_state.items()}
        load_into(model, state)
        del state
        seen = step_of(name, model, None)  # no optimizer step: its parameters after it are not compared
        model.zero_grad(set_to_none=True)
        into = permuted if name in run.permutations else noise
        for quantity in ("output", "loss"):
            if quantity in seen:
                into[quantity] = max(into[quantity], error_of(name, seen[quantity], ref[quantity]))
        for quantity in ("grads", "after", "input_grads"):
            for key, value in seen.get(quantity, {}).items():
                into[quantity][key] = max(into[quantity].get(key, Measured(0.0)),
                                          error_of(name, value, ref[quantity][key]))
        del seen
    return {"ref": ref, "noise": joined_noise(run, noise, permuted)}, params_state


def joined_noise(run: Run, noise: dict, permuted: dict) -> dict:
    """PyTorch's own error per quantity: the larger of the runs that keep the batch in order (``noise``) and the
    batch-permuted ones (``permuted``), but where a permuted run's error is more than :data:`PLAUSIBLE_PERMUTED` times
    the others' (and their few-ulp floor), it is left out with a note: it is not rounding.

    Args:
        run: the check's :class:`.run.Run` (its dtype; its notes take the quantities left out).
        noise: the errors of the runs that keep the batch in order, as :func:`pytorch_step` gathers them.
        permuted: the batch-permuted runs' errors, the same way.

    Returns:
        ``noise`` with the plausible permuted errors joined.
    """
    from .judge import EPS, ULPS, ULPS64

    floor = (ULPS if run.dtype == "float32" else ULPS64) * EPS[run.dtype]

    def joined(where, plain: Measured, other: Measured) -> Measured:
        if other <= PLAUSIBLE_PERMUTED * max(plain, floor):
            return max(plain, other)
        run.notes.add(f"{where}: PyTorch's run with the batch in another order differs from its float64 result by "
                      f"{float(other):.2g} of the scale, more than rounding explains (the runs in order: "
                      f"{float(plain):.2g}); judged against the runs that keep the batch in order")
        return plain

    for quantity in ("output", "loss"):
        noise[quantity] = joined(quantity, noise[quantity], permuted[quantity])
    labels = {"layers": "forward", "grads": "gradient", "after": "buffer", "input_grads": "input gradient"}
    for quantity, label in labels.items():
        for key, other in permuted[quantity].items():
            noise[quantity][key] = joined(f"{label}, {key}", noise[quantity].get(key, Measured(0.0)), other)
    return noise



def fed_optimizer(run: Run, program: str, name: str):
    """``program``'s PyTorch optimizer ``name`` ("ref": float64; "t32"/"t64": PyTorch's own error) and the working
    model of its dtype it steps, built the first time it is asked for. A working model that no run has yet is built
    afresh (its values do not matter: each fed update loads its start into it), PyTorch's random state kept as it was.

    Args:
        run: the check's :class:`.run.Run`.
        program: ``"jit"`` or ``"eager"``.
        name: ``"ref"``, ``"t32"`` or ``"t64"``.

    Returns:
        ``(model, optimizer)``, kept in ``run.shadows[program][name]``.
    """
    if run.shadows[program][name] is None:
        dtype = torch.float64 if name == "ref" else side_dtype(name)
        if run.working.get(dtype) is None:
            with torch.random.fork_rng(devices=[]):
                run.working[dtype] = make_torch_side(run.spec, dtype, None)[0]
        model = run.working[dtype]
        run.shadows[program][name] = (model, run.spec.torch_optimizer(model.parameters()))
    return run.shadows[program][name]



def fed_updates(run: Run, program: str, start: dict, grads, last: bool, in_place: bool = False) -> dict:
    """PyTorch's optimizers fed ``program``'s gradients: float64, the reference (``"ref"``, its parameters read from its
    model as the rows ask for them); float32 (or float64 fed gradients and parameters moved by one ulp), PyTorch's own
    error, measured against it at once (``"noise"``). The optimizers' states are kept for the next step, let go after
    the ``last``. ``in_place``: the reference's optimizer steps PyTorch64's reference model itself, whose parameters
    are ``start`` and are read by nothing after it (the last program of a check of one step), after the other run: no
    working model holds the start a second time, and the reference's values need no copy (1 GB each for 124M
    parameters in float64).

    Args:
        run: the check's :class:`.run.Run`.
        program: ``"jit"`` or ``"eager"``.
        start: PyTorch64's state_dict as the step started.
        grads: the program's gradients, as the port's pytree.
        last: the check's last step.
        in_place: the reference's optimizer steps PyTorch64's reference model itself (see above).

    Returns:
        ``{"ref": the reference's parameters after the step (a :class:`ParamsOf`), "noise": {PyTorch parameter name: the
        other run's :class:`.judge.Measured` error}}``.
    """
    names = [name for name in run.shadows[program] if not (in_place and name == "ref")]
    shadows = {name: fed_optimizer(run, program, name) for name in names}
    if in_place:
        model = run.sides["ref"][0]
        shadows["ref"] = (model, run.spec.torch_optimizer(model.parameters()))
    moves = np.random.default_rng(len(run.pairings) + 1)

    def own_update(name, model, opt):
        if name == "t64":
            # the start's and the gradients' one-ulp moves drawn as they always were (in this order), each applied as
            # the optimizer reads that tensor
            start_signs = {k: ulp_signs(v.shape, moves) for k, v in start.items() if v.is_floating_point()}
            grad_signs = jax.tree_util.tree_map(lambda g: ulp_signs(np.shape(g), moves), grads)
            moved = jax.tree_util.tree_map(Moved, grads, grad_signs)
            return fed_update(model, opt, MovedState(start, start_signs), run.pairings, moved, last)
        return fed_update(model, opt, start, run.pairings, grads, last)

    others = [(name, model, opt) for name, (model, opt) in shadows.items() if name in ("t64", "t32")]
    if in_place:  # the other run first: the reference's step overwrites the start
        owns = [own_update(*other) for other in others]
        ref = fed_update(*shadows["ref"], start, run.pairings, grads, last)
    else:
        ref = fed_update(*shadows["ref"], start, run.pairings, grads, last)
        if any(model is shadows["ref"][0] for _, model, _ in others):
            ref = dict(ref)  # float64: the other run steps the same working model; the reference's values copied first
        owns = (own_update(*other) for other in others)  # one at a time
    fed = {"ref": ref}
    for own in owns:
        fed["noise"] = {key: relative_error(own[key], ref[key]) for key in own}
        del own
    return fed


def reference_parked(run: Run):
    """While a program of the port runs, PyTorch64's reference model, and its optimizer's state, parked on disk
    (:class:`Parked`) where they are over the memory policy's ``parked_above`` bytes (GPT-2 124M's: 1 GB in float64):
    nothing reads them until the program's outcome is compared. Every start of the program is made before, from
    them.

    Args:
        run: the check's :class:`.run.Run`.

    Returns:
        A context manager: a :class:`Parked`, or one that does nothing where they are not over ``parked_above``.
    """
    model, optimizer = run.sides["ref"]
    tensors = [*model.parameters(), *model.buffers()]
    if optimizer is not None:
        tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    parked = Parked(tensors)
    return parked if parked.nbytes > run.memory.parked_above else contextlib.nullcontext()
