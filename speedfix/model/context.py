"""What a file tells us, gathered in the one batched traversal that also runs the rules.

``FileContext`` is the first visitor of the batch. While the tree is walked it records imports,
calls, assignments, loops, functions and classes, each with the *stack* of enclosing frames
(function, class, loop body, periodic ``if step % N == 0`` guard, ``__main__`` guard, ``with``
body). Rules record candidates during the walk and decide in ``Rule.finish()``, when the whole
file is known: a ``DataLoader`` may be created before the loop that proves the script trains on
CUDA, and an import may follow its first use.

Training-loop context: a *step loop* is a ``for``/``while`` whose body calls
``.backward()`` (``accelerator.backward(loss)`` too), an optimizer's/scaler's ``.step()`` or a
callable loss scaler (``loss_scaler(loss, optimizer, ...)``) outside any nested loop, directly or
in a function it calls (one level): one of this file (``f()``, ``self.f()``, ``obj.f()`` for an
object made by a class of this file) or of another scanned file (``Links``, see
``speedfix.project``). Code is *hot* when its nearest enclosing step loop is reached before a
function boundary and no periodic guard sits in between; functions called from hot code (one
level, also from another scanned file) and Lightning ``training_step`` methods are hot too,
except for code under ``if isinstance(v, torch.Tensor):`` in such a helper (whether it runs on
tensors is the caller's business). An epoch loop that only contains the batch loop is not a step
loop, so what runs once per epoch is not hot. CUDA evidence can come from another scanned file
too (``speedfix.model.devices``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Iterator, Union

import libcst as cst
from libcst import BatchableCSTVisitor

from speedfix.model.frames import Frame, FrameKind, Stack
from speedfix.model.scopes import NameBindings
from speedfix.model.versions import TorchVersion
from speedfix.project.facts import FunctionFacts
from speedfix.project.linker import Links
from speedfix.project.steps import CUDA_ATTRIBUTES, CUDA_DEVICE_HELPERS, CUDA_OBJECTS, is_loss_scaler_call, is_optimizer_name
from speedfix.syntax.names import ImportTable, dotted_name, line_binds
from speedfix.syntax.walk import child_nodes


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


LIGHTNING_MODULE = (
    "lightning.LightningModule",
    "lightning.pytorch.LightningModule",
    "lightning.pytorch.core.LightningModule",
    "pytorch_lightning.LightningModule",
)
_LOW_PRECISION = frozenset({"bfloat16", "float16", "half"})


def _is_periodic_test(test: cst.BaseExpression) -> bool:
    """`step % N == 0`, `not (i % N)`, `(i + 1) % N == 0 and ...`: logging, not the hot path.

    Only a modulo makes a guard periodic: `if rank == 0:` or `if verbose:` still run every step.
    """
    return any(
        isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo)
        for node in walk_expression(test)
    )


def _is_tensor_type_test(test: cst.BaseExpression) -> bool:
    """`isinstance(v, torch.Tensor)`, `torch.is_tensor(v)`."""
    if not isinstance(test, cst.Call):
        return False
    name = dotted_name(test.func) or ""
    if name.endswith("is_tensor"):
        return True
    return name == "isinstance" and len(test.args) == 2 and (dotted_name(test.args[1].value) or "").endswith("Tensor")


def is_main_guard(test: cst.BaseExpression) -> bool:
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    sides = [test.left, test.comparisons[0].comparator]
    names = [s.value for s in sides if isinstance(s, cst.Name)]
    strings = [s.evaluated_value for s in sides if isinstance(s, cst.SimpleString)]
    return names == ["__name__"] and strings == ["__main__"]


def walk_expression(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node below ``node`` (for small subtrees only: tests, arguments, statements)."""
    todo = [node]
    while todo:
        current = todo.pop()
        yield current
        todo.extend(child_nodes(current))


