from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from speedfix.engine.findings import Applicability, FixOp, InsertStatements, LossCheck, Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import reference, statement
from speedfix.model.arguments import find_argument, string_value
from speedfix.model.autograd import differentiates_twice
from speedfix.model.deepspeed_config import engine_owned
from speedfix.model.flow import default_choice, enclosing_statements, is_returned
from speedfix.model.forward import LOSS_NAME, is_local_object, plain_object
from speedfix.model.frames import Stack
from speedfix.model import launch
from speedfix.model.frameworks import (ACCELERATOR, accelerate_prepared, accelerate_runs_deepspeed, fabric_owned,
                                        in_lightning_callback, in_lightning_method)
from speedfix.model.index import CallSite
from speedfix.model.networks import (DATA_PARALLEL, fresh_assignments, frozen_before, in_optimizer_class, model_aliases,
                                     multiplies_sparse,
                                     optimized_modules, optimizer_factories, peel, run_first, step_method,
                                     trained_models, wrapper_of)
from speedfix.model.patterns import NO_GRAD
from speedfix.model.subjects import call_subjects, is_for_model
from speedfix.model.versions import v
from speedfix.rules._impact import Estimate, Finding, Impact, compile_gain
from speedfix.syntax.blocks import enclosing_block
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import is_main_guard, walk_expression


@dataclass(frozen=True)
class _Placement:
    """Where `model.compile()` goes: next to ``anchor`` (before it or after it), compiling ``target``."""

    anchor: cst.BaseStatement
    before: bool
    target: str


_QUANTIZATION = ("torch.ao.quantization", "torch.quantization")
_DETECTION = "torchvision.models.detection"


# A trained network's copy evaluated under no_grad (an RL target network, an EMA model): the same
# architecture as the trained one, not a frozen backbone that does most of the work.
_COPY_NAME = re.compile(r"target|^ema_|_ema$|^ema$", re.IGNORECASE)


