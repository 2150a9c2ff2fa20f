from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Applicability, FixOp, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, arg_removed, keyword_arg, same_quotes, string_literal, value_replaced
from speedfix.fixes.entry import setting_at_entry_point
from speedfix.model.amp import lightning_module_in_sixteen_bit
from speedfix.model.arguments import ArgValue, find_argument, literal_bool, literal_int, string_value
from speedfix.model.autograd import differentiates_twice
from speedfix.model.config_files import builds_conv2d, classes_build_conv2d
from speedfix.model.config_tree import Node
from speedfix.model.context import FileContext
from speedfix.model.frameworks import (FP32_PRECISIONS, LIGHTNING_FABRIC, LIGHTNING_TRAINER, SET_ELSEWHERE,
                                       evaluation_only_trainer, fabric_setups,
                                       fitted_classes, in_lightning_method, lightning_on_gpu, lightning_precision,
                                       trainer_fits)
from speedfix.model.hydra_config import config_of
from speedfix.model.tf32 import loop_gains_from_tf32
from speedfix.model.lightning_config import UNKNOWN, ConfiguredTrainer, TrainerValue, configured_trainers
from speedfix.model.index import CallSite
from speedfix.model.networks import conv2d_classes
from speedfix.model.patterns import INSTANTIATE, cudnn_settings, matmul_precision_chosen
from speedfix.model.versions import lightning_before_2, lightning_before_bf16, v
from speedfix.syntax.nodes import code_of
from speedfix.rules._impact import Estimate, Finding, Impact, by_message, compile_gain, small_model, tf32_gain

_FP16 = frozenset({"16", "16-mixed"})
_HEAVY_PROFILERS = frozenset({"advanced", "pytorch", "xla"})
_COMPILE_FROM = v("2.0")
# fp32 matmuls stopped using TF32 by default (and `set_float32_matmul_precision` came) in torch 1.12.
_TF32_OFF_FROM = v("1.12")
_SHARDING = ("torch.distributed.fsdp.fully_shard", "torch.distributed._composable.fsdp.fully_shard",
             "torch.distributed.tensor.parallel.parallelize_module")
_COMPILE_REASON = ("the first steps pay the compile, and a module that does not trace breaks its graph: "
                   "measure it with `speedfix bench`")


# FSDP mixed-precision policies: a model sharded with one computes in its `param_dtype`.


