"""check-port block by block, for models whose whole-model check does not fit in memory.

PyTorch's model runs once in float64 on the spec's example inputs, with the spec's loss: each block's inputs are
recorded as they reach it, and the gradient of the model's loss with respect to each block's output (its cotangent).
Then each block is checked alone, one after the other, by :func:`check_port` on a spec of its own: PyTorch's block
(with the model's weights) against the port's block (the weights moved by the same pairing), both fed the block's
recorded inputs, with the loss ``sum(output · cotangent)``. That loss's gradient with respect to the block's
parameters is the model's own gradient (for parameters used in that block only), so every quantity a whole-model
check compares for the block's parameters (each layer's output, the block's output, the gradients, the optimizer's
update, the buffers) is compared for them here, judged the same way, and the gradient with respect to the block's
input (``INPUT_GRADIENTS``: what the block passes back to the blocks before it, where a ``stop_gradient`` on a
residual stream shows and nothing else does); the block's loss itself, the checker's own
construction (a sum of terms that cancel, whose float32 rounding depends on the order of summation alone), is not. Peak
memory is the PyTorch model once (to record) and one block's check, not the model's.

Then the rest of the model (:mod:`.outside`): the whole model with each block replaced on both sides by a stand-in
that adds PyTorch's recorded ``output - input``: the parts outside the blocks (embeddings, final norm, head, loss,
their update) and each block's arguments as the model gives them (the wiring), compared.

Not compared block by block: optimizers that couple parameters across blocks (a global-norm clip), and, where the
port's blocks are not a list its NNX model holds, the parts outside the blocks (listed in the report).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import weakref
from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

from functional_gan.progress import progress_bar

from . import apis, outside
from .check import check_port
from .memory import (GIB, Phases, block_lists, estimate, estimate_before_building, old_objects_frozen, outside_estimate,
                     parameter_count)
from .pairing import default_to_jax
from .judge import DEFAULT_K, Verdict
from .report import EXIT_AGREEMENT, PROGRAMS, Report, badness, outcome_words, ratio_text
from .spec import Spec, SpecError, as_spec, call_loss, select_output
from .torch_side import Parked


OUTSIDE = "(outside the blocks)"  # the outside check's name in a block-by-block report


@dataclasses.dataclass
class BlockReport:
    """The outcome of a block-by-block check: each block's :class:`Report`, in the model's order."""

    spec: str
    dtype: str
    k: float
    blocks: list[tuple[str, Report]]
    outside: list[str]  # PyTorch's parameters in no block
    memory: Any = None
    allow_precision: bool = False
    # the parts outside the blocks and the wiring (outside.py), or why they were not compared
    outside_report: Report | None = None
    outside_why: str = ""

    def _all(self) -> list[tuple[str, Report]]:
        """The blocks' reports, then the outside check's."""
        extra = [(OUTSIDE, self.outside_report)] if self.outside_report is not None else []
        return list(self.blocks) + extra

    @property
    def outcome(self) -> Verdict:
        """The worst part's verdict: a divergence, else precision findings, else agreement."""
        outcomes = {report.outcome for _, report in self._all()}
        return next((v for v in (Verdict.DIVERGENCE, Verdict.PRECISION_FINDING) if v in outcomes), Verdict.AGREEMENT)

    def exit_status(self, allow_precision: bool | None = None) -> int:
        """1 if a block diverges, else 3 if a block has precision findings (0 with ``allow_precision``), else 0.

        Args:
            allow_precision: precision findings alone exit 0; None (the default) takes the report's own
                ``allow_precision``.

        Returns:
            The exit status of the worst part, the rest of the model's check included: 0, 1 or 3.
        """
        allow = self.allow_precision if allow_precision is None else allow_precision
        return EXIT_AGREEMENT if self.outcome is Verdict.PRECISION_FINDING and allow else self.outcome.exit_status

    @property
    def first_failing(self) -> tuple[str, Report] | None:
        """The first block, in the model's order, that diverges (else the first with precision findings, unless they
        are allowed)."""
        wanted = (Verdict.DIVERGENCE,) if self.allow_precision else (Verdict.DIVERGENCE, Verdict.PRECISION_FINDING)
        for verdict in wanted:
            for name, report in self._all():
                if report.outcome is verdict:
                    return name, report
        return None

    def verdict(self) -> str:
        """The closing line(s): agreement of every part, or the first failing part's own verdict, named."""
        failing = self.first_failing
        if failing is None:
            total = sum(len(report.rows) for _, report in self._all())
            rest = " and the parts outside them" if self.outside_report is not None else ""
            return f"Agreement: all {len(self.blocks)} blocks{rest}, {total} quantities, within tolerance."
        name, report = failing
        return ("Outside the blocks: " if name == OUTSIDE else f"Block {name}: ") + report.verdict()

    def format(self, markdown: bool = False) -> str:
        """The block-by-block report: a row per block (and the rest of the model), then the first failing part's
        report in full.

        Args:
            markdown: the text in a Markdown code block.

        Returns:
            The report, as ``check-port --by-block`` prints it.
        """
        status = self.exit_status()
        lines = [f"check-port {self.spec}, block by block: {outcome_words(self.outcome, self.allow_precision)} "
                 f"(exit status {status}); {len(self.blocks)} "
                 f"blocks, {self.dtype}, k = {self.k:g}",
                 "Each block fed PyTorch's own input to it (float64 run of the whole model), with the loss "
                 "sum(output · the model loss's gradient at its output): its parameters' gradients are the model's, "
                 "and its input's gradient what it passes back (that loss, the checker's own, is not judged).",
                 "", f"  {'block':<28} {'rows':>5}  {'verdict':<12} {'worst':>9}  at"]
        for name, report in self._all():
            worst = max(report.rows, key=badness) if report.rows else None
            verdict = {Verdict.DIVERGENCE.exit_status: "DIVERGENCE", Verdict.PRECISION_FINDING.exit_status: "precision"
                       }.get(report.exit_status(self.allow_precision), "agreement")
            where = f"{worst.label}, {worst.name}" if worst else ""
            lines.append(f"  {name:<28} {len(report.rows):>5}  {verdict:<12} {ratio_text(worst) if worst else '':>9}  "
                         f"{where}")
        if self.outside_report is not None:
            lines += ["", f"{OUTSIDE}: the whole model with each block replaced on both sides by a stand-in that adds "
                      "to its input what PyTorch's block added (its gradient the identity's); its rows are the "
                      "parts outside the blocks and each block's arguments as the model gives them (the wiring)."]
        elif self.outside:
            shown = ", ".join(self.outside[:8]) + (f" and {len(self.outside) - 8} more" if len(self.outside) > 8 else "")
            lines += ["", f"Not in any block, and not compared here ({self.outside_why}; the whole-model check "
                      f"compares them): {shown}."]
        failing = self.first_failing
        if failing is None:
            lines += ["", self.verdict()]
        else:  # the block's own report ends with its first departure in full; the closing line names it
            name, report = failing
            first = report.first_divergence or report.precision_findings[0]
            word = "diverges" if report.outcome is Verdict.DIVERGENCE else "has precision findings"
            title = "The model outside the blocks" if name == OUTSIDE else f"Block {name}"
            lines += ["", f"{title}, in full:", "", report.format(), "",
                      f"{title} {word} first: {first.label}, {first.name} (its report above)."]
        text = "\n".join(lines)
        return f"```text\n{text}\n```\n" if markdown else text

    def to_json(self) -> dict:
        """The block-by-block report as JSON-ready data: the exit status, each block's :meth:`.report.Report.to_json`
        with its name, the rest of the model's (or why it was not compared), the parameters in no block, the peak."""
        return {"spec": self.spec, "by_block": True, "dtype": self.dtype, "k": self.k,
                "exit_status": self.exit_status(), "not_in_blocks": self.outside,
                "blocks": [{"block": name, **report.to_json()} for name, report in self.blocks],
                "outside_blocks": self.outside_report.to_json() if self.outside_report is not None else None,
                "outside_not_compared_because": self.outside_why or None,
                "peak_resident_gib": self.memory.peak if self.memory is not None else None}


