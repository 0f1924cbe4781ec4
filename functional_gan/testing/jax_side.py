"""The JAX side of a check: one step of the port as a pure function (forward with per-layer outputs, loss, gradients,
optimizer update), and the check that it computes in the precision asked."""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import apis, widen
from .memory import trim
from .pairing import variables_from_torch
from .report import program_words
from .spec import PortDtypeError, Spec, SpecError, call_loss, layer_output, select_output

if TYPE_CHECKING:
    from .run import Run


def jax_step_function(adapter: apis.Adapter, spec: Spec, optimizer, keep_state: bool = True) -> Callable:
    """One step of the port as a pure function: (variables, inputs, targets, opt_state) -> what it computed.

    ``opt_state`` None: the optimizer's initial state, made inside (not held beside the step as an input).
    ``keep_state`` False: the optimizer's state after the step is not returned (a check's last step: no step follows;
    Adam's state over 124M parameters is 2 GB in float64).

    Args:
        adapter: the port in one form (:class:`.apis.Adapter`).
        spec: the spec: its ``OUTPUT``, ``from_jax``, ``jax_loss``, ``INPUT_GRADIENTS`` and ``positional`` are read.
        optimizer: the port's optax transformation, or None: a step without an update (the float64 twin).
        keep_state: the step returns the optimizer's state after it.

    Returns:
        ``step(variables, inputs, targets, opt_state)``, returning a dict: ``output``, ``layers`` (by the port's path),
        ``batch_stats`` and ``carry``; with a loss, ``loss`` and ``grads`` (and ``input_grads`` by position with
        ``INPUT_GRADIENTS``); with an optimizer, ``params`` after the update (and ``opt_state`` with ``keep_state``).
    """

    def step(variables, inputs, targets, opt_state):
        # ``variables``: params (PyTorch's, each step), batch_stats and the adapter's "carry" (the port's own state,
        # from its previous step): the capture call and the training call both start from that state, and the
        # training call's state is the one carried to the next step.
        output, stats, layers, carry = adapter.apply(variables, inputs, True)
        layers = {path: out for path, out in ((p, layer_output(v)) for p, v in layers.items()) if out is not None}
        seen = {"output": select_output(output, spec.output, "the port", spec.from_jax), "layers": layers,
                "batch_stats": stats,
                "carry": carry}
        if spec.jax_loss is None:
            return seen

        # INPUT_GRADIENTS: the floating-point inputs are differentiated too, by position
        # (under --by-block, the block's positional inputs only: its keyword arguments' arrays follow them)
        limit = len(inputs) if spec.positional is None else spec.positional
        floats = {i: x for i, x in enumerate(inputs[:limit])
                  if x is not None and jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)} if spec.input_gradients else {}

        def loss_fn(params, differentiated):
            given = tuple(differentiated.get(i, x) for i, x in enumerate(inputs))
            out, stats, _, carry = adapter.apply({**variables, "params": params}, given, False)
            out = select_output(out, spec.output, "the port", spec.from_jax)
            return call_loss(spec.jax_loss, "jax_loss", out, given, targets).reshape(()), (stats, carry)

        if spec.input_gradients:
            (loss, (stats, carry)), (grads, input_grads) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
                variables["params"], floats)
            seen.update(input_grads=input_grads)
        else:
            (loss, (stats, carry)), grads = jax.value_and_grad(loss_fn, has_aux=True)(variables["params"], {})
        seen.update(loss=loss, grads=grads, batch_stats=stats, carry=carry)
        if optimizer is not None:
            import optax

            if opt_state is None:
                opt_state = optimizer.init(variables["params"])
            updates, opt_state = optimizer.update(grads, opt_state, variables["params"])
            seen.update(params=optax.apply_updates(variables["params"], updates))
            if keep_state:
                seen.update(opt_state=opt_state)
        return seen

    return step