class LightningTrainerConfig(Rule):
    """
    ## What it does
    Finds a Lightning `Trainer` that trains on a GPU with slow settings:

    - `precision` left at its default "32-true" (or set to 32): the whole step runs in fp32 (not
      when a LightningModule of the file casts its own weights to 16-bit, `self.to(dtype)` with a
      bf16 or fp16 dtype or a parameter defaulting to one: its matmuls already run in 16-bit);
    - fp32 training in a script that never calls `torch.set_float32_matmul_precision`;
    - `precision="16-mixed"`, which scales the loss where bf16 would not have to (also read
      from a dict of settings: `precision=config.get("precision")`);
    - `profiler=` left on ("advanced", "pytorch" or a profiler object; "simple" at lower severity);
    - a convolutional network (`nn.Conv2d` layers, a torchvision/timm CNN, any
      segmentation_models_pytorch network) trained without `benchmark=True`, or with
      `deterministic=True` on every run (cuDNN's deterministic algorithms; information only, no fix);
    - `accumulate_grad_batches` above 1, which does not make steps faster (information only);
    - `self.log(..., sync_dist=True)` (or `self.log_dict`) in `training_step` (or in a method it calls, such as a
      `shared_step`), an all-reduce per step with several GPUs: one finding per method, on its first;
      not where `on_step=` is given a value the scan cannot read as true (Lightning then reduces once
      an epoch when it is off).

    - a LightningModule trained on the GPU that nothing compiles (`torch.compile`, information
      only; with hydra, a `compile: false` in the model's config is reported on its line);
      likewise a model `fabric.setup(...)` wraps: `fabric.setup(torch.compile(model))` (SF501
      leaves a Fabric's model to this check); not where the file differentiates a gradient (a
      GAN's R1 penalty, `create_graph=True`), which compiled graphs cannot do.

    The same checks hold for a `Fabric` (its precision also defaults to "32-true"; TF32 there
    when its training loop multiplies matrices, as SF201 would judge it, which leaves it here) and for
    Trainers built from configuration: `hydra.utils.instantiate(cfg.trainer)` with the YAML
    hydra composes (`@hydra.main(config_path=..., config_name=...)`, its defaults list and the
    GPU options of the `trainer` group; a `precision` left out is reported on the commented-out
    `# precision:` line when there is one), `LightningCLI(..., trainer_defaults={...})` with what
    the launch commands add (`--trainer.precision`, the `trainer:` section of their `--config`
    YAML; without one, the `trainer:` sections of the project's LightningCLI configs in
    `configs/` or `experiments/`), Lightning 1.x's `Trainer.from_argparse_args(args)` (CPU and
    fp32 unless `parser.set_defaults(...)`, the launch commands or the `lightning: trainer:`
    section of the YAML files they name say otherwise; `--accelerator ddp` with `--gpus 4` is
    1.x's distributed backend on four GPUs), and `Trainer(**config["trainer"])` with
    a YAML file the script loads itself (`yaml.safe_load` of an argparse default), with the
    section hydra composes (`pl.Trainer(**cfg.trainer)`: `trainer/default.yaml`), or with a
    section of the YAML files the launch commands name that the script merges itself
    (`Trainer(**trainer_opt)` where `trainer_opt` is `config.pop("lightning").get("trainer")`
    of `OmegaConf.merge(*[OmegaConf.load(f) for f in opt.base])`, made a `Namespace` and back).
    The compile note sits on the Trainer's `fit` (not an encoder's `fit(data)`). A value in a
    YAML file or a launch command is reported on its line, with what to write there. For such a
    Trainer the conv net may be one its YAML names (`class_path: pkg.models.UNet`, read from the
    project's module without importing it); for any Trainer, the project class `trainer.fit(...)`
    trains (`model = CLIPWrapper(...)` from `models/`), with what its module imports (a class, or a
    factory such as `resnet18`). A Lightning 1.x Trainer given `precision=16` and no device option
    trains on the GPU (1.x runs 16-bit AMP only on CUDA).

    A `Trainer` is GPU code unless its `accelerator` is a known non-GPU one ("cpu", "tpu",
    "mps", ...): the default, "auto", picks the GPU whenever there is one, and so does
    `accelerator="gpu" if torch.cuda.is_available() else "cpu"`. A Lightning 1.x Trainer given
    `gpus` trains on the GPU when the count is not 0 (`gpus=torch.cuda.device_count()`, its
    `accelerator="ddp" if device_num > 1 else None` being the distributed backend; also a count
    read from a YAML file the script loads itself: `gpus=hparams.train.gpus`), and its fix writes
    1.x's `"bf16"`; a project that pins a Lightning older than 1.5, which has no bf16, gets the fp32
    finding without a fix (`precision=16` is its mixed precision). An `accelerator` or
    `precision` speedfix cannot know (`args.accelerator` without a default) means silence. A
    Trainer that its function only tests, validates or predicts with is left alone.
    `detect_anomaly=True` is SF603's. Lightning moves the batches of the loaders a module or data
    module returns to the GPU itself, so no `.to("cuda")` is needed for a script to be GPU code.

    ## Why is this bad?
    In fp32 every matmul and convolution runs at a fraction of what the tensor cores can do:
    `precision="bf16-mixed"` runs them in bf16 under autocast, with fp32 weights and no loss
    scaling, and halves activation memory. Training that stays in fp32 should at least allow
    TF32 matmuls, which Lightning itself asks for at start-up ("You are using a CUDA device that
    has Tensor Cores..."). "16-mixed" needs a GradScaler that checks every gradient for inf and
    reads the result back to the CPU every step; bf16 has fp32's range and needs none. The
    "advanced" profiler runs cProfile around every hook, the "pytorch" one records every op.
    With `benchmark` unset Lightning leaves cuDNN on its heuristics, which are slower than the
    measured choice for the fixed input shapes of image training. Gradient accumulation makes
    the effective batch bigger, not the steps faster: each micro-batch still runs its own forward
    and backward pass.

    ## Example
    ```python
    trainer = L.Trainer(max_epochs=10, profiler="advanced")
    ```

    ## Use instead
    ```python
    torch.set_float32_matmul_precision("high")
    trainer = L.Trainer(max_epochs=10, precision="bf16-mixed")
    ```

    ## Fix safety
    Unsafe. `precision="bf16-mixed"` and TF32 change the numbers (bf16 keeps 8 mantissa bits,
    TF32 10), and bf16 needs an Ampere or newer GPU (A100, RTX 30xx, H100): on a V100 or T4 use
    "16-mixed". The TF32 setting goes at the top of `main()` (or the `__main__` block).
    A setting in a YAML file or a launch command is reported with what to write there: speedfix
    rewrites Python only. `torch.compile` is never added: the first steps pay the compile.
    `benchmark=True` makes cuDNN measure every new input shape: for inputs whose shape changes
    from batch to batch it can be slower, and results are no longer bit-reproducible. Removing
    the profiler removes its report. A value set outside the call (a constant, an argparse
    default) is reported without a fix. Accumulation and `sync_dist` are reported without one:
    the right batch size depends on the GPU's memory, and a per-step metric may need the
    all-reduce.

    ## Impact
    High: fp32 training on a GPU, no `torch.compile`, a profiler left on and TF32 off are among
    the largest gaps; fp32, TF32 and compile are medium for a small model (under 10M parameters,
    counted from the layers it builds, or given by width options of 256 or less); compile
    is low for a model of a billion parameters or more, as in SF501. TF32 is weighed by the kind
    of network as in SF201: low for a conv net (cuDNN already runs its convolutions in TF32),
    medium when nothing shows the network's kind. Medium for fp16 instead of bf16, cuDNN
    autotuning off and values all-reduced for logging on every step; low for
    `accumulate_grad_batches`.

    ## Measured effect
    Mixed precision: "up to 3x" on Volta and newer GPUs (PyTorch's tuning guide) and Lightning's
    docs; TF32: about 7x for a large A100 matmul; profilers: the tuning guide's "Disable
    debugging APIs"; `benchmark`: 1.42x per epoch on a V100 (SpeechBrain); accumulation
    "Improves training speed: No" (Hugging Face).
    Sources: https://lightning.ai/docs/pytorch/stable/common/precision_basic.html,
    https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html,
    https://huggingface.co/docs/transformers/perf_train_gpu_one,
    https://github.com/speechbrain/speechbrain/pull/294
    """

    impact = "high"
    code = "SF901"
    name = "lightning-trainer-config"
    summary = "Lightning `Trainer` or `Fabric` on a GPU in fp32, without TF32, with a profiler or without cuDNN autotuning"
    severity = Severity.WARNING
    requires = (b"Trainer", b"sync_dist", b"Fabric", b"LightningCLI", b"hydra")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = 'Train in bf16 mixed precision (`precision="bf16-mixed"`)'
    effect = "bf16 autocast on tensor cores: up to 3x; TF32 for what stays fp32."

    VALID = [
        Valid(  # hyena-dna: `on_step=` a flag of the module's own config, off unless a run sets it
            """
            import lightning as L

            class Task(L.LightningModule):
                def _shared_step(self, batch, prefix):
                    loss = self.model(batch).mean()
                    log_on_step = self.hparams.eval.get("log_on_step", False) and prefix == "train"
                    self.log_dict({f"{prefix}/loss": loss}, on_step=log_on_step, on_epoch=True, sync_dist=True)
                    return loss

                def training_step(self, batch, batch_idx):
                    return self._shared_step(batch, "train")

            L.Trainer(accelerator="gpu", devices=8, precision="bf16-mixed", benchmark=True).fit(torch.compile(Task()))
            """
        ),
        Valid(  # a GAN's R1 penalty differentiates a gradient: no compile note (compiled graphs cannot)
            """
            import lightning as L
            import torch

            class GAN(L.LightningModule):
                def training_step(self, batch, batch_idx):
                    batch.requires_grad_()
                    score = self.disc(batch)
                    grad, = torch.autograd.grad(score.sum(), batch, create_graph=True)
                    return score.mean() + grad.pow(2).sum()

            L.Trainer(accelerator="gpu", precision="bf16-mixed", benchmark=True).fit(GAN())
            """
        ),
        Valid(  # a Trainer that only tests a checkpoint: nothing trains
            """
            import pytorch_lightning as pl

            def evaluate(model, data):
                trainer = pl.Trainer(accelerator="gpu", devices=1)
                trainer.test(model, datamodule=data)
            """
        ),
        Valid(  # the same, with the Trainer bound by an annotated assignment (eben's test.py)
            """
            from pytorch_lightning import Trainer

            def evaluate(model, data):
                trainer: Trainer = Trainer(gpus=1, logger=False)
                trainer.test(model=model, datamodule=data)
            """
        ),
        Valid(  # FSDP2's bf16 policy sets the precision; the Trainer's stays at its default
            """
            import torch
            import lightning as L
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            class LM(L.LightningModule):
                def configure_model(self):
                    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                    fully_shard(self.model, mp_policy=policy)

            torch.set_float32_matmul_precision("high")
            trainer = L.Trainer(accelerator="cuda", devices=4, strategy=ModelParallelStrategy())
            trainer.fit(LM(), loader)
            """
        ),
        Valid(  # the module casts its own weights to bf16 (OminiControl): no fp32 matmuls are left
            """
            import torch
            import lightning as L

            class LoRAModel(L.LightningModule):
                def __init__(self, dtype: torch.dtype = torch.bfloat16):
                    super().__init__()
                    self.net = build_network()
                    self.to("cuda").to(dtype)

            trainer = L.Trainer(accelerator="gpu", devices=1, max_epochs=10)
            """
        ),
        Valid(  # tuned: bf16 mixed precision
            """
            import lightning as L
            trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_epochs=10)
            """
        ),
        Valid(  # a CPU run
            """
            import lightning as L
            trainer = L.Trainer(accelerator="cpu", max_epochs=10)
            """
        ),
        Valid(  # values speedfix cannot know
            """
            import lightning as L
            def main(args):
                trainer = L.Trainer(accelerator=args.accelerator)
                other = L.Trainer(precision=args.precision, profiler=args.profiler)
            """
        ),
        Valid(  # the GPU only when a flag asks for it, and the flag is off by default
            """
            import argparse
            import torch
            import pytorch_lightning as pl

            parser = argparse.ArgumentParser()
            parser.add_argument("--gpu", action="store_true")
            opts = parser.parse_args()
            pl.Trainer(accelerator="gpu" if opts.gpu and torch.cuda.is_available() else "cpu").fit(Net())
            """
        ),
        Valid(  # fp32 on purpose, with TF32 chosen; no profiler
            """
            import torch
            from lightning.pytorch import Trainer
            torch.set_float32_matmul_precision("medium")
            trainer = Trainer(precision="bf16-true", profiler=None)
            """
        ),
        Valid(  # Lightning 1.x without a GPU option trains on the CPU
            """
            import pytorch_lightning as pl
            def main(args):
                trainer = pl.Trainer.from_argparse_args(args, max_epochs=32)
            """
        ),
        Valid(  # determinism only when asked for: the user's per-run choice
            """
            import torch.nn as nn
            import lightning as L

            class SmallResNet(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 32, 3, padding=1)

            def main(args):
                trainer = L.Trainer(precision="bf16-mixed", deterministic=args.deterministic)
            """
        ),
        Valid(  # not Lightning's Trainer
            """
            from transformers import Trainer
            trainer = Trainer(model=model, args=args)
            """
        ),
        Valid(  # a settings object of the file made for the CPU
            """
            import dataclasses
            import lightning as L

            @dataclasses.dataclass
            class RunConfig:
                accelerator: str = "gpu"
                devices: int = 1

            run = RunConfig(accelerator="cpu")
            trainer = L.Trainer(accelerator=run.accelerator, devices=run.devices)
            """
        ),
    ]
    INVALID = [
        Invalid(  # the precision comes from a settings dict written earlier (a notebook cell)
            """
            import lightning as L
            import torch

            torch.set_float32_matmul_precision("high")
            settings = {"epochs": 5, "precision": "16-mixed"}
            trainer = L.Trainer(max_epochs=settings["epochs"], precision=settings.get("precision"))
            trainer.fit(module, datamodule=dm)
            """,
            count=2,  # fp16 where bf16 fits, and compile
        ),
        Invalid(
            """
            import lightning as L

            def main():
                trainer = L.Trainer(max_epochs=10)
                trainer.fit(model, datamodule=dm)
            """,
            fixed="""
            import lightning as L
            import torch

            def main():
                torch.set_float32_matmul_precision("high")
                trainer = L.Trainer(max_epochs=10, precision="bf16-mixed")
                trainer.fit(model, datamodule=dm)
            """,
            count=3,
        ),
        Invalid(  # an explicit 32, a profiler and accumulation (reported, no fix)
            """
            import torch
            from pytorch_lightning import Trainer

            def main():
                trainer = Trainer(precision=32, profiler='advanced', accumulate_grad_batches=4)
            """,
            fixed="""
            import torch
            from pytorch_lightning import Trainer

            def main():
                torch.set_float32_matmul_precision('high')
                trainer = Trainer(precision='bf16-mixed', accumulate_grad_batches=4)
            """,
            count=4,
        ),
        Invalid(  # fp16 mixed precision where bf16 fits
            """
            import lightning.pytorch as pl
            trainer = pl.Trainer(accelerator="cuda", precision="16-mixed")
            """,
            fixed="""
            import lightning.pytorch as pl
            trainer = pl.Trainer(accelerator="cuda", precision="bf16-mixed")
            """,
        ),
        Invalid(  # a conv net without the cuDNN autotuner
            """
            import torch.nn as nn
            import lightning as L

            class Net(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 16, 3)

            trainer = L.Trainer(precision="bf16-mixed")
            """,
            fixed="""
            import torch.nn as nn
            import lightning as L

            class Net(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 16, 3)

            trainer = L.Trainer(precision="bf16-mixed", benchmark=True)
            """,
        ),
        Invalid(  # the module's network comes from a helper of the file that builds a torchvision ResNet
            """
            import torchvision
            import lightning as L

            def make_backbone():
                return torchvision.models.resnet34(num_classes=100)

            class Classifier(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.net = make_backbone()

            trainer = L.Trainer(precision="bf16-mixed")
            """,
            fixed="""
            import torchvision
            import lightning as L

            def make_backbone():
                return torchvision.models.resnet34(num_classes=100)

            class Classifier(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.net = make_backbone()

            trainer = L.Trainer(precision="bf16-mixed", benchmark=True)
            """,
        ),
        Invalid(  # a segmentation_models_pytorch network decodes with convolutions, whatever the encoder
            """
            import lightning as L
            import segmentation_models_pytorch as smp

            class Segmenter(L.LightningModule):
                def __init__(self, arch):
                    super().__init__()
                    self.net = smp.create_model(arch, encoder_name="resnet18", classes=2)

            trainer = L.Trainer(precision="bf16-mixed")
            """,
            fixed="""
            import lightning as L
            import segmentation_models_pytorch as smp

            class Segmenter(L.LightningModule):
                def __init__(self, arch):
                    super().__init__()
                    self.net = smp.create_model(arch, encoder_name="resnet18", classes=2)

            trainer = L.Trainer(precision="bf16-mixed", benchmark=True)
            """,
        ),
        Invalid(  # the accelerator read from a settings dataclass of the file: its default "auto" picks the GPU
            """
            from dataclasses import dataclass
            import lightning as L

            @dataclass
            class Settings:
                epochs: int = 3
                accelerator: str = "auto"

            settings = Settings()
            L.Trainer(accelerator=settings.accelerator, precision="bf16-mixed").fit(Model())
            """
        ),
        Invalid(  # "gpu" whenever the machine has one: the GPU run is the one that counts
            """
            import torch
            import pytorch_lightning as pl

            torch.set_float32_matmul_precision("high")
            runner = pl.Trainer(accelerator="gpu" if torch.cuda.is_available() else "cpu", max_epochs=5)
            runner.fit(torch.compile(Net()))
            """,
            """
            import torch
            import pytorch_lightning as pl

            torch.set_float32_matmul_precision("high")
            runner = pl.Trainer(accelerator="gpu" if torch.cuda.is_available() else "cpu", max_epochs=5, precision="bf16-mixed")
            runner.fit(torch.compile(Net()))
            """,
        ),
        Invalid(  # precision from an argparse default: reported, no fix for it
            """
            import argparse
            import lightning as L

            def main():
                parser = argparse.ArgumentParser()
                parser.add_argument("--precision", default="16-mixed")
                args = parser.parse_args()
                trainer = L.Trainer(precision=args.precision)
            """,
        ),
        Invalid(  # LightningCLI: `trainer_defaults` without a precision, nothing compiles the module
            """
            import torch
            from lightning.pytorch.cli import LightningCLI

            if __name__ == "__main__":
                torch.set_float32_matmul_precision("high")
                LightningCLI(Model, DataModule, trainer_defaults={"max_epochs": 90, "benchmark": True})
            """,
            count=2,
        ),
        Invalid(  # a Fabric loop of linear layers in fp32: bf16 and TF32 advice, both on the Fabric call
            """
            import torch
            import lightning as L

            def main():
                fabric = L.Fabric(accelerator="cuda", devices=1)
                net = torch.compile(torch.nn.Linear(1024, 1024))
                model, optimizer = fabric.setup(net, torch.optim.AdamW(net.parameters(), fused=True))
                for x in loader:
                    fabric.backward(model(x).sum())
                    optimizer.step()
            """,
            fixed="""
            import torch
            import lightning as L

            def main():
                torch.set_float32_matmul_precision("high")
                fabric = L.Fabric(accelerator="cuda", devices=1, precision="bf16-mixed")
                net = torch.compile(torch.nn.Linear(1024, 1024))
                model, optimizer = fabric.setup(net, torch.optim.AdamW(net.parameters(), fused=True))
                for x in loader:
                    fabric.backward(model(x).sum())
                    optimizer.step()
            """,
            count=2,
        ),
        Invalid(  # Fabric defaults to "32-true" as well
            """
            import torch
            import lightning as L

            def main():
                torch.set_float32_matmul_precision("high")
                fabric = L.Fabric(accelerator="cuda", devices=1)
            """,
            fixed="""
            import torch
            import lightning as L

            def main():
                torch.set_float32_matmul_precision("high")
                fabric = L.Fabric(accelerator="cuda", devices=1, precision="bf16-mixed")
            """,
        ),
        Invalid(  # Fabric's model, never compiled: the advice in Fabric's terms
            """
            import torch
            import lightning as L

            def main():
                torch.set_float32_matmul_precision("high")
                fabric = L.Fabric(accelerator="cuda", devices=2, precision="bf16-mixed")
                model = Transformer(vocab_size=32000)
                optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
                model, optimizer = fabric.setup(model, optimizer)
            """,
        ),
        Invalid(  # Lightning 1.x: `from_argparse_args` with the GPU chosen by `set_defaults`
            """
            import argparse
            import torch
            from pytorch_lightning import Trainer

            def main():
                torch.set_float32_matmul_precision("high")
                parser = argparse.ArgumentParser()
                parser = Trainer.add_argparse_args(parser)
                parser.set_defaults(gpus=1, max_epochs=10)
                args = parser.parse_args()
                trainer = Trainer.from_argparse_args(args)
            """,
        ),
        Invalid(  # Lightning 1.x: the machine's GPUs, with the distributed backend in `accelerator` (HTS-AT)
            """
            import torch
            import pytorch_lightning as pl

            def main(model, data):
                torch.set_float32_matmul_precision("high")
                device_num = torch.cuda.device_count()
                trainer = pl.Trainer(gpus=device_num, accelerator="ddp" if device_num > 1 else None, max_epochs=100)
                trainer.fit(model, data)
            """,
            fixed="""
            import torch
            import pytorch_lightning as pl

            def main(model, data):
                torch.set_float32_matmul_precision("high")
                device_num = torch.cuda.device_count()
                trainer = pl.Trainer(
                    gpus=device_num,
                    accelerator="ddp" if device_num > 1 else None,
                    max_epochs=100,
                    precision="bf16",
                )
                trainer.fit(model, data)
            """,
            count=2,  # and the compile note
        ),
        Invalid(  # Lightning 1.x runs 16-bit AMP only on CUDA: `precision=16` makes this GPU code
            """
            import argparse
            import torch.nn as nn
            import pytorch_lightning as pl

            class Encoder(pl.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.stem = nn.Conv2d(3, 64, 7, stride=2)

            def main(args):
                trainer = pl.Trainer.from_argparse_args(args, precision=16, max_epochs=32)
            """,
            count=2,  # bf16 instead of fp16, and the conv net's autotuner
        ),
        Invalid(  # reproducibility asked for on every run of a conv net: reported, no fix
            """
            import torch.nn as nn
            import lightning as L

            class SmallResNet(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 32, 3, padding=1)

            trainer = L.Trainer(precision="bf16-mixed", deterministic=True)
            """,
        ),
        Invalid(  # an all-reduce per logged value and step
            """
            import lightning as L

            class Model(L.LightningModule):
                def training_step(self, batch, batch_idx):
                    loss = self.model(batch).mean()
                    self.log("train_loss", loss, sync_dist=True)
                    return loss

                def validation_step(self, batch, batch_idx):
                    self.log("val_loss", self.model(batch).mean(), sync_dist=True)
            """,
        ),
        Invalid(  # the same in a helper the training step calls: one finding for the helper's three values
            """
            import lightning as L

            class Segmenter(L.LightningModule):
                def shared_step(self, batch, phase):
                    logits = self(batch["image"])
                    loss = self.loss_fn(logits, batch["mask"])
                    self.log(f"{phase}/loss", loss, on_step=True, sync_dist=True)
                    self.log(f"{phase}/iou", self.iou(logits, batch["mask"]), on_step=True, sync_dist=True)
                    self.log(f"{phase}/f1", self.f1(logits, batch["mask"]), on_step=True, sync_dist=True)
                    return loss

                def training_step(self, batch, batch_idx):
                    return self.shared_step(batch, "train")

                def validation_step(self, batch, batch_idx):
                    return self.shared_step(batch, "val")
            """,
        ),
        Invalid(  # a dict of values logged at once is reduced all the same
            """
            import lightning as L

            class AutoEncoder(L.LightningModule):
                def training_step(self, batch, batch_idx):
                    loss, parts = self.model.loss(batch)
                    self.log_dict({"train/loss": loss, **parts}, sync_dist=True)
                    return loss
            """,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._tf32_reported = False
        self._on_gpu = False  # a Lightning Trainer of this file trains on the GPU

    def impact_here(self, finding: Finding) -> Estimate | None:
        if "TF32" in finding.message:
            return tf32_gain(self.ctx)
        if "torch.compile" in finding.message:
            gain = compile_gain(self.ctx)
            if gain is not None:
                return gain
        if "fp32" in finding.message:
            small = small_model(self.ctx, Impact.MEDIUM)
            if small is not None:
                return small
        return by_message(finding, (
            ("fp16 mixed precision", Impact.MEDIUM, "fp16 already runs on the tensor cores; bf16 saves the loss scaling"),
            ("cuDNN's default algorithms", Impact.MEDIUM, "cuDNN autotuning"),
            ("cuDNN's deterministic algorithms", Impact.MEDIUM, "cuDNN autotuning instead of deterministic kernels"),
            ("sync_dist=True", Impact.MEDIUM, "one small all-reduce per logged value and step"),
            ("accumulate_grad_batches", Impact.LOW, "a larger batch, if it fits"),
        ))

    def finish(self) -> None:
        for site in self.ctx.calls_to(*LIGHTNING_TRAINER):
            self._check_trainer(site)
        for trainer in configured_trainers(self.ctx):
            self._check_configured(trainer)
        for site in self.ctx.calls_to(*LIGHTNING_FABRIC):
            # a Fabric script holds its training loop: TF32 where that loop multiplies matrices (SF201 leaves it here)
            if lightning_on_gpu(self.ctx, site) and self._check_precision(site, "Fabric") \
                    and (not self.ctx.step_loops or loop_gains_from_tf32(self.ctx)):
                self._check_tf32(site.statement or site.node)
        self._check_sync_dist()
        if self._on_gpu:
            self._check_compile()
        self._check_fabric_compile()

    def _check_trainer(self, site: CallSite) -> None:
        if evaluation_only_trainer(self.ctx, site):
            return  # it never trains
        if lightning_on_gpu(self.ctx, site):
            self._on_gpu = True
            if self._check_precision(site):
                self._check_tf32(site.statement or site.node)
            self._check_benchmark(site)
        self._check_profiler(site)
        self._check_accumulation(site)

    # ------------------------------------------------------------------ Trainers built from configuration
    def _check_configured(self, trainer: ConfiguredTrainer) -> None:
        if not trainer.on_gpu():
            return
        self._on_gpu = True
        self._check_configured_benchmark(trainer)
        precision = trainer.get("precision")
        if precision is not None and precision.value is UNKNOWN:
            return
        value = "32" if precision is None else str(precision.value)
        fp16 = value in _FP16
        if value not in FP32_PRECISIONS and not fp16:
            return
        bf16 = '"bf16"' if trainer.lightning_1x else f'"{self._bf16()}"'
        if fp16:
            message = (f"{_capital(trainer.label)} runs fp16 mixed precision, which scales the loss and checks every "
                       f"gradient for inf each step; bf16 (`precision={bf16}`) needs neither on Ampere and newer GPUs")
        else:
            default = "32" if trainer.lightning_1x else '"32-true"'
            written = f"`precision` defaults to {default}" if precision is None else f"`precision={_shown(value)}`"
            message = f"{_capital(trainer.label)} trains in fp32 ({written}): bf16 mixed precision runs on the tensor cores"
        severity = Severity.INFO if fp16 else Severity.WARNING
        self._report_setting(trainer, precision, "precision", bf16, message, severity)
        if not fp16:
            self._check_tf32(trainer.site.statement or trainer.site.node)

    def _check_configured_benchmark(self, trainer: ConfiguredTrainer) -> None:
        deterministic = trainer.get("deterministic")
        if deterministic is not None and deterministic.value not in (True, False):
            return  # unknown, or a mode such as "warn"
        if not self._conv_net_untuned(trainer.get("benchmark") is not None, trainer.configs):
            return
        if deterministic is not None and deterministic.value is True:
            self._report_setting(trainer, deterministic, "deterministic", "false",
                                 f"{_capital(trainer.label)} sets `deterministic`: {_DETERMINISTIC}", Severity.INFO,
                                 _REPRODUCIBLE)
            return
        self._report_setting(trainer, None, "benchmark", "true", f"{_capital(trainer.label)} trains a conv net with "
                             "cuDNN's default algorithms: `benchmark` is not set", Severity.INFO)

    def _report_setting(self, trainer: ConfiguredTrainer, setting: TrainerValue | None, key: str, value: str,
                        message: str, severity: Severity, reason: str | None = None) -> None:
        """Report a configured Trainer's setting where it is (or would be) written; ``reason``:
        why there is no fix, when it is not only that the value is written elsewhere."""
        where = setting.where if setting is not None else trainer.commented.get(key) or trainer.add_at
        if setting is not None and setting.node is not None:
            written = isinstance(setting.node, cst.Arg) and setting.node.keyword is not None \
                and isinstance(setting.node.value, (cst.Integer, cst.SimpleString, cst.Name))
            self.report(setting.node, message, severity=severity, no_fix_reason=reason or (
                f"write `{key}={value}`{_before_bf16(trainer, key)} there" if written else SET_ELSEWHERE))
        elif where is not None:
            self.report_at(where, message, severity=severity, no_fix_reason=reason or f"set `{key}: "
                           f"{value.strip(chr(34))}` there{_before_bf16(trainer, key)} (speedfix rewrites Python only)")
        else:
            how = (f'add `"{key}": {value}` to `trainer_defaults`, or pass `--trainer.{key}`' if trainer.kind == "cli"
                   else f"pass `--{key} {value.strip(chr(34))}`{_before_bf16(trainer, key)} where the script is launched")
            self.report(trainer.add_node or trainer.site.node, message, severity=severity, no_fix_reason=how)

    def _check_compile(self) -> None:
        """A LightningModule trained on the GPU that nothing compiles."""
        ctx = self.ctx
        if ctx.torch_version < _COMPILE_FROM:
            return
        for site in ctx.calls_to(*INSTANTIATE):  # the module's own switch, set in its hydra config
            resolved = config_of(ctx, site.node.args[0].value) if site.node.args else None
            node = resolved[0].composed.tree.get(*resolved[1]) if resolved and resolved[0].composed else None
            flag = node.get("compile") if node is not None else None
            if flag is not None and flag.value is False:
                self.report_at(flag.at, "`compile: false`: the LightningModule trains without `torch.compile`, "
                               "which fuses its kernels", severity=Severity.INFO, no_fix_reason=_COMPILE_REASON)
                return
        if ctx.calls_to("torch.compile", *_SHARDING) or any(True for _ in ctx.method_calls("compile")):
            return  # compiled already, or sharded by hand (compile goes block by block there)
        if differentiates_twice(ctx) is not None:
            return  # a gradient of a gradient (an R1 penalty): compiled graphs cannot run double backward
        fits = trainer_fits(ctx)
        cli = next((trainer for trainer in configured_trainers(ctx) if trainer.kind == "cli"), None)
        target: cst.CSTNode | None = fits[0].node if fits else None
        if target is None and cli is not None:  # the module class LightningCLI gets
            positional = [arg for arg in cli.site.node.args if arg.keyword is None and not arg.star]
            target = positional[0].value if positional else cli.site.node
        if target is not None:
            self.report(target, "the LightningModule trains without `torch.compile`: compile it before `trainer.fit` "
                        "(`model = torch.compile(model)`) or in its `configure_model`", severity=Severity.INFO,
                        no_fix_reason=_COMPILE_REASON)

    def _check_fabric_compile(self) -> None:
        """A model `fabric.setup` wraps (on the GPU) that nothing compiles."""
        ctx = self.ctx
        if ctx.torch_version < _COMPILE_FROM or ctx.calls_to("torch.compile", *_SHARDING) \
                or any(True for _ in ctx.method_calls("compile")):
            return
        if not any(lightning_on_gpu(ctx, site) for site in ctx.calls_to(*LIGHTNING_FABRIC)):
            return
        for setup in fabric_setups(ctx)[:1]:
            model = code_of(setup.node.args[0].value)
            self.report(setup.node, f"the model `fabric.setup` wraps is not compiled: `fabric.setup(torch.compile({model}))` "
                        "fuses its kernels (Fabric compiles it again over its strategy's wrapper)",
                        severity=Severity.INFO, no_fix_reason=_COMPILE_REASON)

    # ------------------------------------------------------------------ precision
    def _check_precision(self, site: CallSite, what: str = "Trainer") -> bool:
        """Report fp32 or fp16 training; True when the Trainer (or Fabric) certainly trains in fp32."""
        value, precision = lightning_precision(self.ctx, site)  # None: unknown, or FSDP's own policy
        if value is None:
            return False
        if value in FP32_PRECISIONS:
            if lightning_module_in_sixteen_bit(self.ctx):
                return False  # the module's weights are 16-bit already: no fp32 matmuls for bf16 or TF32 to speed up
            default = '"32"' if self._lightning_1x(site) else '"32-true"'
            written = f"`precision` defaults to {default}" if precision.missing else f"`precision={_shown(value)}`" \
                if not isinstance(precision.node, cst.IfExp) \
                else f"`precision` is {_shown(value)} with the defaults of the project's options and run configs"
            if lightning_before_bf16(self.ctx.project):  # nuwave's pytorch_lightning==1.1.6: `precision=16` or an upgrade
                self.report(precision.arg or site.node,
                            f"`{what}` trains in fp32 ({written}): mixed precision runs on the tensor cores",
                            no_fix_reason="the project pins a Lightning older than 1.5, which has no bf16: `precision=16` "
                                          "(fp16 with loss scaling) is its mixed precision, or upgrade Lightning for "
                                          '`precision="bf16"`')
                return True
            self.report(
                precision.arg or site.node,
                f"`{what}` trains in fp32 ({written}): bf16 mixed precision runs on the tensor cores",
                fix_ops=self._set_precision(site, precision),
                no_fix_reason=SET_ELSEWHERE,
            )
            return True
        if value in _FP16:
            self.report(
                precision.arg or site.node,
                "fp16 mixed precision scales the loss and checks every gradient for inf each step; "
                f"bf16 (`precision=\"{self._bf16(site)}\"`) needs neither on Ampere and newer GPUs",
                severity=Severity.INFO,
                fix_ops=self._set_precision(site, precision),
                no_fix_reason=SET_ELSEWHERE,
            )
        return False

    def _bf16(self, site: CallSite | None = None) -> str:
        """Lightning's name for bf16 mixed precision in the Lightning the project pins (or that
        the Trainer's settings show)."""
        return "bf16" if lightning_before_2(self.ctx.project) or self._lightning_1x(site) else "bf16-mixed"

    def _lightning_1x(self, site: CallSite | None) -> bool:
        """A Trainer given `gpus`, a setting Lightning 2.0 removed."""
        return site is not None and not find_argument(self.ctx, site, "gpus").missing

    def _set_precision(self, site: CallSite, precision: ArgValue) -> list[FixOp] | None:
        original = precision.arg
        if original is not None and isinstance(original.value, cst.SimpleString):
            value: cst.BaseExpression = same_quotes(original.value, self._bf16(site))
        else:
            value = cst.parse_expression(string_literal(self.ctx, self._bf16(site)))
        if precision.missing:
            return [self._append(site, keyword_arg("precision", value))]
        if original is None or not isinstance(original.value, (cst.Integer, cst.SimpleString)):
            return None
        return [value_replaced(site.node, original, value)]

    def _check_tf32(self, statement: cst.CSTNode) -> None:
        """Once per file: fp32 training and nothing chooses TF32 (reported on the statement: the
        precision finding sits on the call itself)."""
        ctx = self.ctx
        if matmul_precision_chosen(ctx) or self._tf32_reported or ctx.torch_version < _TF32_OFF_FROM:
            return  # chosen, said, or a torch before 1.12, whose matmuls run in TF32 by default
        self._tf32_reported = True
        high = string_literal(ctx, "high")
        ops, reason = setting_at_entry_point(ctx, "torch.set_float32_matmul_precision", lambda call: f"{call}({high})")
        self.report(
            statement,
            "fp32 matmuls run without TF32 tensor cores: nothing calls `torch.set_float32_matmul_precision`",
            fix_ops=ops,
            no_fix_reason=reason,
            fix_title='Enable TF32 matmuls: `torch.set_float32_matmul_precision("high")` at the entry point',
        )

    # ------------------------------------------------------------------ other settings
    def _conv_net_untuned(self, benchmark_set: bool, configs: list[Node] = ()) -> bool:
        """A conv net, cuDNN left to its heuristics: no `benchmark`, no cuDNN setting of the
        script. The net is a class of this file, one the run's YAML ``configs`` name, or the
        project class the file's `trainer.fit(...)` trains (its module, or what that imports)."""
        if benchmark_set or cudnn_settings(self.ctx):
            return False
        return bool(conv2d_classes(self.ctx)) or builds_conv2d(self.ctx, list(configs)) \
            or classes_build_conv2d(self.ctx, fitted_classes(self.ctx))

    def _check_benchmark(self, site: CallSite) -> None:
        ctx = self.ctx
        deterministic = find_argument(ctx, site, "deterministic")
        chosen = None if deterministic.missing else literal_bool(ctx, deterministic.node, site.stack)
        if (not deterministic.missing and chosen is None) \
                or not self._conv_net_untuned(not find_argument(ctx, site, "benchmark").missing):
            return
        if chosen:  # reproducibility asked for on every run
            self.report(deterministic.arg or site.node, f"`Trainer(deterministic=True)`: {_DETERMINISTIC}",
                        severity=Severity.INFO, no_fix_reason=_REPRODUCIBLE)
            return
        self.report(
            site.node,
            "`Trainer` trains a conv net with cuDNN's default algorithms: `benchmark=True` is not set",
            severity=Severity.INFO,
            fix_ops=[self._append(site, keyword_arg("benchmark", cst.Name("True")))],
            fix_title="Let cuDNN pick the fastest convolutions (`benchmark=True`)",
        )

    def _check_profiler(self, site: CallSite) -> None:
        profiler = find_argument(self.ctx, site, "profiler")
        if profiler.missing or profiler.unknown or _is_none(profiler.node):
            return
        kind = string_value(self.ctx, profiler.node, site.stack)
        if kind is None and not isinstance(profiler.node, cst.Call):
            return  # a variable: it may be None
        heavy = kind is None or kind in _HEAVY_PROFILERS
        original = profiler.arg
        self.report(
            original or site.node,
            f"`Trainer(profiler={kind!r})` profiles every training hook" if kind else
            "`Trainer(profiler=...)` profiles every training step",
            severity=Severity.WARNING if heavy else Severity.INFO,
            fix_ops=[arg_removed(site.node, original)]
            if original is not None else None,
            no_fix_reason=SET_ELSEWHERE,
            fix_title="Turn the profiler off",
        )

    def _check_accumulation(self, site: CallSite) -> None:
        accumulate = find_argument(self.ctx, site, "accumulate_grad_batches")
        steps = literal_int(self.ctx, accumulate.node, site.stack)
        if steps is None or steps <= 1:
            return
        self.report(
            accumulate.arg or site.node,
            f"`accumulate_grad_batches={steps}` enlarges the effective batch but does not make training faster: "
            "raise the batch size instead while it fits in memory",
            severity=Severity.INFO,
            no_fix_reason="the largest batch that fits depends on the GPU's memory",
        )

    def _check_sync_dist(self) -> None:
        """Once per function of the step (the `training_step`, or a `shared_step` it calls): the
        first `self.log(..., sync_dist=True)` (or `self.log_dict`), naming how many more the same
        step makes."""
        ctx = self.ctx
        found: dict[cst.CSTNode | None, list[tuple[CallSite, ArgValue]]] = {}
        logged = {id(site) for name in ("log", "log_dict") for site in ctx.method_calls(name)}
        for site in [site for site in ctx.calls if id(site) in logged]:  # in the order they are written
            func = site.node.func
            assert isinstance(func, cst.Attribute)
            if not (isinstance(func.value, cst.Name) and func.value.value == "self") or not ctx.is_hot(site.stack):
                continue
            sync = find_argument(ctx, site, "sync_dist")
            on_step = find_argument(ctx, site, "on_step")
            if literal_bool(ctx, sync.node, site.stack) is not True \
                    or not on_step.missing and literal_bool(ctx, on_step.node, site.stack) is not True:
                continue  # (an `on_step=` the scan cannot read: hyena-dna's flag that its configs leave off)
            if not in_lightning_method(ctx, site):
                continue
            found.setdefault(ctx.function_of(site.stack), []).append((site, sync))
        for logs in found.values():
            site, sync = logs[0]
            more = f" (and {len(logs) - 1} more `self.log` call{'s' if len(logs) > 2 else ''} of this step)" \
                if len(logs) > 1 else ""
            method = site.node.func.attr.value  # type: ignore[attr-defined]
            self.report(
                sync.arg or site.node,
                f"`self.{method}(..., sync_dist=True)` in the training step all-reduces the "
                f"value{'s' if method == 'log_dict' else ''} across GPUs every step{more}",
                severity=Severity.INFO,
                no_fix_reason="log it with `on_step=False, on_epoch=True`, "
                "or without `sync_dist` if rank 0's value will do",
            )

    def _append(self, site: CallSite, arg: cst.Arg) -> Transform:
        return Transform(site.node, lambda call: append_args(call, arg, indent=self.ctx.module.default_indent))


_DETERMINISTIC = ("the conv net runs cuDNN's deterministic algorithms, never the fastest ones it would measure; "
                  "unless runs must be bit-reproducible, leave it off and set `benchmark=True`")
_REPRODUCIBLE = "bit-exact reruns are the user's choice to give up (seeding alone keeps runs comparable)"


def _before_bf16(trainer: ConfiguredTrainer, key: str) -> str:
    """Lightning 1.x took "bf16" from 1.5 on; before, 16 was its mixed precision."""
    if not trainer.lightning_1x or key != "precision":
        return ""
    now = trainer.get("precision")
    return " (Lightning 1.5 and newer)" if now is not None and str(now.value) in _FP16 else " (`16` before Lightning 1.5)"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _shown(value: str) -> str:
    """The precision as a script writes it: `32`, `"32-true"`."""
    return value if value.isdigit() else f'"{value}"'


def _is_none(node: cst.BaseExpression | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


