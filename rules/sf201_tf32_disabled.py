from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Applicability, LossCheck, Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import string_literal
from speedfix.fixes.entry import setting_at_entry_point
from speedfix.model.flow import default_choice, off_by_default
from speedfix.model.frameworks import fabric_in_fp32
from speedfix.model.patterns import matmul_precision_choices, tf32_switched_off
from speedfix.model.tf32 import loop_gains_from_tf32, training_steps
from speedfix.model.versions import v
from speedfix.rules._impact import Estimate, Finding, tf32_gain
from speedfix.rules._examples import DQN_BETWEEN_ENV_STEPS, NARROW_MLP, TOY_MLP
from speedfix.syntax.nodes import code_of


class Tf32Disabled(Rule):
    """
    ## What it does
    Finds CUDA training in fp32 that never enables TensorFloat-32 for matrix multiplications:
    in the file's training loop, or, in a file without one, in a method that takes a whole step
    (a backward pass of a loss it computes, and an optimizer step) for another file's loop.
    A script that uses autocast or mentions a 16-bit dtype anywhere (`model.half()`, an FSDP
    `MixedPrecisionPolicy(param_dtype=torch.bfloat16)`, Lightning's `"bf16-mixed"`) is treated as
    already choosing its precision, as is a DeepSpeed engine whose config enables fp16 or bf16 or
    cannot be read (a JSON file the script opens at run time: the config decides), and an object
    that is no `Accelerator` of the file but prepares the model and runs the backward pass (a
    project's accelerator built from a hydra config). A script that every launch command runs
    from a SLURM job script asking for GPUs older than Ampere (`#SBATCH --gres=gpu:v100:4`) is left alone: those
    GPUs have no TF32. So is a file whose trained models are all MLPs no wider than 256 in the
    widths the code states (their matmuls are too small for tensor cores to matter), and one
    whose `Accelerator` states no `mixed_precision=` the scan can read (`**accelerate_kwargs`, or
    none): `accelerate launch --mixed_precision` or the machine's Accelerate config picks it, and
    in bf16 or fp16 no fp32 matmul is left to speed up. An RL update run between an environment's
    steps is left alone too (see SF202): the run waits on the simulator.

    Also finds TF32 switched off for matmuls on the default path
    (`torch.backends.cuda.matmul.allow_tf32 = False`, as NVlabs' EDM and StyleGAN do for
    numerical accuracy) with no other choice that runs: reported on that line, without a fix.

    ## Why is this bad?
    On Ampere and newer GPUs (A100, RTX 30xx, H100) fp32 matmuls can run on tensor cores in TF32,
    several times faster, but PyTorch keeps them in full fp32 unless asked
    (`torch.get_float32_matmul_precision()` is `"highest"` by default). cuDNN convolutions already
    use TF32 by default; matmuls and linear layers do not.

    A script that already chose a precision (`set_float32_matmul_precision(...)`, any
    `allow_tf32`/`fp32_precision` setting, `"highest"` included) or trains under autocast is left
    alone. One that chooses it only behind an option that is off by default
    (`if args.tf32:` with a `store_true` flag) runs in full fp32 by default and is reported. A
    library module whose training steps a scanned script runs, and that script chooses the
    precision (`torch.backends.cuda.matmul.allow_tf32 = args.tf32` in the `main.py` that builds
    the trainer class: its command line decides, and its own scan says when nothing turns TF32
    on), is left alone too. A
    loop of a Lightning `Fabric` that trains in fp32 is left to SF901, which gives the precision
    and TF32 advice of the framework together, on the `Fabric(...)` call; so are the steps of a
    LightningModule, also a loop of its own inside `training_step` (a GAN's two discriminator
    steps under manual optimization): its `Trainer` runs them.

    ## Example
    ```python
    def main():
        model = Net().cuda()
        for x, y in loader:
            ...
    ```

    ## Use instead
    ```python
    def main():
        torch.set_float32_matmul_precision("high")
        model = Net().cuda()
    ```

    ## Fix safety
    Unsafe: TF32 keeps fp32's range but only 10 mantissa bits, so results change (PyTorch's CUDA
    notes: relative error 0.0022 with TF32 against 0.000039 in fp32 for a 10240x10240 matmul).
    Usually harmless for deep learning; not for numerically sensitive code (solvers, physics).
    `set_float32_matmul_precision` is used rather than `allow_tf32`, which PyTorch plans to
    deprecate after 2.9. It has no effect before Ampere.

    The setting is process-wide, so it goes where the script starts: the top of `main()`, else of
    the `if __name__ == "__main__":` block, else (a script that trains at module level) after the
    imports. It runs before the script's own opt-in settings, which still win when their option
    is given. A module with no entry point only defines things for others to import and gets no
    fix: the setting belongs in the program that runs it. Processes started with
    `mp.spawn(worker)` do not run `main()`: set it in the worker too.

    ## Impact
    High: fp32 matmuls without TF32 run at a fraction of an Ampere GPU's tensor-core throughput,
    for a model known to multiply matrices (a transformer of the Hub or a zoo, attention,
    recurrent or linear layers in the scanned files). Medium for a small model (under 10M
    parameters, counted from the layers it builds, or given by width options of 256 or
    less), and for a model whose layers the scan does not see (a factory of another package):
    TF32 does not speed up its convolutions. Low for a conv net whose matmuls are at most a
    classifier head (a zoo CNN, or classes with convolutions and no attention or recurrent
    layer): cuDNN already runs its convolutions in TF32.

    A model whose layers are out of sight is judged by what the file says of it: the name that
    builds it (`network.modeling.__dict__[opts.model]` with `--model deeplabv3plus_mobilenet`, a
    `GeneratorResNet` or `UNet` class of another module: low; `ViT`, `Bert...`, an LSTM: high),
    a checkpoint loaded with `from_pretrained` in a file that imports `transformers`, and a step
    that feeds `input_ids` (a sequence model over token ids): high. A transformer whose stated
    width is small (`ViT(dim=128)`, at most 256) stays medium. Failing all of these, the default
    of an option that names the architecture decides (`--arch resnet18`, `--classifier resnet18`:
    low). Names that disagree, or none, keep medium. The TF32 advice of SF901 (Lightning) and
    SF902 (Hugging Face `TrainingArguments`) is weighed the same way.

    ## Measured effect
    A 10240x10240 fp32 matmul on an A100: 0.11 s in fp32, 0.016 s with TF32 (about 7x), from
    PyTorch's CUDA semantics notes; Hugging Face reports "up to 3x" training throughput.
    Sources: https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices,
    https://huggingface.co/docs/transformers/perf_train_gpu_one
    """

    impact = "high"
    code = "SF201"
    name = "tf32-disabled"
    summary = "CUDA fp32 training that never enables TF32 matmuls"
    severity = Severity.WARNING
    requires = (b"backward", b"step(")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = 'Enable TF32 matmuls: `torch.set_float32_matmul_precision("high")` at the entry point'
    gpu_only = True
    min_torch = v("1.12")
    effect = "fp32 matmuls on tensor cores: about 7x for a large A100 matmul."

    VALID = [
        Valid(  # a library's engine wrapper: the loss is the caller's, and so is the training
            """
            import torch

            class EngineWrapper:
                def __init__(self, engine):
                    self.engine = engine.cuda()

                def backward(self, loss):
                    self.engine.backward(loss)
                    self.engine.step()
            """
        ),
        Valid(  # a project's accelerator built from its hydra config prepares the model and runs the backward
                # pass: the config (PickScore's `accelerator.mixed_precision: BF16`) decides the precision
            """
            import torch
            import hydra
            from hydra.utils import instantiate
            from transformers import CLIPModel

            @hydra.main(config_path="conf", config_name="config")
            def main(cfg):
                accelerator = instantiate(cfg.accelerator)
                model = CLIPModel.from_pretrained(cfg.model.name)
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
                model, optimizer, loader = accelerator.prepare(model, optimizer, instantiate(cfg.loader))
                for batch in loader:
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()

            if __name__ == "__main__":
                main()
            """
        ),
        Valid(NARROW_MLP),  # an RL agent's 256-wide MLPs (TD3): matmuls too small for tensor cores to matter
        Valid(TOY_MLP),  # a 2-4-1 MLP whose widths are its constructor's arguments
        Valid(DQN_BETWEEN_ENV_STEPS),  # a DQN learning between the emulator's steps: the run waits on the environment
        Valid(  # a Fabric loop in fp32: SF901 gives its TF32 advice beside the precision advice
            """
            import torch
            import lightning as L

            def main():
                fabric = L.Fabric(accelerator="cuda", devices=1)
                model = fabric.setup_module(torch.nn.Linear(1024, 1024))
                optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), fused=True))
                for x in fabric.setup_dataloaders(loader):
                    fabric.backward(model(x).sum())
                    optimizer.step()
                    optimizer.zero_grad()
            """
        ),
        Valid(  # a DeepSpeed engine: the JSON config it is given chooses the precision, and the scan
                # cannot read it (read at run time from a file the script names)
            """
            import argparse
            import json
            import deepspeed
            parser = argparse.ArgumentParser()
            parser.add_argument("--ds_file", default="configs/zero2.json")
            args = parser.parse_args()
            with open(args.ds_file) as fh:
                ds_config = json.load(fh)
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
            for batch in loader:
                loss = engine(**{k: v.cuda() for k, v in batch.items()}).loss
                engine.backward(loss)
                engine.step()
            """
        ),
        Valid(  # conv-only networks (DCGAN, super-resolution): cuDNN convolutions use TF32 already
            """
            import torch
            import torch.nn as nn

            class Generator(nn.Module):
                def __init__(self):
                    super(Generator, self).__init__()
                    self.main = nn.Sequential(
                        nn.ConvTranspose2d(100, 64, 4, 1, 0, bias=False), nn.BatchNorm2d(64), nn.ReLU(True),
                        nn.ConvTranspose2d(64, 3, 4, 2, 1, bias=False), nn.Tanh(),
                    )

                def forward(self, z):
                    return self.main(z)

            netG = Generator().cuda()
            criterion = nn.MSELoss()
            optimizer = torch.optim.Adam(netG.parameters())
            for x, _ in loader:
                loss = criterion(netG(noise), x.cuda())
                loss.backward()
                optimizer.step()
            """
        ),
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
        Valid(  # TF32 behind an option that is on by default (`--no-tf32` turns it off)
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--no-tf32", dest="tf32", action="store_false")
            args = parser.parse_args()
            if args.tf32:
                torch.set_float32_matmul_precision("high")
            model = Net().cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
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
        Invalid(  # a trainer's step method, called once per batch by the loop of another file (Graph-WaveNet)
            """
            import torch
            import torch.nn as nn

            class Trainer:
                def __init__(self):
                    self.model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).cuda()
                    self.optimizer = torch.optim.Adam(self.model.parameters())

                def train(self, x, y):
                    self.optimizer.zero_grad()
                    loss = nn.functional.mse_loss(self.model(x), y)
                    loss.backward()
                    self.optimizer.step()
                    return loss.detach()
            """,
        ),
        Invalid(  # TF32 switched off on purpose (NVlabs' EDM): reported on that line, no fix
            """
            import torch

            def main(loader):
                torch.backends.cuda.matmul.allow_tf32 = False
                model = torch.nn.Transformer(d_model=512).cuda()
                optimizer = torch.optim.Adam(model.parameters(), fused=True)
                for src, tgt in loader:
                    model(src.cuda(), tgt.cuda()).mean().backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # a conv net with a Linear head multiplies matrices; an fp32 autocast and a bf16 copy
            # written on the host (llm.c's checkpoint export) are no mixed precision
            """
            import torch
            import torch.nn as nn

            class QNetwork(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(4, 32, 8, stride=4)
                    self.fc = nn.Linear(3136, 512)

            def export(t):
                return t.detach().cpu().to(torch.bfloat16)

            q_network = QNetwork().cuda()
            ctx = torch.autocast("cuda", dtype=torch.float32)
            for x, y in loader:
                with ctx:
                    loss = q_network(x.cuda()).sum()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            import torch.nn as nn

            torch.set_float32_matmul_precision("high")

            class QNetwork(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(4, 32, 8, stride=4)
                    self.fc = nn.Linear(3136, 512)

            def export(t):
                return t.detach().cpu().to(torch.bfloat16)

            q_network = QNetwork().cuda()
            ctx = torch.autocast("cuda", dtype=torch.float32)
            for x, y in loader:
                with ctx:
                    loss = q_network(x.cuda()).sum()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # workers started with mp.spawn never run main()'s settings: the worker gets it
            """
            import torch
            import torch.multiprocessing as mp

            def main_worker(gpu, args):
                model = Net().cuda(gpu)
                for x, y in loader:
                    loss = model(x.cuda(gpu)).sum()
                    loss.backward()
                    optimizer.step()

            def main():
                args = parse()
                mp.spawn(main_worker, nprocs=2, args=(args,))
            """,
            fixed="""
            import torch
            import torch.multiprocessing as mp

            def main_worker(gpu, args):
                torch.set_float32_matmul_precision("high")
                model = Net().cuda(gpu)
                for x, y in loader:
                    loss = model(x.cuda(gpu)).sum()
                    loss.backward()
                    optimizer.step()

            def main():
                args = parse()
                mp.spawn(main_worker, nprocs=2, args=(args,))
            """,
        ),
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
        Invalid(  # a script that trains at module level: after the imports, in the file's own
            # alias and quote style (the import that binds the alias ends the block)
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

            train(nn.Linear(8, 1).cuda(), loader, opt)
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

            train(nn.Linear(8, 1).cuda(), loader, opt)
            """,
        ),
        Invalid(  # TF32 only behind a flag that is off by default: the default run is full fp32;
            # the setting goes to the top of main(), before the flag's own choice
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--tf32", action="store_true")

            def main():
                '''Train.'''
                args = parser.parse_args()
                if args.tf32:
                    torch.backends.cuda.matmul.allow_tf32 = True
                model = Net().cuda()
                for x, y in loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    opt.step()

            if __name__ == "__main__":
                main()
            """,
            fixed="""
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--tf32", action="store_true")

            def main():
                '''Train.'''
                torch.set_float32_matmul_precision("high")
                args = parser.parse_args()
                if args.tf32:
                    torch.backends.cuda.matmul.allow_tf32 = True
                model = Net().cuda()
                for x, y in loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    opt.step()

            if __name__ == "__main__":
                main()
            """,
        ),
        Invalid(  # a library module (it only defines things): no setting at import time
            """
            import torch

            def fit(model, loader, opt):
                for x, y in loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    opt.step()
            """,
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        return tf32_gain(self.ctx)

    def finish(self) -> None:
        ctx = self.ctx
        if not loop_gains_from_tf32(ctx) or fabric_in_fp32(ctx):
            return  # (conv-only training: cuDNN convolutions use TF32 already; a Fabric's TF32 is SF901's)
        off = tf32_switched_off(ctx)
        if off is not None and off.statement is not None:
            self.report(off.statement, f"TF32 is switched off (`{code_of(off.statement.body[0])}`): fp32 matmuls in "
                        "this training loop run without tensor cores",
                        no_fix_reason="a deliberate choice, often for numerical accuracy: set it to True (TF32 keeps "
                        "fp32's range with a 10-bit mantissa) unless the run needs full fp32 matmuls")
            return
        choices = matmul_precision_choices(ctx)
        chosen, gate = default_choice(ctx, choices)
        if chosen:
            return
        if ctx.links.tf32 is not None and not ctx.has_main_guard and not choices:
            return  # the script that imports this module and runs it chooses for the process
        node = training_steps(ctx)[0]  # the first step loop, in source order (or step method)
        high = string_literal(ctx, "high")
        opt_ins = [stack for statement, stack in choices if off_by_default(ctx, statement, stack)]
        ops, reason = setting_at_entry_point(
            ctx, "torch.set_float32_matmul_precision", lambda call: f"{call}({high})", opt_ins
        )
        where = "training step" if isinstance(node, cst.FunctionDef) else "training loop"
        message = f"fp32 matmuls in this {where} run without TF32 tensor cores"
        if gate is not None:
            message += f": the script sets the precision only when `{gate}`, which is off by default"
        self.report(node, message, fix_ops=ops, no_fix_reason=reason)
