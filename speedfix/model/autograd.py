"""Where the outputs of a forward pass go: into something autograd may differentiate, or only
to the host.

A policy that picks an action (`q_network(obs).argmax(1).cpu().numpy()` handed to `env.step`),
a sample saved as an image, a value printed: a forward pass whose outputs only leave as host
values, indices or detached copies records an autograd graph that no `backward()` ever uses.
``outputs_leave_autograd`` follows a call's value through its expression, the names it is
assigned to (in the same function) and the expressions they are read in; anything it cannot
follow (a call of unknown code, a store into an attribute or a list, a `return`) counts as
possibly differentiated. ``runs_network`` says whether a call runs a network at all;
``only_detached`` whether the outputs leave as detached copies (a GAN's fakes for the
discriminator step) rather than host values; ``called_without_grad`` whether another file runs a
function of this one under `torch.no_grad()`.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.context import FileContext
from speedfix.model.flow import default_truth
from speedfix.model.forward import LOSS_NAME, calls_model, is_local_object, steps
from speedfix.model.frames import Stack
from speedfix.model.index import CallSite
from speedfix.model.networks import builds, builds_module, class_assignments, is_module_class, peel, trained_models
from speedfix.model.rl import is_acting_function, is_env_step
from speedfix.project.steps import MODULE_API
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import SCOPES, walk_expression
from speedfix.syntax.walk import child_nodes

# Tensor methods and attributes whose result carries no graph: host values, indices, detached
# copies, metadata.
_LEAVING_METHODS = frozenset({"item", "tolist", "numpy", "detach", "argmax", "argmin", "size", "dim", "numel"})
_LEAVING_ATTRIBUTES = frozenset({"data", "shape", "dtype", "device", "ndim", "is_cuda"})
_HOST_BUILTINS = frozenset({"int", "float", "bool", "len", "print", "str", "repr", "round", "format"})
_LEAVING_TORCH = frozenset({"torch.argmax", "torch.argmin", "torch.multinomial", "torchvision.utils.save_image"})
_DEPTH = 4


def runs_network(ctx: FileContext, site: CallSite) -> bool:
    """`model(x)`, `self.actor(state)`, `self.forward(x)`, `actor.get_action(obs)`: a call that
    runs a network (a module of the file's own making, or a trained model), not a loss."""
    func = site.node.func
    name = dotted_name(func)
    if name is None or LOSS_NAME.search(name):
        return False
    if is_local_object(ctx, name):
        return _is_network(ctx, name, site)
    if not isinstance(func, cst.Attribute) or func.attr.value in MODULE_API or func.attr.value.startswith("_"):
        return False
    receiver = dotted_name(func.value)  # a method of the network: `actor.get_action(obs)`, `model.forward(x)`
    return receiver is not None and is_local_object(ctx, receiver) and _is_network(ctx, receiver, site) \
        and (func.attr.value == "forward" or _forward_method(ctx, func.attr.value, receiver, site))


def _forward_method(ctx: FileContext, name: str, receiver: str, site: CallSite) -> bool:
    """Is every method ``name`` of the file's modules a forward pass: one that runs the module
    (`self.fc(x)`, `self(x)`) and takes no training step (`model.pi(x)`, not `model.train_net()`)?
    A method of a class of another scanned file (`self.policy.sample(state)` with the policy from
    model.py) is one when it takes no step there and calls something (not a setter); methods the
    scan cannot see are not."""
    methods = [info for info in ctx.functions.get(name, ()) if info.class_name and is_module_class(ctx, info.class_name)]
    if methods:
        return all((calls_model(ctx, info.node.body) or _calls_self(info.node.body)) and not steps(info.node.body)
                   for info in methods)
    made = class_assignments(ctx, receiver, site.stack) if receiver.startswith("self.") else \
        ctx.assignments_in_scope(receiver, site.stack)
    for assignment in made:
        built = peel(ctx, assignment.value)
        owner = ctx.project_name(dotted_name(built.func)) if isinstance(built, cst.Call) else None
        facts = ctx.links.function(f"{owner}.{name}") if owner else None
        if facts is not None:
            # `model.reset_length(n)` sets attributes; `model.get_step()` reads a buffer's value, `model.save(path)` writes
            return not (facts.steps or facts.trains or facts.sets_only) and facts.runs_parts
    return False


def _calls_self(body: cst.CSTNode) -> bool:
    """`self(x)` in a method: the module's own forward."""
    return any(isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "self"
               for node in walk_expression(body))


def _is_network(ctx: FileContext, name: str, site: CallSite) -> bool:
    owner = ctx.class_of(site.stack)
    if name in ("self", "self.forward"):
        return owner is not None and is_module_class(ctx, owner.name.value)
    trained = {model for model, _ in trained_models(ctx)}
    if name in trained or builds(ctx, name, site.stack, None):
        return True
    if name.startswith("self."):  # `self.actor = Actor(...).to(device)` in `__init__` (TD3's agent class)
        # ... or the trained model handed to the constructor (`self.model = model`, then `self.model.to(device)`)
        return any(_builds_network(ctx, a.value, a.stack) or isinstance(a.value, cst.Name) and a.value.value in trained
                   for a in class_assignments(ctx, name, site.stack))
    return _builds_network(ctx, cst.Name(name), site.stack)


def _builds_network(ctx: FileContext, value: cst.BaseExpression, stack: Stack) -> bool:
    """`Actor(...).to(device)` with `Actor` a module class of the file, `copy.deepcopy(self.actor)`."""
    if isinstance(value, cst.Call) and ctx.qualname(value.func) == "copy.deepcopy" and value.args:
        value = value.args[0].value
    built = peel(ctx, value)
    if isinstance(built, cst.Call) and builds_module(ctx, built, stack):
        return True
    made_by = ctx.constructor_of(built, stack) if not isinstance(built, cst.Call) else dotted_name(built.func)
    return made_by is not None and made_by in ctx.classes and is_module_class(ctx, made_by)


def outputs_leave_autograd(ctx: FileContext, site: CallSite) -> bool:
    """Does every use of the call's value end as a host value, an index or a detached copy (so
    the graph it records is never differentiated)?"""
    scope = ctx.function_of(site.stack) or ctx.module
    return _Flow(ctx, scope).leaves(site.node, 0)


def only_detached(ctx: FileContext, site: CallSite) -> bool:
    """Does every use of the call's value leave autograd as a detached tensor (`.detach()`,
    `.data`): `fake = G(z).detach()` handed to the discriminator, still on the device?"""
    flow = _Flow(ctx, ctx.function_of(site.stack) or ctx.module)
    return flow.leaves(site.node, 0) and flow.exits == {"detach"}


def called_without_grad(ctx: FileContext, function: cst.FunctionDef) -> bool:
    """Does another scanned file call ``function`` under `torch.no_grad()` / `inference_mode()`
    (`with torch.no_grad(): validate(...)` in train.py, `validate` defined here)? For a method,
    a call of that name on an object whose class the caller cannot name counts too."""
    name = function.name.value
    if name in ctx.links.no_grad_methods and any(info.node is function and info.class_name
                                                 for info in ctx.functions.get(name, ())):
        return True  # `with torch.no_grad(): self.agent.act(obs)`, the agent's class unknown there
    for key in ctx.links.no_grad:
        owner, _, called = key.rpartition(".")
        if called == name and any(info.node is function and info.class_name == (owner or None)
                                  for info in ctx.functions.get(name, ())):
            return True
    return False


_PARENTS: WeakKeyDictionary[FileContext, dict[int, dict[int, cst.CSTNode]]] = WeakKeyDictionary()
# Per file: a statement's (or block's) reads of each variable, by the node's id.
_LOADS: WeakKeyDictionary[FileContext, dict[int, dict[str, list[cst.CSTNode]]]] = WeakKeyDictionary()


def feeds_environment(ctx: FileContext, site: CallSite) -> bool:
    """Does the call's value (`q.argmax(1).cpu().numpy()`, `m.sample().item()`) reach an
    environment's `step()`, directly or through the names it is assigned to, or leave a policy's
    `select_action` as the action? The environment needs it on the host: its sync is the price
    of acting, not a mistake."""
    scope = ctx.function_of(site.stack) or ctx.module
    return _Flow(ctx, scope).reaches_env(site.node, 0)


class _Flow:
    def __init__(self, ctx: FileContext, scope: cst.CSTNode) -> None:
        self.ctx = ctx
        self.scope = scope
        by_scope = _PARENTS.setdefault(ctx, {})
        if id(scope) not in by_scope:
            by_scope[id(scope)] = _parents(scope)
        self.parents = by_scope[id(scope)]
        self.exits: set[str] = set()  # how the value left: "detach" (`.detach()`, `.data`), "host"
        self.loads = _LOADS.setdefault(ctx, {})

    def _left(self, how: str) -> bool:
        self.exits.add(how)
        return True

    def leaves(self, node: cst.CSTNode, depth: int) -> bool:
        parents = self.parents
        current = node
        while True:
            parent = parents.get(id(current))
            if parent is None:
                return False
            if isinstance(parent, cst.Attribute) and parent.value is current:
                grand = parents.get(id(parent))
                if isinstance(grand, cst.Call) and grand.func is parent:
                    if parent.attr.value == "backward":
                        return False
                    if parent.attr.value in _LEAVING_METHODS:
                        return self._left("detach" if parent.attr.value == "detach" else "host")
                    current = grand  # `.cpu()`, `.max(1)`, `.view(...)`: still a tensor of the graph
                    continue
                if parent.attr.value in _LEAVING_ATTRIBUTES:
                    return self._left("detach" if parent.attr.value == "data" else "host")
                current = parent
            elif isinstance(parent, cst.Subscript) and parent.value is current:
                current = parent
            elif isinstance(parent, (cst.Index, cst.Slice, cst.SubscriptElement)):
                return self._left("host")  # an index
            elif isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation, cst.Element, cst.Tuple, cst.List)):
                current = parent
            elif isinstance(parent, cst.IfExp):
                if parent.test is current:
                    return self._left("host")
                current = parent
            elif isinstance(parent, (cst.Comparison, cst.ComparisonTarget)):
                return self._left("host")
            elif isinstance(parent, cst.Arg):
                call = parents.get(id(parent))
                if not isinstance(call, cst.Call):
                    return False
                verdict = self._argument_of(call)
                if verdict is not None:
                    return verdict and self._left("host")
                current = call
            elif isinstance(parent, cst.Expr):
                return self._left("host")
            elif isinstance(parent, (cst.If, cst.While)) and parent.test is current:
                return self._left("host")
            elif isinstance(parent, cst.Assign) and parent.value is current:
                return self._assigned(parent, depth)
            else:
                return False

    def reaches_env(self, node: cst.CSTNode, depth: int) -> bool:
        current, parents = node, self.parents
        while True:
            parent = parents.get(id(current))
            if parent is None or isinstance(parent, cst.BaseStatement):
                return False
            if isinstance(parent, cst.Call) and is_env_step(parent.func) \
                    and parent.func is not current:
                return True
            if isinstance(parent, cst.Return) and is_acting_function(self.scope):
                return True  # the action a policy's `select_action` hands to the environment step
            if isinstance(parent, cst.Assign) and parent.value is current:
                statement = parents.get(id(parent))
                names = [n for t in parent.targets for n in (_plain_names(t.target) or ())]
                if depth >= 2 or not isinstance(statement, cst.SimpleStatementLine):
                    return False
                return any(self.reaches_env(load, depth + 1)
                           for name in names for load in (self._reached(name, statement) or ()))
            current = parent

    def _argument_of(self, call: cst.Call) -> bool | None:
        """True: the argument leaves autograd there; None: the call's result carries it on
        (a torch function); False: unknown code may differentiate it."""
        name = dotted_name(call.func)
        qualified = self.ctx.qualname(call.func) or ""
        if name in _HOST_BUILTINS or qualified in _LEAVING_TORCH or qualified.startswith("numpy."):
            return True
        if is_env_step(call.func):
            return True
        if qualified.startswith(("torch.autograd", "torch.distributed.autograd", "torch.optim")):
            return False  # differentiated there (`dist_autograd.backward(cid, [loss])`)
        if qualified.startswith(("torch.", "torchvision.utils.")):
            return None
        if not qualified and LOSS_NAME.search(name or "") and is_local_object(self.ctx, name):
            return None  # `criterion(out, y)`: the loss of an evaluation carries the graph on
        return False

    def _assigned(self, assign: cst.Assign, depth: int) -> bool:
        names: list[str] = []
        for target in assign.targets:
            found = _plain_names(target.target)
            if found is None:
                return False  # stored into an attribute, an item: kept for later
            names.extend(found)
        if depth >= _DEPTH:
            return False
        return all(self._read(name, assign, depth + 1) for name in names if name != "_")

    def _read(self, name: str, assign: cst.Assign, depth: int) -> bool:
        statement = self.parents.get(id(assign))
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        reached = self._reached(name, statement)
        return reached is not None and all(self.leaves(load, depth) for load in reached)

    def _reached(self, name: str, statement: cst.BaseStatement) -> list[cst.CSTNode] | None:
        """The reads of ``name`` that its value, assigned at ``statement``, may reach: the
        statements after it in its block up to one that assigns the name again, then those after
        the compound statement around it, and, in a loop, the whole loop body (the next turn).
        None when the code around cannot be followed."""
        parents, loads = self.parents, []
        current: cst.CSTNode = statement
        while current is not self.scope:
            holder = parents.get(id(current))
            if holder is None:
                return None
            if isinstance(holder, (cst.IndentedBlock, cst.Module)):
                for later in holder.body[holder.body.index(current) + 1:]:
                    loads.extend(self._loads(later).get(name, ()))
                    if _rebinds(later, name):
                        return loads
                if holder is self.scope:
                    return loads
            elif isinstance(holder, (cst.For, cst.While)):
                loads.extend(self._loads(holder.body).get(name, ()))  # the next turn of the loop
            current = holder
        return loads


    def _loads(self, node: cst.CSTNode) -> dict[str, list[cst.CSTNode]]:
        """The reads of each variable in ``node``, found once per file (a statement is searched
        for every name assigned before it)."""
        found = self.loads.get(id(node))
        if found is None:
            found = self.loads[id(node)] = _loads(node, self.parents)
        return found


