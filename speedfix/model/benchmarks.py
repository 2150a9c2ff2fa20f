"""Code that times a layer instead of training a model: a micro-benchmark.

A research repository often keeps, beside its model, functions that measure a layer's speed and
memory (Pyraformer's `test_NSA(args, input_len)`: a layer, an optimizer and a constant input made
on the spot, a clock read, a thousand forward and backward passes, the time per pass printed).
Their loops step an optimizer, so they look like training; but what runs there is the measurement
the author wants, in the precision the author chose, on inputs that never change. Advice about
them (autocast, TF32, where the input is made) would change what is measured, not speed up a run.

A top-level function is taken for one when all of these hold: a step loop of the function counts
passes over `range(...)`, a clock is read before that loop and again after it (`time.time()`,
`time.perf_counter()`, `timeit.default_timer()`, a CUDA event), and the
function makes tensors with torch's factories (`torch.ones`, `torch.randn`, ...), its synthetic
input. A loop over a loader or a dataset is never one.
"""

from __future__ import annotations

import libcst as cst

from speedfix.model.context import FileContext
from speedfix.model.frames import FrameKind
from speedfix.model.index import CallSite
from speedfix.syntax.names import dotted_name

_CLOCKS = frozenset({"time.time", "time.perf_counter", "time.monotonic", "time.process_time", "timeit.default_timer",
                     "time.time_ns", "time.perf_counter_ns", "torch.cuda.Event"})
_FACTORIES = frozenset({"torch.ones", "torch.zeros", "torch.randn", "torch.rand", "torch.randint", "torch.full",
                        "torch.empty", "torch.ones_like", "torch.zeros_like", "torch.randn_like", "torch.rand_like"})


def micro_benchmarks(ctx: FileContext) -> dict[int, str]:
    """The top-level functions of the file that time a layer on inputs they make (see the module
    docstring): index in the module's body -> name."""
    if not ctx.step_loops or not any(name in _CLOCKS for name in ctx.calls_by_qualname):
        return {}
    by_function: dict[int, list[tuple[int, CallSite]]] = {}  # a top-level function's calls, in file order
    for index, site in enumerate(ctx.calls):
        outer = site.stack[0].node if site.stack and site.stack[0].kind is FrameKind.FUNCTION else None
        if outer is not None:
            by_function.setdefault(id(outer), []).append((index, site))
    found: dict[int, str] = {}
    for index, statement in enumerate(ctx.module.body):
        sites = by_function.get(id(statement))
        if isinstance(statement, cst.FunctionDef) and sites and _times_a_layer(ctx, statement, sites):
            found[index] = statement.name.value
    return found


def _times_a_layer(ctx: FileContext, function: cst.FunctionDef, sites: list[tuple[int, CallSite]]) -> bool:
    clocks = [index for index, site in sites if ctx.call_qualname(site) in _CLOCKS]
    if len(clocks) < 2 or not any(ctx.call_qualname(site) in _FACTORIES for _, site in sites):
        return False
    for loop in ctx.step_loops:
        info = ctx.loops.get(loop)
        if info is None or not info.stack or info.stack[0].node is not function or not _counts(info.iter):
            continue
        inside = [index for index, site in sites if any(frame.node is loop for frame in site.stack)]
        if inside and min(clocks) < min(inside) and max(clocks) > max(inside):
            return True
    return False


def _counts(iterable: cst.BaseExpression | None) -> bool:
    """`range(1000)`, `range(repeat_times)`: passes counted, no data read."""
    return isinstance(iterable, cst.Call) and dotted_name(iterable.func) == "range"
