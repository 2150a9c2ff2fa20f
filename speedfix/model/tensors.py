"""Tensors and host values: which expressions certainly hold a tensor, which make a Python value
on the host, and which calls wait for the GPU to make one.

A name holds a tensor in a function when it receives a ``backward()`` (``loss.backward()``,
``accelerator.backward(loss)``, also through ``loss.mean().backward()``), or is assigned the
result of a tensor-returning torch function or a tensor method on a tensor, or a batch moved to
the device, or is a method's parameter that another method of the class hands a tensor
(``self.get_accuracy(logits, labels)``); a name also bound to a host value somewhere in the function (``lossf =
loss.item()``) may hold a Python number, so it does not count. Reading a tensor's value on the
host (``.item()``, ``.cpu()``, ``.tolist()``, ``float(t)``, formatting it, testing its truth)
makes the CPU wait until the GPU has computed it. The answers are certain or silent: an
expression not known to hold a tensor is not one.
"""

from __future__ import annotations

import re
from dataclasses import InitVar, dataclass, field
from functools import cached_property
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.attention import module_built_by
from speedfix.model.context import FileContext
from speedfix.model.flow import returned_values
from speedfix.model.frames import Frame, FrameKind, Stack, class_of_method, function_of
from speedfix.model.index import Assignment
from speedfix.model.loaders import Place, tensor_place
from speedfix.model.patterns import BatchNames
from speedfix.project.steps import LIGHTNING_MODULE
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import is_string, walk_expression

# Tensor methods that copy the tensor to the host and wait for the GPU.
SYNC_METHODS = ("item", "cpu", "tolist")
# Tensor methods that queue no GPU work: `.detach()` returns the same storage without autograd
# history, so `loss.detach().item()` waits for nothing more than `loss.item()` does.
NO_WORK_METHODS = frozenset({"detach"})
# Built-ins that need a tensor's value as a Python object (a number, a string).
HOST_CONVERSIONS = ("float", "int", "bool", "str", "repr", "format")
# Tensor methods whose result is again a tensor on the same device (`.item()`, `.tolist()`,
# `.cpu()`, `.size()` and friends are not: their results are host values).
TENSOR_METHODS = frozenset(
    """
    abs add all any argmax argmin bfloat16 bmm ceil clamp clip clone contiguous cuda detach div
    double eq exp expand flatten float floor ge gt half isfinite isinf isnan le log log_softmax
    long lt masked_fill matmul max mean min mm mul ne neg norm permute pow prod relu reshape round
    sigmoid sign softmax sqrt square squeeze std sub sum t tanh transpose type_as unsqueeze var
    view view_as
    """.split()
)
# Attributes of a tensor that are host values: reading them never waits for the GPU.
HOST_ATTRIBUTES = frozenset("shape dtype device ndim is_cuda is_sparse is_quantized is_meta requires_grad "
                            "grad_fn is_leaf layout names".split())
# torch functions that do not return a tensor (torch.cuda.*, torch.nn.Linear, ... are left out
# by their dot: only top-level functions and the functional modules below count).
_NOT_TENSORS = frozenset(
    """
    device dtype Size Generator finfo iinfo load save compile no_grad enable_grad inference_mode
    set_grad_enabled autocast manual_seed seed initial_seed numel typename result_type
    promote_types can_cast broadcast_shapes
    """.split()
)
_TENSOR_MODULES = ("torch.nn.functional.", "torch.linalg.", "torch.fft.", "torch.special.")
# Tensor methods whose result is a Python value (or a NumPy array) on the host.
_HOST_RESULTS = ("item", "tolist", "numpy")


# TensorBoard writers: `add_scalar(tag, value, step)` turns a tensor value into a number on the host.
SUMMARY_WRITERS = frozenset({"torch.utils.tensorboard.SummaryWriter", "torch.utils.tensorboard.writer.SummaryWriter",
                             "tensorboardX.SummaryWriter"})


def is_summary_writer(ctx: FileContext, receiver: cst.BaseExpression, stack: Stack) -> bool:
    """A TensorBoard `SummaryWriter` (`writer = SummaryWriter(logdir)`, or `self.writer` set to one
    in a method of the class)."""
    made = ctx.constructor_of(receiver, stack)
    if made is None:
        built = module_built_by(ctx, class_of_method(stack), dotted_name(receiver) or "")
        made = ctx.qualname(built.func) if built is not None else None
    return made in SUMMARY_WRITERS