def _block_list(spec: Spec, model: torch.nn.Module) -> list[tuple[str, Any]]:
    """The spec's blocks (``BLOCKS`` or ``blocks()``), or the default: PyTorch's largest ``ModuleList``/``Sequential``
    of modules of one class, paired by index with the only list of as many modules in the port (NNX, Equinox)."""
    if spec.blocks is not None:
        blocks = spec.blocks() if callable(spec.blocks) else spec.blocks
        try:
            blocks = [(str(name), port) for name, port in blocks]
        except (TypeError, ValueError) as error:
            raise SpecError("blocks() must return a list of (PyTorch module name, the port's block) pairs") from error
        if not blocks:
            raise SpecError("blocks() returned no blocks")
        names = dict(model.named_modules())
        unknown = [name for name, _ in blocks if name not in names]
        if unknown:
            raise SpecError(f"blocks() names {', '.join(map(repr, unknown[:3]))}, which PyTorch's model has no module "
                            f"called (its containers: {', '.join(name for name, _ in block_lists(model)[:5]) or 'none'})")
        return blocks
    containers = [name for name, _ in block_lists(model)]
    if not containers:
        raise SpecError("--by-block: PyTorch's model has no ModuleList or Sequential of two or more modules of one "
                        "class; name the blocks in the spec: blocks() returning [(PyTorch module name, the port's "
                        "block), ...]")
    container = containers[0]
    children = [f"{container}.{name}" for name, _ in model.get_submodule(container).named_children()]
    abstract = _abstract_port(spec)
    if abstract is not None:  # each block built when it is checked: the port's model is never whole in memory
        lists = _module_lists(abstract, len(children))
        if len(lists) == 1:
            return [(child, _materializer(block)) for child, block in zip(children, lists[0][1])]
    port = spec.jax_model() if spec.jax_model is not None else None
    if port is None or apis.is_linen(port):
        raise SpecError(f"--by-block: PyTorch's blocks are {container}.0 … {container}.{len(children) - 1}; a "
                        f"{'Linen' if port is not None else 'plain-function'} port's blocks cannot be found by looking "
                        "at it: name them in the spec, blocks() returning [(PyTorch module name, the port's block "
                        f"module), ...] (examples/port/gpt2.py)")
    lists = _module_lists(port[0] if isinstance(port, tuple) else port, len(children))
    if len(lists) != 1:
        found = "none" if not lists else ", ".join(path for path, _ in lists)
        raise SpecError(f"--by-block: PyTorch's blocks are {container}.0 … {container}.{len(children) - 1}; the port "
                        f"has {'no list' if not lists else 'more than one list'} of {len(children)} modules ({found}): "
                        "name them in the spec, blocks() returning [(PyTorch module name, the port's block), ...]")
    return list(zip(children, lists[0][1]))