def check_dtypes(seen: dict, dtype: str, run) -> None:
    """The port's outputs are in the precision asked, or a PortDtypeError names the first layer that is not. In float64
    a layer that computes in float32 inside a model whose output is float64 is an island, not refused: the check
    measures its error (:mod:`.widen`) and judges what follows against it.

    Args:
        seen: the port's outcome of one step (its ``layers`` by the port's path, its ``output``).
        dtype: the check's dtype, ``"float32"`` or ``"float64"``.
        run: the check's :class:`.run.Run` (PyTorch's modules in order, and the port's path of each).

    Raises:
        PortDtypeError: a paired layer's output or the model's output holds a floating-point array of another dtype than
            ``dtype`` (in float64, only where the model's output itself is not float64); the message names the first.
    """
    torch_order = [n for n, _ in run.sides["ref"][0].named_modules() if n in run.layer_paths]
    layer_paths = run.layer_paths
    def wrong(value) -> str | None:  # read off the arrays the port returned (a Python number has no dtype of its own)
        for leaf in jax.tree_util.tree_leaves(value):
            kind = np.dtype(getattr(leaf, "dtype", np.dtype(dtype)))
            if np.issubdtype(kind, np.floating) and kind != np.dtype(dtype):
                return str(kind)
        return None

    places = [(name or "(model)", seen["layers"].get(layer_paths[name])) for name in torch_order]
    places.append(("its output", seen["output"]))
    if dtype == "float64" and wrong(seen["output"]) is None:
        return  # a layer narrower inside a float64 output: an island, judged against its own precision (widen.py)
    for where, value in places:
        got = wrong(value) if value is not None else None
        if got is not None:
            raise PortDtypeError(
                f"the port computes in {got}, not {dtype} as asked: {where} gives {got} from {dtype} inputs and "
                f"parameters (a dtype fixed inside the port: Flax's dtype='{got}', a cast, or an NNX layer built with "
                f"param_dtype={got}, the default, which nnx.Embed also takes as the dtype it computes in). It cannot be "
                f"checked in {dtype} as it is: check it with --dtype {got}, or build it to compute in {dtype} (for Flax Linen, "
                f"Hugging Face's Flax classes among them, dtype=None: the module computes in its inputs' dtype; for "
                f"NNX, param_dtype=jnp.zeros(()).dtype in jax_model(), which is {dtype} under the check)")


def port_islands_run(run: Run, step_function, start: dict) -> dict:
    """The port's step without its optimizer, compiled, with its lower-precision islands computed in float64.

    Args:
        run: the check's :class:`.run.Run` (the inputs and targets on the JAX side).
        step_function: the port's step without its optimizer (:func:`jax_step_function` with no optimizer).
        start: the variables the step starts from.

    Returns:
        The step's outcome, fetched from the device (:func:`collected`).
    """
    wide = jax.jit(widen.widened(step_function))
    return collected(run, lambda: wide(start, run.jax_inputs, run.jax_targets, None))



def narrowed(tree):
    """``tree`` as a float32 program takes it: floating-point leaves in float32, integers in 32 bits.

    Args:
        tree: a pytree of arrays (NumPy, JAX) or numbers.

    Returns:
        The tree with its leaves as NumPy arrays: floating-point ones in float32, clipped to its range; integers of more
        than 32 bits in int32 (unsigned ones in uint32); the rest in their own dtype. PRNG keys are kept as they are.
    """
    def narrow(a):
        if jax.dtypes.issubdtype(getattr(a, "dtype", np.float64), jax.dtypes.prng_key):  # a key (NNX's Rngs)
            return a
        a = np.asarray(a)
        if a.dtype.kind == "f":  # beyond float32's range at its ends (an attention mask of float64's lowest value)
            limit = np.finfo(np.float32)
            return np.clip(a, limit.min, limit.max).astype(np.float32)
        if a.dtype.kind in "iu" and a.dtype.itemsize > 4:  # as JAX makes them without 64-bit types
            return a.astype(np.int32 if a.dtype.kind == "i" else np.uint32)
        return a
    return jax.tree_util.tree_map(narrow, tree)



