"""Reinforcement learning as scripts write it: environments, acting and replay buffers.

An RL script trains in a loop that steps an environment (`env.step(action)`), picks each action
with the policy (in the loop, or in an `act`/`select_action` method), and samples its training
batches from a replay buffer (`buffer.sample(batch_size)`), not from a DataLoader. Code in those
places runs once per environment step or per update, as often as a training step: what costs
there (a tensor made on the CPU and copied over, a graph recorded for an action) costs every step.
"""

from __future__ import annotations

import re
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.context import FileContext
from speedfix.model.frames import FrameKind, Stack
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import walk_expression

_BUFFER_CLASS = re.compile(r"buffer|replay|memory|storage|rollout", re.IGNORECASE)
_BUFFER_NAME = re.compile(r"buffer$|^(replay_)?memory$|^replay$", re.IGNORECASE)


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