def _abstract_port(spec: Spec):
    """The spec's NNX port with no values (``nnx.eval_shape``: shapes and dtypes only, no memory), where its state is
    parameters and running statistics alone (all of which the check fills with PyTorch's); else None (the port is
    built as it is: another API, or a variable of its own, such as a table it computed at construction)."""
    if spec.jax_model is None:
        return None
    try:
        from flax import nnx

        abstract = nnx.eval_shape(spec.jax_model)
        if not apis.is_nnx(abstract):
            return None
        kinds = {type(v) for _, v in nnx.iter_graph(abstract) if isinstance(v, nnx.Variable)}
    except Exception:  # built as it is, where its own error (if any) is said
        return None
    return abstract if kinds and all(issubclass(k, (nnx.Param, nnx.BatchStat)) for k in kinds) else None


def _materializer(abstract):
    """A function that builds the abstract NNX module ``abstract`` with zeros for its values (the check replaces
    every one with PyTorch's)."""
    def build():
        import jax
        import jax.numpy as jnp
        from flax import nnx

        graphdef, state = nnx.split(abstract)
        state = jax.tree_util.tree_map(
            lambda leaf: jnp.zeros(leaf.shape, leaf.dtype) if isinstance(leaf, jax.ShapeDtypeStruct) else leaf, state)
        return nnx.merge(graphdef, state)
    return build


def _module_lists(port, length: int, path: str = "", depth: int = 0) -> list[tuple[str, list]]:
    """The port's attributes (to a depth of 3) that are lists or tuples of ``length`` modules."""
    found = []
    if depth > 3:
        return found
    for key, value in list(vars(port).items()) if hasattr(port, "__dict__") else []:
        if key.startswith("_"):
            continue
        items = list(value) if isinstance(value, (list, tuple)) or type(value).__name__ == "List" else None
        if items is not None and len(items) == length and all(hasattr(i, "__dict__") for i in items) \
                and all(_is_module(i) for i in items):
            found.append((f"{path}{key}", items))
        elif _is_module(value):
            found += _module_lists(value, length, f"{path}{key}.", depth + 1)
    return found


def _is_module(value) -> bool:
    return apis.is_nnx(value) or apis.is_equinox(value) or apis.is_linen(value)


