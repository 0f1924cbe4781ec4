"""The PyTorch side of a check: the models (float64 reference, float32 and its batch-permuted twins), one step with
every paired layer's output recorded, and PyTorch's optimizer fed the port's gradients."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import re
import sys
from collections.abc import Mapping

import numpy as np
import torch

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .memory import _LIBC, trim
from .pairing import Pairing
from .spec import Spec, call_loss, select_output
from .taps import ModuleStack, TorchTaps, as_array


def make_torch_side(spec: Spec, dtype: torch.dtype, state: dict | None):
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
    by about 12 ulps of its scale between a row-major and a column-major weight of 9216 columns)."""
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
    ``model.layers.*.input_layernorm``), each with its narrow dtype, in the order first met."""
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
    of the whole state in that dtype first)."""
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
    steps every parameter at once (its step may couple them)."""
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
    for."""
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
    function = getattr(_LIBC, "madvise", None) if sys.platform.startswith("linux") else None
    if function is not None:
        function.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        function.restype = ctypes.c_int
    return function


_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4  # Linux's value (asm-generic/mman-common.h)
_MADVISE = _madvise()
