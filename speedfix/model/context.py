"""What a file's code means for training: its step loops and the code that runs on every step.

``FileContext`` is what a rule is given: the file index (``speedfix.model.index``) and, on top of
it, the training loops. A *step loop* is a ``for``/``while`` whose body calls ``.backward()``
(``accelerator.backward(loss)`` too), an optimizer's/scaler's ``.step()`` or a callable loss
scaler (``loss_scaler(loss, optimizer, ...)``) outside any nested loop, directly or in a function
it calls (one level): one of this file (``f()``, ``self.f()``, ``obj.f()`` for an object made by
a class of this file) or of another scanned file (``Links``, see ``speedfix.project``); a
`.backward()` with no update beside it, in code that only reads the gradients it makes (a
receptive field or a saliency map drawn from `img.grad`), marks no step, nor does one inside a
`lambda` (a benchmark's `backward = lambda: out.backward(grad)`). Code is
*hot* when its nearest enclosing step loop is reached before a function boundary and no periodic
guard sits in between (nor a branch on one pass of the step loop, `if i == len(loader) - 1:`,
nor a module's eval-mode branch, `if not self.training:`); functions called from hot code (also from another scanned file, and
then three levels more) or handed to a call there (`run_step(batch, loss_fn=masked_loss)`), the ``forward`` of a module class whose object hot code calls, Lightning
``training_step`` methods, the per-batch hooks of a LightningModule or `Callback` (``on_train_batch_end``,
``on_after_backward``...), and what they call (``self.shared_step(batch)``), the ``compute_loss``
and ``training_step`` of a Hugging Face Trainer subclass and what they call, a method that takes a
step, or calls such methods outside a loop of its own (an agent's `update()` running
`update_critic()` and `update_actor()`), that no code of the file calls, are hot too, except
for code under ``if isinstance(v, torch.Tensor):`` in such a helper (whether it runs on tensors
is the caller's business). An epoch loop that only contains the batch loop is not a step loop, so what runs once
per epoch is not hot.
"""

from __future__ import annotations

from functools import cached_property

import libcst as cst

from speedfix.model.frames import FrameKind, Stack, function_of
from speedfix.model.index import CallSite, FileIndex, FunctionInfo
from speedfix.project.facts import FunctionFacts
from speedfix.project.steps import (HF_STEP_METHODS, HF_TRAINERS, LIGHTNING_CALLBACK, LIGHTNING_MODULE, NO_GRAD_CALLS,
                                    LIGHTNING_STEP_HOOKS, is_loss_scaler_call, is_optimizer_name)
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import walk_expression


