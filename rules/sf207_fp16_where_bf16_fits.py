from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Applicability, FixOp, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, keyword_arg, reference
from speedfix.fixes.scaler import scaler_removal
from speedfix.model.amp import (Autocast, Precision, autocast_passed_around, autocasts, loss_scaler_calls,
                                scaler_scope, scalers)
from speedfix.model.versions import v


class Fp16WhereBf16Fits(Rule):
    """
    ## What it does
    Finds CUDA training in fp16 mixed precision with a `GradScaler`:
    `torch.autocast("cuda", dtype=torch.float16)`, or an autocast that leaves the dtype to
    CUDA's default, which is fp16 (`torch.cuda.amp.autocast()`, `torch.amp.autocast("cuda")`).
    Scripts that choose the dtype at run time (nanoGPT's `'bfloat16' if
    torch.cuda.is_bf16_supported() else 'float16'`, timm's `--amp-dtype`) are left alone. A
    timm/Meta loss scaler called as `loss_scaler(loss, optimizer, ...)` counts as the GradScaler
    when it is made in another file (DeiT's and MAE's `engine.py`): reported without a fix.

    ## Why is this bad?
    fp16 has a 5-bit exponent: small gradients underflow to zero, so fp16 training needs a
    `GradScaler` that multiplies the loss, unscales every gradient, checks them all for inf/NaN,
    skips the steps where it finds some and reads that check back to the CPU (a host sync in
    `scaler.step`) every step. bf16 keeps fp32's 8-bit exponent: on Ampere and newer GPUs (A100,
    RTX 30xx/40xx, H100) it runs on the same tensor cores as fast as fp16 and needs no scaler at
    all (PyTorch's AMP docs: bf16 "only uses `torch.autocast`").

    ## Example
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Use instead
    ```python
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    ```

    ## Fix safety
    Unsafe: bf16 has 8 mantissa bits against fp16's 11, so the numbers change, and GPUs before
    Ampere (V100, T4) have no fast bf16: there it is emulated and slow, or not supported. To keep
    a fallback for them, choose the dtype at run time and enable the scaler only for fp16:
    `dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16`,
    `torch.autocast("cuda", dtype=dtype)` and `GradScaler("cuda", enabled=dtype == torch.float16)`.
    The fix sets `dtype=torch.bfloat16` on every fp16 CUDA autocast and drops the scaler:
    `scaler.scale(loss).backward()` becomes `loss.backward()`, `scaler.step(opt)` becomes
    `opt.step()`, `scaler.update()`, `scaler.unscale_(opt)` and the `GradScaler(...)` line go.
    A scaler that is used in any other way (saved with `state_dict()`, read with `get_scale()`,
    passed to a function, tested with `scaler is not None`) gets no fix. Verify with
    `speedfix apply --verify`.

    ## Impact
    Medium: no loss scaling, so the scaler's work and its host sync per step go. Nothing moves
    it.

    ## Measured effect
    On an A100, HF's trainer benchmark measured bf16 and fp16 autocast within a few percent of
    each other, so the speed stays; what goes is the scaler's per-step unscale, inf/NaN check
    and host sync, and the steps it skips after an overflow.
    Sources: https://github.com/huggingface/transformers/issues/15026,
    https://pytorch.org/docs/stable/amp.html
    """

    impact = "medium"
    code = "SF207"
    name = "fp16-where-bf16-fits"
    summary = "fp16 autocast with a GradScaler where bf16 (no scaler) would do"
    severity = Severity.WARNING
    requires = (b"GradScaler", b"scaler")  # `scaler`: a timm/Meta NativeScaler passed in
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Use bf16 autocast and drop the GradScaler"
    gpu_only = True
    min_torch = v("1.10")
    effect = "No loss scaling: the scaler's unscale, inf check and host sync per step go (bf16 is as fast as fp16 on Ampere+)."

    VALID = [
        Valid(  # bf16 where supported, fp16 with an enabled scaler only as the fallback (nanoGPT)
            """
            import torch
            dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float16'
            ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
            ctx = torch.amp.autocast(device_type='cuda', dtype=ptdtype)
            scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))
            for it in range(max_iters):
                with ctx:
                    logits, loss = model(X, Y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """
        ),
        Valid(  # already bf16 (the scaler is SF204's)
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x.cuda()).sum()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            """
        ),
        Valid(  # autocast handed around with its dtype from the command line (timm)
            """
            import torch
            from functools import partial
            amp_autocast = partial(torch.autocast, device_type=device.type, dtype=amp_dtype)
            loss_scaler = torch.amp.GradScaler("cuda")
            with amp_autocast():
                loss = model(x.cuda()).sum()
            """
        ),
    ]
    INVALID = [
        Invalid(  # the deprecated API with CUDA's default dtype (fp16); clipping after unscale_ stays
            """
            import torch
            from torch.cuda.amp import GradScaler, autocast

            scaler = GradScaler(enabled=use_amp)
            for x, y in loader:
                optimizer.zero_grad()
                with autocast(enabled=use_amp):
                    loss = criterion(model(x.cuda()), y.cuda())
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            """,
            fixed="""
            import torch
            from torch.cuda.amp import autocast

            for x, y in loader:
                optimizer.zero_grad()
                with autocast(enabled=use_amp, dtype=torch.bfloat16):
                    loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            """,
        ),
        Invalid(  # an explicit fp16, gradient accumulation, a scaled loss expression, a trainer class
            """
            import torch

            class Trainer:
                def __init__(self, model, optimizer):
                    self.model, self.optimizer = model, optimizer
                    self.scaler = torch.amp.GradScaler("cuda")

                def train_step(self, i, x, y):
                    with torch.autocast("cuda", dtype=torch.float16):
                        loss = self.model(x.cuda(), y.cuda())
                    self.scaler.scale(loss / self.accum).backward()
                    if (i + 1) % self.accum == 0:
                        self.scaler.step(self.optimizer)
                        self.scaler.update()
                        self.optimizer.zero_grad()
            """,
            fixed="""
            import torch

            class Trainer:
                def __init__(self, model, optimizer):
                    self.model, self.optimizer = model, optimizer

                def train_step(self, i, x, y):
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = self.model(x.cuda(), y.cuda())
                    (loss / self.accum).backward()
                    if (i + 1) % self.accum == 0:
                        self.optimizer.step()
                        self.optimizer.zero_grad()
            """,
        ),
        Invalid(  # the scaler is optional and checkpointed (torchvision references): no fix
            """
            import torch
            scaler = torch.cuda.amp.GradScaler() if args.amp else None
            for image, target in data_loader:
                with torch.cuda.amp.autocast(enabled=scaler is not None):
                    loss = criterion(model(image.cuda()), target.cuda())
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    optimizer.step()
            checkpoint = {"model": model.state_dict(), "scaler": scaler.state_dict()}
            """,
        ),
        Invalid(  # the loss scale is logged: no fix
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.autocast(device_type="cuda"):
                    loss = model(x.cuda()).sum()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                log(loss_scale=scaler.get_scale())
            """,
        ),
        Invalid(  # the engine of a DeiT/MAE layout: the NativeScaler comes from main.py, no fix
            """
            import torch

            def train_one_epoch(model, criterion, data_loader, optimizer, device, loss_scaler, max_norm=0):
                for samples, targets in data_loader:
                    samples = samples.to(device, non_blocking=True)
                    with torch.cuda.amp.autocast():
                        loss = criterion(model(samples), targets.to(device, non_blocking=True))
                    optimizer.zero_grad()
                    loss_scaler(loss, optimizer, clip_grad=max_norm, parameters=model.parameters())
            """,
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        if autocast_passed_around(ctx):
            return
        cuda = [cast for cast in autocasts(ctx) if cast.on_cuda]
        running = [cast for cast in cuda if cast.on_by_default]
        if not running or any(cast.precision is not Precision.FP16 for cast in running):
            return
        message = "fp16 autocast with a GradScaler: on Ampere or newer GPUs bf16 is as fast and needs no loss scaling"
        made = [scaler for scaler in scalers(ctx) if scaler.enabled is not False]
        if not made:
            passed_in = loss_scaler_calls(ctx)
            if passed_in and not scalers(ctx):
                self.report(running[0].site.node, message, no_fix_reason=_PASSED_IN.format(passed_in[0].func))
            return
        ops: list[FixOp] = []
        reason = None
        for scaler in scalers(ctx):
            removal, reason = scaler_removal(ctx, scaler)
            if removal is None:
                break
            ops.extend(removal)
        else:
            for cast in cuda:
                if cast.precision is Precision.FP16:
                    rewrite = self._to_bf16(cast, ops)
                    if rewrite is None:
                        reason = "the autocast's arguments come from `*args`/`**kwargs`"
                        break
                    ops.append(rewrite)
        if reason is not None:
            reason += "; with bf16, `GradScaler(..., enabled=False)` keeps its calls working and does nothing"
        scopes = {scaler_scope(ctx, scaler) for scaler in scalers(ctx)}
        region = scopes.pop() if len(scopes) == 1 else ctx.module
        self.report(running[0].site.node, message, fix_ops=None if reason else ops, no_fix_reason=reason, restructures=region)

    def _to_bf16(self, cast: Autocast, ops: list[FixOp]) -> Transform | None:
        """`dtype=torch.bfloat16` in place of the fp16 dtype, or added."""
        if any(arg.star for arg in cast.site.node.args):
            return None
        bf16 = reference(self.ctx, "torch.bfloat16", ops, cast.site.stack)
        indent = self.ctx.module.default_indent
        return Transform(cast.site.node, lambda call: _with_dtype(call, cst.parse_expression(bf16), indent))


_PASSED_IN = (
    "the loss scaler (`{}`) is made elsewhere: set `dtype=torch.bfloat16` here, then call "
    "`loss.backward()` and `optimizer.step()` instead of the scaler (or build it disabled)"
)


def _with_dtype(call: cst.CSTNode, dtype: cst.BaseExpression, indent: str) -> cst.CSTNode:
    """``call`` with its dtype argument set to ``dtype``: the `dtype=` keyword, else the second
    positional argument (`dtype` in both autocast signatures), else a new keyword."""
    assert isinstance(call, cst.Call)
    args = list(call.args)
    for index, arg in enumerate(args):
        if arg.keyword is not None and arg.keyword.value == "dtype":
            args[index] = arg.with_changes(value=dtype)
            return call.with_changes(args=args)
    positional = [i for i, arg in enumerate(args) if arg.keyword is None]
    if len(positional) >= 2:
        args[positional[1]] = args[positional[1]].with_changes(value=dtype)
        return call.with_changes(args=args)
    return append_args(call, keyword_arg("dtype", dtype), indent=indent)