def port_variant(run: Run, function, start: dict) -> dict:
    """float64: the port's program without its optimizer, run in float32 from the same start (64-bit types off, so
    that a dtype the port fixes to its inputs' computes in float32 too). Rounding error scales with the unit roundoff:
    the same summation orders and cancellations in float64 err 2⁻²⁹ times as much, so ``|JAX₃₂ − JAX₆₄| · 2⁻²⁹``
    estimates the port's own float64 error, XLA's sums included, as PyTorch's float32 run estimates PyTorch's.

    Args:
        run: the check's :class:`.run.Run` (the inputs and targets on the JAX side).
        function: the port's step without its optimizer, compiled or not.
        start: the float64 start; it, the inputs and the targets are narrowed to float32 first (:func:`narrowed`).

    Returns:
        The float32 program's outcome, fetched from the device (:func:`collected`).
    """
    start, inputs, targets = narrowed((start, run.jax_inputs, run.jax_targets))
    with jax.enable_x64(False), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Explicitly requested dtype float64")  # a dtype the port fixes
        warnings.filterwarnings("ignore", message="overflow encountered in cast")  # float64's finfo.min as a mask
        # the start as JAX arrays, as the float64 programs get it: a NumPy array in an NNX variable takes an update
        # written in place (``self.running_mean[...] = ...``) as NumPy's own, which a traced value cannot be
        start = jax.tree_util.tree_map(lambda a: jnp.asarray(a) if isinstance(a, np.ndarray) else a, start)
        return collected(run, lambda: function(start, inputs, targets, None))



def noise_program(programs: tuple[str, ...]) -> str:
    """The program whose float64 twin measures JAX's own float32 error: op by op where it runs (a fault of the
    compiler alone then never reads as rounding), else the compiled one.

    Args:
        programs: the programs the check runs (``"jit"``, ``"eager"``).

    Returns:
        ``"eager"`` where it is among ``programs``, else the first of them.
    """
    return "eager" if "eager" in programs else programs[0]



def run_program(run: Run, function, program: str, before: dict, opt_state, first: bool) -> dict:
    """One step of the port by ``function``; on the first call, a port that raises is a spec the checker cannot use.

    Args:
        run: the check's :class:`.run.Run`.
        function: the program's step, ``(variables, inputs, targets, opt_state) -> outcome``.
        program: ``"jit"`` or ``"eager"``, as the error message names it.
        before: the variables the step starts from.
        opt_state: the optimizer's state as the step starts, or None (made inside the step).
        first: the check's first run of the port: an exception it raises is said as a :class:`.spec.SpecError` (later,
            it propagates as it is).

    Returns:
        The step's outcome, fetched from the device (:func:`collected`).

    Raises:
        SpecError: the port's step raised on the ``first`` run (its type and first line said, with a hint where an
            Equinox port lacks ``PER_SAMPLE`` or inputs were moved channels-last by default), or it raised a SpecError
            while it was traced (raised again without JAX's note on its traceback).
    """
    trim()  # what the step's start and the previous program freed, handed back before this one allocates
    try:
        return collected(run, lambda: function(before, run.jax_inputs, run.jax_targets, opt_state))
    except SpecError as error:  # raised while JAX traced the step, which appends a note on its traceback filtering
        raise type(error)(str(error).split("\n-----")[0]) from error
    except Exception as error:
        if not first:
            raise
        hints = []
        if run.adapter.api == "Equinox" and not run.spec.per_sample:
            hints.append("an Equinox model that acts on one sample needs PER_SAMPLE = True")
        if run.adapter.channels_last and run.spec.to_jax is None and any(np.ndim(x) >= 3 for x in run.inputs):
            hints.append("its inputs of 3 or more dimensions were moved channels-last; to_jax says otherwise")
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        words = run.spec.words()
        raise SpecError(f"{words['port']} ({program_words((program,))}) failed on {words['inputs']}: "
                        f"{type(error).__name__}: {message}" + (f" ({'; '.join(hints)})" if hints else "")) from error



