"""The frames around a node: what encloses code, as the one walk of the file index sees it.

A *stack* is the tuple of frames from the module down to the code: functions, classes, loop
bodies, `with` bodies and the kinds of `if` body that the training-loop questions need (a
periodic `if step % N == 0:` guard, the `__main__` guard, an `isinstance(v, torch.Tensor)` test,
a branch on one pass of a loop `if i == 0:`, a module's inference branch `if not self.training:`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import libcst as cst

from speedfix.syntax.deadline import tick


class FrameKind(Enum):
    FUNCTION = "function"
    CLASS = "class"
    LOOP = "loop"
    GUARD = "guard"  # body of a periodic `if step % N == 0:`
    MAIN = "main"  # body of `if __name__ == "__main__":`
    WITH = "with"
    # body of `if isinstance(v, torch.Tensor):` in a helper (`v = v.item()` in a logger's
    # update()): it runs on every step only if the caller passes tensors, which the call shows
    TYPE_GUARD = "type_guard"
    # body of `if i == 0:` or `if i == len(loader) - 1:` with `i` its loop's counter: one pass of
    # that loop (the first or last step, once per epoch)
    ONCE = "once"
    # body of `if not self.training:` or `else:` of `if self.training:`: a module in eval mode
    # (inference), never part of a training step
    INFERENCE = "inference"


@dataclass(frozen=True, slots=True)
class Frame:
    kind: FrameKind
    node: cst.CSTNode


Stack = tuple[Frame, ...]


def class_of_method(stack: Stack) -> cst.ClassDef | None:
    """The class a method is defined in (the frame right outside the innermost function)."""
    for index in range(len(stack) - 1, -1, -1):
        if stack[index].kind is FrameKind.FUNCTION:
            outer = stack[index - 1] if index > 0 else None
            if outer is not None and outer.kind is FrameKind.CLASS and isinstance(outer.node, cst.ClassDef):
                return outer.node
            return None
    return None


def function_of(stack: Stack) -> cst.CSTNode | None:
    tick()
    for frame in reversed(stack):
        if frame.kind is FrameKind.FUNCTION:
            return frame.node
    return None


def class_of(stack: Stack) -> cst.ClassDef | None:
    """The innermost class around code at ``stack`` (its methods included)."""
    for frame in reversed(stack):
        if frame.kind is FrameKind.CLASS and isinstance(frame.node, cst.ClassDef):
            return frame.node
    return None


def nearest_loop(stack: Stack) -> cst.CSTNode | None:
    """The innermost loop around ``stack`` within the same function."""
    tick()
    for frame in reversed(stack):
        if frame.kind is FrameKind.LOOP:
            return frame.node
        if frame.kind in (FrameKind.FUNCTION, FrameKind.CLASS):
            return None
    return None


def enclosing_loops(stack: Stack) -> list[cst.CSTNode]:
    return [frame.node for frame in stack if frame.kind is FrameKind.LOOP]


def in_main_guard(stack: Stack) -> bool:
    return any(frame.kind is FrameKind.MAIN for frame in stack)


def at_module_level(stack: Stack) -> bool:
    return not any(frame.kind in (FrameKind.FUNCTION, FrameKind.CLASS) for frame in stack)


def in_inference_branch(stack: Stack) -> bool:
    """Is code at ``stack`` in a module's eval-mode branch (`if not self.training:`)?"""
    return any(frame.kind is FrameKind.INFERENCE for frame in stack)
