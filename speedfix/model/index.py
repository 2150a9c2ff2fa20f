"""The file index: what one file says, recorded in the one batched walk that also runs the rules.

``FileIndex`` is the first visitor of the batch. While the tree is walked it records imports,
calls, assignments, loops, functions, classes and ``with`` blocks, each with the *stack* of
enclosing frames (``speedfix.model.frames``), the names each scope binds
(``speedfix.model.scopes``) and what the file mentions (CUDA, 16-bit dtypes). After the walk
it answers lookups: the qualified name of a call, the calls of a torch function, the value a
name certainly holds, the bases of a class. What the recorded code means for training is the
business of the modules above it (``speedfix.model.context`` for the training loops).

Rules record candidates during the walk and decide in ``Rule.finish()``, when the whole file is
known: a ``DataLoader`` may be created before the loop that proves the script trains on CUDA,
and an import may follow its first use.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterator, Union

import libcst as cst

from speedfix.model.frames import (Frame, FrameKind, Stack, at_module_level, class_of, enclosing_loops, function_of,
                                   in_main_guard, nearest_loop)
from speedfix.model.scopes import NameBindings
from speedfix.model.project_files import ProjectFiles
from speedfix.model.versions import TorchVersion
from speedfix.project.facts import IMPORT_MODULE, imported_by_name
from speedfix.project.linker import Links
from speedfix.project.steps import CUDA_ATTRIBUTES, CUDA_DEVICE_HELPERS, CUDA_OBJECTS, is_iterable_wrapper
from speedfix.syntax.names import ImportTable, dotted_name, line_binds
from speedfix.syntax.nodes import is_main_guard, parameter_default, target_names, walk_expression
from speedfix.syntax.walk import Visitor

Loop = Union[cst.For, cst.While]
FunctionNode = cst.FunctionDef


@dataclass(slots=True)
class CallSite:
    node: cst.Call
    func: str | None  # dotted name as written (`DL`, `torch.utils.data.DataLoader`, `opt.step`)
    stack: Stack
    statement: cst.SimpleStatementLine | None


@dataclass(slots=True)
class Assignment:
    target: str  # dotted: `model`, `self.model`
    value: cst.BaseExpression
    stack: Stack
    statement: cst.SimpleStatementLine | None
    unpacked: bool = False  # `x, y = value`: target is one element of value
    augmented: bool = False  # `x += value`
    position: int | None = None  # `x, y = value`: the target's place in a flat target tuple (`y`: 1)

    @property
    def part(self) -> cst.BaseExpression | None:
        """`x, y = a, b`: the element the target takes (`a`); None unless both sides are flat
        and of one length."""
        value = self.value
        if self.position is None or not isinstance(value, (cst.Tuple, cst.List)):
            return None
        elements = value.elements
        if any(isinstance(element, cst.StarredElement) for element in elements) or self.position >= len(elements):
            return None
        return elements[self.position].value


@dataclass(slots=True)
class LoopInfo:
    node: Loop
    stack: Stack  # frames enclosing the loop statement itself
    targets: tuple[str, ...]  # names bound by a `for` target
    iter: cst.BaseExpression | None


@dataclass(slots=True)
class FunctionInfo:
    node: FunctionNode
    name: str
    class_name: str | None
    stack: Stack


@dataclass(slots=True)
class ClassInfo:
    node: cst.ClassDef
    name: str
    bases: list[str]


@dataclass(slots=True)
class WithInfo:
    node: cst.With
    items: list[cst.BaseExpression]
    stack: Stack


_LOW_PRECISION = frozenset({"bfloat16", "float16", "half"})


def entered(item: cst.BaseExpression) -> cst.BaseExpression:
    """The context manager a `with` item enters: `a and b` is `b` (`with accelerator.accumulate(model)
    and torch.no_grad():` turns autograd off and accumulates nothing), `a or b` is `a`."""
    while isinstance(item, cst.BooleanOperation):
        item = item.right if isinstance(item.operator, cst.And) else item.left
    return item


# Code that runs every this many steps or more is no part of the training loop's cost: a call that
# costs a whole step (an `empty_cache()` with the allocations after it) is a thousandth of the run.
RARE_PERIOD = 1000


def _is_periodic_test(test: cst.BaseExpression, every_step: Callable[[cst.BaseExpression], bool]) -> bool:
    """`step % N == 0`, `not (i % N)`, `(i + 1) % N == 0 and ...`: logging, not the hot path.

    Only a modulo makes a guard periodic: `if rank == 0:` or `if verbose:` still run every step,
    and so does `if i % log_interval == 0:` with ``every_step`` saying N is 1 (`log_interval = 1`).
    """
    return any(
        isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo) and not every_step(node.right)
        for node in walk_expression(test)
    )


def runs_on_one_pass(test: cst.BaseExpression, is_counter: Callable[[str], bool]) -> bool:
    """`i == 0`, `i == len(loader) - 1`, `epoch == 0 and i == 0`: a loop's counter (as
    ``is_counter`` tells) compared for equality holds on one pass of its loop (a string is no
    count: `if phase == "train":` in `for phase in ("train", "val"):` picks a kind of pass)."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return runs_on_one_pass(test.left, is_counter) or runs_on_one_pass(test.right, is_counter)
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    if not isinstance(test.comparisons[0].operator, cst.Equal):
        return False
    sides = (test.left, test.comparisons[0].comparator)
    if any(isinstance(side, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)) for side in sides):
        return False
    return any(isinstance(side, cst.Name) and is_counter(side.value) for side in sides)