def _plain_names(target: cst.BaseExpression) -> list[str] | None:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        names: list[str] = []
        for element in target.elements:
            found = _plain_names(element.value)
            if found is None:
                return None
            names.extend(found)
        return names
    return None


def _parents(scope: cst.CSTNode) -> dict[int, cst.CSTNode]:
    """Child id -> parent for the code of a function (or of a module, without its functions
    and classes)."""
    found: dict[int, cst.CSTNode] = {}
    todo = [scope]
    while todo:
        node = todo.pop()
        for child in child_nodes(node):
            found[id(child)] = node
            if type(child) not in SCOPES:
                todo.append(child)
    return found


def _rebinds(statement: cst.BaseStatement, name: str) -> bool:
    """`name = ...` as a statement of its own (not in a branch): the value before is gone."""
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, cst.Assign) and any(_plain_names(t.target) == [name] for t in small.targets)
        for small in statement.body
    )


def _loads(scope: cst.CSTNode, parents: dict[int, cst.CSTNode]) -> dict[str, list[cst.CSTNode]]:
    """Reads of each variable in ``scope`` (not assignment targets, attributes or keywords); a
    lambda, comprehension or nested function that reads it counts as a read where it stands
    (SR-GNN's `get = lambda i: hidden[i][alias_inputs[i]]`: the value goes on with `get`)."""
    loads: dict[str, list[cst.CSTNode]] = {}
    todo = [scope]
    while todo:
        node = todo.pop()
        for child in child_nodes(node):
            if type(child) in SCOPES:
                for name in {n.value for n in walk_expression(child) if type(n) is cst.Name}:
                    loads.setdefault(name, []).append(child)
                continue
            todo.append(child)
            if type(child) is cst.Name and not _stored(child, parents):
                loads.setdefault(child.value, []).append(child)
    return loads