def _record(spec: Spec, model: torch.nn.Module, names: list[str], dtype: str) -> dict[str, dict]:
    """Each block's inputs as they reach it and the cotangent of the model's loss at its output (float64 run; each
    rounded to float32 for a float32 check, where both frameworks take those values)."""
    records: dict[str, dict] = {}
    outputs: dict[str, torch.Tensor] = {}
    shapes: dict[str, int | None] = {}
    modules = dict(model.named_modules())

    def before(name):
        def hook(_module, args, kwargs):
            if name in records:
                raise SpecError(f"--by-block: the block {name} runs more than once in one forward pass (a block "
                                "shared between places cannot be fed one input)")
            if not all(torch.is_tensor(a) for a in args):
                kinds = ", ".join(type(a).__name__ for a in args)
                raise SpecError(f"--by-block: the block {name} is called with ({kinds}) as its positional arguments; "
                                "block by block takes tensors there (anything else by keyword)")
            records[name] = {"inputs": tuple(a.detach().cpu().numpy().copy() for a in args),
                             "keywords": Keywords.of(kwargs)}
        return hook

    def after(name):
        def hook(_module, _args, out):
            outputs[name] = select_output(out, spec.block_output, f"PyTorch's block {name}")
            shapes[name] = len(out) if isinstance(out, tuple) else None
        return hook

    handles = [modules[n].register_forward_pre_hook(before(n), with_kwargs=True) for n in names]
    handles += [modules[n].register_forward_hook(after(n)) for n in names]
    inputs = [torch.as_tensor(np.asarray(x)).double() if np.asarray(x).dtype.kind == "f" else torch.as_tensor(np.asarray(x))
              for x in spec.example_inputs()]
    targets = [torch.as_tensor(np.asarray(x)).double() if np.asarray(x).dtype.kind == "f" else torch.as_tensor(np.asarray(x))
               for x in (spec.example_targets() if spec.example_targets else ())]
    try:
        output = select_output(model(*inputs), spec.output, "PyTorch's model")
    finally:
        for handle in handles:
            handle.remove()
    missing = [n for n in names if n not in records]
    if missing:
        raise SpecError(f"--by-block: PyTorch's model did not run the block(s) {', '.join(missing[:3])} on the example "
                        "inputs")
    if spec.torch_loss is not None:
        loss = call_loss(spec.torch_loss, "torch_loss", output, inputs, targets)
        cotangents = torch.autograd.grad(loss, [outputs[n] for n in names], allow_unused=True)
        for name, cotangent in zip(names, cotangents):
            value = torch.zeros_like(outputs[name]) if cotangent is None else cotangent
            records[name]["cotangent"] = value.detach().cpu().numpy().copy()
    for name in names:  # what the outside check's stand-in of the block gives (outside.py)
        records[name]["stand_in"] = _stand_in(spec, records[name], outputs[name].detach().cpu().numpy(), shapes[name])
    if dtype == "float32":
        for record in records.values():
            record["inputs"] = tuple(_narrowed(x) for x in record["inputs"])
            record["keywords"] = record["keywords"].narrowed()
            if "cotangent" in record:
                record["cotangent"] = record["cotangent"].astype(np.float32)
    return records


def _stand_in(spec: Spec, record: dict, output: np.ndarray, tuple_output: int | None) -> outside.Recorded:
    first = record["inputs"][0]
    constant = tuple(first.shape) != tuple(output.shape)
    offset = output.copy() if constant else output - first
    port_offset = None
    if spec.block_to_jax is not None:  # the offset in the port's layout, moved as the block's first input is
        rest, keywords = record["inputs"][1:], record["keywords"].rebuilt(record["keywords"].arrays)
        try:
            moved_out = np.asarray(spec.block_to_jax(output, *rest, **keywords)[0], np.float64)
            port_offset = moved_out if constant else \
                moved_out - np.asarray(spec.block_to_jax(first, *rest, **keywords)[0], np.float64)
        except Exception:  # block_to_jax's own failure is said where the block is checked
            port_offset = None
    return outside.Recorded(offset, port_offset, constant, tuple_output)


def _narrowed(array: np.ndarray) -> np.ndarray:
    """A float64 array in float32, its values beyond float32's range at its ends (an attention mask of float64's
    ``finfo.min``: float32's, as the model in float32 makes it)."""
    if array.dtype.kind != "f":
        return array
    limit = np.finfo(np.float32)
    return np.clip(array, limit.min, limit.max).astype(np.float32)


@dataclasses.dataclass
class Keywords:
    """A block's keyword arguments as PyTorch's model passed them (transformers' decoder layers take
    ``attention_mask``, ``position_ids`` and ``position_embeddings=(cos, sin)`` by keyword): their tensors as arrays,
    flattened in order (they follow the block's positional inputs in its spec's example inputs, each converted to the
    check's dtype as inputs are), a key/value cache replaced by None (training uses none; the model made one because
    its config says ``use_cache``), and everything else kept as it was (None, a flag)."""

    structure: Any  # torch.utils._pytree's spec of the keyword arguments (a dict)
    leaves: list  # the leaves as they were, None where a tensor was
    slots: tuple  # the positions of the tensors among the leaves
    arrays: list  # the tensors, as arrays, in order

    @classmethod
    def of(cls, kwargs: dict) -> "Keywords":
        """The keyword arguments a block was called with, kept as a :class:`Keywords`.

        Args:
            kwargs: the block's keyword arguments as PyTorch's forward pre-hook received them.

        Returns:
            A :class:`Keywords`: the tensors detached and copied to NumPy arrays in flattened order, a key/value cache
            replaced by None, every other leaf kept as it was.
        """
        from torch.utils import _pytree

        flat, structure = _pytree.tree_flatten(dict(kwargs))
        # a key/value cache (transformers' DynamicCache, made by a model whose config says use_cache) fills up at each
        # call: the block, called again and again by the check, would attend to the keys of every earlier call
        flat = [None if _is_cache(leaf) else leaf for leaf in flat]
        slots = tuple(i for i, leaf in enumerate(flat) if torch.is_tensor(leaf))
        return cls(structure, [None if i in slots else leaf for i, leaf in enumerate(flat)], slots,
                   [flat[i].detach().cpu().numpy().copy() for i in slots])

    def narrowed(self) -> "Keywords":
        return dataclasses.replace(self, arrays=[_narrowed(a) for a in self.arrays])

    def rebuilt(self, arrays) -> dict:
        """The keyword arguments with ``arrays`` where the tensors were.

        Args:
            arrays: the values put in the tensors' places, in the order of :attr:`arrays` (tensors or arrays); a place
                without one stays None.

        Returns:
            The keyword arguments as a dict, in the structure PyTorch's model passed them.
        """
        from torch.utils import _pytree

        flat = list(self.leaves)
        for slot, array in zip(self.slots, arrays):
            flat[slot] = array
        return _pytree.tree_unflatten(flat, self.structure)


