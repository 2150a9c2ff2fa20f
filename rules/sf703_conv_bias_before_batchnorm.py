from __future__ import annotations

from collections import Counter

import libcst as cst

from speedfix.engine.findings import Applicability, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, keyword_arg
from speedfix.model.arguments import find_argument
from speedfix.model.choices import parameter_values
from speedfix.model.frames import Stack
from speedfix.model.index import CallSite
from speedfix.model.networks import ConvWrapper, conv_wrapper
from speedfix.project.steps import CONV_LAYERS
from speedfix.syntax.blocks import enclosing_block
from speedfix.syntax.comments import arg_has_noqa, has_noqa
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import walk_expression

_CONV = set(CONV_LAYERS)  # transposed convolutions too: `bias` is their eighth parameter as well
_BATCHNORM = {f"torch.nn.{prefix}BatchNorm{d}d" for prefix in ("", "modules.batchnorm.") for d in (1, 2, 3)}
_SEQUENTIAL = ("torch.nn.Sequential", "torch.nn.modules.container.Sequential")


class ConvBiasBeforeBatchnorm(Rule):
    """
    ## What it does
    Finds a convolution (transposed ones too) with a bias feeding straight into batch
    normalisation: adjacent in an `nn.Sequential(...)` (also in the list `nn.Sequential(*layers)`
    takes, as the code appends to it: `layers.append(conv)`, `layers += [conv, bn, relu]`), or
    `self.bn(self.conv(x))` in a module whose `self.conv` is used nowhere else. A BatchNorm added
    only under a condition the convolution is not under (`if batch_norm: layers += [conv2d,
    nn.BatchNorm2d(v), ...]`, as VGG's `make_layers` does) is reported without a fix: the variant
    without it needs the bias (`bias=not batch_norm` keeps both right). The convolutions of one
    class (or function) are one finding, at the first, whose fix sets `bias=False` on each; one on a line that ends with
    `# noqa` is a finding of its own, so that the comment keeps that line alone as it is. A
    class of the file that only wraps one convolution (Tacotron's `ConvNorm`: the convolution
    built in `__init__` with `bias=bias`, `bias=True` by default, and `forward` returning its
    output) counts as that convolution: the fix passes the wrapper `bias=False`; a wrapper that
    always gives its convolution a bias is reported without a fix.

    ## Why is this bad?
    Batch normalisation subtracts the per-channel mean right away, so the convolution's bias is
    cancelled: it is a wasted parameter, an extra broadcast add in the forward pass and an extra
    reduction in the backward pass, per layer and step. PyTorch's tuning guide: "disable bias
    for convolutions directly followed by a batch norm".

    ## Example
    ```python
    nn.Sequential(nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU())
    ```

    ## Use instead
    ```python
    nn.Sequential(nn.Conv2d(64, 128, 3, padding=1, bias=False), nn.BatchNorm2d(128), nn.ReLU())
    ```

    ## Fix safety
    Unsafe: the `*.bias` entries disappear from the `state_dict`, so loading an existing or
    pretrained checkpoint with `strict=True` fails, and the results change within float rounding.
    An explicit `bias=True` is reported without a fix.

    ## Impact
    Low: one wasted addition per convolution and a parameter that does nothing. Nothing moves
    it.

    ## Measured effect
    Small: one broadcast add and its gradient per convolution; the profiler's pattern matcher
    reports it as `Conv2dBiasFollowedByBatchNorm2dPattern`.
    Sources: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html,
    https://github.com/pytorch/pytorch/blob/main/torch/profiler/_pattern_matcher.py
    """

    impact = "low"
    code = "SF703"
    name = "conv-bias-before-batchnorm"
    summary = "Convolution with a bias straight into BatchNorm (the bias is cancelled)"
    severity = Severity.INFO
    requires = (b"BatchNorm",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.RNG  # one fewer initialisation draw shifts every later layer's weights
    fix_title = "Drop the cancelled bias: `bias=False`"
    effect = "One broadcast add and its gradient less per convolution."

    VALID = [
        Valid(  # pointMLP: the block's `bias=True` default, but the model passes on the `bias=False` every factory gives
            """
            from torch import nn


            class ConvBNReLU1D(nn.Module):
                def __init__(self, cin, cout, bias=True):
                    super().__init__()
                    self.net = nn.Sequential(nn.Conv1d(cin, cout, 1, bias=bias), nn.BatchNorm1d(cout), nn.ReLU())

                def forward(self, x):
                    return self.net(x)


            class Model(nn.Module):
                def __init__(self, dim=64, bias=True):
                    super().__init__()
                    self.embedding = ConvBNReLU1D(3, dim, bias=bias)

                def forward(self, x):
                    return self.embedding(x)


            def point_mlp(**kwargs):
                return Model(dim=64, bias=False, **kwargs)
            """
        ),
        Valid(  # the wrapper activates its convolution's output: the BatchNorm does not undo that bias
            """
            import torch
            from torch import nn


            class ConvAct(nn.Module):
                def __init__(self, cin, cout, bias=True):
                    super().__init__()
                    self.conv = nn.Conv1d(cin, cout, 3, padding=1, bias=bias)

                def forward(self, x):
                    return torch.relu(self.conv(x))


            encoder = nn.Sequential(ConvAct(80, 512), nn.BatchNorm1d(512))
            """
        ),
        Valid(  # the conv's output is kept for a skip connection before it is normalised: its bias still counts
            """
            import torch.nn as nn
            class Unit(nn.Module):
                def __init__(self, c):
                    super().__init__()
                    self.conv = nn.Conv2d(c, c, 3, padding=1)
                    self.norm = nn.BatchNorm2d(c)
                def forward(self, h):
                    h = self.conv(h)
                    skip = h
                    h = self.norm(h)
                    return h + skip
            """
        ),
        Valid(
            """
            import torch.nn as nn
            block = nn.Sequential(nn.Conv2d(3, 16, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU())
            """
        ),
        Valid(  # an activation in between: the bias is not cancelled
            """
            import torch.nn as nn
            block = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.BatchNorm2d(16))
            """
        ),
        Valid(  # the convolution is also used without the batch norm
            """
            import torch.nn as nn
            class Block(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(16, 16, 3, padding=1)
                    self.bn = nn.BatchNorm2d(16)
                def forward(self, x, normalise=True):
                    return self.bn(self.conv(x)) if normalise else self.conv(x)
            """
        ),
    ]
    INVALID = [
        Invalid(  # a class that only wraps a convolution (Tacotron's `ConvNorm`) takes `bias=False` for it
            """
            import torch
            from torch import nn


            class ConvNorm(nn.Module):
                def __init__(self, cin, cout, kernel_size=1, bias=True):
                    super().__init__()
                    self.conv = nn.Conv1d(cin, cout, kernel_size, padding=kernel_size // 2, bias=bias)

                def forward(self, x):
                    return self.conv(x)


            encoder = nn.Sequential(ConvNorm(80, 512, kernel_size=5), nn.BatchNorm1d(512), nn.ReLU())
            """,
            """
            import torch
            from torch import nn


            class ConvNorm(nn.Module):
                def __init__(self, cin, cout, kernel_size=1, bias=True):
                    super().__init__()
                    self.conv = nn.Conv1d(cin, cout, kernel_size, padding=kernel_size // 2, bias=bias)

                def forward(self, x):
                    return self.conv(x)


            encoder = nn.Sequential(ConvNorm(80, 512, kernel_size=5, bias=False), nn.BatchNorm1d(512), nn.ReLU())
            """,
        ),
        Invalid(  # layers appended to a list that `nn.Sequential(*layers)` takes
            """
            import torch.nn as nn
            layers = []
            layers.append(nn.Conv2d(3, 64, 3))
            layers.append(nn.BatchNorm2d(64))
            block = nn.Sequential(*layers)
            """,
            fixed="""
            import torch.nn as nn
            layers = []
            layers.append(nn.Conv2d(3, 64, 3, bias=False))
            layers.append(nn.BatchNorm2d(64))
            block = nn.Sequential(*layers)
            """,
        ),
        Invalid(  # the BatchNorm only under `if batch_norm:` (VGG's make_layers): the plain variant needs its bias
            """
            import torch.nn as nn

            def make_layers(cfg, batch_norm=False):
                layers, channels = [], 3
                for width in cfg:
                    conv2d = nn.Conv2d(channels, width, kernel_size=3, padding=1)
                    if batch_norm:
                        layers += [conv2d, nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
                    else:
                        layers += [conv2d, nn.ReLU(inplace=True)]
                    channels = width
                return nn.Sequential(*layers)
            """
        ),
        Invalid(  # PointNet's stack of convolutions: one finding for the class, a fix for each
            """
            import torch.nn as nn

            class STN3d(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv1 = nn.Sequential(nn.Conv1d(3, 64, 1), nn.BatchNorm1d(64))
                    self.conv2 = nn.Sequential(nn.Conv1d(64, 128, 1), nn.BatchNorm1d(128))
                    self.conv3 = nn.Sequential(nn.Conv1d(128, 1024, 1), nn.BatchNorm1d(1024))
            """,
            fixed="""
            import torch.nn as nn

            class STN3d(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv1 = nn.Sequential(nn.Conv1d(3, 64, 1, bias=False), nn.BatchNorm1d(64))
                    self.conv2 = nn.Sequential(nn.Conv1d(64, 128, 1, bias=False), nn.BatchNorm1d(128))
                    self.conv3 = nn.Sequential(nn.Conv1d(128, 1024, 1, bias=False), nn.BatchNorm1d(1024))
            """,
        ),
        Invalid(
            """
            import torch.nn as nn
            features = nn.Sequential(
                nn.Conv2d(3, 64, kernel_size=3, padding=1),
                nn.BatchNorm2d(64),
                nn.ReLU(inplace=True),
            )
            """,
            fixed="""
            import torch.nn as nn
            features = nn.Sequential(
                nn.Conv2d(3, 64, kernel_size=3, padding=1, bias=False),
                nn.BatchNorm2d(64),
                nn.ReLU(inplace=True),
            )
            """,
        ),
        Invalid(  # one statement each in forward, the name rebound: the conv's output goes only to the norm
            """
            import torch.nn as nn
            class ConvUnit(nn.Module):
                def __init__(self, cin, cout):
                    super().__init__()
                    self.conv = nn.Conv2d(cin, cout, 3, padding=1)
                    self.norm = nn.BatchNorm2d(cout)
                def forward(self, h):
                    h = self.conv(h)
                    h = self.norm(h)
                    return h.relu()
            """,
            fixed="""
            import torch.nn as nn
            class ConvUnit(nn.Module):
                def __init__(self, cin, cout):
                    super().__init__()
                    self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
                    self.norm = nn.BatchNorm2d(cout)
                def forward(self, h):
                    h = self.conv(h)
                    h = self.norm(h)
                    return h.relu()
            """,
        ),
        Invalid(  # attributes composed in forward (pytorch-cifar's ResNet blocks)
            """
            import torch.nn as nn
            import torch.nn.functional as F
            class BasicBlock(nn.Module):
                def __init__(self, planes):
                    super().__init__()
                    self.conv1 = nn.Conv2d(planes, planes, 3, padding=1)
                    self.bn1 = nn.BatchNorm2d(planes)
                def forward(self, x):
                    return F.relu(self.bn1(self.conv1(x)))
            """,
            fixed="""
            import torch.nn as nn
            import torch.nn.functional as F
            class BasicBlock(nn.Module):
                def __init__(self, planes):
                    super().__init__()
                    self.conv1 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
                    self.bn1 = nn.BatchNorm2d(planes)
                def forward(self, x):
                    return F.relu(self.bn1(self.conv1(x)))
            """,
        ),
        Invalid(  # a VAE decoder's upsampling block: a transposed convolution's bias is cancelled too
            """
            import torch.nn as nn
            up = nn.Sequential(
                nn.ConvTranspose2d(128, 64, kernel_size=3, stride=2, padding=1, output_padding=1),
                nn.BatchNorm2d(64),
                nn.LeakyReLU(),
            )
            """,
            fixed="""
            import torch.nn as nn
            up = nn.Sequential(
                nn.ConvTranspose2d(128, 64, kernel_size=3, stride=2, padding=1, output_padding=1, bias=False),
                nn.BatchNorm2d(64),
                nn.LeakyReLU(),
            )
            """,
        ),
        Invalid(  # the convolution on a `# noqa` line is left as it is; the other one of the block is fixed
            """
            import torch.nn as nn
            block = nn.Sequential(
                nn.Conv2d(3, 32, 3),  # noqa: SF703
                nn.BatchNorm2d(32),
                nn.Conv2d(32, 64, 3),
                nn.BatchNorm2d(64),
            )
            """,
            fixed="""
            import torch.nn as nn
            block = nn.Sequential(
                nn.Conv2d(3, 32, 3),  # noqa: SF703
                nn.BatchNorm2d(32),
                nn.Conv2d(32, 64, 3, bias=False),
                nn.BatchNorm2d(64),
            )
            """,
        ),
        Invalid(  # an explicit bias=True is the author's call: reported, no fix
            """
            import torch.nn as nn
            stem = nn.Sequential(nn.Conv2d(3, 32, 3, bias=True), nn.BatchNorm2d(32))
            """
        ),
    ]

    def finish(self) -> None:
        self._found: list[cst.Call] = []
        self._apart: set[int] = set()  # convolutions on a `# noqa` line: a finding of their own
        self._conditional: set[int] = set()  # convolutions whose BatchNorm is added only under an `if`
        self._wrapped: set[int] = set()  # wrapper classes that always give their convolution a bias
        self._wrappers: dict[str, ConvWrapper | None] = {}
        self._order = {id(site.node): index for index, site in enumerate(self.ctx.calls)}  # the file's order
        for site in self.ctx.calls_to(*_SEQUENTIAL):
            layers = [arg for arg in site.node.args if arg.keyword is None and not arg.star]
            for conv, norm in zip(layers, layers[1:]):
                if (self._is(conv.value, _CONV) or self._wrapper(conv.value)) and self._is(norm.value, _BATCHNORM):
                    self._report(conv.value)
                    if arg_has_noqa(conv):
                        self._apart.add(id(conv.value))
            starred = [arg.value for arg in site.node.args if arg.star == "*" and isinstance(arg.value, cst.Name)]
            for name in starred:  # `layers.append(nn.Conv2d(...))`, `layers.append(nn.BatchNorm2d(...))`, `nn.Sequential(*layers)`
                added = self._added_layers(name.value, site)
                for (conv, _), (norm, norm_block) in zip(added, added[1:]):
                    if self._is(conv, _CONV) and self._is(norm, _BATCHNORM):
                        self._report(conv)
                        made = self.ctx.site_of(conv)  # type: ignore[arg-type]
                        # `if batch_norm: layers.append(nn.BatchNorm2d(c))`: the conv also goes without one
                        if made is None or made.statement is None or enclosing_block(self.ctx, made.statement) is not norm_block:
                            self._conditional.add(id(conv))
        self._check_composed_attributes()
        self._report_by_class()

    def _added_layers(self, name: str, sequential: CallSite) -> list[tuple[cst.BaseExpression, object]]:
        """The layers the function around ``sequential`` puts in the list ``name``, in the order
        of the code (`layers.append(x)`, `layers += [conv, bn, relu]`, as the SR tutorial's and
        torchvision's VGG blocks build them), each with the block of the statement that adds it;
        a layer made a line before goes by its value."""
        ctx = self.ctx
        function = ctx.function_of(sequential.stack)
        added: list[tuple[tuple[int, int], cst.BaseExpression, object]] = []
        order = self._order
        for site in ctx.method_calls("append"):
            if ctx.function_of(site.stack) is function and site.func == f"{name}.append" and len(site.node.args) == 1 \
                    and site.statement is not None:
                added.append(((order[id(site.node)], 0), self._layer(site.node.args[0].value, site.stack),
                              enclosing_block(ctx, site.statement)))
        for assignment in ctx.assignments_in_scope(name, sequential.stack):
            statement = assignment.statement
            if assignment.augmented and isinstance(assignment.value, (cst.List, cst.Tuple)) and statement is not None:
                first = next((order[id(node)] for node in walk_expression(statement) if id(node) in order), 0)
                block = enclosing_block(ctx, statement)
                for offset, element in enumerate(assignment.value.elements):
                    added.append(((first, offset), self._layer(element.value, assignment.stack), block))
        return [(layer, block) for _, layer, block in sorted(added, key=lambda item: item[0])]

    def _layer(self, value: cst.BaseExpression, stack: Stack) -> cst.BaseExpression:
        """``value``, or what a name holds when it is bound once (`conv2d = nn.Conv2d(...)`)."""
        if isinstance(value, cst.Name):
            return self.ctx.single_value(value.value, stack) or value
        return value

    def _check_composed_attributes(self) -> None:
        """`self.bn(self.conv(x))` where `self.conv` is a Conv and `self.bn` a BatchNorm, and
        `self.conv` is called nowhere else."""
        calls = Counter((self.ctx.class_of(site.stack), dotted_name(site.node.func)) for site in self.ctx.calls)
        reported: set[tuple[cst.ClassDef | None, str]] = set()
        for site in self.ctx.calls:
            outer = dotted_name(site.node.func)
            if not outer or not outer.startswith("self.") or len(site.node.args) != 1:
                continue
            inner = self._conv_output(site)
            conv_name = dotted_name(inner.func) if isinstance(inner, cst.Call) else None
            key = (self.ctx.class_of(site.stack), conv_name)
            if not conv_name or not conv_name.startswith("self.") or key in reported or calls[key] != 1:
                continue
            conv = self._constructed(conv_name, site)
            if conv is not None and self._is(conv, _CONV) and self._is(self._constructed(outer, site), _BATCHNORM):
                reported.add(key)
                self._report(conv)
                made = self.ctx.site_of(conv)  # type: ignore[arg-type]
                if made is not None and has_noqa(made.statement):
                    self._apart.add(id(conv))

    def _conv_output(self, site: CallSite) -> cst.BaseExpression:
        """What ``site`` (`self.bn(...)`) normalises: its argument, or, for `x = self.bn(x)` right
        after `x = self.conv(x)` (one statement each), that statement's call: the conv's output
        then goes to the BatchNorm and nowhere else."""
        arg = site.node.args[0].value
        statement = site.statement
        if not (isinstance(arg, cst.Name) and _assigns_to(statement, arg.value) is site.node):
            return arg
        block = enclosing_block(self.ctx, statement)  # type: ignore[arg-type]
        index = next((i for i, s in enumerate(block or ()) if s is statement), 0)
        previous = _assigns_to(block[index - 1], arg.value) if block and index > 0 else None
        return previous if isinstance(previous, cst.Call) else arg

    def _constructed(self, attribute: str, site: CallSite) -> cst.BaseExpression | None:
        """The value of the single `self.attr = ...` in the class around ``site``."""
        cls = self.ctx.class_of(site.stack)
        found = [a for a in self.ctx.assignments.get(attribute, []) if any(frame.node is cls for frame in a.stack)]
        return found[0].value if len(found) == 1 else None

    def _wrapper(self, node: cst.BaseExpression | None) -> ConvWrapper | None:
        """A class of the file that only wraps a convolution with a bias (`ConvNorm(...)`)."""
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Name)):
            return None
        name = node.func.value
        if name not in self._wrappers:  # once per class: the search reads every call of the file
            self._wrappers[name] = conv_wrapper(self.ctx, name)
        return self._wrappers[name]

    def _is(self, node: cst.BaseExpression | None, qualnames: set[str]) -> bool:
        return isinstance(node, cst.Call) and self.ctx.qualname(node.func) in qualnames

    def _never_biased(self, name: cst.Name, site: CallSite) -> bool:
        function = self.ctx.function_of(site.stack)
        return isinstance(function, cst.FunctionDef) and parameter_values(self.ctx, function, name.value) == {False}

    def _report(self, conv: cst.BaseExpression) -> None:
        assert isinstance(conv, cst.Call)
        if conv not in self._found:
            self._found.append(conv)

    def _report_by_class(self) -> None:
        """One finding per class (or per function, or the module) for its convolutions whose bias
        a BatchNorm cancels: at the first, with the fix of each that leaves `bias` unset."""
        groups: dict[int, list[tuple[cst.Call, bool]]] = {}
        owners: dict[int, str | None] = {}
        for conv in sorted(self._found, key=lambda call: self._order.get(id(call), 0)):
            site = self.ctx.site_of(conv)
            if site is None:
                continue
            wrapper = self._wrapper(conv)
            if wrapper is not None and wrapper.bias is None:
                unset = False  # its class always gives the convolution a bias: no argument to leave out
                self._wrapped.add(id(conv))
            else:
                bias = find_argument(self.ctx, site, *(wrapper.bias if wrapper is not None and wrapper.bias else ("bias", 7)))
                if not bias.missing and isinstance(bias.node, cst.Name) and bias.node.value == "False":
                    continue
                if not bias.missing and isinstance(bias.node, cst.Name) and self._never_biased(bias.node, site):
                    continue  # a parameter every construction of the class sets to False
                unset = bias.missing
            owner = self.ctx.class_of(site.stack) or self.ctx.function_of(site.stack)
            key = id(conv) if id(conv) in self._apart else id(owner)  # `# noqa` suppresses its own line alone
            groups.setdefault(key, []).append((conv, unset))
            owners[key] = owner.name.value if isinstance(owner, (cst.ClassDef, cst.FunctionDef)) else None
        indent = self.ctx.module.default_indent
        for key, convs in groups.items():
            message = "the convolution's bias is cancelled by the BatchNorm right after it"
            if len(convs) > 1:
                where = f" of `{owners[key]}`" if owners[key] else ""
                message += f" (and {len(convs) - 1} more convolution{'s' if len(convs) > 2 else ''}{where})"
            ops = [Transform(conv, lambda call: append_args(call, keyword_arg("bias", cst.Name("False")), indent=indent))
                   for conv, unset in convs if unset and id(conv) not in self._conditional]
            if ops:
                self.report(convs[0][0], message, fix_ops=ops)
            elif any(id(conv) in self._conditional for conv, _ in convs):
                self.report(convs[0][0], message + " when the code adds it", no_fix_reason="the BatchNorm is added only "
                            "under a condition: pass `bias=` its negation (`bias=not batch_norm`)")
            elif any(id(conv) in self._wrapped for conv, _ in convs):
                wrapper = next(self._wrapper(conv) for conv, _ in convs if id(conv) in self._wrapped)
                self.report(convs[0][0], message, no_fix_reason=f"`{wrapper.name}` gives its convolution a bias: "  # type: ignore[union-attr]
                            "let it take `bias=False`")
            else:
                self.report(convs[0][0], message, no_fix_reason="`bias` is set explicitly")


def _assigns_to(statement: cst.CSTNode | None, name: str) -> cst.BaseExpression | None:
    """The value of a statement that is only `name = value`, else None."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return None
    assign = statement.body[0]
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
        return None
    target = assign.targets[0].target
    return assign.value if isinstance(target, cst.Name) and target.value == name else None