def training_flag(test: cst.BaseExpression) -> bool | None:
    """`self.training` (True) or `not self.training` (False): a module's train/eval mode, tested
    in its own methods; None for another test."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = training_flag(test.expression)
        return None if inner is None else not inner
    return True if dotted_name(test) == "self.training" else None


def _leaves(block: cst.BaseSuite, *, loops: bool = False) -> bool:
    """Does ``block`` end with `return` or `raise` (``loops``: or `continue`)?"""
    ends = (cst.Return, cst.Raise, cst.Continue) if loops else (cst.Return, cst.Raise)
    if isinstance(block, cst.SimpleStatementSuite):  # `if x: return`
        return bool(block.body) and isinstance(block.body[-1], ends)
    last = block.body[-1] if isinstance(block, cst.IndentedBlock) and block.body else None
    return isinstance(last, cst.SimpleStatementLine) and bool(last.body) and isinstance(last.body[-1], ends)


def _is_off_period_test(test: cst.BaseExpression, every_step: Callable[[cst.BaseExpression], bool]) -> bool:
    """A test that holds on the steps between two periodic ones: `step % N != 0`, `step % N`,
    `not step % N == 0`, or either side of an `or` (`if step % N or x is None: return`)."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
        return _is_off_period_test(test.left, every_step) or _is_off_period_test(test.right, every_step)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = test.expression
        return isinstance(inner, cst.Comparison) and len(inner.comparisons) == 1 \
            and isinstance(inner.comparisons[0].operator, cst.Equal) and _is_periodic_test(inner, every_step)
    if isinstance(test, cst.BinaryOperation):
        return isinstance(test.operator, cst.Modulo) and not every_step(test.right)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        operator, right = test.comparisons[0].operator, test.comparisons[0].comparator
        zero = isinstance(right, cst.Integer) and right.value == "0"
        left = test.left
        return zero and isinstance(operator, (cst.NotEqual, cst.GreaterThan)) and isinstance(left, cst.BinaryOperation) \
            and isinstance(left.operator, cst.Modulo) and not every_step(left.right)
    return False


def _is_tensor_type_test(test: cst.BaseExpression) -> bool:
    """`isinstance(v, torch.Tensor)`, `torch.is_tensor(v)`."""
    if not isinstance(test, cst.Call):
        return False
    name = dotted_name(test.func) or ""
    if name.endswith("is_tensor"):
        return True
    return name == "isinstance" and len(test.args) == 2 and (dotted_name(test.args[1].value) or "").endswith("Tensor")