def _is_cache(value) -> bool:
    """A key/value cache: an instance of a class named ``Cache`` or deriving from one (transformers' ``Cache``)."""
    return any(kind.__name__ == "Cache" for kind in type(value).__mro__)


def _recorded_in_float64(spec: Spec, model: torch.nn.Module, names: list[str], dtype: str) -> tuple[dict, str]:
    """:func:`_record` run in float64 on a model that keeps its own parameters: each parameter widened where the forward
    reads it (:func:`_widened_where_read`), else, where that cannot run (a parameter read other than as its module's
    attribute, such as one kept in a list; a module already parametrized), the whole model widened and back. Either way the same numbers (widening is exact and each operation
    sees the same float64 values); the first holds the model once at its own width, not again in float64 (GPT-2
    124M: 0.47 GiB, not 0.93). Returns the records and which way they were made."""
    width = next((p.dtype for p in model.parameters()), torch.float32)
    if not any(torch.nn.utils.parametrize.is_parametrized(m) for m in model.modules()):
        saved = {name: buffer.clone() for name, buffer in model.named_buffers()}  # a failed try's statistics undone
        try:
            with _widened_where_read(model):
                return _record(spec, model, names, dtype), "parameters widened where read"
        except SpecError:
            raise
        except Exception:  # the whole model widened below: its own error, if it has one, is raised from there
            model.load_state_dict(saved, strict=False)
    model.double()
    try:
        return _record(spec, model, names, dtype), "the model widened whole"
    finally:
        model.to(width)  # exact: the model's own values, widened and back


@contextlib.contextmanager
def _widened_where_read(model: torch.nn.Module):
    """The model's floating-point parameters read as float64 (a parametrization: ``module.weight`` is the parameter
    widened, each time it is read) and its floating-point buffers widened (and narrowed back after, with what the
    forward wrote into them: a BatchNorm's running statistics, as ``model.double()`` then ``model.to(width)`` would).
    What autograd saves of a widened parameter for the backward (a Linear's weight) is saved as the parameter itself
    and widened again when the backward reads it: no float64 copy of the model stays resident."""
    from torch.nn.utils import parametrize

    widened: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # storage address -> (the widened tensor, its parameter)

    def forget(address):
        def callback(ref):
            if widened.get(address, (None,))[0] is ref:
                del widened[address]
        return callback

    class Widened(torch.nn.Module):
        def forward(self, original):
            wide = original.to(torch.float64)
            address = wide.untyped_storage().data_ptr()
            if address:
                widened[address] = (weakref.ref(wide, forget(address)), original)
            return wide

    def pack(tensor):
        if tensor.dtype == torch.float64 and tensor.numel():
            entry = widened.get(tensor.untyped_storage().data_ptr())
            if entry is not None and entry[0]() is not None:  # alive: that storage is the widened parameter's
                return (entry[1], tensor.size(), tensor.stride(), tensor.storage_offset())
        # not the tensor itself: a node that saves its own output would hold that output, and through it the node, in
        # a cycle Python's collector cannot see (the graph, the model's parameters with it, would outlive the run)
        return tensor.detach()

    def unpack(packed):
        if isinstance(packed, tuple):
            original, size, stride, offset = packed
            return original.detach().to(torch.float64).as_strided(size, stride, offset)  # the same layout as before
        return packed

    done, buffers, orders = [], [], []
    try:
        for module in list(model.modules()):
            orders.append((module, list(module._parameters)))
            for name, parameter in list(module._parameters.items()):
                if parameter is not None and parameter.is_floating_point():
                    parametrize.register_parametrization(module, name, Widened(), unsafe=True)
                    done.append((module, name))
            for name, buffer in list(module._buffers.items()):
                if buffer is not None and buffer.is_floating_point():
                    buffers.append((module, name, buffer.dtype))
                    module._buffers[name] = buffer.to(torch.float64)
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
    finally:
        for module, name in reversed(done):
            parametrize.remove_parametrizations(module, name, leave_parametrized=False)
        for module, order in orders:  # each parameter back in its place (removing one appends it)
            module._parameters = type(module._parameters)((name, module._parameters[name]) for name in order)
        for module, name, width in buffers:
            module._buffers[name] = module._buffers[name].to(width)