class FileContext(FileIndex):
    """The file index, and which of its loops train (see the module docstring)."""

    # The periodic guards that hold on every step of every run, by ``id``: their period is an
    # option that is 1 by default and no launch command changes (`if (step + 1) %
    # args.gradient_accumulation == 0:`), set by the engine after the walk
    # (``speedfix.model.flow.every_step_guards``).
    every_step_guards: frozenset[int] = frozenset()

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

    def _is_backward(self, site: CallSite) -> bool:
        """`.backward()` (also `accelerator.backward(loss)`, `scaler.scale(loss).backward()`)."""
        func = site.node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "backward":
            return True
        return self.call_qualname(site) == "torch.autograd.backward"

    def _is_update(self, site: CallSite) -> bool:
        """An optimizer's or scaler's `.step()`, `loss_scaler(loss, optimizer, ...)`."""
        func = site.node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "step":
            return self.is_optimizer_like(func.value, site.stack)
        return self.is_loss_scaler(site)

    @staticmethod
    def is_loss_scaler(site: CallSite) -> bool:
        """`loss_scaler(loss, optimizer, ...)` (timm/Meta `NativeScaler`)."""
        args = site.node.args
        positional = [dotted_name(arg.value) for arg in args if arg.keyword is None and not arg.star]
        keywords = {arg.keyword.value for arg in args if arg.keyword is not None}
        return is_loss_scaler_call(site.func, positional, keywords)

    @cached_property
    def _markers(self) -> tuple[set[cst.CSTNode], set[cst.CSTNode]]:
        """(loops with a marker directly in their body, functions with one outside loops).

        A place whose only markers are `.backward()` calls and that reads gradients without
        updating anything with them (`img.grad.abs()` to draw a receptive field or a saliency
        map) differentiates to look, not to train: it is no step."""
        places: dict[cst.CSTNode, bool] = {}  # place -> it also updates (an optimizer step)
        for site in self.calls:
            update = self._is_update(site)
            if not update and (not self._is_backward(site) or _deferred(site)):
                continue
            place = self.nearest_loop(site.stack) or self.function_of(site.stack)
            if place is not None:
                places[place] = places.get(place, False) or update
        steps = {place for place, update in places.items()
                 if update or not (_inspects_gradients(place) or _input_gradients(place))}
        loops = {place for place in steps if isinstance(place, (cst.For, cst.While))}
        return loops, steps - loops

    def local_callees(self, site: CallSite) -> list[FunctionInfo]:
        """The same-file functions a call may run: `f(...)`, `self.f(...)`, and `obj.f(...)`
        where `obj` was made by a class of this file (`metric = Accumulator(3)`)."""
        func = site.node.func
        if type(func) is cst.Name:
            return self.functions.get(func.value, [])
        if not isinstance(func, cst.Attribute) or not isinstance(func.value, cst.Name):
            return []
        found = self.functions.get(func.attr.value, [])
        if func.value.value == "self":
            return found
        owner = self.constructor_of(func.value, site.stack)
        return [info for info in found if owner is not None and info.class_name == owner and owner in self.classes]

    def local_callers(self, function: cst.CSTNode) -> list[CallSite]:
        """The calls of this file that may run ``function`` (``local_callees`` the other way
        round), in file order."""
        return self._local_callers.get(function, [])

    @cached_property
    def _local_callers(self) -> dict[cst.CSTNode, list[CallSite]]:
        index: dict[cst.CSTNode, list[CallSite]] = {}
        for site in self.calls:
            for node in dict.fromkeys(info.node for info in self.local_callees(site)):
                index.setdefault(node, []).append(site)
        return index

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
        if not isinstance(func, cst.Attribute) or not isinstance(func.value, cst.Name):
            return None
        made = [self.constructor_of(func.value, site.stack)]
        if made[0] is None:  # `policy = TD3.TD3(...)` or `DDPG.DDPG(...)` by an option: any of them
            made = [dotted_name(value.func) for a in self.assignments_in_scope(func.value.value, site.stack)
                    if isinstance(value := unmoved(a.value), cst.Call)]  # `Trainer(net).cuda()` too
        for owner in made:  # spelled through the imports (`sac.SAC`) or not yet (`from models import *`)
            for qualified in (owner, self.project_name(owner)):
                found = self.links.function(f"{qualified}.{func.attr.value}") if qualified else None
                if found is not None:
                    return found
        return None

    def project_iterates(self, site: CallSite, name: str, *, any_loop: bool = False, again: bool = False) -> bool:
        """Does the function of another scanned file that ``site`` calls iterate the argument
        ``name`` in its training loop (`train_one_epoch(model, loader, ...)`), or with
        ``any_loop`` in any loop (`evaluate(val_loader, model)`), or with ``again`` in a loop
        inside another loop (`infiniteloop(loader)`: `while True: for x in loader: yield x`)?"""
        callee = self.project_callee(site)
        if callee is None:
            return False
        iterated = callee.repeats if again else callee.loops_over if any_loop else callee.iterated
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

    def called_by_others_as(self, stack: Stack) -> str | None:
        """The name other files call the function around ``stack`` by (``Links.networks``,
        ``Links.on_device``): a module-level function's, or its class's for an `__init__`
        (`Solver(data, model, ...)`); None for anything else."""
        function = function_of(stack)
        if not isinstance(function, cst.FunctionDef):
            return None
        infos = [info for info in self.functions.get(function.name.value, ()) if info.node is function]
        if any(not info.stack for info in infos):
            return function.name.value
        if function.name.value == "__init__" and any(len(info.stack) == 1 and info.class_name for info in infos):
            return next(str(info.class_name) for info in infos if info.class_name)
        return None

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

    @property
    def step_functions(self) -> set[cst.CSTNode]:
        """Functions that take a training step outside their own loops (an agent's `learn()`:
        each call is one step, wherever it is called from)."""
        return self._markers[1]

    @cached_property
    def step_loops(self) -> set[cst.CSTNode]:
        """Loops with a step marker in their body, or calling a function (of this file or
        another scanned one) that takes a step outside its own loops, or a method of the class
        that subclasses in other scanned files override with a step."""
        direct_loops, step_functions = self._markers
        result = set(direct_loops)
        for site in self.calls:
            loop = self.nearest_loop(site.stack)
            if loop is None or loop in result or self._grad_off(site.stack):
                continue
            if any(info.node in step_functions for info in self.local_callees(site)):
                result.add(loop)
            elif (callee := self.project_callee(site)) is not None and callee.steps:
                result.add(loop)
            elif self.links.stepping_overrides and self._overridden_step(site):
                result.add(loop)
        return result

    @cached_property
    def training_loops(self) -> set[cst.CSTNode]:
        """The step loops and the loops around them (PPO: each prompt batch is rolled out, then
        its micro-batches are trained on in an inner loop; the prompt loop trains too)."""
        return set(self.step_loops) | {frame.node for loop in self.step_loops for frame in self.loops[loop].stack
                                       if frame.kind is FrameKind.LOOP}

    def _grad_off(self, stack: Stack) -> bool:
        """Is code at ``stack`` inside a `with` that turns autograd off (any of its items:
        Wave-U-Net's `with tqdm(...) as pbar, torch.no_grad():`)? A function called there takes
        no step: its `backward()` would raise (it is one that steps only when a flag says so)."""
        return any(frame.kind is FrameKind.WITH and frame.node in self._grad_off_withs for frame in stack)

    @cached_property
    def _grad_off_withs(self) -> frozenset[cst.CSTNode]:
        return frozenset(info.node for info in self.withs if any(
            isinstance(item, cst.Call) and self.qualname(item.func) in NO_GRAD_CALLS for item in info.items))

    def _overridden_step(self, site: CallSite) -> bool:
        """`self.train_step(...)` in a method of a class whose subclasses in other scanned files
        define `train_step` with a step (``Links.stepping_overrides``)."""
        func = site.node.func
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"):
            return False
        owner = self.class_of(site.stack)
        return owner is not None and f"{owner.name.value}.{func.attr.value}" in self.links.stepping_overrides

    @cached_property
    def drives_training(self) -> bool:
        """Does the file train: a step loop of its own, or a call of another scanned file's
        function that holds a training loop (`train_one_epoch(model, loader, ...)` in main.py)?"""
        return bool(self.step_loops) or any(
            (callee := self.project_callee(site)) is not None and callee.trains for site in self.calls
        )

    def _hot(self, stack: Stack, *, through_calls: bool, guards_count: bool = True) -> bool:
        # Asked for every call, attribute and loop the rules look at; the sites of one block
        # share their stack (the index makes one tuple per block): answered once per stack.
        key = (id(stack), through_calls, guards_count)
        known = self._hot_answers.get(key)
        if known is None or known[0] is not stack:  # the stack is kept, so its id is not reused
            known = self._hot_answers[key] = (stack, self._hot_at(stack, through_calls, guards_count))
        return known[1]

    @cached_property
    def _hot_answers(self) -> dict[tuple[int, bool, bool], tuple[Stack, bool]]:
        return {}

    def _hot_at(self, stack: Stack, through_calls: bool, guards_count: bool) -> bool:
        type_guarded = once = False
        for frame in reversed(stack):
            if frame.kind is FrameKind.GUARD and id(frame.node) not in self.every_step_guards \
                    and (guards_count or self.rare_guard(frame.node, stack)):
                return False
            if frame.kind is FrameKind.INFERENCE:
                return False
            type_guarded = type_guarded or frame.kind is FrameKind.TYPE_GUARD
            if frame.kind is FrameKind.LOOP:
                if frame.node in self.step_loops:
                    return not once  # `if i == len(loader) - 1:` of the step loop: once per epoch
                once = False  # one pass of a loop inside the step: once per step
            once = once or frame.kind is FrameKind.ONCE
            if frame.kind is FrameKind.FUNCTION:
                return through_calls and not type_guarded and frame.node in self.hot_functions
            if frame.kind is FrameKind.CLASS:
                return False
        return False

    @cached_property
    def hot_functions(self) -> set[cst.CSTNode]:
        """Functions run on every step: called from hot code here, or from a training loop in
        another scanned file (``Links.hot``), Lightning training steps and per-batch hooks (of the
        module or of a `Callback`: `on_train_batch_end`, `on_after_backward`...), methods that take a whole
        step that no code of this file calls (a trainer's `train_step`), and the `forward` of a
        module class of this file whose object hot code calls (`model(x)` after `model =
        Tagger.from_pretrained(...)`); then what those call outside a periodic guard, three levels
        more (a logger's `log()` that turns every step's images into pictures)."""
        hot: set[cst.CSTNode] = set()
        for site in self.calls:
            if self._hot(site.stack, through_calls=False):
                hot.update(self._runs(site))
        for key in self.links.hot:
            owner, _, name = key.rpartition(".")
            hot.update(info.node for info in self.functions.get(name, ()) if info.class_name == (owner or None))
        steps = {info.node: info.class_name for info in self.functions.get("training_step", ())
                 if info.class_name and self.is_subclass_of(info.class_name, *LIGHTNING_MODULE)}
        steps.update({info.node: info.class_name for name in LIGHTNING_STEP_HOOKS for info in self.functions.get(name, ())
                      if info.class_name and self.is_subclass_of(info.class_name, *LIGHTNING_MODULE, *LIGHTNING_CALLBACK)})
        steps.update({info.node: info.class_name for name in HF_STEP_METHODS for info in self.functions.get(name, ())
                      if info.class_name and self.is_subclass_of(info.class_name, *HF_TRAINERS)})
        hot.update(steps)
        # a method that takes a whole step (`trainer.train_step(x, y)`) that no code of this file
        # calls: another file's loop does, once per step
        called = self._local_callers
        for node in self.step_functions:
            if node not in called:
                hot.add(node)
                continue
            for site in called[node]:  # DrQ-v2's `update()` runs `update_critic()` and `update_actor()` once each
                caller = self.function_of(site.stack)
                if isinstance(caller, cst.FunctionDef) and caller not in called and self.nearest_loop(site.stack) is None:
                    hot.add(caller)
        for site in self.calls:  # `loss = self.shared_step(batch)`: what the step calls runs every step too
            owner = _step_around(site.stack, steps, self.every_step_guards)
            if owner is not None:
                hot.update(info.node for info in self._step_callees(site, owner))
        for _ in range(3):
            more = {node for site in self.calls if _plainly_in(site.stack, hot, self.every_step_guards)
                    for node in self._runs(site)} - hot
            if not more:
                break
            hot |= more
        return hot

    def _step_callees(self, site: CallSite, owner: str) -> list[FunctionInfo]:
        """The functions a call in a Lightning `training_step` of class ``owner`` runs: a function
        of the file, or a method of the module (`self.shared_step(...)`, defined by the class or a
        base class of the file), not another class's method of the same name."""
        func = site.node.func
        if isinstance(func, cst.Name):
            return [info for info in self.functions.get(func.value, ()) if info.class_name is None]
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"):
            return []
        lineage = {owner}
        todo = [owner]
        while todo:
            info = self.classes.get(todo.pop())
            for base in info.bases if info is not None else ():
                if base in self.classes and base not in lineage:
                    lineage.add(base)
                    todo.append(base)
        return [info for info in self.functions.get(func.attr.value, ()) if info.class_name in lineage]

    def _runs(self, site: CallSite) -> list[cst.CSTNode]:
        """The functions of this file a call runs: its callees, a module's `forward`, or a
        function the call is handed to run itself (Megatron's `train_step(...,
        forward_step_func=forward_step)`, `checkpoint(block, x)`, `optimizer.step(closure)`)."""
        found = [info.node for info in self.local_callees(site)]
        for arg in site.node.args:
            if isinstance(arg.value, cst.Name) and not arg.star:
                found.extend(info.node for info in self.functions.get(arg.value.value, ()) if info.class_name is None)
        for owner in self.module_classes_called(site):
            found.extend(info.node for info in self.functions.get("forward", ()) if info.class_name == owner)
        return found

    def module_classes_called(self, site: CallSite) -> set[str]:
        """The classes of this file whose objects a call like `model(x)` or `self.net(x)` runs:
        what the name is built by (`Net(...)`, `Net.from_pretrained(...)`, moved with `.to()`
        or `.cuda()`), in its scope, or for `self.net` in any method of the class."""
        name = dotted_name(site.node.func)
        if name is None or name in self.functions or name in self.classes:
            return set()
        if name.startswith("self."):
            owner = self.class_of(site.stack)
            assignments = [a for a in self.assignments.get(name, ()) if owner is not None and self.class_of(a.stack) is owner]
        elif "." not in name:
            assignments = self.assignments_in_scope(name, site.stack)
        else:
            return set()
        found: set[str] = set()
        for assignment in assignments:
            value = unmoved(assignment.part if assignment.unpacked else assignment.value)
            built = dotted_name(value.func) if isinstance(value, cst.Call) else None
            if built is not None and built.rsplit(".", 1)[-1] in _LOADERS:
                built = built.rsplit(".", 1)[0]  # `Tagger.from_pretrained(path)`
            if built in self.classes:
                found.add(built)
        return found

    def is_hot(self, stack: Stack) -> bool:
        """Does code at ``stack`` run on every training step (see the module docstring)?"""
        return self._hot(stack, through_calls=True)

    def in_training_loop(self, stack: Stack) -> bool:
        """Like ``is_hot``, but code under a periodic guard counts too ("every N steps" is still
        inside the loop: right for calls that cost a lot each time they run), unless the file
        says N is ``RARE_PERIOD`` or more (`if step % 2000 == 0:`)."""
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

    def iteration_scope(self, stack: Stack) -> cst.CSTNode | None:
        """``step_scope``, widened to the outermost step loop of the same function around it: a
        GAN's discriminator steps in a loop inside the generator's step loop are one iteration."""
        scope = self.step_scope(stack)
        if scope is None or not any(frame.kind is FrameKind.LOOP and frame.node is scope for frame in stack):
            return scope
        start = max((index + 1 for index, frame in enumerate(stack) if frame.kind is FrameKind.FUNCTION), default=0)
        return next((frame.node for frame in stack[start:] if frame.kind is FrameKind.LOOP and frame.node in self.step_loops),
                    scope)