def float64_twin(run: Run, function, make_before: Callable[[], dict], compile_first: bool = False) -> dict:
    """A program's step without its optimizer, in float64 from the same start (PyTorch64's parameters and buffers, made
    by ``make_before``), for JAX's own float32 error up to the gradients. ``compile_first`` (a jitted ``function``):
    compiled before its start is made, from the shapes of a start made and let go first, so that XLA's compilation
    does not run beside the start's float64 parameters (GPT-2's: 1 GB).

    Args:
        run: the check's :class:`.run.Run` (the inputs and targets, widened to float64).
        function: the program's step without its optimizer (jitted where ``compile_first``).
        make_before: makes the float64 start; called twice where ``compile_first``.
        compile_first: compile ``function`` from the start's shapes before the start it runs from is made.

    Returns:
        The float64 outcome, fetched from the device (:func:`collected`).
    """
    with jax.enable_x64(True):
        inputs, targets = floats_in((run.jax_inputs, run.jax_targets), jnp.float64)
        if compile_first:
            before = make_before()
            shapes = jax.eval_shape(lambda: before)
            del before
            with apis.nested_outputs():  # traced as collected runs it: layers inside the port's own scans leave
                function = function.lower(shapes, inputs, targets, None).compile()
            trim()
        before = make_before()
        return collected(run, lambda: function(before, inputs, targets, None))



def float64_update(optimizer):
    """The port's optimizer step in float64 fed the float32 program's own gradients, from the same parameters and
    optimizer state, ``(params, grads, opt_state) -> {"params": ...}``: the update stage's float64 twin. Fed the
    float64 twin's gradients instead, Adam would turn a gradient that is zero but for rounding (a key bias under
    softmax: 1e-19 in float64, 1e-9 in float32) into steps of different size, and a wrong update of 1% there would
    read as rounding. Compiled once per check; the float32 parameters, gradients and state are widened inside the
    compiled step, where XLA fuses the conversions into the update (no float64 copy of them is held: 2 GB on a model
    of 124M parameters).

    Args:
        optimizer: the port's optax transformation.

    Returns:
        ``update(params, grads, opt_state) -> {"params": the parameters after the step, float64 NumPy arrays}``;
        ``opt_state`` None: the optimizer's initial state, made inside.
    """
    import optax

    @jax.jit
    def step(params, grads, opt_state):  # widened inside: no float64 copy of the parameters and gradients is kept
        params, grads, opt_state = floats_in((params, grads, opt_state), jnp.float64)
        if opt_state is None:
            opt_state = optimizer.init(params)
        updates, _ = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates)

    def update(params, grads, opt_state) -> dict:
        with jax.enable_x64(True):
            return {"params": jax.device_get(step(params, grads, opt_state))}

    return update



@contextlib.contextmanager
def bias_corrections_exact():
    """While in effect, optax's Adam-family bias corrections 1 − βᵗ are computed as −expm1(t · log β) (log β in Python's
    float64; the product and expm1 in the step's precision, float32 in a float32 check: two roundings, each within an
    ulp), which has no cancellation, not as float32's 1 − β^t, whose subtraction loses digits (PyTorch computes 1 − βᵗ
    in Python's float64)."""
    import math

    import optax

    original = optax.tree.bias_correction

    def exact(moment, decay, count):
        log_decay = math.log(decay) if isinstance(decay, (int, float)) else jnp.log(decay)
        correction = -jnp.expm1(jnp.asarray(count, jnp.float32) * log_decay)
        return jax.tree_util.tree_map(lambda t: t / correction.astype(t.dtype), moment)

    optax.tree.bias_correction = exact
    try:
        yield
    finally:
        optax.tree.bias_correction = original



def update_with_exact_bias_corrections(optimizer):
    """``(params, grads, opt_state) -> {"params": ...}``: the port's optimizer step, its bias corrections exact
    (:func:`bias_corrections_exact`), in the check's dtype.

    Args:
        optimizer: the port's optax transformation.

    Returns:
        ``update(params, grads, opt_state) -> {"params": the parameters after the step, fetched from the device}``;
        ``opt_state`` None: the optimizer's initial state.
    """
    import optax

    def update(params, grads, opt_state):
        with bias_corrections_exact():
            state = optimizer.init(params) if opt_state is None else opt_state
            updates, _ = optimizer.update(grads, state, params)
            return {"params": jax.device_get(optax.apply_updates(params, updates))}

    return update



