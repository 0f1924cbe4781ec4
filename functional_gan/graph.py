"""Pictures of the graph: a jaxpr drawn with its stop_gradient cut, beside PyTorch's autograd graph.

What PyTorchViz does for PyTorch, for JAX: :func:`jaxpr_to_dot` draws the equations of a traced
function and marks the cut. An equation is *cut* when every path from it to the output passes
through ``stop_gradient``: it still runs in the forward pass, but no gradient flows back through
it. Cut equations are grey and dashed, ``stop_gradient`` is red, and inputs that receive no
gradient are grey. :func:`torch_graph_to_dot` walks ``grad_fn`` / ``next_functions`` from a
PyTorch result, as PyTorchViz does (it needs no torch import: it walks the objects it is given).
DOT is always written; SVG and PNG too when Graphviz's ``dot`` is on the PATH. The pictures
``functional-gan graph`` draws are in :mod:`functional_gan.lessons.pictures`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Sequence

import jax
from jax.extend import core as jex_core

CUT_PRIMITIVES = ("stop_gradient",)


def _eqn_label(eqn) -> str:
    name = eqn.primitive.name
    params = eqn.params
    if name in ("pjit", "jit", "closed_call", "core_call") and "name" in params:
        return f"{name}[{params['name']}]"
    if name.startswith("custom_vjp_call") or name.startswith("custom_jvp_call"):
        inner = params.get("call_jaxpr") or params.get("jvp_jaxpr_fun") or params.get("fun_jaxpr")
        source = getattr(getattr(getattr(inner, "jaxpr", None), "debug_info", None), "func_src_info", None) or ""
        return f"{name}[{source.split(' at ')[0] or 'custom'}]"
    if name == "conv_general_dilated":
        return f"conv (stride {params['window_strides']}, lhs_dil {params['lhs_dilation']})"
    return name


def _shape(var) -> str:
    aval = var.aval
    return f"{aval.dtype}{list(aval.shape)}" if hasattr(aval, "shape") else str(aval)


def gradient_flow(jaxpr) -> tuple[set[int], set[int]]:
    """(indices of equations a gradient flows through, indices of input vars that receive one).

    Walks back from the outputs; a ``stop_gradient`` equation is reached but not passed.
    """
    producer = {}
    for index, eqn in enumerate(jaxpr.eqns):
        for var in eqn.outvars:
            producer[var] = index
    live_eqns: set[int] = set()
    live_vars = set()
    stack = [v for v in jaxpr.outvars if not isinstance(v, jex_core.Literal)]
    while stack:
        var = stack.pop()
        if var in live_vars:
            continue
        live_vars.add(var)
        if var not in producer:
            continue
        index = producer[var]
        eqn = jaxpr.eqns[index]
        if eqn.primitive.name in CUT_PRIMITIVES:
            continue  # the cut: the gradient stops here
        live_eqns.add(index)
        stack.extend(v for v in eqn.invars if not isinstance(v, jex_core.Literal))
    live_inputs = {i for i, v in enumerate(jaxpr.invars) if v in live_vars}
    return live_eqns, live_inputs


def _ancestors(jaxpr) -> set[int]:
    """Indices of the equations the outputs depend on at all (through stop_gradient too)."""
    producer = {var: index for index, eqn in enumerate(jaxpr.eqns) for var in eqn.outvars}
    needed: set[int] = set()
    stack = [v for v in jaxpr.outvars if not isinstance(v, jex_core.Literal)]
    seen = set()
    while stack:
        var = stack.pop()
        if var in seen or var not in producer:
            continue
        seen.add(var)
        needed.add(producer[var])
        stack.extend(v for v in jaxpr.eqns[producer[var]].invars if not isinstance(v, jex_core.Literal))
    return needed


def jaxpr_to_dot(closed_jaxpr, input_names: Sequence[str] | None = None, title: str = "", mark_cut: bool = True) -> str:
    """DOT source for a (closed) jaxpr, with the stop_gradient cut marked when ``mark_cut``.

    Equations whose results never reach an output (dead code, such as running-statistics updates
    a loss discards) are left out.
    """
    jaxpr = closed_jaxpr.jaxpr
    live_eqns, live_inputs = gradient_flow(jaxpr) if mark_cut else (set(range(len(jaxpr.eqns))), set(range(len(jaxpr.invars))))
    needed = _ancestors(jaxpr)
    names = list(input_names or [])
    lines = ["digraph jaxpr {", '  rankdir=TB; node [fontname="Helvetica", fontsize=10];']
    if title:
        lines.append(f'  labelloc="t"; label="{title}";')
    source = {}
    for i, var in enumerate(jaxpr.invars):
        label = names[i] if i < len(names) else f"in{i}"
        live = i in live_inputs
        style = 'style=filled, fillcolor="lightblue"' if live else 'style="filled,dashed", fillcolor="gray90", fontcolor="gray40"'
        suffix = "" if live else "\\n(no gradient)"
        lines.append(f'  in{i} [shape=box, {style}, label="{label}\\n{_shape(var)}{suffix}"];')
        source[var] = f"in{i}"
    used_vars = {v for i in needed for v in jaxpr.eqns[i].invars if not isinstance(v, jex_core.Literal)}
    for i, var in enumerate(jaxpr.constvars):
        if var in used_vars:
            lines.append(f'  const{i} [shape=box, style=filled, fillcolor="gray95", label="const\\n{_shape(var)}"];')
            source[var] = f"const{i}"
    for index, eqn in enumerate(jaxpr.eqns):
        if index not in needed:
            continue
        node = f"e{index}"
        if eqn.primitive.name in CUT_PRIMITIVES:
            attrs = 'shape=octagon, style=filled, fillcolor="red", fontcolor="white", penwidth=2'
            label = "stop_gradient\\n(cut)"
        elif index in live_eqns:
            attrs = 'shape=ellipse, style=filled, fillcolor="palegreen"'
            label = _eqn_label(eqn)
        else:
            attrs = 'shape=ellipse, style="filled,dashed", fillcolor="gray90", fontcolor="gray40", color="gray60"'
            label = _eqn_label(eqn) + "\\n(no gradient flows)"
        lines.append(f'  {node} [{attrs}, label="{label}"];')
        for var in eqn.invars:
            if isinstance(var, jex_core.Literal) or var not in source:
                continue
            if eqn.primitive.name in CUT_PRIMITIVES:
                edge = '[color="red", style=dashed, penwidth=2, label="✂"]'
            elif index in live_eqns:
                edge = ""
            else:
                edge = '[color="gray60", style=dashed]'
            lines.append(f"  {source[var]} -> {node} {edge};")
        for var in eqn.outvars:
            source[var] = node
    for i, var in enumerate(jaxpr.outvars):
        lines.append(f'  out{i} [shape=doubleoctagon, style=filled, fillcolor="gold", label="output\\n{_shape(var)}"];')
        if not isinstance(var, jex_core.Literal) and var in source:
            lines.append(f"  {source[var]} -> out{i};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def torch_graph_to_dot(output, params: dict | None = None, title: str = "") -> str:
    """DOT source of PyTorch's autograd graph behind ``output`` (a walk of ``grad_fn``, as PyTorchViz).

    ``params`` maps names to leaf tensors so that their ``AccumulateGrad`` nodes carry the names.
    """
    names = {id(p): n for n, p in (params or {}).items()}
    lines = ["digraph autograd {", '  rankdir=BT; node [fontname="Helvetica", fontsize=10];']
    if title:
        lines.append(f'  labelloc="t"; label="{title}";')
    lines.append(f'  out [shape=doubleoctagon, style=filled, fillcolor="gold", label="output\\n{list(output.shape)}"];')
    if output.grad_fn is None:
        lines.append('  none [shape=box, label="grad_fn = None\\n(no graph: nothing to differentiate)"];')
        lines.append("  none -> out;")
        return "\n".join(lines + ["}"]) + "\n"
    seen = set()
    stack = [output.grad_fn]
    lines.append(f"  n{id(output.grad_fn)} -> out;")
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if hasattr(fn, "variable"):
            var = fn.variable
            label = f"{names.get(id(var), 'leaf')}\\n{list(var.shape)}"
            lines.append(f'  n{id(fn)} [shape=box, style=filled, fillcolor="lightblue", label="{label}"];')
        else:
            lines.append(f'  n{id(fn)} [shape=ellipse, style=filled, fillcolor="lightgray", label="{type(fn).__name__}"];')
        for child, _ in fn.next_functions:
            if child is not None:
                lines.append(f"  n{id(child)} -> n{id(fn)};")
                stack.append(child)
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_dot(dot_source: str, path: Path, formats: Sequence[str] = ("svg", "png")) -> list[Path]:
    """Write ``path`` (.dot) and, when Graphviz is installed, the rendered formats beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dot_source)
    written = [path]
    dot = shutil.which("dot")
    if dot:
        for fmt in formats:
            target = path.with_suffix(f".{fmt}")
            subprocess.run([dot, f"-T{fmt}", str(path), "-o", str(target)], check=True, timeout=300)
            written.append(target)
    return written
