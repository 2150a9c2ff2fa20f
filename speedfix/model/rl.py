"""Reinforcement learning as scripts write it: environments, acting and replay buffers.

An RL script trains in a loop that steps an environment (`env.step(action)`), picks each action
with the policy (in the loop, or in an `act`/`select_action` method), and samples its training
batches from a replay buffer (`buffer.sample(batch_size)`), not from a DataLoader. Code in those
places runs once per environment step or per update, as often as a training step: what costs
there (a tensor made on the CPU and copied over, a graph recorded for an action) costs every step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.context import FileContext
from speedfix.model.frames import FrameKind, Stack
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import walk_expression

_BUFFER_CLASS = re.compile(r"buffer|replay|memory|storage|rollout", re.IGNORECASE)
_BUFFER_NAME = re.compile(r"buffer$|^(replay_)?memory$|^replay$", re.IGNORECASE)
# numpy allocations a buffer keeps its storage in (`self.state = np.zeros((max_size, state_dim))`)
_HOST_ALLOCATIONS = frozenset(f"numpy.{name}" for name in ("zeros", "empty", "ones", "full"))


def reads_replay_buffer(ctx: FileContext, dataset: cst.BaseExpression | None, stack: Stack) -> bool:
    """A Dataset built over a replay buffer (`RLDataset(self.buffer, sample_size)`, Lightning's DQN):
    training fills the buffer as it goes, and worker processes, each with a copy taken when it
    started, would sample stale experience. Such a loader belongs in the main process."""
    name = dotted_name(dataset) if dataset is not None else None
    call = dataset if isinstance(dataset, cst.Call) else ctx.single_value(name, stack) if name else None
    return isinstance(call, cst.Call) and any(
        _BUFFER_NAME.search((dotted_name(arg.value) or "").rsplit(".", 1)[-1]) for arg in call.args)


def is_env_step(func: cst.BaseExpression) -> bool:
    """`env.step(action)`, `envs.step(...)`, `self.env.step(...)`: an environment's step."""
    if not isinstance(func, cst.Attribute) or func.attr.value != "step":
        return False
    return "env" in (dotted_name(func.value) or "").rsplit(".", 1)[-1].lower()


def is_acting_function(function: cst.CSTNode | None) -> bool:
    """`act`, `select_action`, `get_action`, `sample_action`: a policy picking an action, one
    that returns it (not `set_action_std`, which only changes a setting)."""
    if not isinstance(function, cst.FunctionDef):
        return False
    words = function.name.value.lower().split("_")
    return ("act" in words or "action" in words) and any(
        isinstance(node, cst.Return) and node.value is not None for node in walk_expression(function.body))


def is_buffer_sampler(stack: Stack) -> bool:
    """`ReplayBuffer.sample()`: a method that draws a training batch from a replay buffer."""
    function = class_node = None
    for frame in reversed(stack):
        if frame.kind is FrameKind.FUNCTION and function is None:
            function = frame.node
        elif frame.kind is FrameKind.CLASS and function is not None:
            class_node = frame.node
            break
    if not isinstance(function, cst.FunctionDef) or not isinstance(class_node, cst.ClassDef):
        return False
    return function.name.value.startswith(("sample", "get_batch")) and bool(_BUFFER_CLASS.search(class_node.name.value))


def in_rollout(ctx: FileContext, stack: Stack) -> bool:
    """Does code at ``stack`` run once per environment step or per update: in a loop that steps
    an environment, in a policy's acting method, or in a replay buffer's `sample`?"""
    if is_acting_function(ctx.function_of(stack)) or is_buffer_sampler(stack):
        return True
    loops = {frame.node for frame in stack if frame.kind is FrameKind.LOOP}
    return bool(loops) and any(loop in loops for loop in _env_loops(ctx))


def _env_loops(ctx: FileContext) -> set[cst.CSTNode]:
    """Loops with an environment step in them (nested loops included)."""
    found = _ENV_LOOPS.get(ctx)
    if found is None:
        found = _ENV_LOOPS[ctx] = {
            frame.node for site in ctx.calls if is_env_step(site.node.func)
            for frame in site.stack if frame.kind is FrameKind.LOOP
        }
    return found


_ENV_LOOPS: WeakKeyDictionary[FileContext, set[cst.CSTNode]] = WeakKeyDictionary()


def trains_between_env_steps(ctx: FileContext) -> bool:
    """Does every training step of the file run between an environment's steps: its step loop
    steps an environment too (cleanrl's DQN), or sits in a function that another file's loop
    calls between rollouts (`agent.update(rollouts)` of an A2C/PPO script: ``Links.env_updates``)?
    Such a run waits on the simulator and trains a small policy on small batches: the GPU is
    not what it waits for."""
    found = _BETWEEN_ENV_STEPS.get(ctx)
    if found is None:
        found = _BETWEEN_ENV_STEPS[ctx] = _between_env_steps(ctx)
    return found


def _between_env_steps(ctx: FileContext) -> bool:
    loops, functions = ctx.step_loops, ctx.step_functions
    if not loops and not functions:
        return False
    env_loops = _env_loops(ctx)
    updates = set(ctx.links.env_updates) if ctx.links is not None else set()
    methods = set(ctx.links.env_methods) if ctx.links is not None else set()  # on an agent a config builds
    if not env_loops and not updates and not methods:
        return False
    stacks = [site.stack for site in ctx.calls if any(frame.node in loops or frame.node in functions for frame in site.stack)]
    return bool(stacks) and all(
        any(frame.node in env_loops for frame in stack) or _function_name(stack) in updates
        or _run_by_env_method(ctx, stack, methods) for stack in stacks)


def _run_by_env_method(ctx: FileContext, stack: Stack, methods: set[str]) -> bool:
    """Is code at ``stack`` in a method of those names, or in one that such a method of the file
    calls (SAC's `update()` running `update_critic()` and `update_actor()`)?"""
    function = ctx.function_of(stack)
    if not isinstance(function, cst.FunctionDef) or not methods or ctx.class_of(stack) is None:
        return False
    return function.name.value in methods or any(
        isinstance(caller := ctx.function_of(site.stack), cst.FunctionDef) and caller.name.value in methods
        for site in ctx.local_callers(function))


def _function_name(stack: Stack) -> str | None:
    """`Class.method` or `function` of the outermost function around ``stack`` (as the project
    facts name them)."""
    owner = None
    for frame in stack:
        if frame.kind is FrameKind.CLASS and isinstance(frame.node, cst.ClassDef):
            owner = frame.node.name.value
        elif frame.kind is FrameKind.FUNCTION and isinstance(frame.node, cst.FunctionDef):
            return f"{owner}.{frame.node.name.value}" if owner else frame.node.name.value
    return None


_BETWEEN_ENV_STEPS: WeakKeyDictionary[FileContext, bool] = WeakKeyDictionary()


@dataclass(frozen=True)
class HostBuffer:
    """A replay buffer class that keeps its storage in numpy arrays it allocates."""

    name: str
    arrays: frozenset[str]  # `state` for `self.state = np.zeros((max_size, state_dim))` in `__init__`
    writers: frozenset[str]  # its methods that write single rows: `self.state[self.ptr] = state`
    loaders: frozenset[str]  # its methods that replace the arrays whole: `self.state = dataset["observations"]`


def host_buffer(ctx: FileContext, class_name: str) -> HostBuffer | None:
    """The replay buffer class ``class_name`` of this file, when its storage is numpy arrays."""
    info = ctx.classes.get(class_name)
    if info is None or not _BUFFER_CLASS.search(class_name):
        return None
    arrays: set[str] = set()
    rows: set[tuple[str, str]] = set()  # (method, attribute) of `self.state[self.ptr] = state`
    whole: set[tuple[str, str]] = set()  # (method, attribute) of `self.state = ...` outside `__init__`
    for method in info.node.body.body:
        if not isinstance(method, cst.FunctionDef):
            continue
        for node in walk_expression(method.body):
            if not isinstance(node, cst.Assign):
                continue
            for target in node.targets:
                written = target.target.value if isinstance(target.target, cst.Subscript) else target.target
                name = dotted_name(written) or ""
                if not name.startswith("self.") or name.count(".") != 1:
                    continue
                if isinstance(target.target, cst.Subscript):
                    rows.add((method.name.value, name[5:]))
                elif method.name.value != "__init__":
                    whole.add((method.name.value, name[5:]))
                elif isinstance(node.value, cst.Call) and ctx.qualname(node.value.func) in _HOST_ALLOCATIONS:
                    arrays.add(name[5:])
    if not arrays:
        return None
    return HostBuffer(class_name, frozenset(arrays), frozenset(method for method, name in rows if name in arrays),
                      frozenset(method for method, name in whole if name in arrays))


def filled_once(ctx: FileContext, buffer: HostBuffer) -> bool:
    """Is the buffer loaded whole and never written row by row while training (an offline
    dataset: TD3+BC's `convert_D4RL`)? Yes when a scanned file calls one of its loaders on an
    object it builds and no file calls a row writer (``Links.methods_used``, or a call of that
    method's name here)."""
    used = {name.split(".", 1)[1] for name in (ctx.links.methods_used if ctx.links is not None else ())
            if name.split(".", 1)[0] == buffer.name}
    here = {(site.func or "").rsplit(".", 1)[-1] for site in ctx.calls if "." in (site.func or "")}
    # a row writer the buffer itself calls (`self.add(...)` from `add_batch`) runs whenever its caller does
    return bool((used | here) & (buffer.loaders - buffer.writers)) and not (used | here) & buffer.writers


# A method that generates what the step then trains on: a language model's `generate(...)` (RLHF,
# GRPO), a rollout engine's `rollout(...)`, an agent's `collect_rollouts(...)`.
_GENERATION = re.compile(r"generate(?:_\w+)?|rollouts?|collect_rollouts?|sample_completions?")
_GENERATION_CALLS: WeakKeyDictionary[FileContext, str | None] = WeakKeyDictionary()


def generation_in_step(ctx: FileContext) -> str | None:
    """The call (as code, `rollout_engine.rollout(...)`) by which every training step of the file
    generates the samples it trains on, or None. Autoregressive decoding then takes most of the
    step, at lengths that change from step to step."""
    if ctx not in _GENERATION_CALLS:
        _GENERATION_CALLS[ctx] = next((f"{dotted_name(site.node.func)}(...)" for site in ctx.calls
                                       if isinstance(site.node.func, cst.Attribute) and dotted_name(site.node.func)
                                       and _GENERATION.fullmatch(site.node.func.attr.value) and ctx.is_hot(site.stack)), None)
    return _GENERATION_CALLS[ctx]