def lightning_batches(ctx: FileContext) -> dict[cst.CSTNode, set[str]]:
    """Lightning moves each batch to the module's device before `training_step(self, batch, ...)`
    runs: its batch parameter holds device tensors, and so does the parameter of a method of the
    module that the step hands it to (`self.shared_step(batch, "train")`)."""
    steps: dict[cst.CSTNode, set[str]] = {}
    for info in ctx.functions.get("training_step", ()):
        params = info.node.params.params
        if info.class_name and len(params) > 1 and ctx.is_subclass_of(info.class_name, *LIGHTNING_MODULE):
            steps[info.node] = {params[1].name.value}
    result = dict(steps)
    for site in ctx.calls if steps else ():
        func = site.node.func
        batch = steps.get(ctx.function_of(site.stack))  # type: ignore[arg-type]
        if not batch or not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
                             and func.value.value == "self"):
            continue
        for callee in ctx.local_callees(site):
            params = [p.name.value for p in callee.node.params.params][1:]  # after `self`
            for index, arg in enumerate(site.node.args):
                name = dotted_name(arg.value)
                if name not in batch or arg.star:
                    continue
                param = arg.keyword.value if arg.keyword is not None else params[index] if index < len(params) else None
                if param is not None:
                    result.setdefault(callee.node, set()).add(param)
    return result


def returns_tensor(qualified: str) -> bool:
    """Does the torch function of this qualified name return a tensor (`torch.zeros`,
    `torch.nn.functional.softmax`; not `torch.device`, `torch.is_tensor`)?"""
    if qualified.startswith(_TENSOR_MODULES):
        return True
    if not qualified.startswith("torch."):
        return False
    name = qualified[len("torch."):]
    return "." not in name and name not in _NOT_TENSORS and not name.startswith(("is_", "get_", "set_", "are_", "use_"))


def is_host_value(value: cst.BaseExpression) -> bool:
    """`t.item()`, `float(t)`, `t.item() * n`: a Python number (or list) made on the host."""
    if isinstance(value, cst.BinaryOperation):
        return is_host_value(value.left) or is_host_value(value.right)
    if not isinstance(value, cst.Call):
        return False
    if isinstance(value.func, cst.Attribute):
        return value.func.attr.value in _HOST_RESULTS
    return isinstance(value.func, cst.Name) and value.func.value in ("float", "int", "bool")


def host_constant(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> cst.BaseExpression | None:
    """The value of ``node`` when it is `self.<name>` holding host data that a module's
    `__init__` sets once and nothing changes (pytorch-fm's `self.offsets = np.array((0,
    *np.cumsum(field_dims)[:-1]))`): a numpy array or a list, tuple or number literal. None otherwise."""
    name = dotted_name(node)
    owner = class_of_method(stack)
    if owner is None or name is None or not name.startswith("self.") or name.count(".") != 1:
        return None
    found = [a for a in ctx.assignments.get(name, ()) if class_of_method(a.stack) is owner]  # (`self.` of other classes too)
    if len(found) != 1 or found[0].unpacked or found[0].augmented or name in ctx.item_assignments:
        return None
    made = found[0]
    function = function_of(made.stack)
    if not isinstance(function, cst.FunctionDef) or function.name.value != "__init__":
        return None
    value = made.value
    if isinstance(value, (cst.List, cst.Tuple, cst.Integer, cst.Float)):
        return value
    if isinstance(value, cst.Call) and (ctx.qualname(value.func) or "").startswith("numpy."):
        return value
    return None


def has_sync_before(expr: cst.BaseExpression) -> bool:
    """`x.cpu().numpy().tolist()`: a host copy earlier in the chain already waited for the GPU."""
    while True:
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            if expr.func.attr.value in ("item", "cpu", "numpy", "tolist"):
                return True
            expr = expr.func.value
        elif isinstance(expr, (cst.Attribute, cst.Subscript)):
            expr = expr.value
        else:
            return False


def is_library_value(ctx: FileContext, receiver: cst.BaseExpression) -> bool:
    """`np.array(...).tolist()`: a call into another library returns no tensor."""
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
        qualified = ctx.qualname(receiver.func)
        if qualified is not None:
            return not qualified.startswith("torch.")
        receiver = receiver.func.value
    return False


def is_python_number(ctx: FileContext, node: cst.BaseExpression, stack: Stack, depth: int = 0) -> bool:
    """Is ``node`` certainly a Python number, not a tensor? Literals, arithmetic, `math.*`,
    `float()`/`int()`, the `__init__` parameters a model is configured with, and variables and
    `self.` attributes set once to such values."""
    if depth > 5:
        return False
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.UnaryOperation):
        return is_python_number(ctx, node.expression, stack, depth + 1)
    if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)):
        return is_python_number(ctx, node.left, stack, depth + 1) and is_python_number(ctx, node.right, stack, depth + 1)
    if isinstance(node, cst.Call):
        name = ctx.qualname(node.func) or ""
        return name.startswith("math.") or (isinstance(node.func, cst.Name) and node.func.value in ("float", "int")
                                            and not name)
    if isinstance(node, cst.Name):
        if node.value == "None":
            return True  # `qk_scale or head_dim ** -0.5`
        assigned = ctx.assignments_in_scope(node.value, stack)
        if len(assigned) == 1 and not assigned[0].unpacked:
            return is_python_number(ctx, assigned[0].value, assigned[0].stack, depth + 1)
        return not assigned and _is_number_parameter(ctx.function_of(stack), node.value)
    name = dotted_name(node)
    cls = class_of_method(stack)
    if name is not None and name.startswith("self.") and name.count(".") == 1 and cls is not None:
        found = [a for a in ctx.assignments.get(name, []) if any(f.node is cls for f in a.stack)]
        return len(found) == 1 and is_python_number(ctx, found[0].value, found[0].stack, depth + 1)
    return False