class FileIndex(NameBindings, Visitor):
    """What one file says; also the indexing visitor that records it."""

    def __init__(
        self, module: cst.Module, path: str, torch_version: TorchVersion, links: Links | None = None,
        project: ProjectFiles | None = None,
    ) -> None:
        Visitor.__init__(self)
        NameBindings.__init__(self)
        self.module = module
        self.path = path
        self.torch_version = torch_version
        self.links = links or Links()  # what the other files of the scan tell this one
        # the project's configuration files, read inside the project only (None: none are read)
        self.project = project
        self.imports = ImportTable()
        self.imports.add_star_libraries(self.links.star_libraries)
        self.calls: list[CallSite] = []
        self.assignments: dict[str, list[Assignment]] = defaultdict(list)
        # `kw["num_workers"] = 4`: mutations of a dict that **kwargs resolution must respect
        self.item_assignments: dict[str, list[Assignment]] = defaultdict(list)
        self.loops: dict[cst.CSTNode, LoopInfo] = {}
        self.functions: dict[str, list[FunctionInfo]] = defaultdict(list)
        self.classes: dict[str, ClassInfo] = {}
        self.withs: list[WithInfo] = []
        self.module_imports: list[cst.SimpleStatementLine] = []  # top-level import lines
        self.import_lines: list[cst.SimpleStatementLine] = []  # every import line, any depth
        self.mentions_cuda = False
        self.mentions_low_precision = False  # torch.bfloat16/float16/half, "bf16-mixed", ...
        self.low_precision_at: list[tuple[cst.SimpleStatementLine | None, Stack]] = []  # where it is mentioned
        self._option_words: set[int] = set()  # strings naming or describing a command-line option
        self._quotes = {"'": 0, '"': 0}
        self.stack: Stack = ()
        self._statement: cst.SimpleStatementLine | None = None
        self._import_depth = 0
        self._framed_ifs: set[cst.If] = set()
        # periodic guards whose period the file does not state: (the `if`, its stack, the
        # divisors of its modulos), for the model to read as options (``flow.every_step_guards``)
        self.unstated_periods: list[tuple[cst.If, Stack, list[cst.BaseExpression]]] = []
        self._blocks: list[cst.IndentedBlock] = []  # the indented blocks around the code being visited
        self._eval_tails: list[cst.IndentedBlock] = []  # blocks whose rest is eval-mode code (see leave_If)

    # ------------------------------------------------------------------ indexing visitor
    def _push(self, kind: FrameKind, node: cst.CSTNode) -> None:
        self.stack = self.stack + (Frame(kind, node),)

    def _pop(self) -> None:
        self.stack = self.stack[:-1]

    def _flag_values(self, test: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
        """The values of the plain names a test of flags reads (`if epoch_eval or step_eval:`),
        each assigned once in the function around it (`step_eval = step % interval == 0`)."""
        parts = [test]
        while parts:
            part = parts.pop()
            if isinstance(part, cst.BooleanOperation):
                parts.extend((part.left, part.right))
            elif isinstance(part, cst.Name):  # (not through `not`: `if not log_now:` runs on most steps)
                here = function_of(self.stack)
                found = [a for a in self.assignments.get(part.value, ()) if function_of(a.stack) is here]
                if len(found) == 1 and not (found[0].unpacked or found[0].augmented):
                    yield found[0].value

    def _note_periods(self, guard: cst.If, tests: list[cst.BaseExpression]) -> None:
        """Keep a periodic guard's divisors unless the file states one of them (`step % 100`)."""
        divisors = [node.right for test in tests for node in walk_expression(test)
                    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo)]
        if all(self.period_of(divisor, self.stack) in (None, 1) for divisor in divisors):
            self.unstated_periods.append((guard, self.stack, divisors))

    def _is_one(self, divisor: cst.BaseExpression) -> bool:
        """A `step % 1 == 0` guard holds on every step (``period_of``)."""
        return self.period_of(divisor, self.stack) == 1

    def period_of(self, divisor: cst.BaseExpression, stack: Stack) -> int | None:
        """N of a `step % N` guard at ``stack`` where the file states it: a number, a
        module-level constant assigned once, above (`log_interval = 1`), or an attribute of the
        class set once from a parameter's default (`self.every = every` in `__init__(self,
        every=2000)`); None otherwise."""
        if isinstance(divisor, cst.Attribute) and dotted_name(divisor) is not None:
            owner = class_of(stack)
            found = [a for a in self.assignments.get(dotted_name(divisor) or "", ()) if class_of(a.stack) is owner]
            if len(found) != 1 or not isinstance(found[0].value, cst.Name):
                return None
            divisor = parameter_default(function_of(found[0].stack), found[0].value.value)
        elif isinstance(divisor, cst.Name):
            found = self.assignments.get(divisor.value, ())
            if len(found) != 1 or found[0].stack or found[0].unpacked or divisor.value in self.rebound_everywhere:
                return None
            divisor = found[0].value
        if isinstance(divisor, cst.Integer):
            try:
                return int(divisor.value.replace("_", ""), 0)
            except ValueError:
                return None
        return None

    def rare_guard(self, guard: cst.CSTNode, stack: Stack) -> bool:
        """Does a periodic guard (`if step % 2000 == 0:`, or `if step % N != 0: return` before
        the code) run what it guards every ``RARE_PERIOD`` steps or more, by a period the file
        states? Such code costs a thousandth or less of what it would on every step."""
        if not isinstance(guard, cst.If):
            return False
        periods = [self.period_of(node.right, stack) for node in walk_expression(guard.test)
                   if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo)]
        return any(period is not None and period >= RARE_PERIOD for period in periods)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._statement = node
        if any(type(s) is cst.Import or type(s) is cst.ImportFrom for s in node.body):
            self.import_lines.append(node)
            if not self.stack:
                self.module_imports.append(node)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self._statement = None

    def visit_Import(self, node: cst.Import) -> None:
        self.imports.add_import(node, module_level=not self._in_function())
        self._import_depth += 1

    def leave_Import(self, original_node: cst.Import) -> None:
        self._import_depth -= 1

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.imports.add_import_from(node, module_level=not self._in_function())
        self._import_depth += 1

    def leave_ImportFrom(self, original_node: cst.ImportFrom) -> None:
        self._import_depth -= 1

    @property
    def in_import(self) -> bool:
        return self._import_depth > 0

    def _in_function(self) -> bool:
        return any(frame.kind is FrameKind.FUNCTION for frame in self.stack)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        name = node.name.value
        owner = self.stack[-1].node if self.stack and self.stack[-1].kind is FrameKind.CLASS else None
        class_name = owner.name.value if isinstance(owner, cst.ClassDef) else None
        self.functions[name].append(FunctionInfo(node, name, class_name, self.stack))
        if not self.stack:
            self.imports.local_definitions.add(name)
        self._push(FrameKind.FUNCTION, node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        bases = [dotted_name(arg.value) or "" for arg in node.bases if arg.keyword is None]
        self.classes[node.name.value] = ClassInfo(node, node.name.value, bases)
        if not self.stack:
            self.imports.local_definitions.add(node.name.value)
        self._push(FrameKind.CLASS, node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._pop()

    def visit_For(self, node: cst.For) -> None:
        self.loops[node] = LoopInfo(node, self.stack, target_names(node.target), node.iter)

    def visit_For_body(self, node: cst.For) -> None:
        self._push(FrameKind.LOOP, node)

    def leave_For_body(self, node: cst.For) -> None:
        self._pop()

    def visit_While(self, node: cst.While) -> None:
        self.loops[node] = LoopInfo(node, self.stack, (), None)

    def visit_While_body(self, node: cst.While) -> None:
        self._push(FrameKind.LOOP, node)

    def leave_While_body(self, node: cst.While) -> None:
        self._pop()

    def visit_If_body(self, node: cst.If) -> None:
        if is_main_guard(node.test):
            self._push(FrameKind.MAIN, node)
        elif _is_periodic_test(node.test, self._is_one) or any(
                _is_periodic_test(value, self._is_one) for value in self._flag_values(node.test)):
            self._note_periods(node, [node.test, *self._flag_values(node.test)])
            self._push(FrameKind.GUARD, node)
        elif _is_tensor_type_test(node.test) and self._in_function():
            self._push(FrameKind.TYPE_GUARD, node)
        elif runs_on_one_pass(node.test, self._is_counter):
            self._push(FrameKind.ONCE, node)
        elif training_flag(node.test) is False:
            self._push(FrameKind.INFERENCE, node)
        else:
            return
        self._framed_ifs.add(node)

    def leave_If_body(self, node: cst.If) -> None:
        if node in self._framed_ifs:
            self._framed_ifs.discard(node)
            self._pop()

    def visit_If_orelse(self, node: cst.If) -> None:
        if training_flag(node.test) is True:  # `else:` of `if self.training:`, its `elif`s too
            self._push(FrameKind.INFERENCE, node)
            self._framed_ifs.add(node)

    def leave_If_orelse(self, node: cst.If) -> None:
        self.leave_If_body(node)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._blocks.append(node)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self._blocks.pop()
        if self._eval_tails and self._eval_tails[-1] is original_node:
            self._eval_tails.pop()
            self._pop()

    def leave_If(self, original_node: cst.If) -> None:
        """`if self.training: return losses`, then the eval-mode code: the rest of the block is
        inference (torchvision's detectors). `if step % N != 0: return` (or `continue`), then
        the rest of the block runs every N steps: it is periodic, as under `if step % N == 0:`."""
        if original_node.orelse is not None or not self._blocks or not _leaves(original_node.body, loops=True) \
                or (self._eval_tails and self._eval_tails[-1] is self._blocks[-1]):
            return
        if training_flag(original_node.test) is True and _leaves(original_node.body):
            self._eval_tails.append(self._blocks[-1])
            self._push(FrameKind.INFERENCE, original_node)
        elif _is_off_period_test(original_node.test, self._is_one):
            self._note_periods(original_node, [original_node.test])
            self._eval_tails.append(self._blocks[-1])
            self._push(FrameKind.GUARD, original_node)

    def _is_counter(self, name: str) -> bool:
        """Is ``name`` the counter of the innermost loop around the code being visited: `i` of
        `for i in range(n)`, of `for i, batch in enumerate(loader)` (also through wrappers and
        names: `pbar = tqdm(list(enumerate(loader)))`), or of `for i, (x, y) in ...`?"""
        for frame in reversed(self.stack):
            if frame.kind is FrameKind.LOOP:
                info = self.loops.get(frame.node)
                if info is None or not isinstance(info.node, cst.For):
                    return False
                target, source = info.node.target, self._iterated(info.node.iter, 0)
                if isinstance(target, cst.Name):
                    return target.value == name and isinstance(source, cst.Call) and dotted_name(source.func) == "range"
                if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != 2:
                    return False
                first, second = (element.value for element in target.elements)
                paired = isinstance(source, cst.Call) and dotted_name(source.func) == "enumerate"
                return isinstance(first, cst.Name) and first.value == name and (paired or isinstance(second, (cst.Tuple, cst.List)))
            if frame.kind in (FrameKind.FUNCTION, FrameKind.CLASS):
                return False
        return False

    def _iterated(self, expr: cst.BaseExpression, depth: int) -> cst.BaseExpression:
        """What a loop iterates under progress bars and lists, through names bound above, up to
        an `enumerate(...)`."""
        while isinstance(expr, cst.Call) and expr.args and dotted_name(expr.func) != "enumerate" \
                and is_iterable_wrapper(dotted_name(expr.func)):
            expr = expr.args[0].value
        found = self.assignments.get(expr.value, ()) if isinstance(expr, cst.Name) and depth < 3 else ()
        return self._iterated(found[-1].value, depth + 1) if found and not found[-1].unpacked else expr

    def visit_With(self, node: cst.With) -> None:
        self.withs.append(WithInfo(node, [entered(item.item) for item in node.items], self.stack))

    def visit_With_body(self, node: cst.With) -> None:
        self._push(FrameKind.WITH, node)

    def leave_With_body(self, node: cst.With) -> None:
        self._pop()

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(CallSite(node, dotted_name(node.func), self.stack, self._statement))
        if isinstance(node.func, cst.Name) and node.func.value in CUDA_DEVICE_HELPERS:
            self.mentions_cuda = True  # `try_gpu()`
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value == "half":
            self._low_precision()  # `model.half()`
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument":
            # `add_argument('--fp16', action='store_true', help='... fp16 ...')` names an option; its
            # `default=` (`default="bf16"`, `default="cuda"`) is a setting of the default run
            for arg in node.args:
                if arg.keyword is None or arg.keyword.value in ("help", "metavar", "dest"):
                    self._option_words.update(_string_parts(arg.value))

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._record_assignment(target.target, node.value)
        value = node.value
        if self.links.modules and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name) \
                and isinstance(value, cst.Call) and len(value.args) == 1 and not value.args[0].keyword \
                and not value.args[0].star and self.imports.resolve(dotted_name(value.func)) == IMPORT_MODULE:
            self._imported_by_name(node.targets[0].target.value, value.args[0].value)

    def _imported_by_name(self, name: str, argument: cst.BaseExpression) -> None:
        """`MODEL = importlib.import_module(args.model)`: ``name`` stands for the module the
        other files of the scan say it imports (``facts.imported_by_name``, read the same way)."""
        try:
            expression = ast.parse(self.module.code_for_node(argument).strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return
        imported = imported_by_name(expression)
        if imported is not None and imported in self.links.modules:
            self.imports.bind_module(name, imported)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._record_assignment(node.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        name = dotted_name(node.target)
        if name:
            self.assignments[name].append(
                Assignment(name, node.value, self.stack, self._statement, augmented=True)
            )

    def _record_assignment(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            names = target_names(target)
            flat = len(names) == len(target.elements) and not any(isinstance(e, cst.StarredElement) for e in target.elements)
            for position, name in enumerate(names):
                self.assignments[name].append(Assignment(
                    name, value, self.stack, self._statement, unpacked=True, position=position if flat else None
                ))
            return
        if isinstance(target, cst.Subscript):
            owner = dotted_name(target.value)
            if owner:
                self.item_assignments[owner].append(Assignment(owner, value, self.stack, self._statement))
            return
        name = dotted_name(target)
        if name:
            self.assignments[name].append(Assignment(name, value, self.stack, self._statement))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        attr = node.attr.value
        if attr in CUDA_ATTRIBUTES or (isinstance(node.value, cst.Name) and node.value.value in CUDA_OBJECTS):
            self.mentions_cuda = True
        elif attr in _LOW_PRECISION and (attr != "half" or (isinstance(node.value, cst.Name) and node.value.value == "torch")):
            self._low_precision()  # `torch.bfloat16`, `torch.half`; `args.half` is an option's name (`.half()`: visit_Call)

    def visit_DictElement(self, node: cst.DictElement) -> None:
        # `"fp16": {"enabled": args.fp16}` (a DeepSpeed config): its `enabled` value decides, not the key
        if isinstance(node.key, cst.SimpleString) and isinstance(node.value, cst.Dict) and any(
                isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)
                and element.key.evaluated_value == "enabled" for element in node.value.elements):
            self._option_words.add(id(node.key))

    def _low_precision(self) -> None:
        self.mentions_low_precision = True
        self.low_precision_at.append((self._statement, self.stack))

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if "cuda" in node.value and id(node) not in self._option_words:  # not `add_argument("--cuda")`
            self.mentions_cuda = True
        if "16" in node.value and any(tag in node.value for tag in ("bf16", "fp16", "16-mixed", "float16")) \
                and id(node) not in self._option_words:
            self._low_precision()
        quote = node.quote[0]
        if quote in self._quotes:
            self._quotes[quote] += 1

    @property
    def quote(self) -> str:
        """The file's prevailing quote character, for string literals a fix writes."""
        return "'" if self._quotes["'"] > self._quotes['"'] else '"'
    # ------------------------------------------------------------------ frames
    # The stack questions of ``frames``, asked of the index as rules have always asked them.
    function_of = staticmethod(function_of)
    class_of = staticmethod(class_of)
    nearest_loop = staticmethod(nearest_loop)
    enclosing_loops = staticmethod(enclosing_loops)
    in_main_guard = staticmethod(in_main_guard)
    at_module_level = staticmethod(at_module_level)
    # ------------------------------------------------------------------ names

    def qualname(self, node: cst.BaseExpression | None) -> str | None:
        """Qualified name of a Name/Attribute chain through the file's imports."""
        if node is None:
            return None
        return self.imports.resolve(dotted_name(node))

    def call_qualname(self, site: CallSite) -> str | None:
        return self.imports.resolve(site.func)

    @cached_property
    def calls_by_qualname(self) -> dict[str, list[CallSite]]:
        index: dict[str, list[CallSite]] = defaultdict(list)
        for site in self.calls:
            name = self.imports.resolve(site.func)
            if name:
                index[name].append(site)
        return index

    @cached_property
    def _sites(self) -> dict[cst.Call, CallSite]:
        return {site.node: site for site in self.calls}

    def site_of(self, call: cst.Call) -> CallSite | None:
        return self._sites.get(call)

    def calls_to(self, *qualnames: str) -> list[CallSite]:
        found: list[CallSite] = []
        for name in qualnames:
            found.extend(self.calls_by_qualname.get(name, ()))
        return found

    def method_calls(self, attr: str) -> Iterator[CallSite]:
        """Calls of the form `<expr>.attr(...)`."""
        yield from self._calls_by_method.get(attr, ())

    @cached_property
    def _calls_by_method(self) -> dict[str, list[CallSite]]:
        index: dict[str, list[CallSite]] = defaultdict(list)
        for site in self.calls:
            if isinstance(site.node.func, cst.Attribute):
                index[site.node.func.attr.value].append(site)
        return index

    def imports_binding(self, local: str) -> list[cst.SimpleStatementLine]:
        return [line for line in self.import_lines if line_binds(line, local)]

    def local_name_for(self, qualified: str, stack: Stack = ()) -> str | None:
        """How code inserted at ``stack`` can spell ``qualified`` with the file's module-level
        imports (``T.compile``), or None when no imported name certainly means it there."""
        return self.imports.local_name_for(qualified, module_level=True,
                                           usable=lambda local, target: self.means(local, target, stack))
    # ------------------------------------------------------------------ values

    @cached_property
    def assignments_by_function(self) -> dict[cst.CSTNode | None, dict[str, list[Assignment]]]:
        """Function node (None: module level) -> target -> its assignments there, in file order.

        Built once after the walk: looking a name up among all of the file's assignments for
        every use made the scan quadratic on generated files with thousands of functions."""
        index: dict[cst.CSTNode | None, dict[str, list[Assignment]]] = {}
        for name, found in self.assignments.items():
            for assignment in found:
                index.setdefault(self.function_of(assignment.stack), {}).setdefault(name, []).append(assignment)
        return index

    def assignments_in(self, function: cst.CSTNode | None, name: str) -> list[Assignment]:
        """Assignments to ``name`` directly in ``function`` (None: at module level)."""
        return self.assignments_by_function.get(function, {}).get(name, [])

    def assignments_in_scope(self, name: str, stack: Stack) -> list[Assignment]:
        """Assignments to ``name`` in the function of ``stack``, else at module level."""
        function = self.function_of(stack)
        local = self.assignments_in(function, name)
        if local or function is None:
            return list(local)
        return list(self.assignments_in(None, name))

    def single_value(self, name: str, stack: Stack) -> cst.BaseExpression | None:
        """The value of a name assigned exactly once (plainly) in scope, else None."""
        found = self.assignments_in_scope(name, stack)
        if len(found) != 1 or found[0].unpacked or found[0].augmented:
            return None
        return found[0].value

    def constructor_of(self, expr: cst.BaseExpression, stack: Stack) -> str | None:
        """Qualified name of the call that made ``expr`` (`opt = torch.optim.AdamW(...)`)."""
        name = dotted_name(expr)
        if name is None:
            return None
        value = self.single_value(name, stack)
        if isinstance(value, cst.Call):
            return self.qualname(value.func) or dotted_name(value.func)
        return None
    # ------------------------------------------------------------------ classes

    def class_bases(self, class_name: str, _seen: frozenset[str] = frozenset()) -> set[str]:
        """Qualified bases of a class defined in this file, transitively through local classes."""
        info = self.classes.get(class_name)
        if info is None or class_name in _seen:
            return set()
        result: set[str] = set()
        for base in info.bases:
            qualified = self.imports.resolve(base)
            if base == class_name and base in self.imports.bindings:
                # `class TrainingArguments(TrainingArguments)`: the base is read before the class
                # statement rebinds the name, so it is still the imported class
                qualified = self.imports.bindings[base]
            if qualified:
                result.add(qualified)
            elif base in self.classes:
                result |= self.class_bases(base, _seen | {class_name})
        return result

    def is_subclass_of(self, class_name: str, *qualnames: str) -> bool:
        return bool(self.class_bases(class_name) & set(qualnames))
    # ------------------------------------------------------------------ the module

    @cached_property
    def has_main_guard(self) -> bool:
        return any(
            isinstance(statement, cst.If) and is_main_guard(statement.test) for statement in self.module.body
        )


def _string_parts(node: cst.BaseExpression) -> Iterator[int]:
    """The ids of the plain strings a string expression is made of (`'a ' 'b'` is two)."""
    if isinstance(node, cst.ConcatenatedString):
        yield from _string_parts(node.left)
        yield from _string_parts(node.right)  # type: ignore[arg-type]
    elif isinstance(node, cst.SimpleString):
        yield id(node)
