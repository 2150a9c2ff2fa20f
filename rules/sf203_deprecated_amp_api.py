from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from speedfix.engine.findings import Applicability, Category, FixOp, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import NO_SPACE, append_args, insert_first_arg, keyword_arg, string_literal
from speedfix.model.versions import TorchVersion, v
from speedfix.syntax.names import bound_name, dotted_name
from speedfix.syntax.nodes import walk_expression


@dataclass(frozen=True)
class _Old:
    kind: str  # autocast | scaler | custom_fwd | custom_bwd
    device: str  # cuda | cpu
    member: str  # the name inside torch.amp
    needs: TorchVersion  # first torch version with the replacement


_OLD_API = {
    "torch.cuda.amp.autocast": _Old("autocast", "cuda", "autocast", v("1.10")),
    "torch.cuda.amp.autocast_mode.autocast": _Old("autocast", "cuda", "autocast", v("1.10")),
    "torch.cpu.amp.autocast": _Old("autocast", "cpu", "autocast", v("1.10")),
    "torch.cpu.amp.autocast_mode.autocast": _Old("autocast", "cpu", "autocast", v("1.10")),
    "torch.cuda.amp.GradScaler": _Old("scaler", "cuda", "GradScaler", v("2.3")),
    "torch.cuda.amp.grad_scaler.GradScaler": _Old("scaler", "cuda", "GradScaler", v("2.3")),
    "torch.cpu.amp.GradScaler": _Old("scaler", "cpu", "GradScaler", v("2.3")),
    "torch.cpu.amp.grad_scaler.GradScaler": _Old("scaler", "cpu", "GradScaler", v("2.3")),
    "torch.cuda.amp.custom_fwd": _Old("custom_fwd", "cuda", "custom_fwd", v("2.4")),
    "torch.cuda.amp.custom_bwd": _Old("custom_bwd", "cuda", "custom_bwd", v("2.4")),
}
_OLD_MODULES = {"torch.cuda.amp": "torch.amp", "torch.cpu.amp": "torch.amp"}
_OLD_PARENTS = ("torch.cuda", "torch.cpu")  # `from torch.cuda import amp`
# Positional parameters of torch.{cuda,cpu}.amp.autocast, which become keywords after "cuda".
_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")


@dataclass
class _Use:
    node: cst.BaseExpression  # the reference: `torch.cuda.amp.autocast`, `amp.GradScaler`, `autocast`
    qualified: str
    old: _Old
    call: cst.Call | None
    decorator: cst.Decorator | None
    branches: tuple[tuple[cst.CSTNode, str], ...]  # the `try`/`if` parts it sits in