class ModelNotCompiled(Rule):
    """
    ## What it does
    Finds a model that a CUDA script trains (its parameters go to a `torch.optim` optimizer, to
    another library's (`transformers.AdamW`, bitsandbytes' `AdamW8bit`, apex's `FusedAdam`), or to
    an optimizer class of the file or of another project file built on `torch.optim.Optimizer`:
    SAM, LARS, LAMB) but never passes to `torch.compile`, however it is built (a class of the file,
    `torchvision.models.resnet50()`, `models.__dict__[args.arch]()`, `timm.create_model(...)`,
    `AutoModel.from_pretrained(...)`) and wrapped (`nn.DataParallel`, `DistributedDataParallel`).
    A script that compiles only behind an option that is off by default (`if args.compile:` with
    a `store_true` flag, nanoGPT-style `compile = False`, a dataclass field `compile: bool = False`
    that `tyro.cli`, `pyrallis` or `HfArgumentParser` fills) does not compile its default run and
    is reported, without a fix; one whose option defaults to on is left alone. A script that
    differentiates a backward pass (`torch.autograd.grad(..., create_graph=True)` for a gradient
    penalty, as StyleGAN2's R1 and path-length regularisers do; or a scanned module it imports,
    as a potential's forces do) is left alone too: compiled
    graphs do not support double backward, so compiling would make it raise. So is a network
    that multiplies sparse matrices (a graph convolution's `torch.spmm(adj, support)`, in its own
    class or in a layer class of another scanned file): Dynamo cannot trace sparse tensors and
    runs those parts eagerly, so the compile buys only its own start-up time. A model handed to
    `deepspeed.initialize(model=...)` in a training script is the engine's: SF905 gives its
    compile advice once, as `engine.compile()`. One that `accelerator.prepare(...)` hands to
    DeepSpeed (a `deepspeed_plugin=`, or launch commands that all use DeepSpeed) is reported in
    Accelerate's terms, without a fix: with `dynamo_backend="inductor"` Accelerate has the engine
    compile it (`engine.compile()`, DeepSpeed 0.14.4 and newer) after ZeRO has wrapped it; a
    machine-wide `accelerate config` may already ask for that, and `accelerate launch
    --dynamo_backend inductor` in every launch command does.

    ## Why is this bad?
    Eager PyTorch launches one kernel per operation and writes every intermediate to GPU memory.
    `torch.compile` captures the forward and backward graphs and fuses them into fewer, larger
    kernels (Triton on GPUs), which cuts memory traffic and launch overhead.

    ## Example
    ```python
    model = GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ```

    ## Use instead
    ```python
    model = GPT(config).to(device)
    model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ```

    ## Fix safety
    Unsafe: the first step pays the compile time (seconds to minutes: about a minute for a
    12-layer transformer on a GPU, as nanoGPT notes), and the first call under `torch.no_grad()`
    or in eval mode (an evaluation pass, a FLOP profile in the loop) compiles a second graph, so a
    short benchmark window may hold a compile. A batch of a new shape (an epoch's smaller last
    batch, per-batch padding to the longest sequence) recompiles once with that dimension dynamic,
    not once per shape, so per-batch padding keeps the fix (`dynamic=True` from the start saves
    that one recompile and compiles the batch dimension symbolic too); guards that keep failing
    recompile up to `torch._dynamo.config.recompile_limit` (8) times, then the function runs
    eagerly. Code that compile cannot trace causes graph breaks, fused kernels change numerics
    slightly, and Windows support is limited.

    Where the statement goes, and why: right after the model is built and moved to its device,
    before the optimizer is created from it. Before a `DistributedDataParallel` wrapper, also one
    made in `if`/`else` branches, it compiles the module the wrapper gets (as nanoGPT does). After
    an `nn.DataParallel` wrapper, it compiles the wrapper: DataParallel's replicas on the other
    GPUs would still call the module compiled before wrapping, bound to the first GPU's weights
    (on one GPU both work). Code too tangled to place it (different modules wrapped in different
    branches) gets no fix. For torch 2.2 and newer
    the fix is `model.compile()`, which compiles the module in place: `model` stays the same
    object, so `model.state_dict()` keys keep their names (no `_orig_mod.` prefix that breaks
    checkpoints) and the optimizer's parameters are the model's parameters. For 2.0 and 2.1 it is
    `model = torch.compile(model)`; the parameters are still shared, so the optimizer is right, but
    saved `state_dict` keys gain the `_orig_mod.` prefix, so the fix is refused when the file saves
    or loads a state dict. Scripts that already use `torch.compile` on their default path are left
    alone. A step that runs the model only through a method of its own (`loss =
    self.model.compute_loss(batch)`, never `self.model(...)`) gets no fix: compiling the module
    compiles its `forward`, which that step never calls; the reason names the method to compile.

    ## Impact
    High: compiling is one of the largest single gains in training speed. Medium for a small model
    (under 10M parameters, counted from the layers it builds, or given by width options of
    256 or less), where the compile time of a short run is a large share of what it saves; medium
    too for an RL agent's updates between environment steps, whose stepping and acting the compile
    leaves as they are, for a graph network (the file imports `torch_geometric`, DGL or
    `torch_scatter`, or the project requires them: batches of graphs whose node and edge counts
    change every step recompile or run with dynamic shapes), and for a linear probe whose backbone
    is frozen (its backward pass is the head's only). Low for a model of a billion parameters or
    more (its checkpoint, config or layers say so): most of its step is large matmuls, which
    compile leaves to the same kernels, and a fine-tune's batches of varying length recompile. Low
    too where every step first generates the samples it trains on (`model.generate(...)`,
    `rollout_engine.rollout(...)`: RLHF, GRPO): decoding token by token at changing lengths takes
    most of the step.

    ## Measured effect
    PyTorch 2.0 announcement: 43% average training speedup on an A100 over 163 open-source models
    (21% in fp32, 51% with AMP); nanoGPT: about 250 ms to 135 ms per iteration. It can also be
    slower (MMAction2 TSN: 0.50 to 0.61 s/iter): let `speedfix bench` decide.
    Sources: https://pytorch.org/get-started/pytorch-2.0/, https://github.com/karpathy/nanoGPT
    """

    impact = "high"
    code = "SF501"
    name = "model-not-compiled"
    summary = "Trained `nn.Module` never passed to `torch.compile` (CUDA)"
    severity = Severity.WARNING
    requires = (b"optim",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = "Compile the model after it is built and moved to its device"
    gpu_only = True
    min_torch = v("2.0")
    effect = "Fused kernels: +43% mean training speed on A100 (PyTorch 2.0)."

    VALID = [
        Valid(  # votenet's eval.py: an optimizer made only to load a checkpoint's state into it; nothing trains
            """
            import torch
            from models import VoteNet

            net = VoteNet().cuda()
            optimizer = torch.optim.Adam(net.parameters(), lr=0.001)
            checkpoint = torch.load("log/checkpoint.tar")
            net.load_state_dict(checkpoint["model_state_dict"])
            optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
            net.eval()
            with torch.no_grad():
                for batch in loader:
                    print(net(batch.cuda()).argmax(1))
            """
        ),
        Valid(  # K-FAC: an optimizer class whose inner SGD updates the model it is handed; whoever builds it trains it
            """
            import torch
            import torch.optim as optim

            class KFACOptimizer(optim.Optimizer):
                def __init__(self, model, lr=0.25, momentum=0.9):
                    super().__init__(model.parameters(), dict(lr=lr))
                    self.model = model.to(torch.device("cuda"))
                    self.optim = optim.SGD(model.parameters(), lr=lr * (1 - momentum), momentum=momentum)

                def step(self):
                    for p in self.model.parameters():
                        p.grad.data.mul_(0.5)
                    self.optim.step()
            """,
        ),
        Valid(  # a graph convolution over a sparse adjacency matrix: nothing for the compiler to fuse
            """
            import torch
            import torch.nn as nn

            class SparseGraphLayer(nn.Module):
                def __init__(self, n_in, n_out):
                    super().__init__()
                    self.weight = nn.Parameter(torch.empty(n_in, n_out))

                def forward(self, x, adj):
                    return torch.spmm(adj, x @ self.weight)

            class TwoHop(nn.Module):
                def __init__(self, n_in, n_hidden, n_out):
                    super().__init__()
                    self.first = SparseGraphLayer(n_in, n_hidden)
                    self.second = SparseGraphLayer(n_hidden, n_out)

                def forward(self, x, adj):
                    return self.second(torch.relu(self.first(x, adj)), adj)

            net = TwoHop(1433, 16, 7).cuda()
            opt = torch.optim.Adam(net.parameters(), lr=0.01)
            for step in range(200):
                loss = net(features, adj).log_softmax(-1)[train_idx].mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # Fabric wraps the model: SF901 says how to compile it there (`fabric.setup(torch.compile(model))`)
            """
            import torch
            import lightning as L

            fabric = L.Fabric(accelerator="cuda", precision="bf16-mixed")
            model = Net()
            optimizer = torch.optim.AdamW(model.parameters(), fused=True)
            model, optimizer = fabric.setup(model, optimizer)
            for x, y in loader:
                loss = criterion(model(x), y)
                fabric.backward(loss)
                optimizer.step()
            """
        ),
        Valid(  # the DeepSpeed engine owns the model: SF905 says to call `engine.compile()`
            """
            import deepspeed

            import torch

            model = build_transformer(args).cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, args=args)
            for batch in loader:
                loss = engine(batch.cuda())
                engine.backward(loss)
                engine.step()
            """
        ),
        Valid(  # a GAN with an R1 penalty: the gradient's graph is differentiated again
            """
            import torch
            from torch import autograd

            def r1_penalty(pred, images):
                grad, = autograd.grad(outputs=pred.sum(), inputs=images, create_graph=True)
                return grad.pow(2).flatten(1).sum(1).mean()

            critic = Critic().cuda()
            opt = torch.optim.Adam(critic.parameters(), lr=2e-4)
            for images in loader:
                images = images.cuda().requires_grad_()
                pred = critic(images)
                loss = torch.nn.functional.softplus(-pred).mean() + 5 * r1_penalty(pred, images)
                opt.zero_grad()
                loss.backward()
                opt.step()
            """
        ),
        Invalid(  # Accelerate hands the model to DeepSpeed's engine: its own terms, no `torch.compile` before it
            """
            import torch
            from accelerate import Accelerator, DeepSpeedPlugin
            from transformers import AutoModelForCausalLM
            accelerator = Accelerator(mixed_precision="bf16", deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
            model = AutoModelForCausalLM.from_pretrained("gpt2")
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
            model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
            for step, batch in enumerate(train_loader):
                accelerator.backward(model(**batch).loss)
                optimizer.step()
                optimizer.zero_grad()
            """
        ),
        Valid(  # Accelerate compiles the model in prepare()
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator(dynamo_backend="inductor")
            model = Net()
            optimizer = torch.optim.AdamW(model.parameters())
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                accelerator.backward(model(batch).sum())
                optimizer.step()
            """
        ),
        Valid(  # quantization-aware training, and a detection model
            """
            import torch
            import torchvision
            model = torchvision.models.detection.__dict__[args.model](weights=None).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
            for images, targets in loader:
                loss = sum(model(images, targets).values())
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(
            """
            import torch
            model = Net().cuda()
            model.qconfig = torch.ao.quantization.get_default_qat_qconfig("fbgemm")
            torch.ao.quantization.prepare_qat(model, inplace=True)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # nanoGPT: compiling is an option that is on by default
            """
            import torch
            compile = True
            model = GPT(config).to("cuda")
            optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
            if compile:
                model = torch.compile(model)
            """
        ),
        Valid(
            """
            import torch
            model = Net().cuda()
            model = torch.compile(model)
            optimizer = torch.optim.AdamW(model.parameters())
            """
        ),
        Valid(  # Lightning's configure_optimizers: the Trainer owns the model
            """
            import torch
            import lightning as L
            class Model(L.LightningModule):
                def configure_optimizers(self):
                    return torch.optim.Adam(self.parameters(), lr=1e-3)
            trainer = L.Trainer(accelerator="cuda")
            """
        ),
        Valid(  # a GAN LightningModule optimizing its generator and discriminator apart: the Trainer
            # owns both, and the advice to compile the module comes once, from SF901
            """
            import torch
            import lightning as L
            class GAN(L.LightningModule):
                def configure_optimizers(self):
                    gen = torch.optim.Adam(self.gen.parameters(), lr=2e-4)
                    disc = torch.optim.Adam(self.disc.parameters(), lr=2e-4)
                    return [gen, disc], []
            L.Trainer(accelerator="gpu").fit(GAN())
            """
        ),
        Valid(  # a Lightning module parallelized in configure_model: SF901 reports it uncompiled
            """
            import torch
            import lightning as L

            class LM(L.LightningModule):
                def configure_model(self):
                    parallelize(self.model, self.device_mesh)

                def training_step(self, batch):
                    return self.model(batch).sum()

                def configure_optimizers(self):
                    return torch.optim.AdamW(self.model.parameters(), lr=3e-4)

            L.Trainer(accelerator="cuda", precision="bf16-mixed").fit(LM(), loader)
            """
        ),
        Valid(  # a Callback trains a linear probe hung on the LightningModule: the Trainer owns it
            """
            import torch
            import lightning as L
            class Probe(L.Callback):
                def on_fit_start(self, trainer, pl_module):
                    pl_module.probe = torch.nn.Linear(512, 10).to(pl_module.device)
                    self.opt = torch.optim.Adam(pl_module.probe.parameters(), lr=1e-4)
            L.Trainer(accelerator="gpu", callbacks=[Probe()]).fit(Net())
            """
        ),
        Valid(  # CPU-only scripts get no GPU advice
            """
            import torch
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """
        ),
        Valid(  # a project's own compile helper may well call torch.compile
            """
            import torch
            model = Net().cuda()
            model = compile_for_speed(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """
        ),
        Valid(  # a helper makes the optimizer from the parameters it is handed; the caller compiled the model
            """
            import torch

            def training_tools(cfg, weights):
                return torch.optim.AdamW(weights, lr=cfg.lr)

            def run(cfg):
                net = build_net(cfg).cuda()
                net.compile()
                optimizer = training_tools(cfg, net.parameters())
            """
        ),
        Valid(  # an optimizer factory (ConvNeXt's optim_factory.py): the caller builds the model
            """
            import torch

            def create_optimizer(args, model):
                params = [p for p in model.parameters() if p.requires_grad]
                optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
                return optimizer

            x = torch.ones(1).cuda()
            """
        ),
    ]
    INVALID = [
        Invalid(  # an optimizer class chosen by name (`optimizer_cls = torch.optim.AdamW`), over param groups (fastcomposer)
            """
            import torch
            optimizer_cls = torch.optim.AdamW
            model = Composer(unet).cuda()
            unet_params = [p for p in model.unet.parameters() if p.requires_grad]
            optimizer = optimizer_cls([{"params": unet_params, "lr": 1e-5}], weight_decay=0.01)
            for batch in loader:
                model(batch).backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            optimizer_cls = torch.optim.AdamW
            model = Composer(unet).cuda()
            model.compile()
            unet_params = [p for p in model.unet.parameters() if p.requires_grad]
            optimizer = optimizer_cls([{"params": unet_params, "lr": 1e-5}], weight_decay=0.01)
            for batch in loader:
                model(batch).backward()
                optimizer.step()
            """,
        ),
        Invalid(  # the optimizer a hydra config names; the step runs the model through its own loss method
            """
            import hydra
            import torch

            class Workspace:
                def __init__(self, cfg):
                    self.model = hydra.utils.instantiate(cfg.policy).cuda()
                    self.optimizer = hydra.utils.instantiate(cfg.optimizer, params=self.model.parameters())

                def run(self, loader):
                    for batch in loader:
                        loss = self.model.compute_loss(batch)
                        loss.backward()
                        self.optimizer.step()
            """
        ),
        Invalid(  # built in the `__main__` block: the compile goes there, after the model, not above the block
            """
            import torch
            import torch.nn as nn

            if __name__ == "__main__":
                device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
                model = nn.Linear(512, 512).to(device)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for x in torch.randn(100, 8, 512).to(device):
                    model(x).mean().backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            import torch.nn as nn

            if __name__ == "__main__":
                device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
                model = nn.Linear(512, 512).to(device)
                model.compile()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for x in torch.randn(100, 8, 512).to(device):
                    model(x).mean().backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # the optimizer comes from a `set_optimizer(opt, model)` helper: the model is still trained
            # (`set_optimizer_lr(optimizer, lr_fn, epoch)` sets its learning rate: no model there)
            """
            import torch
            import torch.nn as nn

            def set_optimizer(opt, model):
                return torch.optim.SGD(model.parameters(), lr=opt.lr, momentum=0.9)

            def main(opt, loader):
                model = nn.Sequential(nn.Conv2d(3, 64, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10)).cuda()
                optimizer = set_optimizer(opt, model)
                lr_fn = make_lr_fn(opt)
                set_optimizer_lr(optimizer, lr_fn, 0)
                for x, y in loader:
                    loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            import torch.nn as nn

            def set_optimizer(opt, model):
                return torch.optim.SGD(model.parameters(), lr=opt.lr, momentum=0.9)

            def main(opt, loader):
                model = nn.Sequential(nn.Conv2d(3, 64, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10)).cuda()
                model.compile()
                optimizer = set_optimizer(opt, model)
                lr_fn = make_lr_fn(opt)
                set_optimizer_lr(optimizer, lr_fn, 0)
                for x, y in loader:
                    loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # a hand-written large-batch optimizer (LARS/LAMB style) built on `torch.optim.Optimizer`
            """
            import torch
            from torch import optim

            class ScaledSGD(optim.Optimizer):
                def __init__(self, params, lr=0.1):
                    super().__init__(params, dict(lr=lr))

                @torch.no_grad()
                def step(self):
                    for group in self.param_groups:
                        for p in group["params"]:
                            if p.grad is not None:
                                p.add_(p.grad / (p.grad.norm() + 1e-8), alpha=-group["lr"])

            def main(loader):
                encoder = Encoder().cuda()
                optimizer = ScaledSGD(encoder.parameters(), lr=0.2)
                for x in loader:
                    loss = encoder(x.cuda()).pow(2).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            from torch import optim

            class ScaledSGD(optim.Optimizer):
                def __init__(self, params, lr=0.1):
                    super().__init__(params, dict(lr=lr))

                @torch.no_grad()
                def step(self):
                    for group in self.param_groups:
                        for p in group["params"]:
                            if p.grad is not None:
                                p.add_(p.grad / (p.grad.norm() + 1e-8), alpha=-group["lr"])

            def main(loader):
                encoder = Encoder().cuda()
                encoder.compile()
                optimizer = ScaledSGD(encoder.parameters(), lr=0.2)
                for x in loader:
                    loss = encoder(x.cuda()).pow(2).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # a helper builds the optimizer (and its schedule) from the parameters it is handed
            """
            import torch

            def training_tools(cfg, weights):
                optimizer = torch.optim.SGD(weights, lr=cfg.lr, momentum=0.9)
                return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 30)

            def run(cfg):
                net = build_net(cfg).cuda()
                trainable = [p for p in net.parameters() if p.requires_grad]
                optimizer, scheduler = training_tools(cfg, trainable)
            """,
            fixed="""
            import torch

            def training_tools(cfg, weights):
                optimizer = torch.optim.SGD(weights, lr=cfg.lr, momentum=0.9)
                return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 30)

            def run(cfg):
                net = build_net(cfg).cuda()
                net.compile()
                trainable = [p for p in net.parameters() if p.requires_grad]
                optimizer, scheduler = training_tools(cfg, trainable)
            """,
        ),
        Invalid(  # the optimizer class chosen by name, its groups filled from `model.named_parameters()`
            """
            import torch

            def main(args):
                model = build_model(args).cuda()
                decay, no_decay = [], []
                for name, param in model.named_parameters():
                    (no_decay if name.endswith("bias") else decay).append(param)
                groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
                optimizer = getattr(torch.optim, args.optimizer)(groups, lr=1e-4)
            """,
            fixed="""
            import torch

            def main(args):
                model = build_model(args).cuda()
                model.compile()
                decay, no_decay = [], []
                for name, param in model.named_parameters():
                    (no_decay if name.endswith("bias") else decay).append(param)
                groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
                optimizer = getattr(torch.optim, args.optimizer)(groups, lr=1e-4)
            """,
        ),
        Invalid(  # a GAN: the generator runs under no_grad in the critic's step but is trained, not frozen
            """
            import torch
            generator = Generator().cuda()
            critic = Critic().cuda()
            opt_g = torch.optim.Adam(generator.parameters(), lr=1e-4)
            opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4)
            for real, _ in loader:
                with torch.no_grad():
                    fake = generator(torch.randn(64, 128, device="cuda"))
                critic_loss = critic(fake).mean() - critic(real.cuda()).mean()
                critic_loss.backward()
                opt_c.step()
                gen_loss = -critic(generator(torch.randn(64, 128, device="cuda"))).mean()
                gen_loss.backward()
                opt_g.step()
            """,
            fixed="""
            import torch
            generator = Generator().cuda()
            generator.compile()
            critic = Critic().cuda()
            critic.compile()
            opt_g = torch.optim.Adam(generator.parameters(), lr=1e-4)
            opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4)
            for real, _ in loader:
                with torch.no_grad():
                    fake = generator(torch.randn(64, 128, device="cuda"))
                critic_loss = critic(fake).mean() - critic(real.cuda()).mean()
                critic_loss.backward()
                opt_c.step()
                gen_loss = -critic(generator(torch.randn(64, 128, device="cuda"))).mean()
                gen_loss.backward()
                opt_g.step()
            """,
            count=2,
        ),
        Invalid(  # the model makes its own optimizer (nanoGPT/llm.c); compiling is off by default
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--compile", type=int, default=0)
            args = parser.parse_args()
            model = GPT(config)
            model.to("cuda")
            if args.compile:
                model = torch.compile(model)
            raw_model = model.module if ddp else model
            optimizer = raw_model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4)
            """,
        ),
        Invalid(  # timm's optimizer factory, given the options first (DeiT)
            """
            import torch
            from timm.optim import create_optimizer
            model = Net().cuda()
            model_without_ddp = model
            optimizer = create_optimizer(args, model_without_ddp)
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            from timm.optim import create_optimizer
            model = Net().cuda()
            model.compile()
            model_without_ddp = model
            optimizer = create_optimizer(args, model_without_ddp)
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # an optimizer over param groups from a helper, and a `model_without_ddp` alias
            """
            import torch
            import utils
            model = Net().cuda()
            model_without_ddp = model
            params = utils.set_weight_decay(model_without_ddp, 1e-4)
            optimizer = torch.optim.SGD(params, lr=0.1)
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            import utils
            model = Net().cuda()
            model.compile()
            model_without_ddp = model
            params = utils.set_weight_decay(model_without_ddp, 1e-4)
            optimizer = torch.optim.SGD(params, lr=0.1)
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # a trainer class keeps the model as `self.net` and wraps it there; param groups from its own methods
            """
            import torch

            class Runner:
                def __init__(self, opts):
                    net = SegNet(classes=21)
                    groups = [{"params": net.backbone_params(), "lr": opts.lr},
                              {"params": net.head_params(), "lr": opts.lr * 10}]
                    self.net, self.opt = net, torch.optim.SGD(groups, momentum=0.9)
                    if opts.cuda:
                        self.net = torch.nn.DataParallel(self.net).cuda()

                def run_epoch(self):
                    for image, mask in self.loader:
                        loss = self.loss_fn(self.net(image.cuda()), mask.cuda())
                        loss.backward()
                        self.opt.step()
            """,
            fixed="""
            import torch

            class Runner:
                def __init__(self, opts):
                    net = SegNet(classes=21)
                    groups = [{"params": net.backbone_params(), "lr": opts.lr},
                              {"params": net.head_params(), "lr": opts.lr * 10}]
                    self.net, self.opt = net, torch.optim.SGD(groups, momentum=0.9)
                    if opts.cuda:
                        self.net = torch.nn.DataParallel(self.net).cuda()
                    net.compile()

                def run_epoch(self):
                    for image, mask in self.loader:
                        loss = self.loss_fn(self.net(image.cuda()), mask.cuda())
                        loss.backward()
                        self.opt.step()
            """,
        ),
        Invalid(
            """
            import torch
            from torch import nn, optim

            def main():
                device = torch.device("cuda")
                model = Net().to(device)

                # optimizer and schedule
                optimizer = optim.Adam(model.parameters(), lr=1e-3)
            """,
            fixed="""
            import torch
            from torch import nn, optim

            def main():
                device = torch.device("cuda")
                model = Net().to(device)
                model.compile()

                # optimizer and schedule
                optimizer = optim.Adam(model.parameters(), lr=1e-3)
            """,
        ),
        Invalid(  # compile before the DDP wrapper; torch 2.1 rebinds the name with the file's alias
            """
            import torch as t
            from torch.nn.parallel import DistributedDataParallel as DDP

            def setup(rank):
                net = Net().cuda(rank)
                net = DDP(net, device_ids=[rank])
                opt = t.optim.SGD(net.parameters(), lr=0.1)
            """,
            fixed="""
            import torch as t
            from torch.nn.parallel import DistributedDataParallel as DDP

            def setup(rank):
                net = Net().cuda(rank)
                net = t.compile(net)
                net = DDP(net, device_ids=[rank])
                opt = t.optim.SGD(net.parameters(), lr=0.1)
            """,
            torch="2.1",
        ),
        Invalid(  # the DDP wrapper has another name: compile the module it wraps (pytorch/examples' ddp)
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def demo(device_ids):
                model = ToyModel().cuda(device_ids[0])
                ddp_model = DDP(model, device_ids)
                optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.001)
            """,
            fixed="""
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def demo(device_ids):
                model = ToyModel().cuda(device_ids[0])
                model.compile()
                ddp_model = DDP(model, device_ids)
                optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.001)
            """,
        ),
        Invalid(  # 2.0/2.1 would prefix checkpoint keys with `_orig_mod.`: no fix
            """
            import torch
            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            torch.save(model.state_dict(), "model.pt")
            """,
            torch="2.0",
        ),
        Invalid(  # pytorch/examples imagenet: a zoo model, DDP in one branch and DataParallel in
            # another: compile the outermost module once the branches are done (in place)
            """
            import torch
            import torchvision.models as models

            def main_worker(gpu, args):
                model = models.__dict__[args.arch]()
                if args.distributed:
                    model.cuda(gpu)
                    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
                else:
                    model = torch.nn.DataParallel(model).cuda()

                # define the optimizer
                optimizer = torch.optim.SGD(model.parameters(), args.lr)
            """,
            fixed="""
            import torch
            import torchvision.models as models

            def main_worker(gpu, args):
                model = models.__dict__[args.arch]()
                if args.distributed:
                    model.cuda(gpu)
                    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
                else:
                    model = torch.nn.DataParallel(model).cuda()
                model.compile()

                # define the optimizer
                optimizer = torch.optim.SGD(model.parameters(), args.lr)
            """,
        ),
        Invalid(  # DDP only in some runs: compile the module before the branch that wraps it
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def main(args):
                model = torchvision.models.resnet50().cuda()
                if args.distributed:
                    model = DDP(model, device_ids=[args.gpu])
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """,
            fixed="""
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def main(args):
                model = torchvision.models.resnet50().cuda()
                model.compile()
                if args.distributed:
                    model = DDP(model, device_ids=[args.gpu])
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """,
        ),
        Invalid(  # a Hugging Face model; `re.compile` is not a model compile
            """
            import re
            import torch
            from transformers import AutoModelForSequenceClassification

            PATTERN = re.compile(r"\\d+")
            model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")
            model.to("cuda")
            optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
            """,
            fixed="""
            import re
            import torch
            from transformers import AutoModelForSequenceClassification

            PATTERN = re.compile(r"\\d+")
            model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")
            model.to("cuda")
            model.compile()
            optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
            """,
        ),
        Invalid(  # batches padded per batch to their longest sequence: one recompile, then the
            # sequence dimension is dynamic (automatic dynamic shapes), so the fix stays
            """
            import torch
            from torch.utils.data import DataLoader
            from transformers import AutoModelForCausalLM, DataCollatorWithPadding

            model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2-0.5B").to("cuda")
            loader = DataLoader(dataset, batch_size=8, collate_fn=DataCollatorWithPadding(tokenizer))
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
            for batch in loader:
                loss = model(**batch.to("cuda")).loss
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            from transformers import AutoModelForCausalLM, DataCollatorWithPadding

            model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2-0.5B").to("cuda")
            model.compile()
            loader = DataLoader(dataset, batch_size=8, collate_fn=DataCollatorWithPadding(tokenizer))
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
            for batch in loader:
                loss = model(**batch.to("cuda")).loss
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # compiling is an option that is off by default: the default run is eager
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--compile", action="store_true")
            args = parser.parse_args()
            model = Net().cuda()
            if args.compile:
                model = torch.compile(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """,
        ),
        Invalid(  # CleanRL-style options: a dataclass `tyro.cli` fills, its `compile` field off by default
            """
            from dataclasses import dataclass
            import torch
            import tyro

            @dataclass
            class Args:
                compile: bool = False

            args = tyro.cli(Args)
            model = Net().cuda()
            if args.compile:
                model = torch.compile(model)
            optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
            """,
        ),
        Invalid(  # another library's optimizer updates the parameters all the same
            """
            import bitsandbytes as bnb
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained("gpt2").to("cuda")
            optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=1e-4)
            """,
            fixed="""
            import bitsandbytes as bnb
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained("gpt2").to("cuda")
            model.compile()
            optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=1e-4)
            """,
        ),
        Invalid(  # a linear probe (DINO): the frozen backbone does the work, so no automatic fix
            """
            import torch
            backbone = Backbone().cuda().eval()
            head = torch.nn.Linear(768, 1000).cuda()
            optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
            for x, y in loader:
                with torch.no_grad():
                    features = backbone(x.cuda())
                loss = criterion(head(features), y.cuda())
                loss.backward()
                optimizer.step()
            """,
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        gain = compile_gain(self.ctx)
        if gain is None and id(finding.node) in self._frozen:
            return Estimate(Impact.MEDIUM, "its backbone is frozen and only a head trains: compiling speeds up the "
                                           "forward pass, and the backward pass is small")
        return gain

    def finish(self) -> None:
        ctx = self.ctx
        self._frozen: set[int] = set()  # the reported nodes of models whose backbone is frozen (a linear probe)
        if any(name.startswith(_QUANTIZATION) for name in ctx.calls_by_qualname):
            return  # quantization-aware training: fake-quant modules break Dynamo's graphs
        if self._accelerate_compiles():
            return
        if differentiates_twice(ctx) is not None:
            return  # a gradient of a gradient: compiled graphs cannot run double backward
        models = [*trained_models(ctx), *optimizer_factories(ctx)]
        others = [(model, site.stack) for model, site in models]
        compiles = [(site, call_subjects(ctx, site, receiver=ctx.qualname(site.node.func) != "torch.compile"))
                    for site in self._compile_calls()]
        reported: set[str] = set()
        for model, site in models:
            if model in reported or self._detection_model(model, site) or self._optimizer_factory(model, site):
                continue
            if in_optimizer_class(ctx, site.stack):
                continue  # an optimizer's inner optimizer (K-FAC's SGD): whoever builds the optimizer trains the model
            if self._sparse(model, site):
                continue  # sparse tensors: Dynamo falls back to eager around them, nothing is fused
            if model.startswith("self.") and in_lightning_method(ctx, site) or in_lightning_callback(ctx, site):
                continue  # the LightningModule's submodules: the Trainer owns them, SF901 gives the compile advice
            if fabric_owned(ctx, model):
                continue  # `fabric.setup(model)`: SF901 gives the compile advice in Fabric's terms
            if engine_owned(ctx, model):
                continue  # `deepspeed.initialize(model=model)`: SF905 gives it as `engine.compile()`
            if accelerate_prepared(ctx, model) and accelerate_runs_deepspeed(ctx):
                if not self._launched_compiling():
                    self._report_accelerate(site, model)
                continue
            # a compile of this model (or of something that may be it) settles it; one of another model does not
            mine = [(call.statement, call.stack) for call, subjects in compiles
                    if is_for_model(ctx, subjects, model, site.stack, others)]
            compiled, gate = default_choice(ctx, mine)
            if compiled:
                continue
            helper_compiled, helper_gate = default_choice(ctx, self._compile_helpers(model))
            if helper_compiled:
                continue
            reported.add(model)
            self._report(site, model, gate or helper_gate)

    def _sparse(self, model: str, site: CallSite) -> bool:
        """Is ``model`` built by a network that multiplies sparse matrices (a graph convolution)?"""
        ctx = self.ctx
        built = [peel(ctx, assignment.value) for assignment in fresh_assignments(ctx, model, site.stack, None)]
        return any(isinstance(call, cst.Call) and multiplies_sparse(ctx, call, site.stack) for call in built)

    def _accelerate_compiles(self) -> bool:
        """`Accelerator(dynamo_backend="inductor")` or a `dynamo_plugin=`: `prepare()` compiles."""
        for site in self.ctx.calls_to(*ACCELERATOR):
            for keyword in ("dynamo_backend", "dynamo_plugin"):
                node = find_argument(self.ctx, site, keyword).node
                off = node is None or (isinstance(node, cst.Name) and node.value == "None") \
                    or string_value(self.ctx, node, site.stack) in ("no", "NO")
                if not off:
                    return True
        return False

    def _launched_compiling(self) -> bool:
        """Does every launch command of the script pass `accelerate launch --dynamo_backend` (not "no")?"""
        commands = launch.launches(self.ctx)
        return bool(commands) and all(str(command.launcher_options.get("dynamo_backend", "no")).lower() != "no"
                                      for command in commands)

    def _report_accelerate(self, site: CallSite, model: str) -> None:
        """A model that `accelerator.prepare` hands to DeepSpeed's engine: Accelerate compiles it
        there (`engine.compile()`) when asked; a `torch.compile` before it would be wrapped by
        ZeRO's hooks."""
        built = run_first(self.ctx, fresh_assignments(self.ctx, model, site.stack, site.statement))
        self.report(built[0].value if built else site.node,
                    f"`{model}` is trained without `torch.compile` (Accelerate hands it to DeepSpeed's engine, which "
                    "compiles it when Accelerate is asked to)",
                    no_fix_reason='a machine-wide `accelerate config` may set it: pass `dynamo_backend="inductor"` to '
                    "`Accelerator(...)` or `--dynamo_backend inductor` to `accelerate launch`")

    def _optimizer_factory(self, model: str, site: CallSite) -> bool:
        """`def create_optimizer(args, model): ... return SGD(params)`: the model is handed in and
        the optimizer handed back; the model is compiled where it is built, by the caller."""
        ctx = self.ctx
        function = ctx.function_of(site.stack)
        if not isinstance(function, cst.FunctionDef):
            return False
        params = {param.name.value for param in (*function.params.params, *function.params.kwonly_params)}
        root = model.split(".", 1)[0]
        if root not in params or root == "self":  # Lightning's `configure_optimizers(self)` is no factory
            return False
        return is_returned(function, site)

    def _detection_model(self, model: str, site: CallSite) -> bool:
        """A torchvision detection model (Faster/Mask R-CNN, RetinaNet...): images of varying
        sizes and data-dependent box sampling and NMS recompile and break the graph."""
        for assignment in fresh_assignments(self.ctx, model, site.stack, site.statement):
            value = peel(self.ctx, assignment.value)  # without `.cuda()`, `.to(device)`
            if not isinstance(value, cst.Call):
                continue
            func = value.func.value if isinstance(value.func, cst.Subscript) else value.func  # `detection.__dict__[name]`
            if (self.ctx.qualname(func) or "").startswith(_DETECTION):
                return True
        return False

    def _compile_calls(self) -> list[CallSite]:
        """`torch.compile(...)` and `<module>.compile()` (not `re.compile`)."""
        ctx = self.ctx
        calls = list(ctx.calls_to("torch.compile"))
        for site in ctx.method_calls("compile"):
            receiver = site.node.func.value  # type: ignore[attr-defined]
            if ctx.qualname(receiver) is None:
                calls.append(site)
        return calls

    def _compile_helpers(self, model: str) -> list[tuple[cst.BaseStatement | None, Stack]]:
        """A project's own compile helper given the model (`compile_for_speed(model)`)."""
        return [
            (site.statement, site.stack) for site in self.ctx.calls
            if site.func and "compile" in site.func.lower() and any(dotted_name(arg.value) == model for arg in site.node.args)
        ]

    def _report(self, site: CallSite, model: str, gate: str | None) -> None:
        message = f"`{model}` is trained without `torch.compile`"
        built = run_first(self.ctx, fresh_assignments(self.ctx, model, site.stack, site.statement))
        node = built[0].value if built else site.node
        if frozen_before(self.ctx, site):
            self._frozen.add(id(node))
        if gate is not None:
            self.report(node, f"{message} by default: it is compiled only when `{gate}`, which is off by default",
                        no_fix_reason="pass the option, or make compiling the default")
            return
        owner = self.ctx.class_of(site.stack)
        if owner is not None and any(info.class_name == owner.name.value for info in self.ctx.functions.get("configure_model", ())):
            self.report(node, message, no_fix_reason="the model is set up in `configure_model` (sharded or parallelized): "
                        "compile its blocks there, before they are wrapped")
            return
        frozen = self._frozen_module(model)
        if frozen is not None:
            self.report(node, message, no_fix_reason=f"`{frozen}` also runs in the step, frozen under `torch.no_grad()`: "
                        f"compile the module that does the work (`{frozen}.compile()` for a frozen backbone)")
            return
        method = step_method(self.ctx, model)
        if method is not None:
            self.report(node, message, no_fix_reason=f"the training step runs `{model}.{method}(...)`, never `{model}(...)`: "
                        f"compiling the module compiles a `forward` the step does not call; compile the method "
                        f"(`{model}.{method} = torch.compile({model}.{method})`) or the submodules it calls")
            return
        if not self.ctx.torch_version >= v("2.2") and self._touches_state_dict():
            self.report(node, message, no_fix_reason="with torch < 2.2 compiling renames state_dict keys (`_orig_mod.`)")
            return
        placement = self._placement(site, model)
        if isinstance(placement, str):
            self.report(node, message, no_fix_reason=placement)
            return
        ops: list[FixOp] = []
        target = placement.target
        if self.ctx.torch_version >= v("2.2"):
            new = statement(f"{target}.compile()")
        else:
            new = statement(f"{target} = {reference(self.ctx, 'torch.compile', ops, site.stack)}({target})")
        # InsertStatements, not a Transform of the anchor: other fixes may rewrite that statement
        ops.insert(0, InsertStatements(placement.anchor, (new,), after=not placement.before))
        self.report(node, message, fix_ops=ops)

    def _frozen_module(self, model: str) -> str | None:
        """Another module called under `torch.no_grad()` in the training step (DINO's linear
        probe: a frozen backbone, then the trained head): the work may well be there."""
        ctx = self.ctx
        trained = optimized_modules(ctx)  # a GAN's generator under no_grad in the critic's step is trained, not frozen
        for info in ctx.withs:
            if not any(isinstance(item, cst.Call) and ctx.qualname(item.func) in NO_GRAD for item in info.items):
                continue
            if not ctx.in_training_loop(info.stack):
                continue
            for node in walk_expression(info.node.body):
                name = dotted_name(node.func) if isinstance(node, cst.Call) else None  # `backbone(x)`, `self.encoder(x)`
                if is_local_object(ctx, name) and name != model and not LOSS_NAME.search(name or "") and name not in trained \
                        and not _COPY_NAME.search((name or "").rsplit(".", 1)[-1]) and not plain_object(ctx, name, info.stack):
                    return name
        return None

    # ------------------------------------------------------------------ where the compile goes
    def _placement(self, site: CallSite, model: str) -> _Placement | str:
        """Right after the model is built and moved to its device, before the optimizer; before a
        DDP wrapper (compiling the module it wraps, as nanoGPT does), also when the wrapping
        happens in `if`/`else` branches; after an `nn.DataParallel` wrapper (its replicas on other
        GPUs cannot run a module compiled before wrapping). A string: why there is no fix."""
        ctx = self.ctx
        if site.statement is None:
            return "the optimizer is not created in a plain statement"
        # The optimizer may be made in one branch of an `if opt_name == ...:` chain: go up to
        # the block that holds the whole chain (never out of a loop, `with` or function, nor
        # out of an `if` that builds the model too: `if __name__ == "__main__":` does).
        anchor: cst.BaseStatement = site.statement
        built = [id(outer) for a in ctx.assignments_in_scope(model, site.stack) if a.statement is not None
                 for outer in enclosing_statements(ctx, a.statement)]
        for outer in enclosing_statements(ctx, site.statement)[1:]:
            if not isinstance(outer, cst.If) or id(outer) in built or is_main_guard(outer.test):
                break
            anchor = outer
        block = enclosing_block(ctx, anchor)
        if block is None:
            return "the optimizer is not created in a plain statement"
        index = next(i for i, s in enumerate(block) if s is anchor)
        wraps, touched = self._model_statements(block, site, model)
        if any(qualified in DATA_PARALLEL for _, (qualified, _) in wraps):
            last = max([i for i, _ in wraps] + [i for i in touched if i < index])
            return _Placement(block[last], False, model)
        if wraps and min(i for i, _ in wraps) < index:
            inner = {dotted_name(call.args[0].value) for _, (_, call) in wraps}
            if len(inner) != 1 or None in inner:
                return "the model is wrapped in DistributedDataParallel under different names"
            first = min(i for i, _ in wraps)
            return _Placement(block[first], True, inner.pop() or model)
        # No wrapper, or a DDP wrapper made after the optimizer (compiling in place before it is
        # the same): after the last statement that builds, moves or loads the model.
        before = [i for i in touched if i < index]
        if not before:
            return _Placement(anchor, True, model)
        return _Placement(block[before[-1]], False, model)

    def _model_statements(
        self, block: list[cst.BaseStatement], site: CallSite, model: str
    ) -> tuple[list[tuple[int, tuple[str, cst.Call]]], list[int]]:
        """Positions in ``block`` of the statements (their branches included) that wrap the model
        (`model = DDP(inner, ...)`, with the wrapper and its call) and of those that build, move or
        load it: assign it or one of its attributes, or call a method on it as a statement of its
        own (`model.cuda()`, `model.load_state_dict(...)`). Read from the file's index of
        assignments and calls, not by walking each statement: that walk was a third of a scan."""
        ctx = self.ctx
        position = {id(statement): i for i, statement in enumerate(block)}

        def where(statement: cst.BaseStatement | None) -> int | None:
            if statement is None:
                return None
            for outer in enclosing_statements(ctx, statement):
                if id(outer) in position:
                    return position[id(outer)]
            return None

        function = ctx.function_of(site.stack)
        names = model_aliases(ctx, model, function)  # `self.model = model`: wrapped under that name too
        wraps: list[tuple[int, tuple[str, cst.Call]]] = []
        touched: set[int] = set()
        for name, assignments in ctx.assignments_by_function.get(function, {}).items():
            if not any(name == alias or name.startswith(alias + ".") for alias in names):
                continue
            for assignment in assignments:
                at = where(assignment.statement)
                if at is None or (name != model and dotted_name(assignment.part or assignment.value) == model):
                    continue  # `self.model = model` only names it
                touched.add(at)
                wrapped = wrapper_of(ctx, assignment.value) if name in names and not assignment.unpacked else None
                if wrapped is not None:
                    wraps.append((at, wrapped))
        for call in ctx.calls:
            func = call.node.func
            statement = call.statement
            if not isinstance(func, cst.Attribute) or dotted_name(func.value) not in names:
                continue
            if statement is not None and ctx.function_of(call.stack) is function and any(
                isinstance(small, cst.Expr) and small.value is call.node for small in statement.body
            ):
                at = where(statement)
                if at is not None:
                    touched.add(at)
        wraps.sort(key=lambda found: found[0])
        return wraps, sorted(touched)

    def _touches_state_dict(self) -> bool:
        return any(True for _ in self.ctx.method_calls("state_dict")) or any(
            True for _ in self.ctx.method_calls("load_state_dict")
        )