def _block_spec(spec: Spec, name: str, template: torch.nn.Module, port, record: dict) -> Spec:
    """The check-port spec of one block: PyTorch's block against the port's, on the block's recorded inputs."""
    port_of = port if _is_module(port) or isinstance(port, tuple) else None
    if port_of is None and not callable(port):
        raise SpecError(f"blocks(): the port's block for {name} is a {type(port).__name__}, not a module (Linen, NNX, "
                        "Equinox) nor a function that builds one")
    first = port_of[0] if isinstance(port_of, tuple) else port_of  # Equinox's (module, state)
    # the API's usual layout (Linen, NNX: channels-last); a function that builds the block: read off its output's shape
    channels_last = None if first is None else (apis.is_linen(first) or apis.is_nnx(first))
    inputs = record["inputs"]
    keywords: Keywords = record["keywords"]
    count = len(inputs)

    def torch_block():  # called as the model called it: its keyword arguments rebuilt from the inputs that follow
        block = copy.deepcopy(template)
        if keywords.leaves:
            original = block.forward
            block.forward = lambda *flat: original(*flat[:count], **keywords.rebuilt(flat[count:]))
        return block

    def block_to_jax(*args, **kwargs):  # the spec's, its failure said in block-mode words
        try:
            return spec.block_to_jax(*args, **kwargs)
        except Exception as error:
            given = f" (PyTorch's model called the block with the keyword arguments {', '.join(kwargs)}: " \
                    "block_to_jax(*inputs, **keywords) is called with them)" if kwargs else ""
            raise SpecError(f"the spec's block_to_jax failed on block {name}'s recorded inputs: "
                            f"{type(error).__name__}: {error}{given}") from error

    to_jax = block_to_jax if spec.block_to_jax is not None else None
    if keywords.leaves:
        if spec.block_to_jax is not None:
            def to_jax(*flat):
                return block_to_jax(*flat[:count], **keywords.rebuilt(flat[count:]))
        else:  # the port's block takes the positional inputs, in the API's layout
            def to_jax(*flat):
                return default_to_jax(*flat[:count]) if channels_last else tuple(flat[:count])
    changes = dict(torch_model=torch_block, jax_model=(lambda: port) if port_of is not None else port,
                   example_inputs=lambda: (*inputs, *keywords.arrays), example_targets=None, to_jax=to_jax,
                   from_jax=spec.block_from_jax, param_map=None, jax_params=None, jax_apply=None, jax_state=None,
                   output=spec.block_output, blocks=None, name=f"{spec.name} [{name}]",
                   torch_loss=None, jax_loss=None, torch_optimizer=None, jax_optimizer=None, block=name,
                   positional=count)
    if "cotangent" in record:
        cotangent = record["cotangent"]
        moved = np.asarray(default_to_jax(cotangent)[0])
        if spec.block_to_jax is not None:  # moved as the block's first input is: the same call, the cotangent first
            chosen = np.asarray(block_to_jax(cotangent, *inputs[1:], **keywords.rebuilt(keywords.arrays))[0])
        elif channels_last is not None:
            chosen = moved if channels_last else cotangent
        else:
            chosen = None

        def torch_loss(output, *rest):
            return torch.sum(output * rest[-1])

        def jax_loss(output, *rest):
            port_cotangent = chosen
            if port_cotangent is None:
                port_cotangent = cotangent if tuple(output.shape) == cotangent.shape else moved
            if tuple(output.shape) != port_cotangent.shape:
                raise SpecError(f"--by-block: the port's block {name} gives {tuple(output.shape)} where PyTorch's "
                                f"output is {cotangent.shape} in the port's layout {port_cotangent.shape} "
                                "(block_to_jax/block_from_jax say how to convert)")
            return jnp.sum(output * jnp.asarray(port_cotangent, output.dtype))

        changes.update(example_targets=lambda: (cotangent,), torch_loss=torch_loss, jax_loss=jax_loss,
                       torch_optimizer=spec.torch_optimizer, jax_optimizer=spec.jax_optimizer,
                       input_gradients=any(np.asarray(x).dtype.kind == "f" for x in inputs))
    return dataclasses.replace(spec, **changes)


def _in_model(block: str, row: str) -> str:
    """A block check's row name as the whole model names it: the block's output by the block's name, its input's
    gradient as ``block (input)``, a layer by its dotted path."""
    if row == "output":
        return block
    if row.startswith(":"):  # a tapped function's output in the block itself (TAPS): "layers.1:rope[0]"
        return f"{block}{row}"
    return f"{block} {row}" if row.startswith("(input") else f"{block}.{row}"