def _is_number_parameter(function: cst.CSTNode | None, name: str) -> bool:
    """A parameter of ``__init__`` (what a model is configured with: sizes, rates), or one
    annotated `float`/`int` or defaulting to a number elsewhere."""
    if not isinstance(function, cst.FunctionDef):
        return False
    params = function.params
    for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
        if param.name.value != name:
            continue
        annotation = dotted_name(param.annotation.annotation) if param.annotation is not None else None
        if annotation is not None:
            return annotation in ("float", "int")
        return function.name.value == "__init__" or isinstance(param.default, (cst.Integer, cst.Float))
    return False


@dataclass
class Tensors:
    """The tensors of one file (see the module docstring); ``tensors(ctx)`` gives the file's."""

    context: InitVar[FileContext]
    batches: BatchNames = field(init=False)

    def __post_init__(self, context: FileContext) -> None:
        self.batches = BatchNames(context)

    @property
    def ctx(self) -> FileContext:
        # Held weakly, by the batch names: ``tensors(ctx)`` caches this object by its context,
        # and a cache entry that held its key would keep the file's tree alive to the end.
        return self.batches.ctx

    @cached_property
    def names(self) -> dict[cst.CSTNode | None, set[str]]:
        """Per function: names that certainly hold tensors (backward receivers and the results
        of tensor-returning torch calls and tensor methods on those), less the names also bound
        to a host value (`lossf = loss.item()`): those may hold a Python number."""
        ctx = self.ctx
        result: dict[cst.CSTNode | None, set[str]] = {}
        for site in ctx.method_calls("backward"):
            receiver = site.node.func.value  # type: ignore[attr-defined]
            if site.node.args:  # `accelerator.backward(loss)`, `fabric.backward(loss)`: the argument is the tensor
                receiver = site.node.args[0].value
            # `l.mean().backward()`, `loss.sum().backward()`: `l` holds a tensor too
            while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute) \
                    and receiver.func.attr.value in TENSOR_METHODS and ctx.qualname(receiver.func) is None:
                receiver = receiver.func.value  # (not `torch.mean(...)`: `torch` is a module)
            if isinstance(receiver, cst.Name):
                result.setdefault(ctx.function_of(site.stack), set()).add(receiver.value)
        for function, batch in lightning_batches(ctx).items():
            result.setdefault(function, set()).update(batch)
        host: dict[cst.CSTNode | None, set[str]] = {}
        for target, assignments in ctx.assignments.items():
            for assignment in assignments:
                if not assignment.augmented and is_host_value(assignment.value):
                    host.setdefault(ctx.function_of(assignment.stack), set()).add(target)
        for handed in range(3):
            for _ in range(3):
                for target, assignments in ctx.assignments.items():
                    for assignment in assignments:
                        names = result.setdefault(ctx.function_of(assignment.stack), set())
                        if target not in names and (self._returns_tensor_at(assignment, result) if assignment.unpacked
                                                    else self.holds_tensor(assignment.value, assignment.stack, names)):
                            names.add(target)
            for function, names in host.items():
                result.get(function, set()).difference_update(names)
            if handed == 2 or not self._hand_on(result, host):
                break
        return result

    def _returns_tensor_at(self, assignment: Assignment, result: dict[cst.CSTNode | None, set[str]]) -> bool:
        """`feat, txt, txt_len = self.fetch_data(data)` (End-to-end-ASR's solver): every `return`
        of the function of this file that the call runs gives a tuple whose element at the
        target's place holds a tensor there."""
        call, position = assignment.value, assignment.position
        site = self.ctx.site_of(call) if isinstance(call, cst.Call) and position is not None else None
        if site is None:
            return False
        callees = self.ctx.local_callees(site)
        if len(callees) != 1:
            return False
        names = result.get(callees[0].node, set())
        inside = (*callees[0].stack, Frame(FrameKind.FUNCTION, callees[0].node))
        returns = [node.value for node in walk_expression(callees[0].node.body) if isinstance(node, cst.Return)]
        return bool(returns) and all(
            isinstance(value, cst.Tuple) and position < len(value.elements)
            and self.holds_tensor(value.elements[position].value, inside, names) for value in returns)

    def _hand_on(self, result: dict[cst.CSTNode | None, set[str]], host: dict[cst.CSTNode | None, set[str]]) -> bool:
        """Give a method of the class the tensors a method hands it (`self.get_accuracy(logits,
        labels)` from a Lightning step's helper): its parameters that receive them hold tensors
        (unless also bound to a host value there). True when a parameter was added."""
        ctx = self.ctx
        added = False
        for site in ctx.calls:
            func = site.node.func
            if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"):
                continue
            names = result.get(ctx.function_of(site.stack))
            if not names:
                continue
            for callee in ctx.local_callees(site):
                params = [p.name.value for p in callee.node.params.params][1:]  # after `self`
                given = result.setdefault(callee.node, set())
                for index, arg in enumerate(site.node.args):
                    if arg.star or not self.holds_tensor(arg.value, site.stack, names):
                        continue
                    param = arg.keyword.value if arg.keyword is not None else params[index] if index < len(params) else None
                    if param is not None and param not in given and param not in host.get(callee.node, ()):
                        given.add(param)
                        added = True
        return added

    def is_tensor(self, expr: cst.BaseExpression, stack: Stack) -> bool:
        """Does ``expr`` at ``stack`` hold a tensor the code computed (not a batch still on the host)?"""
        if isinstance(expr, (cst.Name, cst.Subscript, cst.Attribute)) and self.batches.is_host_batch(expr, stack):
            return False
        return self.holds_tensor(expr, stack)

    def made_on_host(self, expr: cst.BaseExpression, stack: Stack, depth: int = 0,
                     seen: frozenset[str] = frozenset()) -> bool:
        """Is ``expr`` a tensor that torch makes on the host and nothing moves: a torch function
        without `device=` (`torch.rand(1) < p`), methods and arithmetic of such tensors
        (`rewards.max() - rewards.min()`), a name every assignment of which binds one, also the
        element a function of the file returns it as (simple_GRPO's `gen_samples` returning
        `torch.tensor(rewards)`, unpacked by the loop that calls it)? Reading it waits for no GPU.
        ``seen``: the names being followed (`rewards = (rewards - rewards.mean()) / ...` keeps a
        host tensor on the host, when another assignment made it there)."""
        if depth > _HOST_DEPTH:
            return False
        if isinstance(expr, (cst.Comparison, cst.BinaryOperation)):
            sides = [expr.left, *(c.comparator for c in expr.comparisons)] if isinstance(expr, cst.Comparison) \
                else [expr.left, expr.right]
            on_host = [self.made_on_host(side, stack, depth + 1, seen) for side in sides]
            # some side made on the host, and no other side that is a tensor (`mask_prob` is a number)
            return any(on_host) and not any(not host and self.is_tensor(side, stack) for side, host in zip(sides, on_host))
        if isinstance(expr, cst.Call):
            if isinstance(expr.func, cst.Attribute) and self.ctx.qualname(expr.func) is None:
                return expr.func.attr.value in _SAME_DEVICE_METHODS and self.made_on_host(expr.func.value, stack, depth + 1,
                                                                                          seen)
            return self.ctx.qualname(expr.func) is not None and tensor_place(self.ctx, expr, stack) is Place.HOST
        if isinstance(expr, cst.Attribute):
            return self._unmoved_buffer(expr, stack, depth)
        if isinstance(expr, cst.Name):
            if expr.value in seen:
                return True  # judged by the name's other assignments
            assignments = self.ctx.assignments_in_scope(expr.value, stack)
            grounded = [a for a in assignments if not any(
                isinstance(node, cst.Name) and node.value == expr.value for node in walk_expression(a.value))]
            return bool(grounded) and all(self._binds_host_tensor(a, depth + 1, seen | {expr.value}) for a in assignments)
        return False

    def _unmoved_buffer(self, expr: cst.Attribute, stack: Stack, depth: int) -> bool:
        """`self.step` of a trainer module (no `forward` of inputs: it runs networks, it is none)
        that registers it in `__init__` from a tensor made on the host (`self.register_buffer(
        "step", torch.tensor(0))`) and never moves itself to the GPU: only the model and the loader
        go through `accelerator.prepare` (lucidrains' trainers, meshgpt's and audiolm's). A
        checkpoint loader may put it on the GPU on a resume; that run's step waits for its loss
        anyway."""
        owner = class_of_method(stack)
        if owner is None or not isinstance(expr.value, cst.Name) or expr.value.value != "self" or any(
                isinstance(statement, cst.FunctionDef) and statement.name.value == "forward"
                and len(statement.params.params) + len(statement.params.kwonly_params) > 1 for statement in owner.body.body):
            return False  # a network (Tacotron's `r_buffer`): it goes to the GPU with its parameters
        name = expr.attr.value
        registered = False
        for node in walk_expression(owner.body):
            if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute) \
                    or dotted_name(node.func.value) != "self":
                continue
            if node.func.attr.value in ("to", "cuda", "half", "bfloat16"):
                return False  # the module moves itself, buffers and all
            if node.func.attr.value == "register_buffer" and len(node.args) >= 2 \
                    and isinstance(node.args[0].value, cst.SimpleString) and node.args[0].value.evaluated_value == name:
                registered = self.made_on_host(node.args[1].value, stack, depth + 1)
        if not registered:
            return False
        return all(isinstance(function := function_of(a.stack), cst.FunctionDef)
                   and function.name.value.startswith(("load", "resume", "restore"))
                   for a in self.ctx.assignments.get(f"self.{name}", ()) if class_of_method(a.stack) is owner)

    def _binds_host_tensor(self, assignment: Assignment, depth: int, seen: frozenset[str]) -> bool:
        if assignment.augmented:
            return False
        if not assignment.unpacked:
            return self.made_on_host(assignment.value, assignment.stack, depth, seen)
        call, index = assignment.value, assignment.position
        if not isinstance(call, cst.Call) or index is None:
            return False
        elements = [(value.elements[index].value if isinstance(value, cst.Tuple) and index < len(value.elements) else None,
                     inside) for value, inside in returned_values(self.ctx, dotted_name(call.func)) or ()]
        tensors = [(element, inside) for element, inside in elements  # (an early `return None, None, None`)
                   if not (isinstance(element, cst.Name) and element.value == "None")]
        return bool(tensors) and all(element is not None and self.made_on_host(element, inside, depth)
                                     for element, inside in tensors)  # (another function: its own names)

    def truth_tested(self, test: cst.BaseExpression, stack: Stack) -> cst.BaseExpression | None:
        """The tensor whose truth value a condition takes (`if t:`, `if not t.any():`, `a and t`)."""
        if isinstance(test, cst.BooleanOperation):
            return self.truth_tested(test.left, stack) or self.truth_tested(test.right, stack)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self.truth_tested(test.expression, stack)
        return test if self.is_tensor(test, stack) else None

    def holds_tensor(self, expr: cst.BaseExpression, stack: Stack, names: set[str] | None = None) -> bool:
        """Is ``expr`` a tensor by what it is made of (``names``: the tensors of its function)?"""
        if names is None:
            names = self.names.get(self.ctx.function_of(stack), set())
        if isinstance(expr, cst.Name):
            return expr.value in names
        if isinstance(expr, cst.Call):
            qualified = self.ctx.qualname(expr.func)
            if qualified is not None:
                return returns_tensor(qualified)
            if isinstance(expr.func, cst.Call):  # `nn.L1Loss()(mel_pred, mel)`: a torch module built and called
                return (self.ctx.qualname(expr.func.func) or "").startswith("torch.nn.")
            if not isinstance(expr.func, cst.Attribute):
                return False
            method, receiver = expr.func.attr.value, expr.func.value
            if method in ("cuda", "to") and self.batches.is_batch(receiver, stack):
                return True  # a batch tensor moved to the device
            return method in TENSOR_METHODS and self.holds_tensor(receiver, stack, names)
        if isinstance(expr, cst.Attribute):
            if expr.attr.value == "grad" and not (isinstance(expr.value, cst.Name) and expr.value.value == "self"):
                return True  # `param.grad` in `for param in model.parameters():` (LSTNet's gradient norm)
            return expr.attr.value not in HOST_ATTRIBUTES and self.holds_tensor(expr.value, stack, names)
        if isinstance(expr, cst.Subscript):
            return self.holds_tensor(expr.value, stack, names)
        if isinstance(expr, cst.BinaryOperation):
            if is_string(expr.left):
                return False  # `"%g" % t` is a string
            return self.holds_tensor(expr.left, stack, names) or self.holds_tensor(expr.right, stack, names)
        if isinstance(expr, cst.UnaryOperation):
            return not isinstance(expr.operator, cst.Not) and self.holds_tensor(expr.expression, stack, names)
        if isinstance(expr, cst.Comparison):
            if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in expr.comparisons):
                return False
            sides = [expr.left, *(c.comparator for c in expr.comparisons)]
            return any(self.holds_tensor(side, stack, names) for side in sides)
        return False