def target_names(target: cst.BaseExpression) -> tuple[str, ...]:
    """Names bound by an assignment or loop target (`x`, `(x, y)`, `i, (x, y)`, `self.m`)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        names: list[str] = []
        for element in target.elements:
            names.extend(target_names(element.value))
        return tuple(names)
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    name = dotted_name(target)
    return (name,) if name else ()


class Visitor(BatchableCSTVisitor):
    """A batchable visitor whose method lookup never touches other attributes.

    libcst's default ``get_visitors`` runs ``inspect.getmembers``, which evaluates every
    property, and so would compute (and cache) facts before the tree was even walked.
    """

    _method_names: ClassVar[dict[type, tuple[str, ...]]] = {}

    def get_visitors(self):  # type: ignore[no-untyped-def]
        cls = type(self)
        names = Visitor._method_names.get(cls)
        if names is None:  # computed once per class: dir() over libcst's stubs is slow
            names = tuple(
                name
                for name in dir(cls)
                if name.startswith(("visit_", "leave_")) and not getattr(getattr(cls, name), "_is_no_op", False)
            )
            Visitor._method_names[cls] = names
        return {name: getattr(self, name) for name in names}


class FileContext(NameBindings, Visitor):
    """Facts about one file; also the indexing visitor that gathers them."""

    def __init__(self, module: cst.Module, path: str, torch_version: TorchVersion, links: Links | None = None) -> None:
        Visitor.__init__(self)
        NameBindings.__init__(self)
        self.module = module
        self.path = path
        self.torch_version = torch_version
        self.links = links or Links()  # what the other files of the scan tell this one
        self.imports = ImportTable()
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
        self._quotes = {"'": 0, '"': 0}
        self.stack: Stack = ()
        self._statement: cst.SimpleStatementLine | None = None
        self._import_depth = 0
        self._framed_ifs: set[cst.If] = set()

    # ------------------------------------------------------------------ indexing visitor
    def _push(self, kind: FrameKind, node: cst.CSTNode) -> None:
        self.stack = self.stack + (Frame(kind, node),)

    def _pop(self) -> None:
        self.stack = self.stack[:-1]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._statement = node
        if any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in node.body):
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
        elif _is_periodic_test(node.test):
            self._push(FrameKind.GUARD, node)
        elif _is_tensor_type_test(node.test) and self._in_function():
            self._push(FrameKind.TYPE_GUARD, node)
        else:
            return
        self._framed_ifs.add(node)

    def leave_If_body(self, node: cst.If) -> None:
        if node in self._framed_ifs:
            self._framed_ifs.discard(node)
            self._pop()

    def visit_With(self, node: cst.With) -> None:
        self.withs.append(WithInfo(node, [item.item for item in node.items], self.stack))

    def visit_With_body(self, node: cst.With) -> None:
        self._push(FrameKind.WITH, node)

    def leave_With_body(self, node: cst.With) -> None:
        self._pop()

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(CallSite(node, dotted_name(node.func), self.stack, self._statement))
        if isinstance(node.func, cst.Name) and node.func.value in CUDA_DEVICE_HELPERS:
            self.mentions_cuda = True  # `try_gpu()`

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._record_assignment(target.target, node.value)

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
        elif attr in _LOW_PRECISION:
            self.mentions_low_precision = True

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if "cuda" in node.value:
            self.mentions_cuda = True
        if "16" in node.value and any(tag in node.value for tag in ("bf16", "fp16", "16-mixed", "float16")):
            self.mentions_low_precision = True
        quote = node.quote[0]
        if quote in self._quotes:
            self._quotes[quote] += 1

    @property
    def quote(self) -> str:
        """The file's prevailing quote character, for string literals a fix writes."""
        return "'" if self._quotes["'"] > self._quotes['"'] else '"'

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
        for site in self.calls:
            func = site.node.func
            if isinstance(func, cst.Attribute) and func.attr.value == attr:
                yield site

    def imports_binding(self, local: str) -> list[cst.SimpleStatementLine]:
        return [line for line in self.import_lines if line_binds(line, local)]

    def local_name_for(self, qualified: str, stack: Stack = ()) -> str | None:
        """How code inserted at ``stack`` can spell ``qualified`` with the file's module-level
        imports (``T.compile``), or None when no imported name certainly means it there."""
        return self.imports.local_name_for(qualified, module_level=True,
                                           usable=lambda local, target: self.means(local, target, stack))

    # ------------------------------------------------------------------ values
    @staticmethod
    def function_of(stack: Stack) -> cst.CSTNode | None:
        for frame in reversed(stack):
            if frame.kind is FrameKind.FUNCTION:
                return frame.node
        return None

    @staticmethod
    def class_of(stack: Stack) -> cst.ClassDef | None:
        """The innermost class around code at ``stack`` (its methods included)."""
        for frame in reversed(stack):
            if frame.kind is FrameKind.CLASS and isinstance(frame.node, cst.ClassDef):
                return frame.node
        return None

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
            if qualified:
                result.add(qualified)
            elif base in self.classes:
                result |= self.class_bases(base, _seen | {class_name})
        return result

    def is_subclass_of(self, class_name: str, *qualnames: str) -> bool:
        return bool(self.class_bases(class_name) & set(qualnames))

    # ------------------------------------------------------------------ training loops
    def is_optimizer_like(self, receiver: cst.BaseExpression, stack: Stack) -> bool:
        """Is `receiver.step()` an optimizer or GradScaler step (not an LR scheduler's)?"""
        made_by = self.constructor_of(receiver, stack)
        if made_by:
            if made_by.startswith("torch.optim.lr_scheduler"):
                return False
            if made_by.startswith("torch.optim.") or made_by.endswith("GradScaler"):
                return True
        name = dotted_name(receiver)
        return name is not None and is_optimizer_name(name)

    def _is_step_marker(self, site: CallSite) -> bool:
        """`.backward()` (also `accelerator.backward(loss)`, `scaler.scale(loss).backward()`),
        an optimizer's or scaler's `.step()`, `loss_scaler(loss, optimizer, ...)`."""
        func = site.node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "backward":
            return True
        if isinstance(func, cst.Attribute) and func.attr.value == "step":
            return self.is_optimizer_like(func.value, site.stack)
        if self.call_qualname(site) == "torch.autograd.backward":
            return True
        return self.is_loss_scaler(site)

    @staticmethod
    def is_loss_scaler(site: CallSite) -> bool:
        """`loss_scaler(loss, optimizer, ...)` (timm/Meta `NativeScaler`)."""
        args = site.node.args
        positional = [dotted_name(arg.value) for arg in args if arg.keyword is None and not arg.star]
        keywords = {arg.keyword.value for arg in args if arg.keyword is not None}
        return is_loss_scaler_call(site.func, positional, keywords)

    @staticmethod
    def nearest_loop(stack: Stack) -> cst.CSTNode | None:
        """The innermost loop around ``stack`` within the same function."""
        for frame in reversed(stack):
            if frame.kind is FrameKind.LOOP:
                return frame.node
            if frame.kind in (FrameKind.FUNCTION, FrameKind.CLASS):
                return None
        return None

    @cached_property
    def _markers(self) -> tuple[set[cst.CSTNode], set[cst.CSTNode]]:
        """(loops with a marker directly in their body, functions with one outside loops)."""
        loops: set[cst.CSTNode] = set()
        functions: set[cst.CSTNode] = set()
        for site in self.calls:
            if not self._is_step_marker(site):
                continue
            loop = self.nearest_loop(site.stack)
            if loop is not None:
                loops.add(loop)
            else:
                function = self.function_of(site.stack)
                if function is not None:
                    functions.add(function)
        return loops, functions

    def local_callees(self, site: CallSite) -> list[FunctionInfo]:
        """The same-file functions a call may run: `f(...)`, `self.f(...)`, and `obj.f(...)`
        where `obj` was made by a class of this file (`metric = Accumulator(3)`)."""
        func = site.node.func
        if isinstance(func, cst.Name):
            return self.functions.get(func.value, [])
        if not isinstance(func, cst.Attribute) or not isinstance(func.value, cst.Name):
            return []
        found = self.functions.get(func.attr.value, [])
        if func.value.value == "self":
            return found
        owner = self.constructor_of(func.value, site.stack)
        return [info for info in found if owner is not None and info.class_name == owner and owner in self.classes]

    def project_callee(self, site: CallSite) -> FunctionFacts | None:
        """The facts of the function of another scanned file that a call runs: an imported
        function (`train_one_epoch(...)`, `engine.train(...)`), class (`Trainer(...)`, its
        constructor) or a method of an object made by an imported class (`trainer.fit()`)."""
        if not self.links.modules:
            return None
        facts = self.links.function(self.project_name(site.func))
        if facts is not None:
            return facts
        func = site.node.func
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
            owner = self.project_name(self.constructor_of(func.value, site.stack))
            return self.links.function(f"{owner}.{func.attr.value}") if owner else None
        return None

    @cached_property
    def copies_to_device(self) -> bool:
        """Is anything copied to a device here (`.to(...)`, `.cuda()`), in the training loop
        of a function of another scanned file that this file calls (the batches of its loaders),
        or by the file that iterates the loaders this file's functions return?"""
        if any(True for _ in self.method_calls("to")) or any(True for _ in self.method_calls("cuda")):
            return True
        if any(uploads for _, _, uploads in self.links.feeds):
            return True
        return any((callee := self.project_callee(site)) is not None and callee.uploads for site in self.calls)

    def project_iterates(self, site: CallSite, name: str, *, any_loop: bool = False) -> bool:
        """Does the function of another scanned file that ``site`` calls iterate the argument
        ``name`` in its training loop (`train_one_epoch(model, loader, ...)`), or with
        ``any_loop`` in any loop (`evaluate(val_loader, model)`)?"""
        callee = self.project_callee(site)
        iterated = (callee.loops_over if any_loop else callee.iterated) if callee is not None else ()
        if not iterated:
            return False
        params = callee.params[1:] if callee.params[:1] == ("self",) else callee.params  # type: ignore[union-attr]
        for index, arg in enumerate(site.node.args):
            if dotted_name(arg.value) != name or arg.star:
                continue
            param = arg.keyword.value if arg.keyword is not None else (params[index] if index < len(params) else None)
            if param in iterated:
                return True
        return False

    def project_name(self, dotted: str | None) -> str | None:
        """Qualified name through the file's imports, `from m import *` of scanned files included."""
        if dotted is None:
            return None
        qualified = self.imports.resolve(dotted)
        if qualified is None and self.links.star:
            head, _, rest = dotted.partition(".")
            star = self.links.star.get(head)
            qualified = f"{star}.{rest}" if star and rest else star
        return qualified

    @cached_property
    def step_loops(self) -> set[cst.CSTNode]:
        """Loops with a step marker in their body, or calling a function (of this file or
        another scanned one) that takes a step outside its own loops."""
        direct_loops, step_functions = self._markers
        result = set(direct_loops)
        for site in self.calls:
            loop = self.nearest_loop(site.stack)
            if loop is None or loop in result:
                continue
            if any(info.node in step_functions for info in self.local_callees(site)):
                result.add(loop)
            elif (callee := self.project_callee(site)) is not None and callee.steps:
                result.add(loop)
        return result

    @cached_property
    def drives_training(self) -> bool:
        """Does the file train: a step loop of its own, or a call of another scanned file's
        function that holds a training loop (`train_one_epoch(model, loader, ...)` in main.py)?"""
        return bool(self.step_loops) or any(
            (callee := self.project_callee(site)) is not None and callee.trains for site in self.calls
        )

    def _hot(self, stack: Stack, *, through_calls: bool, guards_count: bool = True) -> bool:
        type_guarded = False
        for frame in reversed(stack):
            if frame.kind is FrameKind.GUARD and guards_count:
                return False
            type_guarded = type_guarded or frame.kind is FrameKind.TYPE_GUARD
            if frame.kind is FrameKind.LOOP and frame.node in self.step_loops:
                return True
            if frame.kind is FrameKind.FUNCTION:
                return through_calls and not type_guarded and frame.node in self.hot_functions
            if frame.kind is FrameKind.CLASS:
                return False
        return False

    @cached_property
    def hot_functions(self) -> set[cst.CSTNode]:
        """Functions run on every step: called from hot code here (one level), or from a
        training loop in another scanned file (``Links.hot``), and Lightning training steps."""
        hot: set[cst.CSTNode] = set()
        for site in self.calls:
            if self._hot(site.stack, through_calls=False):
                hot.update(info.node for info in self.local_callees(site))
        for key in self.links.hot:
            owner, _, name = key.rpartition(".")
            hot.update(info.node for info in self.functions.get(name, ()) if info.class_name == (owner or None))
        for info in self.functions.get("training_step", ()):
            if info.class_name and self.is_subclass_of(info.class_name, *LIGHTNING_MODULE):
                hot.add(info.node)
        return hot

    def is_hot(self, stack: Stack) -> bool:
        """Does code at ``stack`` run on every training step (see the module docstring)?"""
        return self._hot(stack, through_calls=True)

    def in_training_loop(self, stack: Stack) -> bool:
        """Like ``is_hot``, but code under a periodic guard counts too ("every N steps" is still
        inside the loop: right for calls that cost a lot each time they run)."""
        return self._hot(stack, through_calls=True, guards_count=False)

    def step_scope(self, stack: Stack) -> cst.CSTNode | None:
        """The step loop, or the hot function, that puts code at ``stack`` in the training loop
        (as ``in_training_loop`` decides), or None: what runs once per step for that code."""
        if not self.in_training_loop(stack):
            return None
        for frame in reversed(stack):
            if (frame.kind is FrameKind.LOOP and frame.node in self.step_loops) or frame.kind is FrameKind.FUNCTION:
                return frame.node
        return None

    @staticmethod
    def enclosing_loops(stack: Stack) -> list[cst.CSTNode]:
        return [frame.node for frame in stack if frame.kind is FrameKind.LOOP]

    @staticmethod
    def in_main_guard(stack: Stack) -> bool:
        return any(frame.kind is FrameKind.MAIN for frame in stack)

    @staticmethod
    def at_module_level(stack: Stack) -> bool:
        return not any(frame.kind in (FrameKind.FUNCTION, FrameKind.CLASS) for frame in stack)

    @cached_property
    def has_main_guard(self) -> bool:
        return any(
            isinstance(statement, cst.If) and is_main_guard(statement.test) for statement in self.module.body
        )
