from __future__ import annotations


from speedfix.codegen import NO_IMPORT_BLOCK, setting_after_imports, string_literal
from speedfix.findings import Applicability, LossCheck, Severity
from speedfix.names import dotted_name
from speedfix.patterns import uses_autocast
from speedfix.rule import Invalid, Rule, Valid
from speedfix.versions import v

_TF32_SWITCHES = ("allow_tf32", "fp32_precision")


class Tf32Disabled(Rule):
    """
    ## What it does
    Finds CUDA training in fp32 that never enables TensorFloat-32 for matrix multiplications.
    A script that uses autocast or mentions a 16-bit dtype anywhere (`model.half()`, an FSDP
    `MixedPrecisionPolicy(param_dtype=torch.bfloat16)`, Lightning's `"bf16-mixed"`) is treated as
    already choosing its precision.

    ## Why is this bad?
    On Ampere and newer GPUs (A100, RTX 30xx, H100) fp32 matmuls can run on tensor cores in TF32,
    several times faster, but PyTorch keeps them in full fp32 unless asked
    (`torch.get_float32_matmul_precision()` is `"highest"` by default). cuDNN convolutions already
    use TF32 by default; matmuls and linear layers do not.

    A script that already chose a precision (`set_float32_matmul_precision(...)`, any
    `allow_tf32`/`fp32_precision` setting, `"highest"` included) or trains under autocast is left
    alone.

    ## Example
    ```python
    import torch

    model = Net().cuda()
    for x, y in loader:
        ...
    ```

    ## Use instead
    ```python
    import torch

    torch.set_float32_matmul_precision("high")

    model = Net().cuda()
    ```

    ## Fix safety
    Unsafe: TF32 keeps fp32's range but only 10 mantissa bits, so results change (PyTorch's CUDA
    notes: relative error 0.0022 with TF32 against 0.000039 in fp32 for a 10240x10240 matmul).
    Usually harmless for deep learning; not for numerically sensitive code (solvers, physics).
    `set_float32_matmul_precision` is used rather than `allow_tf32`, which PyTorch plans to
    deprecate after 2.9. It has no effect before Ampere.

    ## Measured effect
    A 10240x10240 fp32 matmul on an A100: 0.11 s in fp32, 0.016 s with TF32 (about 7x), from
    PyTorch's CUDA semantics notes; Hugging Face reports "up to 3x" training throughput.
    Sources: https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices,
    https://huggingface.co/docs/transformers/perf_train_gpu_one
    """

    code = "SF201"
    name = "tf32-disabled"
    summary = "CUDA fp32 training that never enables TF32 matmuls"
    severity = Severity.WARNING
    requires = (b"backward", b"step(")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = 'Enable TF32 matmuls: `torch.set_float32_matmul_precision("high")` after the imports'
    gpu_only = True
    min_torch = v("1.12")
    effect = "fp32 matmuls on tensor cores: about 7x for a large A100 matmul."

    VALID = [
        Valid(
            """
            import torch
            torch.backends.cuda.matmul.allow_tf32 = True
            model = Net().cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # an explicit "highest" is a deliberate choice
            """
            import torch
            torch.set_float32_matmul_precision("highest")
            model = Net().cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # mixed precision: the matmuls already run in fp16/bf16
            """
            import torch
            model = Net().cuda()
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # optional bf16 through FSDP's mixed-precision policy (pytorch/examples FSDP2)
            """
            import torch
            from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
            if args.mixed_precision:
                kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
            model.to_empty(device="cuda")
            for _ in range(10):
                loss = model(x).sum()
                loss.backward()
                optim.step()
            """
        ),
        Valid(  # no training loop here
            """
            import torch
            model = Net().cuda()
            out = model(torch.randn(1, 3, device="cuda"))
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn

            model = nn.Linear(10, 10).cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """,
            fixed="""
            import torch
            import torch.nn as nn

            torch.set_float32_matmul_precision("high")

            model = nn.Linear(10, 10).cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # the file's own alias and quote style; the import that binds it ends the block
            """
            import os
            os.environ["CUDA_VISIBLE_DEVICES"] = '0'
            import torch as T
            from torch import nn

            def train(model, loader, opt):
                for x, y in loader:
                    loss = model(x.to('cuda')).sum()
                    loss.backward()
                    opt.step()
            """,
            fixed="""
            import os
            os.environ["CUDA_VISIBLE_DEVICES"] = '0'
            import torch as T
            from torch import nn

            T.set_float32_matmul_precision('high')

            def train(model, loader, opt):
                for x, y in loader:
                    loss = model(x.to('cuda')).sum()
                    loss.backward()
                    opt.step()
            """,
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        if not ctx.step_loops or self._precision_chosen() or uses_autocast(ctx) or ctx.mentions_low_precision:
            return
        node = next(loop for loop in ctx.loops if loop in ctx.step_loops)  # the first, in source order
        high = string_literal(ctx, "high")
        ops = setting_after_imports(ctx, "torch.set_float32_matmul_precision", lambda call: f"{call}({high})")
        message = "fp32 matmuls in this training loop run without TF32 tensor cores"
        self.report(node, message, fix_ops=ops, no_fix_reason=NO_IMPORT_BLOCK)

    def _precision_chosen(self) -> bool:
        ctx = self.ctx
        if ctx.calls_to("torch.set_float32_matmul_precision"):
            return True
        for name in ctx.assignments:
            if name.rsplit(".", 1)[-1] in _TF32_SWITCHES:
                return True
        return any(dotted_name(site.node.func) and "fp32_precision" in (dotted_name(site.node.func) or "") for site in ctx.calls)