def check_by_block(spec: Spec | str | os.PathLike, dtype: str = "float32", steps: int = 1, k: float = DEFAULT_K, seed: int = 0,
                   programs: tuple[str, ...] | None = None, torch_state: dict | None = None,
                   memory_limit: float | None = None, progress: bool = False,
                   allow_precision: bool = False) -> BlockReport:
    """Check the port block by block (see the module's docstring): the PyTorch model run once in float64 to record
    each block's inputs and cotangent, :func:`check_port` on each block, one at a time, then on the model with its
    blocks replaced (:mod:`.outside`).

    Args:
        spec: what to compare (or a spec file's path), as for :func:`.check.check_port`; its ``blocks()`` (or the default: PyTorch's largest
            ModuleList paired with the port's list of as many modules), ``block_to_jax``/``block_from_jax`` and
            ``BLOCK_OUTPUT`` say what a block is on each side.
        dtype: ``"float32"`` or ``"float64"``, as for :func:`.check.check_port`.
        steps: optimizer steps compared, as for :func:`.check.check_port`.
        k: the allowance in multiples of PyTorch's own error, as for :func:`.check.check_port`.
        seed: PyTorch's seed, as for :func:`.check.check_port`.
        programs: the JAX programs run (None: both), as for :func:`.check.check_port`.
        torch_state: a ``state_dict`` for ``torch_model()``, as for :func:`.check.check_port`.
        memory_limit: bytes; refused where the recording or a block's check, estimated from the PyTorch model's
            parameters (:func:`.memory.estimate`), exceeds it; the check of the rest of the model is left out (and the
            report says so) where its own estimate exceeds it.
        progress: a bar over the parts on standard error (a line per 5% where it is not a terminal).
        allow_precision: precision findings alone exit 0, as for :func:`.check.check_port`.

    Returns:
        A :class:`BlockReport`: each block's :class:`.report.Report`, the rest of the model's (or why it was not
        compared), and the worst part's exit status.

    Raises:
        SpecError: as :func:`.check.check_port`'s, the message naming the block (``--by-block, block layers.3: …``)
            or the rest of the model, and the side that failed.
    """
    spec = as_spec(spec)
    with old_objects_frozen():
        report = _check_by_block(spec, dtype, steps, k, seed, programs, torch_state, memory_limit, progress)
    report.allow_precision = allow_precision
    return report


def _check_by_block(spec: Spec, dtype: str, steps: int, k: float, seed: int, programs: tuple[str, ...] | None,
                    torch_state: dict | None, memory_limit: float | None = None, progress: bool = False
                    ) -> BlockReport:
    import jax

    phases = Phases()
    size = estimate_before_building(spec.torch_model, dtype) if memory_limit is not None else None
    if size is not None:  # before anything is built, where the model builds on the meta device
        _refuse_if_too_large(size, dtype, memory_limit)
    torch.manual_seed(seed)
    try:
        model = spec.torch_model()
    except Exception as error:
        raise SpecError(f"the spec's torch_model() failed: {type(error).__name__}: {error}") from error
    if memory_limit is not None and size is None:  # a model the meta device cannot build: measured built
        _refuse_if_too_large(estimate(model, dtype), dtype, memory_limit)
    if torch_state is not None:
        model.load_state_dict(torch_state)
    model.train(spec.train)
    with jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext():
        blocks = _block_list(spec, model)
    names = [name for name, _ in blocks]
    records, how = _recorded_in_float64(spec, model, names, dtype)
    phases.mark(f"float64 run: blocks' inputs recorded ({how})")
    covered = {id(p) for name in names for p in model.get_submodule(name).parameters()}
    outside_names = [n for n, p in model.named_parameters() if id(p) not in covered]
    templates = {name: model.get_submodule(name) for name in names}
    stand_ins = {name: record.pop("stand_in") for name, record in records.items()}
    # the model keeps what lies outside the blocks (an embedding of 50,257 × 768), for the check of the rest
    outside.replace_torch_blocks(model, {name: outside.TorchStandIn(stand_ins[name], spec.block_to_jax)
                                         for name in names})
    # PyTorch's blocks and the rest, on disk until each is checked: at 1.24B parameters, 4.4 GiB not held
    parked, seen = {}, set()  # a tensor shared by two parts parked with the first (unparked before the second runs)
    for name, part in [*templates.items(), (OUTSIDE, model)]:
        tensors = [t for t in [*part.parameters(), *part.buffers()] if t.untyped_storage().data_ptr() not in seen]
        seen.update(t.untyped_storage().data_ptr() for t in tensors)
        parked[name] = Parked(tensors)
    try:
        for held in parked.values():
            held.__enter__()
        return _checked_by_block(spec, dtype, steps, k, seed, programs, blocks, records, templates, stand_ins, model,
                                 parked, outside_names, phases, progress, memory_limit)
    finally:
        for held in parked.values():  # an error on the way: the files closed, the values no longer needed
            if getattr(held, "file", None) is not None:
                held.file.close()


