from __future__ import annotations

from speedfix.engine.findings import Applicability, LossCheck, Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.scaler import scaler_removal
from speedfix.model.amp import Precision, autocast_passed_around, autocasts, scaler_scope, scalers


class GradScalerWithBf16(Rule):
    """
    ## What it does
    Finds a `GradScaler` in a script whose autocast runs in bf16
    (`torch.autocast("cuda", dtype=torch.bfloat16)`, or the CPU's default). A scaler that is off
    by default (`GradScaler(enabled=(dtype == 'float16'))` with a bf16 `dtype`) is not reported,
    nor is one next to a dtype chosen at run time.

    ## Why is this bad?
    Loss scaling exists for fp16, whose 5-bit exponent lets small gradients underflow. bf16
    keeps fp32's 8-bit exponent, so it needs no scaling (PyTorch's AMP docs: bf16 "only uses
    `torch.autocast`"; Hugging Face's Trainer and Accelerate stopped scaling bf16 for this
    reason). The scaler still does its work every step: it multiplies the loss, unscales every
    gradient, checks them all for inf/NaN and reads that check back to the CPU in
    `scaler.step()`, a host sync that stalls the queue of GPU work.

    ## Example
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Use instead
    ```python
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    ```

    ## Fix safety
    Unsafe: the scaler skips an optimizer step whose gradients hold an inf or a NaN (and halves
    its scale). Without it such a step is taken and writes NaN into the weights; with bf16 that
    takes a real divergence, not an underflow, but a run that relied on the skipping behaves
    differently. Scaling by a power of two is otherwise exact, so the losses stay the same. The
    fix drops the scaler: `scaler.scale(loss).backward()` becomes `loss.backward()`,
    `scaler.step(opt)` becomes `opt.step()`, `scaler.update()`, `scaler.unscale_(opt)` and the
    `GradScaler(...)` line go. A scaler that is used in any other way (saved with `state_dict()`,
    read with `get_scale()`, passed to a function, tested with `scaler is not None`) gets no fix:
    there, `GradScaler(..., enabled=False)` keeps every call working and does nothing.

    ## Impact
    Medium: the scaler's unscale, inf check and host sync every step, for nothing. Nothing
    moves it.

    ## Measured effect
    One unscale and inf/NaN check over all gradients and one host sync per optimizer step less;
    worth most in loops with small models or many steps. Accelerate and Hugging Face's Trainer
    dropped bf16 loss scaling for this reason.
    Sources: https://github.com/huggingface/transformers/pull/21428,
    https://github.com/huggingface/accelerate/pull/1036, https://pytorch.org/docs/stable/amp.html
    """

    impact = "medium"
    code = "SF204"
    name = "grad-scaler-with-bf16"
    summary = "GradScaler next to bf16 autocast, which needs no loss scaling"
    severity = Severity.WARNING
    requires = (b"GradScaler",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Drop the GradScaler (bf16 needs no loss scaling)"
    effect = "One unscale, inf/NaN check and host sync per step less."

    VALID = [
        Valid(  # the scaler is off unless the dtype is fp16 (nanoGPT with a bf16 default)
            """
            import torch
            dtype = 'bfloat16'
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
        Valid(  # the dtype is chosen at run time (nanoGPT)
            """
            import torch
            dtype = 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
            ptdtype = {'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
            scaler = torch.amp.GradScaler('cuda', enabled=(dtype == 'float16'))
            with torch.autocast('cuda', dtype=ptdtype):
                loss = model(X, Y)
            """
        ),
        Valid(  # fp16: the scaler is needed (bf16 there is SF207's advice)
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x).sum()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch

            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = criterion(model(x.cuda()), y.cuda())
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            """,
            fixed="""
            import torch

            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = criterion(model(x.cuda()), y.cuda())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            """,
        ),
        Invalid(  # a bf16 constant, the scaler imported by name; an optional unscale_ takes its `if` along
            """
            from torch.amp import GradScaler
            import torch

            AMP_DTYPE = torch.bfloat16

            def train(model, loader, opt, clip=None):
                scaler = GradScaler()
                for x, y in loader:
                    with torch.autocast(device_type="cuda", dtype=AMP_DTYPE):
                        loss = model(x, y)
                    scaler.scale(loss).backward()
                    if clip:
                        scaler.unscale_(opt)
                    scaler.step(opt)
                    scaler.update()
            """,
            fixed="""
            import torch

            AMP_DTYPE = torch.bfloat16

            def train(model, loader, opt, clip=None):
                for x, y in loader:
                    with torch.autocast(device_type="cuda", dtype=AMP_DTYPE):
                        loss = model(x, y)
                    loss.backward()
                    opt.step()
            """,
        ),
        Invalid(  # saved in the checkpoint: reported, no fix
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).sum()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            torch.save({"model": model.state_dict(), "scaler": scaler.state_dict()}, "ckpt.pt")
            """,
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        running = [cast for cast in autocasts(ctx) if cast.on_by_default]
        if not running or autocast_passed_around(ctx) or any(c.precision is not Precision.BF16 for c in running):
            return
        for scaler in scalers(ctx):
            if scaler.enabled is False:
                continue
            ops, reason = scaler_removal(ctx, scaler)
            message = "`GradScaler` next to bf16 autocast: bf16 has fp32's exponent range and needs no loss scaling"
            if reason is not None:
                reason += "; `GradScaler(..., enabled=False)` keeps it working and does nothing"
            self.report(scaler.site.node, message, fix_ops=ops, no_fix_reason=reason, restructures=scaler_scope(ctx, scaler))