# How far `made_on_host` follows names, methods and returns.
_HOST_DEPTH = 6
# Tensor methods whose result stays where the tensor is (not `.cuda()`, nor `.type_as(other)`).
_SAME_DEVICE_METHODS = TENSOR_METHODS - {"cuda", "type_as"}


_TENSORS: WeakKeyDictionary[FileContext, Tensors] = WeakKeyDictionary()


def tensors(ctx: FileContext) -> Tensors:
    """The file's tensors, computed once and shared by every rule that asks."""
    found = _TENSORS.get(ctx)
    if found is None:
        found = _TENSORS[ctx] = Tensors(ctx)
    return found


# Names of functions that compute a metric (scikit-learn's `roc_auc_score`, `log_loss`; a
# project's `metric_fn`, `compute_accuracy`): given host arrays, they do the work on the CPU.
_METRIC_NAME = re.compile(r"metric|score|auc|(^|_)acc($|_)|accuracy|f1|precision|recall|error|(^|_)loss($|_)|iou|dice",
                          re.IGNORECASE)
_TO_ARRAY = frozenset({"numpy", "tolist"})


def host_metric(ctx: FileContext, statement: cst.CSTNode | None, copy: cst.CSTNode) -> str | None:
    """The function (as written) that ``statement`` hands the host copy ``copy`` to as an array,
    when it is a metric (`metric_fn(y.cpu().numpy(), pred.cpu().numpy())`,
    `roc_auc_score(t.cpu().numpy(), ...)`): the CPU computes it on the step's outputs."""
    if statement is None:
        return None
    for node in walk_expression(statement):
        if not isinstance(node, cst.Call) or not node.args:
            continue
        func = dotted_name(node.func) or ""
        qualified = ctx.qualname(node.func) or ""
        if not (qualified.startswith("sklearn.metrics.") or _METRIC_NAME.search(func.rpartition(".")[2])):
            continue
        for arg in node.args:
            value = arg.value
            while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "astype":
                value = value.func.value
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in _TO_ARRAY \
                    and any(inner is copy for inner in walk_expression(value)):
                return func
    return None