def _step_around(stack: Stack, steps: dict[cst.CSTNode, str | None], every_step: frozenset[int]) -> str | None:
    """The class of the training step whose own body (not under a periodic guard, other than
    one of ``every_step``, not in a nested function) holds code at ``stack``."""
    for frame in reversed(stack):
        if frame.kind is FrameKind.INFERENCE or frame.kind is FrameKind.GUARD and id(frame.node) not in every_step:
            return None
        if frame.kind is FrameKind.FUNCTION:
            return steps.get(frame.node)
    return None


# Methods that return the module itself (or a copy of it) rather than build another one, and
# class methods that build one: `Net().cuda()`, `Tagger.from_pretrained(path)` make a `Net`, a `Tagger`.
MODULE_METHODS = frozenset({"to", "cuda", "train", "eval", "float", "half", "bfloat16", "requires_grad_", "to_empty"})


def unmoved(value: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """`Net().cuda()`, `Net(...).to(device)` -> `Net(...)`: the module a call chain keeps."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in MODULE_METHODS:
        value = value.func.value
    return value
_LOADERS = frozenset({"from_pretrained", "from_config"})


def _plainly_in(stack: Stack, functions: set[cst.CSTNode], every_step: frozenset[int]) -> bool:
    """Is code at ``stack`` in one of ``functions`` itself, not under a periodic guard (other
    than one of ``every_step``) or a type guard?"""
    for frame in reversed(stack):
        if frame.kind in (FrameKind.TYPE_GUARD, FrameKind.CLASS, FrameKind.INFERENCE) \
                or frame.kind is FrameKind.GUARD and id(frame.node) not in every_step:
            return False
        if frame.kind is FrameKind.FUNCTION:
            return frame.node in functions
    return False


# In-place tensor methods that update weights with a gradient (`p.data.add_(p.grad, alpha=-lr)`).
_IN_PLACE_UPDATES = frozenset({"add_", "sub_", "mul_", "div_", "addcmul_", "addcdiv_", "copy_", "lerp_"})


def _inspects_gradients(place: cst.CSTNode) -> bool:
    """Does ``place`` read a `.grad` and never update anything with one: no `w -= lr * w.grad`,
    no arithmetic on a gradient, no `p.data.add_(p.grad, ...)` (a hand-written SGD step)?"""
    reads = False
    for node in walk_expression(place):
        if isinstance(node, (cst.AugAssign, cst.BinaryOperation)) and _mentions_grad(node):
            return False
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value in _IN_PLACE_UPDATES and any(_mentions_grad(arg.value) for arg in node.args):
            return False
        reads = reads or (isinstance(node, cst.Attribute) and node.attr.value == "grad")
    return reads


def _input_gradients(place: cst.CSTNode) -> bool:
    """Are the only gradients ``place`` reads those of tensors it makes itself to take them
    (`var = torch.autograd.Variable(noise_pred.detach(), requires_grad=True)`, then `var.grad`:
    a sampler's regulariser, an adversarial example), no weight's?"""
    leaves: set[str] = set()
    reads: list[str | None] = []
    for node in walk_expression(place):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name) \
                and isinstance(node.value, cst.Call) and _makes_leaf(node.value):
            leaves.add(node.targets[0].target.value)
        elif isinstance(node, cst.Attribute) and node.attr.value == "grad":
            reads.append(dotted_name(node.value))
    return bool(reads) and all(name in leaves for name in reads)


def _makes_leaf(call: cst.Call) -> bool:
    """`Variable(x, requires_grad=True)`, `torch.tensor(..., requires_grad=True)`, `x.detach().requires_grad_()`."""
    if any(arg.keyword is not None and arg.keyword.value == "requires_grad" and isinstance(arg.value, cst.Name)
           and arg.value.value == "True" for arg in call.args):
        return True
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "requires_grad_"


def _mentions_grad(node: cst.CSTNode) -> bool:
    return any(isinstance(sub, cst.Attribute) and sub.attr.value == "grad" for sub in walk_expression(node))


def _deferred(site: CallSite) -> bool:
    """Is the call inside a `lambda` of its statement (a benchmark's `backward = lambda:
    out.backward(grad)`, `do_bench(lambda: loss.backward())`)? It runs where the lambda is
    called, not where it is written."""
    statement = site.statement
    return statement is not None and any(
        isinstance(node, cst.Lambda) and any(inner is site.node for inner in walk_expression(node.body))
        for node in walk_expression(statement)
    )
