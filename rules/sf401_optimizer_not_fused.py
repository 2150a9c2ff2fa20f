from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Applicability, FixOp, LossCheck, RemoveImportIfUnused, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, keyword_arg, reference, remove_arg
from speedfix.model.arguments import find_argument, literal_bool
from speedfix.model.config_files import optimizers_unused
from speedfix.model.flow import enclosing_statements, in_no_run, off_by_default, runs_by_default, unchosen_entry
from speedfix.model.frameworks import configured_trainers_off_gpu
from speedfix.model.frames import function_of
from speedfix.model.context import FileContext
from speedfix.model.index import CallSite
from speedfix.model.networks import frozen_before, only_restored
from speedfix.model.patterns import TRANSFORMERS_ADAMW
from speedfix.model.torch_api import FUSABLE_OPTIMIZERS
from speedfix.model.versions import v
from speedfix.rules._impact import Estimate, Finding, Impact, trains_adapters, trains_hub_model
from speedfix.syntax.comments import has_noqa
from speedfix.syntax.names import dotted_name

_FUSABLE = FUSABLE_OPTIMIZERS
# Options that rule out, or explicitly choose, an implementation: the user decided.
_CHOSEN = ("fused", "foreach", "differentiable", "capturable")  # capturable: stepped inside CUDA graphs
# Fused Adam/AdamW take CPU parameters too from this version on (CUDA ones since 2.0).
_FUSED_ANYWHERE = v("2.4")