def _checked_by_block(spec, dtype, steps, k, seed, programs, blocks, records, templates, stand_ins, model, parked,
                      outside_names, phases, progress, memory_limit) -> BlockReport:
    import jax

    names = [name for name, _ in blocks]
    reports = []
    bar = progress_bar(len(blocks) + 1, "check-port --by-block", "parts", disable=not progress)
    for index, (name, port) in enumerate(blocks):
        blocks[index] = (name, None)  # the port's block let go once checked
        bar.set_postfix_str(name)
        parked.pop(name).__exit__(None, None, None)
        try:
            block_spec = _block_spec(spec, name, templates.pop(name), port, records.pop(name))
            report = check_port(block_spec, dtype, steps, k, seed, programs or PROGRAMS)
        except SpecError as error:  # which block, and (in the message) which side
            raise type(error)(f"--by-block, block {name}: {error}") from error
        reports.append((name, _in_the_model(name, report)))
        del port
        jax.clear_caches()
        phases.mark(f"block {name}")
        bar.update()
    bar.set_postfix_str("outside the blocks")
    parked.pop(OUTSIDE).__exit__(None, None, None)
    count = parameter_count(model)  # what lies outside the blocks
    if memory_limit is not None and outside_estimate(count) > memory_limit:
        outside_report, why = None, (f"checked whole, the {count / 1e6:.0f}M parameters outside the blocks need about "
                                     f"{outside_estimate(count) / GIB:.1f} GiB (estimated), and "
                                     f"{memory_limit / GIB:.1f} GiB are available")
    else:
        outside_report, why = _check_outside(spec, names, stand_ins, dtype, steps, k, seed, programs or PROGRAMS,
                                             model)
    del model
    jax.clear_caches()
    phases.mark("outside the blocks")
    bar.update()
    bar.close()
    return BlockReport(spec.name, dtype, k, reports, outside_names, phases, outside_report=outside_report,
                       outside_why=why)


def _in_the_model(name: str, report: Report) -> Report:
    """A block's report as the model's: its rows named as in the whole model, without the block's loss, which is the
    checker's own construction, not a quantity of the model (a sum of B·T·C terms that cancel, whose float32 rounding
    depends on the order of summation alone): not judged."""
    def renamed(rows):
        return [dataclasses.replace(row, name=_in_model(name, row.name)) for row in rows if row.stage != "loss"]

    rows = renamed(report.rows)
    return dataclasses.replace(
        report, rows=rows, other_rows=renamed(report.other_rows), memory=None, converted=None,
        hints={(stage, _in_model(name, row)): hint for (stage, row), hint in report.hints.items()},
        causes=report.causes if any(r.finding for r in rows) else [])  # else they were of the loss row alone


def _refuse_if_too_large(size, dtype: str, memory_limit: float) -> None:
    if size is not None and size.by_block is not None and size.by_block > memory_limit:
        raise SpecError(f"--by-block: this model ({size.parameters / 1e6:.0f}M parameters, {dtype}) needs about "
                        f"{size.by_block / GIB:.1f} GiB block by block (estimated), and {memory_limit / GIB:.1f} "
                        "GiB are available: it was not started (--no-memory-estimate runs it anyway)")


def _check_outside(spec: Spec, names: list[str], stand_ins: dict[str, outside.Recorded], dtype: str, steps: int,
                   k: float, seed: int, programs: tuple[str, ...], model: torch.nn.Module
                   ) -> tuple[Report | None, str]:
    """The whole model with every block replaced by its stand-in on both sides (see :mod:`.outside`): the parts
    outside the blocks and the wiring, checked. (None, why) where the port's blocks cannot be replaced."""
    import jax

    if spec.jax_model is None:
        return None, "the port is functions (jax_params/jax_apply), whose blocks cannot be replaced"
    with jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext():
        abstract = _abstract_port(spec)  # the blocks replaced before the rest is given values: never whole in memory
        try:
            port = abstract if abstract is not None else spec.jax_model()
        except Exception as error:
            raise SpecError(f"the spec's jax_model() failed: {type(error).__name__}: {error}") from error
        if not apis.is_nnx(port):
            kind = "Linen" if apis.is_linen(port) else "Equinox" if apis.is_equinox(port) else type(port).__name__
            return None, f"the port is a {kind} model, whose blocks the check does not replace (NNX's only)"
        place = outside.find_list(port, len(names), _module_lists)
        if place is None:
            return None, (f"the port's model holds no single list of {len(names)} modules (its blocks may be one "
                          "stacked module run by a scan)")
        owner, attribute = place
        layers = getattr(owner, attribute)
        for index, name in enumerate(names):
            layers[index] = outside.nnx_stand_in(stand_ins[name], spec.block_to_jax is not None)
        if abstract is not None:
            port = _materializer(port)()
    outside_spec = dataclasses.replace(
        spec, torch_model=lambda: copy.deepcopy(model), jax_model=lambda: port, blocks=None,
        taps={**(spec.taps or {}), outside.TAP: (outside.torch_block_input, outside.port_block_input)},
        name=f"{spec.name} [outside the blocks]")
    try:
        report = check_port(outside_spec, dtype, steps, k, seed, programs)
    except SpecError as error:
        raise type(error)(f"--by-block, outside the blocks (the model with each block replaced by a stand-in): "
                          f"{error}") from error
    return dataclasses.replace(report, memory=None, converted=None), ""