def _stored(name: cst.Name, parents: dict[int, cst.CSTNode]) -> bool:
    node: cst.CSTNode = name
    parent = parents.get(id(node))
    while type(parent) in _UNPACKING:
        node, parent = parent, parents.get(id(parent))
    kind = type(parent)
    if kind in _TARGETED:
        return parent.target is node  # type: ignore[union-attr]
    if kind is cst.Attribute:
        return parent.attr is name  # type: ignore[union-attr]
    return kind is cst.Param or (kind is cst.Arg and parent.keyword is name)  # type: ignore[union-attr]


# What a stored name sits in: the nodes of an unpacking target, and the nodes whose `target` it is.
_UNPACKING = frozenset({cst.Tuple, cst.List, cst.Element, cst.StarredElement})
_TARGETED = frozenset({cst.AssignTarget, cst.For, cst.CompFor, cst.AugAssign, cst.AnnAssign})




_GRAPH_OF_GRADIENTS = ("torch.autograd.grad", "torch.autograd.backward")


def differentiates_twice(ctx: FileContext) -> CallSite | str | None:
    """A gradient taken with `create_graph=True` on the default path (`torch.autograd.grad(...,
    create_graph=True)` for an R1 or path-length penalty, `loss.backward(create_graph=True)`):
    the backward pass is itself differentiated later, which `torch.compile` cannot do. Also a
    scanned module the file imports that does so (as shown: schnetpack's forces, `grad(...,
    create_graph=self.training)` in atomistic/response.py, of the model cli.py trains)."""
    sites = [*ctx.calls_to(*_GRAPH_OF_GRADIENTS), *ctx.method_calls("backward")]
    for site in sites:
        keyword = next((arg.value for arg in site.node.args if arg.keyword is not None
                        and arg.keyword.value == "create_graph"), None)
        if keyword is not None and default_truth(ctx, keyword, site.stack) is not False:
            return site
    return ctx.links.double_backward
