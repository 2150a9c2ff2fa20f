from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Applicability, FixOp, InsertStatements, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, insert_first_arg, keyword_arg, reference, remove_arg, statement, string_literal
from speedfix.model.flow import default_choice, enclosing_statements
from speedfix.model.frames import Stack
from speedfix.model.index import Assignment, CallSite
from speedfix.model.networks import (builds, built_classes, calls_in_training_step, fresh_assignments, is_conv2d_net, model_classes,
                             model_names, optimizer_factories, project_conv_dims, reads, reshapes_its_input,
                             trained_models, view_calls)
from speedfix.model.amp import mixed_precision_by_default
from speedfix.model.patterns import BatchNames, root_name
from speedfix.model.subjects import call_subjects, is_for_model
from speedfix.rules._impact import Estimate, Finding, Impact, small_model
from speedfix.syntax.blocks import enclosing_block
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import integer_value, walk_expression

_LAYOUT = "torch.channels_last"


class ConvNotChannelsLast(Rule):
    """
    ## What it does
    Finds a 2-D convolutional network trained on CUDA in the default NCHW memory layout: a model
    built from a class of the file that uses `nn.Conv2d`/`nn.ConvTranspose2d`, or a CNN from a
    model zoo (`torchvision.models.resnet50()`, `models.__dict__[args.arch]()`,
    `models.get_model(...)`, `timm.create_model(...)`), in a script that never uses
    `torch.channels_last`. A script that does, but only behind an option that is off by default
    (`if args.channels_last:`), is reported too, without a fix. 1-D and 3-D conv nets are not
    reported, nor is a net the file trains in fp32: the layout pays off on the fp16/bf16
    tensor-core kernels, so SF202 (mixed precision) comes first. A net trained by a loop of
    another file, whose precision that file decides, is reported.

    ## Why is this bad?
    cuDNN's tensor-core convolution kernels work on channels-last (NHWC) data. Given NCHW tensors
    it transposes the input and output around every convolution; with the weights and the input
    batch in `torch.channels_last` the activations stay NHWC through the whole network.

    ## Example
    ```python
    model = torchvision.models.resnet50().to(device)
    for images, target in train_loader:
        images = images.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = criterion(model(images), target)
    ```

    ## Use instead
    ```python
    model = torchvision.models.resnet50().to(device, memory_format=torch.channels_last)
    for images, target in train_loader:
        images = images.to(device, non_blocking=True, memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = criterion(model(images), target)
    ```

    ## Fix safety
    Unsafe: different convolution kernels run, so results change in the last bits; ops without
    channels-last kernels (rare layers, custom CUDA extensions) convert back and forth and can
    make the model slower (MosaicML saw this on a UNet); `.view()` on activations assumes
    contiguous NCHW memory and raises on channels-last tensors (`.reshape()` and `torch.flatten`
    are fine); and `memory_format=torch.channels_last` raises on an input batch that is not 4-D.
    The fix converts the model where it is built or moved to its device, and the batch where the
    training loop copies it to the GPU (`.cuda()` becomes `.to("cuda", ...)`, which takes the
    layout). It is offered only when both places are found unambiguously and the model's own
    classes neither call `.view()` nor reshape their input; the gain is largest with mixed
    precision.

    ## Impact
    Medium. Low when the file shows no mixed precision (its training loop is in another file) and
    for a small model (under 10M parameters, counted from the layers it builds, or given by
    width options of 256 or less).

    ## Measured effect
    PyTorch's channels-last tutorial: 22% faster ResNet-50 training with AMP on tensor-core GPUs;
    MosaicML Composer: about 30% for ResNet-50 on ImageNet on V100 and A100, 1.5-2x per
    convolution.
    Sources: https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html,
    https://docs.mosaicml.com/projects/composer/en/v0.3.0/method_cards/channels_last.html
    """

    impact = "medium"
    code = "SF206"
    name = "conv-not-channels-last"
    summary = "2-D conv net trained on CUDA in NCHW layout, without `channels_last`"
    severity = Severity.INFO
    requires = (b"Conv2d", b"ConvTranspose2d", b"models", b"create_model", b"diffusers")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Convert the model and the input batch to `torch.channels_last`"
    gpu_only = True
    reads_project = True  # a conv net defined in another scanned file
    effect = "Convolutions without layout transposes: +22-30% for AMP ResNet-50 training."

    VALID = [
        Valid(  # already channels-last
            """
            import torch
            import torchvision
            model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for images, target in loader:
                images = images.cuda().contiguous(memory_format=torch.channels_last)
                loss = criterion(model(images), target)
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # an option that is on by default
            """
            import argparse
            import torch
            import torchvision
            parser = argparse.ArgumentParser()
            parser.add_argument("--no-channels-last", action="store_true")
            args = parser.parse_args()
            model = torchvision.models.resnet18().cuda()
            if not args.no_channels_last:
                model = model.to(memory_format=torch.channels_last)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for images, target in loader:
                loss = criterion(model(images.cuda()), target)
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # 1-D convolutions (audio, sequences): no channels-last layout for 3-D tensors
            """
            import torch
            from torch import nn
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv1d(8, 16, 3)
            model = Net().cuda()
            optimizer = torch.optim.Adam(model.parameters())
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a vision transformer from a zoo
            """
            import torch
            import timm
            model = timm.create_model("vit_base_patch16_224").cuda()
            optimizer = torch.optim.AdamW(model.parameters())
            for images, target in loader:
                loss = criterion(model(images.cuda()), target)
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a small ResNet trained in fp32: the layout pays off with mixed precision (SF202 first)
            """
            import torch
            from torch import nn
            class ResNet(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 16, 3, padding=1)
                    self.fc = nn.Linear(16, 10)
            model = ResNet().to("cuda")
            optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
            for images, labels in train_loader:
                loss = criterion(model(images.to("cuda")), labels.to("cuda"))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """
        ),
    ]
    INVALID = [
        Invalid(  # trained by the script's own optimizer class (a LARS for large batches), under bf16 autocast
            """
            import torch
            import torchvision
            from torch import optim

            class LARS(optim.Optimizer):
                def __init__(self, params, lr):
                    super().__init__(params, dict(lr=lr))

            model = torchvision.models.resnet50().cuda()
            optimizer = LARS(model.parameters(), lr=0.2)
            for images, labels in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = criterion(model(images.cuda(non_blocking=True)), labels.cuda())
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            import torchvision
            from torch import optim

            class LARS(optim.Optimizer):
                def __init__(self, params, lr):
                    super().__init__(params, dict(lr=lr))

            model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
            optimizer = LARS(model.parameters(), lr=0.2)
            for images, labels in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = criterion(model(images.to("cuda", non_blocking=True, memory_format=torch.channels_last)), labels.cuda())
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # pytorch/examples mnist: a local conv net, trained in a function it is passed to
            """
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv1 = nn.Conv2d(1, 32, 3, 1)
                    self.fc = nn.Linear(21632, 10)

                def forward(self, x):
                    return self.fc(torch.flatten(F.relu(self.conv1(x)), 1))

            def train(model, device, train_loader, optimizer):
                for data, target in train_loader:
                    data, target = data.to(device), target.to(device)
                    optimizer.zero_grad()
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = F.cross_entropy(model(data), target)
                    loss.backward()
                    optimizer.step()

            def main():
                device = torch.device("cuda")
                model = Net().to(device)
                optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
                train(model, device, loader, optimizer)
            """,
            fixed="""
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv1 = nn.Conv2d(1, 32, 3, 1)
                    self.fc = nn.Linear(21632, 10)

                def forward(self, x):
                    return self.fc(torch.flatten(F.relu(self.conv1(x)), 1))

            def train(model, device, train_loader, optimizer):
                for data, target in train_loader:
                    data, target = data.to(device, memory_format=torch.channels_last), target.to(device)
                    optimizer.zero_grad()
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = F.cross_entropy(model(data), target)
                    loss.backward()
                    optimizer.step()

            def main():
                device = torch.device("cuda")
                model = Net().to(device, memory_format=torch.channels_last)
                optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
                train(model, device, loader, optimizer)
            """,
        ),
        Invalid(  # pytorch/examples imagenet: built in branches, moved and wrapped in others
            """
            import torch
            import torchvision.models as models

            def main_worker(gpu, args):
                if args.pretrained:
                    model = models.__dict__[args.arch](pretrained=True)
                else:
                    model = models.__dict__[args.arch]()

                if args.distributed:
                    model.cuda(gpu)
                    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
                else:
                    model = torch.nn.DataParallel(model).cuda()
                optimizer = torch.optim.SGD(model.parameters(), args.lr)
                for images, target in train_loader:
                    images = images.cuda(non_blocking=True)
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = criterion(model(images), target.cuda(non_blocking=True))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            import torchvision.models as models

            def main_worker(gpu, args):
                if args.pretrained:
                    model = models.__dict__[args.arch](pretrained=True)
                else:
                    model = models.__dict__[args.arch]()
                model = model.to(memory_format=torch.channels_last)

                if args.distributed:
                    model.cuda(gpu)
                    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
                else:
                    model = torch.nn.DataParallel(model).cuda()
                optimizer = torch.optim.SGD(model.parameters(), args.lr)
                for images, target in train_loader:
                    images = images.to("cuda", non_blocking=True, memory_format=torch.channels_last)
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = criterion(model(images), target.cuda(non_blocking=True))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # moved on its own line after the build; `torch` imported for the layout
            """
            import torchvision
            from torch import optim
            from torch.amp import autocast

            model = torchvision.models.resnet50()
            model.cuda()
            optimizer = optim.SGD(model.parameters(), lr=0.1)
            for step, (images, labels) in enumerate(train_loader):
                logits = model(images.cuda())
                with autocast("cuda"):
                    loss = criterion(logits, labels.cuda())
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torchvision
            from torch import optim
            from torch.amp import autocast
            import torch

            model = torchvision.models.resnet50()
            model.cuda().to(memory_format=torch.channels_last)
            optimizer = optim.SGD(model.parameters(), lr=0.1)
            for step, (images, labels) in enumerate(train_loader):
                logits = model(images.to("cuda", memory_format=torch.channels_last))
                with autocast("cuda"):
                    loss = criterion(logits, labels.cuda())
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # `.cuda(args.gpu)` may get None or a device: keep it, convert after the copy
            """
            import torch
            import torchvision

            def main(args):
                model = torchvision.models.resnet18()
                model = model.cuda(args.gpu)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for i, (images, target) in enumerate(train_loader):
                    images = images.cuda(args.gpu, non_blocking=True)
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = criterion(model(images), target.cuda(args.gpu))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            import torchvision

            def main(args):
                model = torchvision.models.resnet18()
                model = model.cuda(args.gpu).to(memory_format=torch.channels_last)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for i, (images, target) in enumerate(train_loader):
                    images = images.cuda(args.gpu, non_blocking=True).contiguous(memory_format=torch.channels_last)
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = criterion(model(images), target.cuda(args.gpu))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # timm train.py: the layout is an option that is off by default
            """
            import argparse
            import torch
            from timm.models import create_model
            from timm.optim import create_optimizer_v2

            parser = argparse.ArgumentParser()
            parser.add_argument("--model", default="resnet50")
            parser.add_argument("--channels-last", action="store_true", default=False)

            def main():
                args = parser.parse_args()
                model = create_model(args.model)
                model.to(device="cuda")
                if args.channels_last:
                    model.to(memory_format=torch.channels_last)
                optimizer = create_optimizer_v2(model, opt="sgd")
                for input, target in loader:
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = loss_fn(model(input.cuda()), target.cuda())
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # dcgan: `.view()` in the model's forward would fail on NHWC activations
            """
            import torch
            import torch.nn as nn

            class Discriminator(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.main = nn.Sequential(nn.Conv2d(3, 64, 4, 2, 1), nn.Flatten(), nn.LazyLinear(1))

                def forward(self, x):
                    return self.main(x).view(-1)

            netD = Discriminator().to("cuda")
            optimizerD = torch.optim.Adam(netD.parameters())
            for i, data in enumerate(dataloader):
                real = data[0].to("cuda")
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    errD = criterion(netD(real), label)
                errD.backward()
                optimizerD.step()
            """,
        ),
    ]

    _names_channels_last = False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        # Noted during the shared walk: looking for it afterwards walked every call and value again.
        if node.attr.value == "channels_last":
            self._names_channels_last = True

    def impact_here(self, finding: Finding) -> Estimate | None:
        if not mixed_precision_by_default(self.ctx):
            return Estimate(Impact.LOW, "no mixed precision: fp32 convolutions gain little from the layout")
        return small_model(self.ctx, Impact.LOW)

    def finish(self) -> None:
        ctx = self.ctx
        if not ctx.drives_training:
            return
        if ctx.step_loops and not mixed_precision_by_default(ctx):
            return  # trains here in fp32: the layout gains little there, mixed precision first (SF202)
        models = [*trained_models(ctx), *optimizer_factories(ctx)]
        reported: set[str] = set()
        for model, site in models:
            if model in reported:
                continue
            layout_gate = self._layout_gate(model, site, models)
            if layout_gate == "":
                continue
            conv = [b for b in builds(ctx, model, site.stack, site.statement)
                    if is_conv2d_net(ctx, b.built, b.assignment.stack)]
            if not conv:
                continue
            reported.add(model)
            node = conv[0].built
            if layout_gate is not None:
                self.report(node, f"`{model}` is a conv net that uses `channels_last` only when `{layout_gate}`, "
                            "which is off by default",
                            no_fix_reason="pass the option, or make channels-last the default")
                continue
            message = f"`{model}` is a conv net trained in NCHW layout: `channels_last` saves cuDNN a transpose per convolution"
            fresh = [a.statement for a in fresh_assignments(ctx, model, site.stack, site.statement)]
            ops, reason = self._fix(model, site, fresh, conv[0].built)
            self.report(node, message, fix_ops=ops, no_fix_reason=reason)

    # ------------------------------------------------------------------ already channels-last?
    def _layout_gate(self, model: str, site: CallSite, models: list[tuple[str, CallSite]]) -> str | None:
        """None: the script never uses channels_last for ``model``; "": it does by default;
        else the test of the option that turns it on (all its uses are off by default). A use
        for another model (its conversion, the batch only it is called on) does not count."""
        if not self._names_channels_last:
            return None
        others = [(other, at.stack) for other, at in models]
        uses = [(statement, stack) for statement, stack, subjects in self._layout_uses()
                if is_for_model(self.ctx, subjects, model, site.stack, others)]
        used, gate = default_choice(self.ctx, uses)
        return "" if used else gate

    def _layout_uses(self) -> list[tuple[cst.BaseStatement | None, Stack, set[str] | None]]:
        """Where the script names channels_last, and what it converts there (None: cannot say)."""
        ctx = self.ctx
        uses = [(site.statement, site.stack, call_subjects(ctx, site, receiver=True))
                for site in ctx.calls if any(_names_layout(arg.value) for arg in site.node.args)]
        for target, assignments in ctx.assignments.items():
            uses.extend((a.statement, a.stack, {target}) for a in assignments
                        if _names_layout(a.value) and not self._converts_in_call(a.value))
        return uses

    @staticmethod
    def _converts_in_call(value: cst.BaseExpression) -> bool:
        """`x = y.to(memory_format=...)`: the call is a use of its own, with its subject."""
        return isinstance(value, cst.Call) and any(_names_layout(arg.value) for arg in value.args)

    # ------------------------------------------------------------------ the fix
    def _fix(self, model: str, site: CallSite, statements: list, built: cst.Call) -> tuple[list[FixOp] | None, str]:
        ctx = self.ctx
        top = built_classes(ctx, built, site.stack)
        if not top and project_conv_dims(ctx, built):
            return None, "the network is defined in another file, whose `.view()` calls speedfix cannot check from here"
        views = view_calls(ctx, set().union(*(model_classes(ctx, name) for name in top)))
        if views:
            owner = next(f.node.name.value for f in views[0].stack if isinstance(f.node, cst.ClassDef))
            return None, f"`.view()` in `{owner}` fails on channels-last activations: use `.reshape()` there first"
        if any(reshapes_its_input(ctx, name) for name in top):
            return None, "the model reshapes its input, which need not be a 4-D image batch"
        inputs = self._input_moves(model, site.stack)
        if len(inputs) != 1:
            return None, "no single copy of the input batch to the GPU in the training loop"
        ops: list[FixOp] = []
        model_op = self._model_op(model, statements, site.stack, ops)
        if model_op is None:
            return None, "the model is built in several places"
        call, stack = inputs[0]
        layout = reference(ctx, _LAYOUT, ops, stack)
        quote = string_literal(ctx, "cuda")
        ops[:0] = [model_op, Transform(call, lambda updated: _input_to_layout(updated, layout, quote))]
        return ops, ""

    def _model_op(self, model: str, statements: list, stack: Stack, ops: list[FixOp]) -> FixOp | None:
        """Convert where the model is built or moved, else on a new line after its build."""
        ctx = self.ctx
        if any(s is None for s in statements):
            return None
        chains = [enclosing_statements(ctx, s) for s in statements]
        anchor = next((s for s in chains[0] if all(any(s is c for c in chain) for chain in chains)), None)
        block = enclosing_block(ctx, anchor) if anchor is not None else None
        if block is None:
            return None
        layout = reference(ctx, _LAYOUT, ops, stack)
        if len(statements) == 1:
            move = _move_in(statements[0], model)
            if move is not None:
                return Transform(move, lambda updated: _module_to_layout(updated, layout))
        index = next(i for i, s in enumerate(block) if s is anchor)
        following = next((s for s in block[index + 1:] if reads(s, model)), None)
        move = _move_in(following, model, of_variable=True) if following is not None else None
        if move is not None:
            return Transform(move, lambda updated: _module_to_layout(updated, layout))
        new = statement(f"{model} = {model}.to(memory_format={layout})")
        return InsertStatements(anchor, (new,))

    def _input_moves(self, model: str, stack: Stack) -> list[tuple[cst.Call, Stack]]:
        """The `.to()`/`.cuda()` calls that copy the batch the model is called on, in the step."""
        ctx = self.ctx
        batches = BatchNames(ctx)
        found: dict[int, tuple[cst.Call, Stack]] = {}
        for call in calls_in_training_step(ctx, model_names(ctx, model, stack)):
            first = call.node.args[0] if call.node.args and call.node.args[0].keyword is None else None
            if first is None or first.star:
                continue
            move = self._move_of(first.value, call, batches)
            if move is not None:
                found[id(move[0])] = move
        return list(found.values())

    def _move_of(self, arg: cst.BaseExpression, call: CallSite, batches: BatchNames) -> tuple[cst.Call, Stack] | None:
        if _is_move(arg):
            assert isinstance(arg, cst.Call) and isinstance(arg.func, cst.Attribute)
            return (arg, call.stack) if self._is_data(arg.func.value, call.stack, batches) else None
        if not isinstance(arg, cst.Name):
            return None
        ctx = self.ctx
        loop = ctx.nearest_loop(call.stack)
        assignments = [a for a in ctx.assignments_in(ctx.function_of(call.stack), arg.value)
                       if ctx.nearest_loop(a.stack) is loop]
        if len(assignments) != 1 or assignments[0].augmented:
            return None
        value = _element_for(assignments[0], arg.value)
        if value is None or not _is_move(value):
            return None
        assert isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
        return (value, assignments[0].stack) if self._is_data(value.func.value, assignments[0].stack, batches) else None

    def _is_data(self, expr: cst.BaseExpression, stack: Stack, batches: BatchNames) -> bool:
        """A batch from a DataLoader, or what the step loop itself iterates over
        (`for image, target in metric_logger.log_every(data_loader, ...)`)."""
        if batches.is_batch(expr, stack):
            return True
        loop = self.ctx.nearest_loop(stack)
        info = self.ctx.loops.get(loop) if loop is not None else None
        if info is None or loop not in self.ctx.step_loops or not isinstance(info.node, cst.For):
            return False
        counter = _enumerate_counter(info.node)
        return root_name(expr) in info.targets and root_name(expr) != counter


def _names_layout(expr: cst.BaseExpression) -> bool:
    return any(isinstance(node, cst.Attribute) and node.attr.value == "channels_last" for node in walk_expression(expr))


def _enumerate_counter(loop: cst.For) -> str | None:
    """`i` in `for i, batch in enumerate(...)`."""
    if isinstance(loop.iter, cst.Call) and dotted_name(loop.iter.func) == "enumerate" and isinstance(loop.target, cst.Tuple):
        return dotted_name(loop.target.elements[0].value)
    return None


def _is_move(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("to", "cuda")


def _element_for(assignment: Assignment, name: str) -> cst.BaseExpression | None:
    """The value assigned to ``name``: the whole value, or its element in `x, y = a, b`."""
    if not assignment.unpacked:
        return assignment.value
    line = assignment.statement
    small = line.body[0] if line is not None and len(line.body) == 1 else None
    if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Tuple)):
        return None
    target = small.targets[0].target
    if not isinstance(target, cst.Tuple) or len(target.elements) != len(small.value.elements):
        return None
    for element, value in zip(target.elements, small.value.elements):
        if dotted_name(element.value) == name and not isinstance(value, cst.StarredElement):
            return value.value
    return None


def _move_in(statement: cst.BaseStatement, model: str, *, of_variable: bool = False) -> cst.Call | None:
    """The outermost `.to()`/`.cuda()` call in `model = <build>.to(device)`, `model.cuda()` or
    `model = model.to(device)` (``of_variable``: only a move of the variable itself)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and all(dotted_name(t.target) == model for t in small.targets):
        value = small.value
    elif isinstance(small, cst.Expr) and of_variable:
        value = small.value
    else:
        return None
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if value.func.attr.value in ("to", "cuda"):
            receiver = value.func.value
            if of_variable and dotted_name(receiver) != model:
                return None
            return value
        value = value.func.value
    return None


def _module_to_layout(call: cst.CSTNode, layout: str) -> cst.CSTNode:
    """`m.to(device)` -> `m.to(device, memory_format=...)`; `m.cuda()` -> `m.cuda().to(memory_format=...)`."""
    assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
    if call.func.attr.value == "to":
        return append_args(call, keyword_arg("memory_format", layout))
    return cst.Call(func=cst.Attribute(value=call, attr=cst.Name("to")), args=[keyword_arg("memory_format", layout)])


def _input_to_layout(call: cst.CSTNode, layout: str, cuda: str) -> cst.CSTNode:
    """`x.to(device)` -> `x.to(device, memory_format=...)`; `x.cuda(non_blocking=True)` ->
    `x.to("cuda", non_blocking=True, memory_format=...)` (`.cuda()` takes no layout); a `.cuda(d)`
    whose device may be None or a device object keeps it and converts after the copy."""
    assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
    new = keyword_arg("memory_format", layout)
    if call.func.attr.value == "to":
        return append_args(call, new)
    device = [arg for arg in call.args if arg.keyword is None or arg.keyword.value == "device"]
    if not device:
        target: cst.BaseExpression = cst.parse_expression(cuda)
    elif len(device) == 1 and isinstance(device[0].value, cst.Integer) and (number := integer_value(device[0].value)) is not None:
        target = cst.parse_expression(f"{cuda[0]}cuda:{number}{cuda[0]}")  # `.cuda(0x1)`: "cuda:1"
    else:
        return cst.Call(func=cst.Attribute(value=call, attr=cst.Name("contiguous")), args=[new])
    moved = call.with_changes(func=call.func.with_changes(attr=cst.Name("to")))
    if device:  # the other arguments keep their places, lines and comments
        moved = remove_arg(moved, device[0])
    return append_args(insert_first_arg(moved, cst.Arg(target)), new)
