from __future__ import annotations

from speedfix.codegen import NO_IMPORT_BLOCK, setting_after_imports
from speedfix.context import CallSite
from speedfix.findings import Applicability, LossCheck, Severity
from speedfix.patterns import cudnn_settings
from speedfix.rule import Invalid, Rule, Valid

_CONV = tuple(
    f"torch.nn.{prefix}{kind}" for prefix in ("", "modules.conv.") for kind in ("Conv1d", "Conv2d", "Conv3d")
)
# torchvision's transformer families have only a patch-embedding convolution.
_NOT_CONV_NETS = ("vit_", "swin_", "maxvit")


class CudnnBenchmarkOff(Rule):
    """
    ## What it does
    Finds CUDA training of a convolutional network (`nn.Conv1d/2d/3d` layers or a torchvision
    CNN) in a script that never sets `torch.backends.cudnn.benchmark`.

    ## Why is this bad?
    With `benchmark = False` (the default) cuDNN picks convolution algorithms by heuristics. With
    `True` it times the candidates for each new input shape once and keeps the fastest, which for
    the fixed shapes of image training is often much faster. A script that sets
    `cudnn.benchmark` either way, asks for determinism (`cudnn.deterministic`,
    `use_deterministic_algorithms`) or turns cuDNN off has made its choice and is left alone.

    ## Example
    ```python
    import torch

    model = ResNet().cuda()
    for x, y in loader:
        ...
    ```

    ## Use instead
    ```python
    import torch

    torch.backends.cudnn.benchmark = True

    model = ResNet().cuda()
    ```

    ## Fix safety
    Unsafe. Input shapes that change from batch to batch (variable-length audio or text,
    multi-scale detection) make cuDNN benchmark every new shape, which can be slower than the
    default (ColossalAI turned it off by default for this reason); the first steps get slower
    while it measures; the algorithms it picks may differ between runs, so results are not
    bit-reproducible. A last partial batch costs one extra measurement per epoch, not per step.

    ## Measured effect
    SpeechBrain: 17 to 12 minutes per epoch on a V100 (1.42x) and 60 to 25 minutes on a 1080 Ti
    after enabling it; the PyTorch performance tuning guide recommends it for fixed-size inputs.
    Sources: https://github.com/speechbrain/speechbrain/pull/294,
    https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    """

    code = "SF601"
    name = "cudnn-benchmark-off"
    summary = "Conv net trained on CUDA without `cudnn.benchmark = True`"
    severity = Severity.INFO
    requires = (b"Conv", b"models")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Enable the cuDNN autotuner: `torch.backends.cudnn.benchmark = True` after the imports"
    gpu_only = True
    effect = "cuDNN picks the fastest conv algorithm per shape: 1.42x per epoch on a V100 (SpeechBrain)."

    VALID = [
        Valid(  # already on
            """
            import torch
            torch.backends.cudnn.benchmark = True
            conv = torch.nn.Conv2d(3, 8, 3).cuda()
            for x, y in loader:
                loss = conv(x.cuda()).sum()
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # determinism asked for (pytorch/examples imagenet with --seed): the user's choice
            """
            import torch
            import torch.backends.cudnn as cudnn
            from torchvision import models
            if args.seed is not None:
                cudnn.deterministic = True
            model = models.resnet50().cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # no convolutions
            """
            import torch
            model = torch.nn.Linear(8, 8).cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # a vision transformer from torchvision
            """
            import torch
            import torchvision
            model = torchvision.models.vit_b_16().cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn

            model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU()).cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """,
            fixed="""
            import torch
            import torch.nn as nn

            torch.backends.cudnn.benchmark = True

            model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU()).cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # a torchvision CNN; `import torch` is added to the import block
            """
            from torchvision.models import resnet18

            model = resnet18(num_classes=10).to("cuda")
            for x, y in loader:
                loss = model(x.to("cuda")).sum()
                loss.backward()
                opt.step()
            """,
            fixed="""
            from torchvision.models import resnet18
            import torch

            torch.backends.cudnn.benchmark = True

            model = resnet18(num_classes=10).to("cuda")
            for x, y in loader:
                loss = model(x.to("cuda")).sum()
                loss.backward()
                opt.step()
            """,
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        if not ctx.step_loops or cudnn_settings(ctx) or self._uses_lightning():
            return
        conv = self._first_conv()
        if conv is None:
            return
        message = "convolutions run with cuDNN's default algorithms: `cudnn.benchmark` is never enabled"
        ops = setting_after_imports(ctx, "torch.backends.cudnn.benchmark", lambda flag: f"{flag} = True")
        self.report(conv.node, message, fix_ops=ops, no_fix_reason=NO_IMPORT_BLOCK)

    def _first_conv(self) -> CallSite | None:
        for site in self.ctx.calls:
            qualified = self.ctx.call_qualname(site) or ""
            if qualified in _CONV or _is_torchvision_cnn(qualified):
                return site
        return None

    def _uses_lightning(self) -> bool:
        """Lightning's `Trainer(benchmark=...)` owns the flag."""
        return any(
            (self.ctx.call_qualname(site) or "").startswith(("lightning", "pytorch_lightning")) for site in self.ctx.calls
        )


def _is_torchvision_cnn(qualified: str) -> bool:
    """`torchvision.models.resnet50`, not a transformer family or a registry helper."""
    if not qualified.startswith("torchvision.models."):
        return False
    leaf = qualified.rsplit(".", 1)[-1]
    return leaf[:1].islower() and not leaf.startswith(_NOT_CONV_NETS) and leaf not in ("get_model", "get_weight")