def floats_in(tree, width):
    """``tree`` with its floating-point leaves in ``width`` (the rest as they are).

    Args:
        tree: a pytree of arrays or numbers.
        width: the floating-point dtype, such as ``jnp.float64``.

    Returns:
        The tree, its floating-point leaves as JAX arrays of ``width``, the others unchanged.
    """
    return jax.tree_util.tree_map(
        lambda a: jnp.asarray(a, width) if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating) else a, tree)



def collected(run: Run, call) -> dict:
    """A program's outcome fetched from the device, with the outputs of the layers the port runs inside its own
    transformations (which leave through callbacks while it runs) assembled into its per-layer outputs.

    Args:
        run: the check's :class:`.run.Run` (PyTorch's layer shapes and the port's path of each layer).
        call: runs the program, with no arguments, and returns its outcome (a dict with ``layers``).

    Returns:
        The outcome as NumPy arrays (``jax.device_get``), its ``layers`` completed with the nested layers' outputs.
    """
    with apis.nested_outputs() as nested:
        outcome = jax.device_get(call())
    if nested:
        expected = {path: run.layer_shapes[name] for name, path in run.layer_paths.items() if name in run.layer_shapes}
        found = apis.assemble_nested(nested, expected)
        outcome["layers"] = {**found, **outcome["layers"]}
    return outcome



def start_of_step(run: Run, width, own: dict | None, state: dict | None = None) -> dict:
    """The variables a step of the port starts from: PyTorch64's parameters (in ``width``; read from the reference,
    or from ``state``, its state_dict as the step started), and the port's own state after its previous step (``own``;
    on the first step, the statistics PyTorch starts from and the port's initial state).

    Args:
        run: the check's :class:`.run.Run` (its reference model, pairing and the port's variables).
        width: the floating-point dtype of the parameters and of the port's own state.
        own: the port's own state after its previous step (``batch_stats``, ``carry``), or None at the first step.
        state: PyTorch64's state_dict as the step started; None reads the reference model as it is.

    Returns:
        The port's variables: ``params``, PyTorch64's moved by the pairing; ``batch_stats``, PyTorch64's at the first
        step, else the port's own; and ``carry``.
    """
    start = variables_from_torch(run.sides["ref"][0] if state is None else state, run.pairings, run.adapter.variables,
                                 width)
    if own is None:
        return {**start, "carry": run.adapter.carry}
    return {**start, "batch_stats": floats_in(own["batch_stats"], width), "carry": floats_in(own["carry"], width)}



def first_narrow(outcome: dict, run: Run) -> tuple[str, str] | None:
    """(where, dtype) of the first floating-point value of the float64 twin's outcome that is not float64 (its layers
    in PyTorch's order, its output, its gradients), or None.

    Args:
        outcome: the float64 twin's outcome.
        run: the check's :class:`.run.Run` (the port's path of each of PyTorch's layers).

    Returns:
        ``(where, the dtype's name)``, ``where`` a PyTorch layer's name, ``"its output"`` or ``"its gradients"``; or
        None.
    """
    places = [(name or "(model)", outcome["layers"].get(path)) for name, path in run.layer_paths.items()]
    places += [("its output", outcome["output"]), ("its gradients", outcome.get("grads"))]
    for where, value in places:
        for leaf in jax.tree_util.tree_leaves(value):
            kind = np.dtype(getattr(leaf, "dtype", np.float64))
            if np.issubdtype(kind, np.floating) and kind != np.float64:
                return where, str(kind)
    return None



def unshared(tree, beside=None):
    """``tree`` with each array that it holds twice copied at its later places (an optimizer's init may give its first
    and second moments one zeros array), and each that ``beside`` holds (the parameters an init may keep as they are):
    each leaf a buffer of its own, which a donated argument needs.

    Args:
        tree: a pytree of JAX arrays (an optimizer's state).
        beside: a pytree whose arrays ``tree`` must not share (the parameters), or None.

    Returns:
        ``tree``, each array already met (earlier in ``tree``, or in ``beside``) replaced by a copy of its own.
    """
    seen = {id(leaf) for leaf in jax.tree_util.tree_leaves(beside)}

    def own(leaf):
        if id(leaf) in seen:
            return jnp.array(leaf, copy=True)
        seen.add(id(leaf))
        return leaf

    return jax.tree_util.tree_map(own, tree)