class DeprecatedAmpApi(Rule):
    """
    ## What it does
    Finds the device-specific AMP API that PyTorch deprecated in 2.4: `torch.cuda.amp.autocast`,
    `torch.cuda.amp.GradScaler`, `torch.cuda.amp.custom_fwd`/`custom_bwd` and their `torch.cpu.amp`
    twins, through every import form. Not in a type annotation (`scaler: amp.GradScaler`), which
    runs nothing and warns of nothing.

    ## Why is this bad?
    Each use emits a `FutureWarning` that names its replacement: `torch.cuda.amp.autocast(args...)`
    becomes `torch.amp.autocast("cuda", args...)`, `torch.cuda.amp.GradScaler(args...)` becomes
    `torch.amp.GradScaler("cuda", args...)`, and likewise for `custom_fwd`/`custom_bwd` and the
    `torch.cpu.amp` names. The old names will be removed. There is no speed to gain; it is
    hygiene that keeps AMP code working.

    ## Example
    ```python
    from torch.cuda.amp import autocast, GradScaler

    scaler = GradScaler()
    with autocast(dtype=torch.float16):
        loss = model(x)
    ```

    ## Use instead
    ```python
    from torch.amp import autocast, GradScaler

    scaler = GradScaler("cuda")
    with autocast("cuda", dtype=torch.float16):
        loss = model(x)
    ```

    ## Fix safety
    Safe: the new API runs the same code (`torch.cuda.amp.autocast` is a thin subclass of
    `torch.autocast`). Positional arguments of the old autocast (`enabled`, `dtype`,
    `cache_enabled`) become keywords, because the new signature starts with the device. The
    deprecation comes with torch 2.4: for a project that pins an older torch (or an older
    `--torch-version`) nothing is reported, since its torch warns about nothing and the old
    names are its documented API. Imports are rewritten in place
    (`import torch.cuda.amp as amp` becomes `import torch.amp as amp`; TorchFix's codemod produced
    `amp.amp.autocast` here). All uses of one import statement are fixed together, and each
    finding's fix holds all of them, so that it is valid on its own. A name that is used other
    than by calling it (passed around as a value) gets no fix and stays on the old import. A
    compatibility fallback (`try: from torch.amp import GradScaler` / `except ImportError: from
    torch.cuda.amp import GradScaler`, the old API in the `except` of a `try` that uses the new
    one, or in the other branch of a version test such as `if hasattr(torch.amp, "GradScaler"):`)
    is left alone: it is there for older torch.

    ## Impact
    Low: a deprecation, nothing to gain in speed. Nothing moves it.

    ## Measured effect
    None on speed: removes a `FutureWarning` per call and keeps the script working when the old
    names are removed (deprecated since torch 2.4).
    Source: https://pytorch.org/docs/stable/amp.html
    """

    impact = "low"
    code = "SF203"
    name = "deprecated-amp-api"
    summary = "Deprecated `torch.cuda.amp` / `torch.cpu.amp` API (autocast, GradScaler, custom_fwd)"
    severity = Severity.WARNING
    category = Category.DEPRECATION
    # Every way to the old names spells `.amp` (`torch.cuda.amp.autocast`, `from torch.cuda.amp
    # import ...`, `import torch.cuda.amp as a`) or imports `amp` itself (`from torch.cuda import
    # amp`, also in a parenthesised list); a bare `amp` matched "example" and "clamp" in most files.
    requires = (b".amp", b" amp", b"\tamp", b"\namp", b"(amp", b",amp")
    fix_applicability = Applicability.SAFE
    loss_check = LossCheck.EXACT
    fix_title = "Use the device-generic `torch.amp` API"
    min_torch = v("2.4")  # the old names warn from 2.4 on; before, they are the documented API
    effect = "None on speed: removes a FutureWarning per call."

    VALID = [
        Valid(  # SRGAN: a type annotation runs nothing (the scaler is made elsewhere, with the new API)
            """
            import torch
            from torch.cuda import amp

            def train(model, loader, scaler: amp.GradScaler) -> None:
                for x in loader:
                    scaler.scale(model(x).sum()).backward()

            train(model, loader, torch.amp.GradScaler("cuda"))
            """
        ),
        Valid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                pass
            """
        ),
        Valid(  # torch.amp.GradScaler does not exist before 2.3
            """
            import torch
            scaler = torch.cuda.amp.GradScaler()
            """,
            torch="2.2",
        ),
        Valid(  # a compatibility import for torch before 2.3: left as it is
            """
            try:
                from torch.amp import GradScaler
            except ImportError:
                from torch.cuda.amp import GradScaler
            scaler = GradScaler()
            """
        ),
        Valid(  # the old API as the fallback of the new one
            """
            import torch
            try:
                scaler = torch.amp.GradScaler("cuda")
            except AttributeError:
                scaler = torch.cuda.amp.GradScaler()
            """
        ),
        Valid(  # the old API behind a version test
            """
            import torch
            if hasattr(torch.amp, "GradScaler"):
                scaler = torch.amp.GradScaler("cuda")
            else:
                scaler = torch.cuda.amp.GradScaler()
            """
        ),
        Valid(  # a keyword argument that happens to share the name
            """
            from torch.cuda.amp import autocast
            run(autocast=True)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch

            scaler = torch.cuda.amp.GradScaler(enabled=use_amp)
            with torch.cuda.amp.autocast(enabled=use_amp):
                loss = model(x)
            """,
            fixed="""
            import torch

            scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
            with torch.autocast("cuda", enabled=use_amp):
                loss = model(x)
            """,
            count=2,
        ),
        Invalid(  # from-imports keep their names; positional autocast arguments become keywords
            """
            import torch
            from torch.cuda.amp import autocast, GradScaler

            scaler = GradScaler(2.0**16)
            with autocast(True, torch.float16):
                loss = model(x)
            """,
            fixed="""
            import torch
            from torch.amp import autocast, GradScaler

            scaler = GradScaler("cuda", 2.0**16)
            with autocast("cuda", enabled=True, dtype=torch.float16):
                loss = model(x)
            """,
            count=2,
        ),
        Invalid(  # module aliases are rewritten at the import, never as `amp.amp.autocast`
            """
            import torch.cuda.amp as amp
            from torch import nn

            class F(torch.autograd.Function):
                @staticmethod
                @amp.custom_fwd
                def forward(ctx, x):
                    return x

            with amp.autocast():
                y = F.apply(x)
            """,
            fixed="""
            import torch.amp as amp
            from torch import nn

            class F(torch.autograd.Function):
                @staticmethod
                @amp.custom_fwd(device_type="cuda")
                def forward(ctx, x):
                    return x

            with amp.autocast("cuda"):
                y = F.apply(x)
            """,
            count=2,
        ),
        Invalid(  # `from torch.cuda import amp` becomes `from torch import amp`
            """
            from torch.cuda import amp
            scaler = amp.GradScaler(init_scale=1024)
            """,
            fixed="""
            from torch import amp
            scaler = amp.GradScaler("cuda", init_scale=1024)
            """,
        ),
        Valid(  # torch 2.3 and older deprecate nothing: the project pins such a torch
            """
            from torch.cuda.amp import autocast, GradScaler
            scaler = GradScaler()
            with autocast():
                pass
            """,
            torch="2.2",
        ),
        Invalid(  # used as a value: no fix for this import
            """
            from torch.cuda.amp import autocast
            ctx = autocast
            with autocast():
                pass
            """,
            count=2,
        ),
        Invalid(  # one name of a shared import used as a value: the other one moves alone
            """
            from torch.cuda.amp import GradScaler, autocast
            amp_context = autocast
            scaler = GradScaler()
            """,
            fixed="""
            from torch.amp import GradScaler
            from torch.cuda.amp import autocast
            amp_context = autocast
            scaler = GradScaler("cuda")
            """,
            count=2,
        ),
        Invalid(  # an option, not a version test: the old spelling is migrated
            """
            import torch
            if args.bf16:
                ctx = torch.autocast("cuda", dtype=torch.bfloat16)
            else:
                ctx = torch.cuda.amp.autocast()
            """,
            fixed="""
            import torch
            if args.bf16:
                ctx = torch.autocast("cuda", dtype=torch.bfloat16)
            else:
                ctx = torch.autocast("cuda")
            """,
        ),
        Invalid(  # the CPU twin, with an aliased torch
            """
            import torch as T
            with T.cpu.amp.autocast(dtype=T.bfloat16):
                pass
            """,
            fixed="""
            import torch as T
            with T.autocast("cpu", dtype=T.bfloat16):
                pass
            """,
        ),
    ]

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self._uses: list[_Use] = []
        self._skip: set[int] = set()  # ids of Names that are attribute members or keywords
        self._calls: dict[int, cst.Call] = {}
        self._decorators: dict[int, cst.Decorator] = {}
        self._members: dict[str, set[str]] = {}  # `amp.X` references: head name -> members
        self._branches: list[tuple[cst.CSTNode, str]] = []  # (try | if, the part being visited)
        self._annotations = 0  # type annotations open around the node visited

    # ------------------------------------------------------------------ collection
    def visit_Call(self, node: cst.Call) -> None:
        self._calls[id(node.func)] = node
        for arg in node.args:
            if arg.keyword is not None:
                self._skip.add(id(arg.keyword))

    def visit_Decorator(self, node: cst.Decorator) -> None:
        self._decorators[id(node.decorator)] = node

    def visit_Param(self, node: cst.Param) -> None:
        self._skip.add(id(node.name))

    # A type annotation (`scaler: amp.GradScaler`) runs nothing and warns of nothing: the import
    # and the calls it names are reported where they are.
    def visit_Annotation(self, node: cst.Annotation) -> None:
        self._annotations += 1

    def leave_Annotation(self, node: cst.Annotation) -> None:
        self._annotations -= 1

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._skip.add(id(node.attr))
        if isinstance(node.value, cst.Name):
            self._members.setdefault(node.value.value, set()).add(node.attr.value)
        if not self._annotations:
            self._collect(node)

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self._skip and not self._annotations:
            self._collect(node)

    # The parts of a `try` or `if` a use sits in: the old API in one part and the new one in the
    # other is a compatibility fallback, which stays as it is.
    def visit_Try_body(self, node: cst.Try) -> None:
        self._branches.append((node, "body"))

    def leave_Try_body(self, node: cst.Try) -> None:
        self._branches.pop()

    def visit_Try_handlers(self, node: cst.Try) -> None:
        self._branches.append((node, "handlers"))

    def leave_Try_handlers(self, node: cst.Try) -> None:
        self._branches.pop()

    def visit_If_body(self, node: cst.If) -> None:
        self._branches.append((node, "body"))

    def leave_If_body(self, node: cst.If) -> None:
        self._branches.pop()

    def visit_If_orelse(self, node: cst.If) -> None:
        self._branches.append((node, "orelse"))

    def leave_If_orelse(self, node: cst.If) -> None:
        self._branches.pop()

    def _collect(self, node: cst.BaseExpression) -> None:
        if self.ctx.in_import:
            return
        root = node
        while type(root) is cst.Attribute:
            root = root.value
        if type(root) is not cst.Name or root.value not in self.ctx.imports.bindings:
            return  # not imported: no qualified name (cheaper than building the dotted one)
        qualified = self.ctx.qualname(node)
        old = _OLD_API.get(qualified or "")
        if old is None or not self.ctx.torch_version >= old.needs:
            return
        self._uses.append(
            _Use(node, qualified or "", old, self._calls.get(id(node)), self._decorators.get(id(node)), tuple(self._branches))
        )

    # ------------------------------------------------------------------ decisions
    def finish(self) -> None:
        groups: dict[object, list[_Use]] = {}
        for use in self._uses:
            if self._fallback(use):
                continue
            binding = self._binding(use)
            if self.ctx.imports.bindings.get(binding) == "torch":
                groups[id(use.node)] = [use]  # `torch.cuda.amp.X(...)`: each use stands alone
                continue
            lines = self.ctx.imports_binding(binding)
            key = id(lines[0]) if len(lines) == 1 else binding
            groups.setdefault(key, []).append(use)
        for uses in groups.values():
            self._report_group(uses)

    def _binding(self, use: _Use) -> str:
        name = dotted_name(use.node) or ""
        return name.split(".", 1)[0]

    def _fallback(self, use: _Use) -> bool:
        """A compatibility fallback: the name is also imported from the new API (`try: from
        torch.amp import GradScaler` / `except ImportError: from torch.cuda.amp import ...`), or
        the use sits in one part of a `try`/`if` whose other part uses the new API."""
        for line in self.ctx.imports_binding(self._binding(use)):
            for small in line.body:
                module = dotted_name(small.module) if isinstance(small, cst.ImportFrom) and small.module else None
                if module is not None and module not in _OLD_MODULES and module not in _OLD_PARENTS:
                    return True
        for node, part in use.branches:
            if isinstance(node, cst.If) and not _version_test(node.test):
                continue  # `if args.bf16: ... else: torch.cuda.amp.autocast()` is no fallback
            other = _other_parts(node, part)
            if any(self._new_api(child) for piece in other for child in walk_expression(piece)):
                return True
        return False

    def _new_api(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.ImportFrom) and node.module is not None:
            return dotted_name(node.module) == "torch.amp"
        if isinstance(node, (cst.Name, cst.Attribute)):
            qualified = self.ctx.qualname(node) or ""
            return qualified == "torch.autocast" or qualified == "torch.amp" or qualified.startswith("torch.amp.")
        return False

    def _report_group(self, uses: list[_Use]) -> None:
        """The uses through one import statement are fixed together: every finding's fix holds
        the rewrite of all of them and of the import, so that each fix is valid on its own."""
        binding = self._binding(uses[0])
        target = self.ctx.imports.bindings.get(binding, "")
        value_uses = {self._binding(u) for u in uses if u.call is None and not (u.decorator and u.old.kind.startswith("custom"))}
        movable = {self._binding(u) for u in uses} - value_uses
        import_op: FixOp | None = None
        reason = "the name is used as a value, not called: migrate it by hand"
        if target != "torch" and movable:
            import_op = self._import_rewrite(binding, target, movable)
            if import_op is None:
                movable, reason = set(), "the import cannot be rewritten automatically"
        fixed = [u for u in uses if self._binding(u) in movable or target == "torch" and not value_uses]
        ops: list[FixOp] = [self._use_rewrite(use, self._binding(use), target) for use in fixed]
        if import_op is not None:
            ops.append(import_op)
        for use in uses:
            message = f"`{use.qualified}` is deprecated since torch 2.4; use `torch.amp` with a device argument"
            if use in fixed:
                self.report(use.node, message, fix_ops=ops, fix_title=self._title(use))
            else:
                self.report(use.node, message, no_fix_reason=reason)

    def _title(self, use: _Use) -> str:
        if use.old.kind == "autocast":
            return f'Use `torch.autocast("{use.old.device}", ...)`'
        return f'Use `torch.amp.{use.old.member}` with device "{use.old.device}"'

    # ------------------------------------------------------------------ rewrites
    def _new_func(self, use: _Use, binding: str, target: str) -> cst.BaseExpression:
        """The replacement reference, spelled with the file's own names."""
        name = dotted_name(use.node) or ""
        if target == "torch":  # `torch.cuda.amp.X` / `T.cuda.amp.X`
            suffix = "autocast" if use.old.kind == "autocast" else f"amp.{use.old.member}"
            return cst.parse_expression(f"{binding}.{suffix}")
        return cst.parse_expression(name)  # the import that binds it is rewritten; the name stays

    def _use_rewrite(self, use: _Use, binding: str, target: str) -> Transform:
        new_func = self._new_func(use, binding, target)
        device = cst.SimpleString(string_literal(self.ctx, use.old.device))
        old = use.old
        if use.call is not None:
            def rewrite_call(call: cst.CSTNode) -> cst.CSTNode:
                assert isinstance(call, cst.Call)
                call = call.with_changes(func=new_func)
                if old.kind == "autocast":
                    call = call.with_changes(args=_keywordize(call.args))
                    return insert_first_arg(call, cst.Arg(device))
                if old.kind == "scaler":
                    return insert_first_arg(call, cst.Arg(device))
                return append_args(call, keyword_arg("device_type", device), indent=self.ctx.module.default_indent)

            return Transform(use.call, rewrite_call)
        assert use.decorator is not None
        decorator = use.decorator
        return Transform(
            decorator,
            lambda node: node.with_changes(  # type: ignore[attr-defined]
                decorator=cst.Call(func=new_func, args=[keyword_arg("device_type", device)])
            ),
        )

    def _import_rewrite(self, binding: str, target: str, movable: set[str]) -> FixOp | None:
        """Rewrite the import that binds ``binding`` so that the ``movable`` names it binds name
        the torch.amp objects (the others stay on a line of their own)."""
        lines = self.ctx.imports_binding(binding)
        line = lines[0] if len(lines) == 1 else None
        small = line.body[0] if line is not None and len(line.body) == 1 else None
        if isinstance(small, cst.ImportFrom) and small.module is not None and not isinstance(small.names, cst.ImportStar):
            module = dotted_name(small.module)
            if module in _OLD_MODULES:
                return Transform(line, lambda node: _move_names(node, movable, self.ctx.torch_version))
            # `from torch.cuda import amp`: only when `amp` is all this line imports
            if module in _OLD_PARENTS and len(small.names) == 1 and self._members_migrate(binding, target):
                return Transform(line, lambda node: node.with_changes(body=[
                    node.body[0].with_changes(module=cst.Name("torch"))
                ]))
        if isinstance(small, cst.Import) and len(small.names) == 1:
            alias = small.names[0]
            if alias.evaluated_name in _OLD_MODULES and alias.asname is not None and self._members_migrate(binding, target):
                new_module = cst.parse_expression(_OLD_MODULES[alias.evaluated_name])
                return Transform(line, lambda node: node.with_changes(body=[
                    node.body[0].with_changes(names=[node.body[0].names[0].with_changes(name=new_module)])
                ]))
        return None

    def _members_migrate(self, binding: str, target: str) -> bool:
        """Every `binding.X` the file uses exists in torch.amp for the target torch."""
        for member in self._members.get(binding, ()):
            old = _OLD_API.get(f"{target}.{member}")
            if old is None or not self.ctx.torch_version >= old.needs:
                return False
        return True


def _version_test(test: cst.BaseExpression) -> bool:
    """`hasattr(torch.amp, "GradScaler")`, `version.parse(torch.__version__) >= ...`, `TORCH_2_3`:
    a test of what the installed torch has."""
    for node in walk_expression(test):
        if isinstance(node, cst.Call) and dotted_name(node.func) in ("hasattr", "getattr"):
            return True
        if isinstance(node, cst.Name) and ("version" in node.value.lower() or node.value.upper().startswith("TORCH")):
            return True
    return False


def _other_parts(node: cst.CSTNode, part: str) -> list[cst.CSTNode]:
    """The parts of a `try` or `if` other than ``part`` (a `try` body against its handlers)."""
    if isinstance(node, cst.Try):
        return [node.body] if part == "handlers" else list(node.handlers)
    assert isinstance(node, cst.If)
    if part == "body":
        return [node.orelse] if node.orelse is not None else []
    return [node.body]


def _move_names(node: cst.CSTNode, movable: set[str], version: TorchVersion) -> cst.CSTNode:
    """`from torch.cuda.amp import autocast, GradScaler` -> `from torch.amp import ...` for the
    ``movable`` local names the target torch can migrate; the others stay on a line of their own.
    Works on the line as other fixes left it (another rule may have dropped a name)."""
    assert isinstance(node, cst.SimpleStatementLine)
    small = node.body[0]
    if not isinstance(small, cst.ImportFrom) or small.module is None or isinstance(small.names, cst.ImportStar):
        return node
    module = dotted_name(small.module)
    if module not in _OLD_MODULES:
        return node
    moved, kept = [], []
    for alias in small.names:
        old = _OLD_API.get(f"{module}.{alias.evaluated_name}")
        local = bound_name(alias, from_import=True)
        migrates = old is not None and version >= old.needs and local in movable
        (moved if migrates else kept).append(alias)
    if not moved:
        return node
    first = node.with_changes(body=[small.with_changes(module=cst.parse_expression("torch.amp"), names=_tidy(moved))])
    if not kept:
        return first
    rest = cst.SimpleStatementLine(body=[small.with_changes(names=_tidy(kept))])
    return cst.FlattenSentinel([first, rest])


def _tidy(aliases: list[cst.ImportAlias]) -> list[cst.ImportAlias]:
    """Import aliases with commas between them and none after the last."""
    result = []
    for index, alias in enumerate(aliases):
        last = index == len(aliases) - 1
        comma = cst.MaybeSentinel.DEFAULT if last else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        result.append(alias.with_changes(comma=comma))
    return result


def _keywordize(args: tuple[cst.Arg, ...] | list[cst.Arg]) -> list[cst.Arg]:
    """Positional arguments of the old autocast become `enabled=`, `dtype=`, `cache_enabled=`."""
    result = []
    position = 0
    for arg in args:
        if arg.keyword is None and arg.star == "" and position < len(_AUTOCAST_POSITIONAL):
            arg = arg.with_changes(
                keyword=cst.Name(_AUTOCAST_POSITIONAL[position]),
                equal=cst.AssignEqual(whitespace_before=NO_SPACE, whitespace_after=NO_SPACE),
            )
            position += 1
        result.append(arg)
    return result