class OptimizerNotFused(Rule):
    """
    ## What it does
    Finds `torch.optim.Adam` / `AdamW` in a CUDA script created without `fused=` (and without an
    explicit `foreach=`, `differentiable=` or `capturable=`: an optimizer stepped inside CUDA graphs
    or a compiled update), and transformers' own `AdamW` (deprecated, gone from recent releases,
    never fused), whose fix is `torch.optim.AdamW(..., fused=True)` with its defaults kept. Never SGD, nor an optimizer that only a branch the default run skips
    makes (`elif args.opt == "adam":` where `--opt` defaults to `adamw`, also read in a module the
    training script hands its parsed options to). An optimizer a method makes only under a
    condition, beside one it always makes (a second optimizer when the run's parameters ask for
    it), is part of the first one's finding; so are the alternatives a function chooses between by
    a setting the scan cannot read (`if name == "adam": ... elif name == "adamw": ...`). Left
    alone: the `configure_optimizers` of a LightningModule that the project's run configs
    (`configs/*.yaml`: `model: {target: ...}`, `class_path:`) never train while they train other
    classes of its file, or build only as parts of the model they train (latent diffusion's
    `first_stage_config:` autoencoder, frozen), or whose configs give
    LightningCLI an `optimizer:` that replaces the method, or one whose class the configs train
    only with Trainers that all say `accelerator: cpu` (the Trainer places the parameters, and
    the optimizer's state with them, whatever device the module's own code names). Nor an
    optimizer handed a model whose parameters the same function freezes first (`for param in
    model.parameters(): param.requires_grad = False`, then the head unfrozen): the update touches
    a head's few parameters, whatever its kernels.

    ## Why is this bad?
    The default multi-tensor (`foreach`) implementation still launches several kernels per
    parameter group and step; `fused=True` does the whole update in one kernel per group of
    tensors, reading and writing each parameter, gradient and state once.

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    ```

    ## Fix safety
    Unsafe: every parameter must be a floating-point tensor on a supported device (CUDA, and the
    CPU since torch 2.4: for torch 2.1-2.3 the finding has no fix, since a script that falls back
    to the CPU without a GPU would raise), `fused` cannot be combined with `foreach` or
    `differentiable`, and results differ in the last bits. torch 2.0.0's fused AdamW gave worse
    losses under fp16 AMP (pytorch#96755), which is why the rule targets 2.1 and newer. It can be
    slower on some GPUs (pytorch#121857, A40): benchmark it. SGD is never fused automatically: fused SGD corrupts
    momentum on GradScaler-skipped steps (LibreYOLO#771).

    ## Impact
    Low: the update is a small share of a step next to the forward and backward passes, and
    PyTorch already runs it as a few multi-tensor kernels (foreach). Medium for a Hugging Face
    transformer (`from_pretrained`, or a `transformers` model class) trained whole, whose many
    parameters make the update a larger share; a LoRA run updates its adapters only.

    ## Measured effect
    +1.5-2% MFU for Llama-8B in torchtitan; 2-3 ms per iteration in litgpt; Hugging Face made
    `adamw_torch_fused` its default optimizer for torch 2.8 and newer.
    Sources: https://github.com/pytorch/torchtitan/pull/355, https://github.com/Lightning-AI/litgpt/pull/857
    """

    impact = "low"
    code = "SF401"
    name = "optimizer-not-fused"
    summary = "Adam/AdamW on CUDA without `fused=True`"
    severity = Severity.INFO
    requires = (b"Adam",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Use the fused implementation (`fused=True`)"
    gpu_only = True
    min_torch = v("2.1")
    effect = "One fused kernel per optimizer step: 2-3 ms/iteration in litgpt."

    VALID = [
        Valid(  # open-muse: the optimizer class a config file names (`fused_adamw`, apex's fused Adam, in its runs)
            """
            import torch
            from omegaconf import OmegaConf

            config = OmegaConf.load(OmegaConf.from_cli().config)
            model = Net().cuda()
            if config.optimizer.name == "adamw":
                optimizer_cls = torch.optim.AdamW
            elif config.optimizer.name == "fused_adamw":
                optimizer_cls = apex.optimizers.FusedAdam
            optimizer_cls(model.parameters(), lr=1e-4).step()
            """
        ),
        Valid(  # votenet's demo.py: an optimizer made only to load a checkpoint's state into it, never stepped
            """
            import torch

            net = VoteNet().cuda()
            optimizer = torch.optim.Adam(net.parameters(), lr=0.001)
            checkpoint = torch.load("demo.tar")
            optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
            print(net(points.cuda()))
            """
        ),
        Valid(  # the backbone frozen, the classifier head trained: the update touches a few parameters
            """
            import timm
            import torch

            model = timm.create_model("resnet50d", pretrained=True, num_classes=37).cuda()
            for param in model.parameters():
                param.requires_grad = False
            for param in model.get_classifier().parameters():
                param.requires_grad = True
            optimizer = torch.optim.Adam(params=model.parameters(), lr=1e-3)
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            """,
        ),
        Valid(  # capturable: the update is stepped inside CUDA graphs (a compiled "reduce-overhead" step)
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.Adam(model.parameters(), lr=3e-4, capturable=True)
            """
        ),
        Valid(
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
            """
        ),
        Valid(  # an explicit foreach is a deliberate choice (and excludes fused)
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
            """
        ),
        Valid(  # SGD is never fused automatically
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            """
        ),
        Valid(  # the run's optimizer is chosen by a string option: its default picks the fused AdamW
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--opt", default="AdamW")
            args = parser.parse_args()
            model = Net().cuda()
            name = args.opt.lower()
            if name == "adam":
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            elif name in ("adamw", "adamw_fused"):
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
            else:
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """
        ),
        Valid(  # every entry is built, but the default key picks SGD: the Adam is never stepped
            """
            import torch.optim as optim

            optimizer_type = "sgd"
            model = Net().cuda()
            optimizer = {
                "adam": optim.Adam(model.parameters(), 1e-3, betas=(0.9, 0.999)),
                "sgd": optim.SGD(model.parameters(), 1e-2, momentum=0.9, nesterov=True),
            }[optimizer_type]
            """
        ),
        Valid(  # unknown **kwargs may already choose
            """
            import torch
            model = Net().cuda()
            opt = torch.optim.AdamW(model.parameters(), **cfg.optim)
            """
        ),
    ]
    INVALID = [
        Invalid(  # a GAN's two optimizers made side by side: one finding, both fixed
            """
            import torch
            netD = Discriminator().cuda()
            netG = Generator().cuda()
            optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4)
            optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4)
            """,
            fixed="""
            import torch
            netD = Discriminator().cuda()
            netG = Generator().cuda()
            optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, fused=True)
            optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, fused=True)
            """,
        ),
        Invalid(  # a second optimizer made only when the run's parameters ask for one: one finding, both fixed
            """
            import torch
            import lightning as L

            class VAEExperiment(L.LightningModule):
                def configure_optimizers(self):
                    optimizers = [torch.optim.Adam(self.model.parameters(), lr=self.hparams["lr"])]
                    if self.hparams.get("decoder_lr") is not None:
                        optimizers.append(torch.optim.Adam(self.model.decoder.parameters(), lr=2e-4))
                    return optimizers
            """,
            fixed="""
            import torch
            import lightning as L

            class VAEExperiment(L.LightningModule):
                def configure_optimizers(self):
                    optimizers = [torch.optim.Adam(self.model.parameters(), lr=self.hparams["lr"], fused=True)]
                    if self.hparams.get("decoder_lr") is not None:
                        optimizers.append(torch.optim.Adam(self.model.decoder.parameters(), lr=2e-4, fused=True))
                    return optimizers
            """,
        ),
        Invalid(  # transformers' own AdamW: deprecated, unfused, with other defaults than torch's
            """
            import torch
            from transformers import AdamW, get_linear_schedule_with_warmup

            model = Net().cuda()
            optimizer = AdamW(model.parameters(), lr=5e-5, correct_bias=True)
            """,
            fixed="""
            import torch
            from transformers import get_linear_schedule_with_warmup

            model = Net().cuda()
            optimizer = torch.optim.AdamW(
                model.parameters(),
                lr=5e-5,
                eps=1e-6,
                weight_decay=0.0,
                fused=True,
            )
            """,
        ),
        Invalid(  # the optimizer class through an alias; 8-bit Adam under an option that is off by default
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--use_8bit_adam", action="store_true")
            args = parser.parse_args()
            model = Net().cuda()
            if args.use_8bit_adam:
                import bitsandbytes as bnb
                optimizer_cls = bnb.optim.AdamW8bit
            else:
                optimizer_cls = torch.optim.AdamW
            optimizer = optimizer_cls(model.parameters(), lr=1e-4)
            """,
        ),
        Invalid(
            """
            import torch
            from torch import optim

            model = Net().cuda()
            optimizer = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
            """,
            fixed="""
            import torch
            from torch import optim

            model = Net().cuda()
            optimizer = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
            """,
        ),
        Invalid(  # alternatives chosen by a config value the scan cannot read: one finding fixes both
            """
            import torch
            model = Net().cuda()

            def build_optimizer(model, config):
                if config.OPTIMIZER == "adam":
                    return torch.optim.Adam(model.parameters(), lr=config.LR)
                elif config.OPTIMIZER == "adamw":
                    return torch.optim.AdamW(model.parameters(), lr=config.LR)
                raise ValueError(config.OPTIMIZER)
            """,
            fixed="""
            import torch
            model = Net().cuda()

            def build_optimizer(model, config):
                if config.OPTIMIZER == "adam":
                    return torch.optim.Adam(model.parameters(), lr=config.LR, fused=True)
                elif config.OPTIMIZER == "adamw":
                    return torch.optim.AdamW(model.parameters(), lr=config.LR, fused=True)
                raise ValueError(config.OPTIMIZER)
            """,
        ),
        Invalid(  # torch 2.1-2.3: fused AdamW needs CUDA parameters, and the script may fall back to the CPU
            """
            import torch
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model = Net().to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            """,
            torch="2.3",
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        if trains_hub_model(self.ctx) and not trains_adapters(self.ctx):
            return Estimate(Impact.MEDIUM, "a Hugging Face transformer: many parameters to update every step")
        return None

    def finish(self) -> None:
        skipped = {id(site.node) for site in self.ctx.calls_to(*_FUSABLE)  # made in a branch the default run skips,
                   if off_by_default(self.ctx, site.statement, site.stack) is not None  # or an entry it never picks
                   or unchosen_entry(self.ctx, site.node, site.statement, site.stack) is not None}
        sites = [site for site in self.ctx.calls_to(*_FUSABLE)
                 if not self._implementation_chosen(site) and optimizers_unused(self.ctx, site.stack) is None
                 and configured_trainers_off_gpu(self.ctx, site.stack) is None and not frozen_before(self.ctx, site)
                 and not only_restored(self.ctx, site)]  # made to load a checkpoint's state, never stepped
        for site, optional in _fold_optional(self.ctx, [site for site in sites if id(site.node) not in skipped]):
            name = (self.ctx.call_qualname(site) or "").rsplit(".", 1)[-1]
            message = f"`{name}` runs its update as several kernels per step; `fused=True` does it in one"
            beside = [other for other in optional if not _conditional(self.ctx, other)]
            optional = [other for other in optional if _conditional(self.ctx, other)]
            if beside:
                names = ", ".join(f"`{_target(other)}`" for other in beside)
                message += f" (so does {names}, made beside it)" if len(beside) == 1 else f" (so do {names}, made beside it)"
            if optional and _conditional(self.ctx, site):
                message += " (and so do the other optimizers the same function may make instead)" if len(optional) > 1 \
                    else " (and so does the other optimizer the same function may make instead)"
            elif optional:
                message += " (and so do the optimizers the same method makes only under a condition)" if len(optional) > 1 \
                    else " (and so does the one the same method makes only under a condition)"
            self.report(site.node, message, fix_ops=[self._add_fused(other.node) for other in (site, *beside, *optional)])
        for site in self.ctx.calls_to(*TRANSFORMERS_ADAMW):
            self._transformers_adamw(site)
        for site in self.ctx.calls:
            if isinstance(site.node.func, cst.Name) and self.ctx.qualname(site.node.func) is None:
                self._alias(site)
        if not self.ctx.torch_version >= _FUSED_ANYWHERE:
            for finding in self.findings:
                if finding.fix is not None:
                    finding.fix = None
                    finding.no_fix_reason = (f"before torch {_FUSED_ANYWHERE} `fused=True` raises for parameters on "
                                             "the CPU: pass it where the run is certainly on a GPU")

    def _add_fused(self, call: cst.Call) -> Transform:
        return Transform(call, lambda node: append_args(
            node, keyword_arg("fused", cst.Name("True")), indent=self.ctx.module.default_indent
        ))

    def _alias(self, site: CallSite) -> None:
        """`optimizer_cls = torch.optim.AdamW` (diffusers: `bnb.optim.AdamW8bit` under
        `--use_8bit_adam`, off by default), then `optimizer = optimizer_cls(params, ...)`."""
        ctx = self.ctx
        name = site.node.func.value  # type: ignore[attr-defined]
        assignments = ctx.assignments_in_scope(name, site.stack)
        torch_ones = [a for a in assignments if ctx.qualname(a.value) in _FUSABLE]
        default = [a for a in torch_ones if off_by_default(ctx, a.statement, a.stack) is None
                   and not in_no_run(ctx, a.statement, a.stack)]  # not the `else:` of a `--use_8bit_adam` every run passes
        if not default or self._implementation_chosen(site):
            return
        if len(assignments) > len(torch_ones) and not runs_by_default(ctx, default[0].statement, default[0].stack):
            return  # one of several optimizers a config value picks (open-muse: `config.optimizer.name`)
        qualified = ctx.qualname(default[0].value) or ""
        message = (f"`{name}` is `{qualified.rsplit('.', 1)[-1]}` by default, which runs its update as several "
                   "kernels per step; `fused=True` does it in one")
        if len(assignments) == len(torch_ones):
            self.report(site.node, message, fix_ops=[self._add_fused(site.node)])
            return
        self.report(site.node, message, no_fix_reason=f"`{name}` may also be another optimizer, which may not take "
                    f"`fused=`: pass it where `{name}` is the torch one (`functools.partial({qualified}, fused=True)`)")

    def _transformers_adamw(self, site: CallSite) -> None:
        """`transformers.AdamW`: the library's own copy of AdamW, deprecated for years and gone from
        recent releases, never fused. `torch.optim.AdamW` with its defaults pinned replaces it."""
        ctx = self.ctx
        message = ("`transformers.AdamW` is deprecated (and gone from recent transformers releases) and runs its "
                   "update as several kernels per step: `torch.optim.AdamW(..., fused=True)` does it in one")
        call = site.node
        if any(arg.star for arg in call.args) or sum(arg.keyword is None for arg in call.args) > 5:
            self.report(call, message, no_fix_reason="its arguments are not plain keywords")
            return
        correct_bias = find_argument(ctx, site, "correct_bias", 5)
        if not correct_bias.missing and literal_bool(ctx, correct_bias.node, site.stack) is not True:
            self.report(call, message, no_fix_reason="`correct_bias=False` has no counterpart in torch's AdamW")
            return
        ops: list[FixOp] = []
        torch_adamw = cst.parse_expression(reference(ctx, "torch.optim.AdamW", ops, site.stack))
        ops.append(RemoveImportIfUnused(*(ctx.call_qualname(site) or "transformers.AdamW").rsplit(".", 1)))

        def rewrite(node: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(node, cst.Call)
            for keyword in ("correct_bias", "no_deprecation_warning"):
                dropped = next((arg for arg in node.args if arg.keyword is not None and arg.keyword.value == keyword), None)
                if dropped is not None:
                    node = remove_arg(node, dropped)
            node = node.with_changes(func=torch_adamw)
            extra = [keyword_arg(name, value) for name, index, value in (("eps", 3, "1e-6"), ("weight_decay", 4, "0.0"))
                     if find_argument(ctx, site, name, index).missing]  # transformers' defaults, not torch's
            return append_args(node, *extra, keyword_arg("fused", cst.Name("True")), indent=ctx.module.default_indent)

        ops.insert(0, Transform(call, rewrite))
        self.report(call, message, fix_ops=ops,
                    fix_title="Use `torch.optim.AdamW(..., fused=True)` with transformers' defaults (`eps=1e-6`, "
                              "`weight_decay=0.0`)")

    def _implementation_chosen(self, site: CallSite) -> bool:
        return any(not find_argument(self.ctx, site, keyword).missing for keyword in _CHOSEN)


def _fold_optional(ctx: FileContext, sites: list[CallSite]) -> list[tuple[CallSite, list[CallSite]]]:
    """The optimizers one function (or the module's top level) makes: those it makes always (a
    GAN's generator and discriminator optimizers) with those it makes only under a condition beside
    them (`if self.params["LR_2"] is not None: optimizer2 = Adam(...)`), or the alternatives it
    chooses between when it makes none always (`if name == "adam": ... elif name == "adamw": ...`):
    one finding for the function, at the first, which fixes them all."""
    groups: dict[int, list[CallSite]] = {}
    found: list[tuple[CallSite, list[CallSite]]] = []
    for site in sites:
        if has_noqa(site.statement):
            found.append((site, []))  # its own finding, which its comment suppresses
        else:
            groups.setdefault(id(function_of(site.stack)), []).append(site)
    for members in groups.values():
        always = [site for site in members if not _conditional(ctx, site)]
        if len(members) == 1:
            found.append((members[0], []))
            continue
        if not always:  # alternatives (`if name == "adam": ... elif name == "adamw": ...`): one finding
            found.append((members[0], members[1:]))
            continue
        found.append((always[0], [*always[1:], *(site for site in members if site not in always)]))
    return found


def _target(site: CallSite) -> str:
    """What the optimizer is assigned to (`self.d_optimizer`), else its class's name."""
    statement = site.statement
    if statement is not None and len(statement.body) == 1 and isinstance(statement.body[0], cst.Assign) \
            and len(statement.body[0].targets) == 1 and (name := dotted_name(statement.body[0].targets[0].target)):
        return name
    return dotted_name(site.node.func) or "the optimizer"


def _conditional(ctx: FileContext, site: CallSite) -> bool:
    """Made under an `if` of its own function."""
    if site.statement is None:
        return False
    for statement in enclosing_statements(ctx, site.statement)[1:]:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            return False
        if isinstance(statement, cst.If):
            return True
    return False