class CompiledStep:
    """The compiled step as check_port runs it: ``(variables, inputs, targets, opt_state) -> outcome``, with the
    variables' parameters (made for the step from PyTorch's, read by nothing after it) donated where an optimizer
    steps them: the new parameters are written into their buffers. The optimizer's state of a first step is made after
    the program is compiled (XLA's compilation of GPT-2's float64 step holds most of a gigabyte while it runs, not
    beside Adam's two moments) and, with ``donate_fresh_state`` (a large model's: :class:`.memory.MemoryPolicy`),
    donated too, the new state written into its buffers; without it, the later steps run the first step's program,
    compiled once. Donation changes where outputs are written, not what is computed: the reports are the same number
    for number. The step returns its new state at the last step too (nothing reads it): a program without that output
    is fused otherwise, and its update rounds otherwise (Adam's steps on near-zero gradients moved by up to 1e-3 of
    their size in the example ports). Each variant is compiled once per check, for the inputs' shapes and dtypes."""

    def __init__(self, step, optimizer, donate_fresh_state: bool = True):
        def apart(params, rest, inputs, targets, opt_state):
            return step({**rest, "params": params}, inputs, targets, opt_state)

        params = (0,) if optimizer is not None else ()  # without an optimizer no new parameters come out to take them
        self.jitted = {donated: jax.jit(apart, donate_argnums=params + ((4,) if donated else ()))
                       for donated in (False, True)}
        self.donate_fresh_state = donate_fresh_state
        self.compiled = {}

    def with_state(self, make_state: Callable | None):
        """The step's function; ``make_state``: the optimizer's state made for this step (else the state is given).

        Args:
            make_state: makes the optimizer's state for this step (its first), called once the program is compiled;
                None: the state is the ``opt_state`` given to the returned function.

        Returns:
            ``call(variables, inputs, targets, opt_state) -> outcome`` (on the device, not fetched), compiled on its
            first call for each signature of its arguments; with ``make_state``, its ``opt_state`` argument is not read.
        """

        def call(variables, inputs, targets, opt_state):
            params = variables["params"]
            rest = {key: value for key, value in variables.items() if key != "params"}
            fresh = make_state is not None
            donated = fresh and self.donate_fresh_state
            state_shapes = jax.eval_shape(make_state) if fresh else opt_state
            key = (donated, _signature((params, rest, inputs, targets, state_shapes)))
            if key not in self.compiled:
                self.compiled[key] = self.jitted[donated].lower(params, rest, inputs, targets, state_shapes).compile()
            if fresh:
                opt_state = unshared(make_state(), beside=params)
            trim()  # what the start's conversion and the compilation freed, handed back before the program's buffers
            return self.compiled[key](params, rest, inputs, targets, opt_state)

        return call


def _signature(tree) -> tuple:
    """What a compiled program is specialised to: ``tree``'s structure and each leaf's shape, dtype and weak type."""
    leaves, structure = jax.tree_util.tree_flatten(tree)
    return structure, tuple((np.shape(leaf), str(getattr(leaf, "dtype", type(leaf))), getattr(leaf, "weak_type", None))
                            for leaf in leaves)



@contextlib.contextmanager
def fast_variance_off():
    """While in effect, Flax's BatchNorm, LayerNorm and GroupNorm (Linen and NNX) compute the variance as PyTorch does,
    the mean subtracted first (``use_fast_variance=False``), whatever the port built them with: the counterfactual
    that verifies the cause before the report names it."""
    patched = []
    for name in ("flax.linen.normalization", "flax.nnx.nn.normalization"):
        module = sys.modules.get(name)
        if module is None or not hasattr(module, "_compute_stats"):
            continue
        original = module._compute_stats

        def exact(*args, _original=original, **kwargs):
            kwargs["use_fast_variance"] = False
            return _original(*args, **kwargs)

        module._compute_stats = exact
        patched.append((module, original))
    try:
        yield
    finally:
        for module, original in patched:
            module._compute_stats = original
