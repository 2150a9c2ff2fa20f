from __future__ import annotations

from speedfix.engine.findings import Applicability, LossCheck, Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.entry import setting_at_entry_point
from speedfix.model.flow import default_choice, in_no_run, off_by_default
from speedfix.model.frameworks import LIGHTNING_CLI, LIGHTNING_TRAINER
from speedfix.model.index import CallSite
from speedfix.model.lightning_config import configured_trainers
from speedfix.model.loader_classes import dataloader_calls
from speedfix.model.loaders import pads_to_longest
from speedfix.model.frames import class_of
from speedfix.model.networks import (is_conv_architecture, never_used, project_conv_dims, runs_only_periodically,
                                      self_optimizing_classes, zoo_architecture)
from speedfix.model.patterns import cudnn_choices, cudnn_disabled
from speedfix.model.workload import runs_cudnn_layers
from speedfix.project.steps import CONV_LAYERS
from speedfix.rules._impact import Estimate, Finding, Impact, small_model
from speedfix.syntax.nodes import code_of

_CONV = tuple(CONV_LAYERS)  # transposed convolutions run on cuDNN too
_DISABLED = "cuDNN is switched off"


class CudnnBenchmarkOff(Rule):
    """
    ## What it does
    Finds CUDA training of a convolutional network (`nn.Conv1d/2d/3d` layers, or a CNN from a
    model zoo: `torchvision.models.resnet50()`, `models.__dict__[args.arch]()`,
    `models.get_model(...)`, `timm.create_model(...)`) in a script that never sets
    `torch.backends.cudnn.benchmark`. A conv net whose class makes its own optimizer
    (`self.optimizer = optim.RMSprop(self.parameters())`, as RL agents' networks do) is trained
    and reported in its own file, without a fix when that file has no entry point. A network
    of a zoo or of the project that the script loads into a name it never reads again (a VAE
    left over once the latents were extracted ahead) runs no convolution and does not count, nor
    does one the training loop calls only every N steps (a VAE decoding samples now and then).

    ## Why is this bad?
    With `benchmark = False` (the default) cuDNN picks convolution algorithms by heuristics. With
    `True` it times the candidates for each new input shape once and keeps the fastest, which for
    the fixed shapes of image training is often much faster. A script that sets
    `cudnn.benchmark` either way or asks for determinism (`cudnn.deterministic`,
    `use_deterministic_algorithms`) has made its choice and is left alone, and so is a module
    without an entry point of its own that a scanned script imports and runs after choosing
    (the flag is process-wide: `main.py`'s `cudnn.benchmark = True` holds for the `solver.py` it
    runs; a Lightning `Trainer` or `LightningCLI` there counts as its choice: its `benchmark`
    argument sets the flag, and SF901 advises it; a choice under an `if` there does not count,
    nor one in a module that is no script, such as a test's helper); one that does so only
    behind an option that is off by default (pytorch/examples imagenet sets
    `cudnn.deterministic` only under `if args.seed is not None:`) runs the default algorithms by
    default and is reported.

    Also finds cuDNN switched off on the default path: `torch.backends.cudnn.enabled = False`, or
    `= args.enable_cudnn` with a flag that is off unless given, also at the top of a module that a
    training script imports (the switch runs on import, and a script that imports a module making
    a cuDNN choice has made it). Convolutions, recurrent layers and batch norm then run PyTorch's
    own kernels, far slower than cuDNN's.

    ## Example
    ```python
    def main():
        model = torchvision.models.resnet50().cuda()
        for x, y in loader:
            ...
    ```

    ## Use instead
    ```python
    def main():
        torch.backends.cudnn.benchmark = True
        model = torchvision.models.resnet50().cuda()
    ```

    ## Fix safety
    Unsafe. Input shapes that change from batch to batch (variable-length audio or text,
    multi-scale detection) make cuDNN benchmark every new shape, which can be slower than the
    default (ColossalAI turned it off by default for this reason); the first steps get slower
    while it measures; the algorithms it picks may differ between runs, so results are not
    bit-reproducible. A last partial batch costs one extra measurement per epoch, not per step.

    The flag is process-wide, so it goes where the script starts: the top of `main()`, else of the
    `if __name__ == "__main__":` block, else (a script that trains at module level) after the
    imports. It runs before the script's own opt-in settings (`if args.seed is not None:
    cudnn.benchmark = False`), which still win when their option is given. A module with no entry
    point only defines things for others to import and gets no fix. Processes started with
    `mp.spawn(worker)` do not run `main()`: set it in the worker too.

    ## Impact
    Medium. Low for a small model (under 10M parameters, counted from the layers it builds,
    or given by width options of 256 or less), and where the batches are padded to their longest
    sample (a `collate_fn` that calls `pad_sequence`, in the file or another of the project):
    their shapes change, and benchmark mode tunes again for every new one. High when cuDNN is
    switched off in a model with convolutions, recurrent layers or batch norm, whatever its size:
    every one of them runs without it; low when the model is a matmul network without them (a
    transformer, an MLP: cuBLAS runs its matmuls), medium when the scan cannot see its layers.

    ## Measured effect
    SpeechBrain: 17 to 12 minutes per epoch on a V100 (1.42x) and 60 to 25 minutes on a 1080 Ti
    after enabling it; the PyTorch performance tuning guide recommends it for fixed-size inputs.
    Sources: https://github.com/speechbrain/speechbrain/pull/294,
    https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    """

    impact = "medium"
    code = "SF601"
    name = "cudnn-benchmark-off"
    summary = "Conv net trained on CUDA without `cudnn.benchmark = True`"
    severity = Severity.INFO
    requires = (b"Conv", b"models", b"create_model", b"diffusers", b"cudnn.enabled")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Enable the cuDNN autotuner: `torch.backends.cudnn.benchmark = True` at the entry point"
    gpu_only = True
    reads_project = True  # a conv net defined in another scanned file
    effect = "cuDNN picks the fastest conv algorithm per shape: 1.42x per epoch on a V100 (SpeechBrain)."

    VALID = [
        Valid(  # a VAE loaded and never run (fast-DiT trains on latents extracted ahead): no conv net trains
            """
            import torch
            from diffusers.models import AutoencoderKL

            def main(loader):
                model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU()).cuda()
                vae = AutoencoderKL.from_pretrained("stabilityai/sd-vae-ft-ema").cuda()
                opt = torch.optim.AdamW(model.parameters())
                for x in loader:
                    model(x.cuda()).mean().backward()
                    opt.step()
            """
        ),
        Valid(  # a VAE that only decodes samples every N steps (REPA): the training runs no conv net
            """
            import torch
            from diffusers.models import AutoencoderKL

            def main(loader, sample_every=1000):
                model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU()).cuda()
                vae = AutoencoderKL.from_pretrained("stabilityai/sd-vae-ft-ema").cuda()
                opt = torch.optim.AdamW(model.parameters())
                for step, x in enumerate(loader):
                    model(x.cuda()).mean().backward()
                    opt.step()
                    if step % sample_every == 0:
                        with torch.no_grad():
                            images = vae.decode(model(x.cuda())).sample
            """
        ),
        Valid(  # a module that only defines a conv net: whoever trains it decides
            """
            import torch
            import torch.nn as nn

            class QNet(nn.Module):
                def __init__(self, actions):
                    super().__init__()
                    self.features = nn.Sequential(nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Flatten())
                    self.head = nn.LazyLinear(actions)
                    self.to(torch.device("cuda"))

                def forward(self, frames):
                    return self.head(self.features(frames))
            """
        ),
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
        Valid(  # determinism behind a test that cannot be resolved: the user's choice
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
        Valid(  # cuDNN off only when asked for (`--deterministic`, off by default), on otherwise
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--deterministic", action="store_true")
            args = parser.parse_args()
            torch.backends.cudnn.enabled = not args.deterministic
            torch.backends.cudnn.benchmark = True
            conv = torch.nn.Conv2d(3, 8, 3).cuda()
            for x, y in loader:
                loss = conv(x.cuda()).sum()
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
        Invalid(  # an RL network that makes its own optimizer and moves itself to the GPU: it is trained,
            # by whichever file steps that optimizer (no entry point here: no fix)
            """
            import torch
            import torch.nn as nn

            class QNet(nn.Module):
                def __init__(self, actions, lr):
                    super().__init__()
                    self.features = nn.Sequential(nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Flatten())
                    self.head = nn.LazyLinear(actions)
                    self.optimizer = torch.optim.Adam(self.parameters(), lr=lr)
                    self.to(torch.device("cuda"))

                def forward(self, frames):
                    return self.head(self.features(frames))
            """,
        ),
        Invalid(  # a diffusers U-Net is a conv net
            """
            import torch
            from diffusers import UNet2DModel

            def main():
                model = UNet2DModel(sample_size=64, in_channels=3, out_channels=3).to("cuda")
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
                for batch in loader:
                    loss = model(batch.cuda(), t).sample.mean()
                    loss.backward()
                    optimizer.step()

            if __name__ == "__main__":
                main()
            """,
            fixed="""
            import torch
            from diffusers import UNet2DModel

            def main():
                torch.backends.cudnn.benchmark = True
                model = UNet2DModel(sample_size=64, in_channels=3, out_channels=3).to("cuda")
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
                for batch in loader:
                    loss = model(batch.cuda(), t).sample.mean()
                    loss.backward()
                    optimizer.step()

            if __name__ == "__main__":
                main()
            """,
        ),
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
        Invalid(  # pytorch/examples imagenet: determinism only with --seed (default None); a zoo
            # model by name; the flag goes to the top of main(), before the script's own choice
            """
            import argparse
            import torch
            import torch.backends.cudnn as cudnn
            import torchvision.models as models

            parser = argparse.ArgumentParser()
            parser.add_argument("-a", "--arch", default="resnet18")
            parser.add_argument("--seed", default=None, type=int)

            def main():
                args = parser.parse_args()
                if args.seed is not None:
                    torch.manual_seed(args.seed)
                    cudnn.deterministic = True
                    cudnn.benchmark = False
                model = models.__dict__[args.arch]().cuda()
                for images, target in train_loader:
                    loss = criterion(model(images.cuda()), target.cuda())
                    loss.backward()
                    optimizer.step()

            if __name__ == "__main__":
                main()
            """,
            fixed="""
            import argparse
            import torch
            import torch.backends.cudnn as cudnn
            import torchvision.models as models

            parser = argparse.ArgumentParser()
            parser.add_argument("-a", "--arch", default="resnet18")
            parser.add_argument("--seed", default=None, type=int)

            def main():
                cudnn.benchmark = True
                args = parser.parse_args()
                if args.seed is not None:
                    torch.manual_seed(args.seed)
                    cudnn.deterministic = True
                    cudnn.benchmark = False
                model = models.__dict__[args.arch]().cuda()
                for images, target in train_loader:
                    loss = criterion(model(images.cuda()), target.cuda())
                    loss.backward()
                    optimizer.step()

            if __name__ == "__main__":
                main()
            """,
        ),
        Invalid(  # timm, in the `__main__` block of a script without main()
            """
            import timm
            import torch

            if __name__ == "__main__":
                model = timm.create_model("resnet50").cuda()
                for x, y in loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    opt.step()
            """,
            fixed="""
            import timm
            import torch

            if __name__ == "__main__":
                torch.backends.cudnn.benchmark = True
                model = timm.create_model("resnet50").cuda()
                for x, y in loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    opt.step()
            """,
        ),
        Invalid(  # Rainbow DQN: cuDNN is on only with `--enable-cudnn`, off by default
            """
            import argparse
            import torch
            from model import QNetwork

            parser = argparse.ArgumentParser()
            parser.add_argument("--enable-cudnn", action="store_true", help="faster, not deterministic")
            args = parser.parse_args()
            if torch.cuda.is_available():
                device = torch.device("cuda")
                torch.backends.cudnn.enabled = args.enable_cudnn
            net = QNetwork().to(device)
            for step in range(100_000):
                loss = net(replay.sample().to(device)).mean()
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # a library module (it only defines things): no setting at import time
            """
            import torch
            from torch import nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3)

            def fit(model, loader, opt):
                for x, y in loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    opt.step()
            """,
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        if finding.message.startswith(_DISABLED):
            layers = runs_cudnn_layers(self.ctx)
            if layers is False:
                return Estimate(Impact.LOW, "cuDNN is off, but the model is a matmul network (its matmuls run on "
                                            "cuBLAS): no convolution, recurrent layer or batch norm loses it")
            if layers is None:
                return Estimate(Impact.MEDIUM, "cuDNN is off; the scan cannot see whether the model has "
                                               "convolutions, recurrent layers or batch norm")
            return Estimate(Impact.HIGH, "cuDNN is off: convolutions run PyTorch's own kernels")
        padded = next((site for site in dataloader_calls(self.ctx) if pads_to_longest(self.ctx, site)), None)
        if padded is not None:
            return Estimate(Impact.LOW, "the batches are padded to their longest sample, so their shapes change: "
                                        "benchmark mode tunes again for every new shape")
        return small_model(self.ctx, Impact.LOW)

    def finish(self) -> None:
        ctx = self.ctx
        trainers = set() if ctx.drives_training else self_optimizing_classes(ctx)
        disabled = cudnn_disabled(ctx)
        # switched off when a training script imports this module (crnn's evaluate.py)
        on_import = disabled is not None and not disabled.stack and ctx.links.trained_by is not None
        if not (ctx.drives_training or trainers or on_import) or self._uses_lightning():
            return
        if disabled is not None and disabled.statement is not None:
            literal = code_of(disabled.value) == "False"
            imported = f", when {ctx.links.trained_by} imports this module" if on_import and not ctx.drives_training else ""
            self.report(
                disabled.statement,
                f"{_DISABLED} (`{disabled.target} = {code_of(disabled.value)}`"
                f"{'' if literal else ', False by default'}{imported}): convolutions, recurrent layers and batch "
                "norm run PyTorch's own kernels, far slower than cuDNN's",
                no_fix_reason="leave cuDNN on (the default) unless a cuDNN problem needs it off; "
                "for reproducibility set `cudnn.deterministic = True` instead",
            )
            return
        choices = cudnn_choices(ctx)
        chosen, gate = default_choice(ctx, choices)
        if chosen:
            return
        if ctx.links.cudnn is not None and not ctx.has_main_guard:
            return  # the script that imports this module and runs it chooses for the process
        if ctx.links.cudnn_imported is not None:
            return  # a module it imports chooses for the process when imported
        conv = self._first_conv()
        if conv is None or not ctx.drives_training and not ((owner := class_of(conv.stack)) and owner.name.value in trainers):
            return  # a module only: report the conv net of a class that trains itself (has its own optimizer)
        message = "convolutions run with cuDNN's default algorithms: `cudnn.benchmark` is never enabled"
        if gate is not None:
            message = ("convolutions run with cuDNN's default algorithms: the script sets cuDNN up only when "
                       f"`{gate}`, which is off by default")
        opt_ins = [stack for statement, stack in choices if off_by_default(ctx, statement, stack)]
        ops, reason = setting_at_entry_point(ctx, "torch.backends.cudnn.benchmark", lambda flag: f"{flag} = True", opt_ins)
        self.report(conv.node, message, fix_ops=ops, no_fix_reason=reason)

    def _first_conv(self) -> CallSite | None:
        """The first convolution layer or zoo CNN the file builds."""
        for site in self.ctx.calls:
            if self._builds_conv(site) and not in_no_run(self.ctx, site.statement, site.stack):
                return site  # not one under `if args.model == "Autoformer":` where every launch picks another
        return None

    def _builds_conv(self, site: CallSite) -> bool:
        """A convolution layer, a zoo CNN or a project class with convolutions that the training runs."""
        if self.ctx.call_qualname(site) in _CONV:
            return True
        zoo = zoo_architecture(self.ctx, site.node, site.stack)
        if zoo is not None and is_conv_architecture(zoo[1]) and self._runs_in_training(site):
            return True
        # a project class with convolutions (`ResNet18()` of models.py)
        return bool(project_conv_dims(self.ctx, site.node)) and self._runs_in_training(site)

    def _runs_in_training(self, site: CallSite) -> bool:
        """Not a network the script never calls, nor one it calls only every N steps (a VAE
        decoding samples now and then)."""
        return not never_used(self.ctx, site) and not runs_only_periodically(self.ctx, site)

    def _uses_lightning(self) -> bool:
        """Lightning's `Trainer(benchmark=...)` owns the flag (SF901 says so); a `Fabric` has none."""
        return bool(self.ctx.calls_to(*LIGHTNING_TRAINER, *LIGHTNING_CLI)) or bool(configured_trainers(self.ctx))
