from __future__ import annotations

from collections import defaultdict
from functools import cached_property

import libcst as cst

from speedfix.engine.findings import Applicability, FixOp, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import reference, string_literal
from speedfix.model.amp import Autocast, Passing, Precision, autocasts, gated_autocasts, mixed_precision_by_default
from speedfix.model.arguments import find_argument
from speedfix.model.autograd import runs_network
from speedfix.model.forward import (assigned_names, backward_calls, calls_model, forward_range, read_names, statement_block, steps,
                              wrap)
from speedfix.model.flow import in_no_run
from speedfix.model.frames import FrameKind
from speedfix.model.index import CallSite, WithInfo
from speedfix.model.networks import optimizes_tensors_only, project_builds_rnn
from speedfix.model.rl import trains_between_env_steps
from speedfix.model.scale import trains_narrow_mlps_only
from speedfix.model.versions import TorchVersion, v
from speedfix.project.steps import CUDNN_RNN_LAYERS
from speedfix.rules._impact import Estimate, Finding, Impact, small_model
from speedfix.syntax.blocks import statement_owner
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import code_of, walk_expression
from speedfix.rules._examples import DQN_BETWEEN_ENV_STEPS, NARROW_MLP, TOY_MLP

# Autocast raises on these ("unsafe to autocast"): the model has to move to the logits version first.
_LEGACY_AUTOCAST_FROM = v("1.6")  # torch.cuda.amp.autocast
_BANNED_UNDER_AUTOCAST = ("torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss", "torch.nn.functional.binary_cross_entropy")
# Autocast runs cuDNN RNNs in fp16 whatever dtype is asked for (its `_cudnn_rnn` wrapper
# reflattens the weights into an fp16 buffer; cuDNN had no bf16 RNNs before 9.13): without a
# GradScaler their gradients can underflow.
class NoMixedPrecision(Rule):
    """
    ## What it does
    Finds CUDA training loops whose forward pass and loss run in fp32: no `torch.autocast`
    anywhere in the script and no 16-bit model or dtype (`model.half()`, `torch.bfloat16`,
    Lightning's `"bf16-mixed"`, FSDP mixed-precision policies). An autocast that its defaults
    turn off (`dtype=ptdtype` with `--dtype float32` as the argparse default or nanoGPT's
    `dtype = 'float32'`, `enabled=args.amp` with a `store_true` flag) does not count: the run
    with the defaults is fp32, and that is reported at the autocast, unless an `Accelerator` that
    leaves its precision open runs in 16-bit all the same (every launch command passes
    `--mixed_precision bf16`, or its DeepSpeed plugin's config enables bf16). So is an autocast
    that wraps only the loss while the model's forward pass runs before it. A loop with several backward
    calls (a GAN's critic, generator and penalty steps) is one finding, whose fix covers each.
    NVIDIA apex's `amp.initialize` counts as mixed precision, unless its `opt_level` is apex's
    pure-fp32 "O0" with the defaults (`--amp` defaulting to "O0" and no launch command passing
    it; also where the script may restore its options from a checkpoint), or it runs only under
    an option that is off by default and that no launch command turns on (`if args.fp16:` with
    `--fp16` a flag: the finding is at the default branch's `loss.backward()`, not apex's
    `scaled_loss.backward()`). A project on a torch before 1.10
    (a `torch==0.4.1` pin) still gets the finding, without a fix and saying so: autocast is the
    biggest gain an fp32 loop has, and it is worth upgrading torch for; from torch 1.6 the
    finding points at the fp16 autocast that torch has (`torch.cuda.amp.autocast()` with a
    `GradScaler`) instead. Not reported where every
    trained model is an MLP no wider than 256 in the widths the code states (an RL agent's actor
    and critics): its matmuls are too small for tensor cores to matter; nor where every training
    step runs between an environment's steps (a DQN whose loop steps the emulator, an A2C/PPO
    agent's `update()` that the main loop calls between rollouts, also on an agent a config
    builds, `self.agent.update(...)`, and the `update_critic()` it runs): the run waits on the simulator,
    and its small policy and value networks on batches of tens leave the GPU idle anyway. A
    backward pass whose step is an optimizer's over standalone tensors (PPO-Lagrangian's
    `SGD([self.log_lambda])`) runs no network and is no training step here; nor is the
    `loss.backward()` of a helper handed the loss (`def update_params(optim, loss):`) in a file
    that runs no network: the forward pass, and autocast, belong to its callers.

    ## Why is this bad?
    Tensor cores run bf16 and fp16 matmuls and convolutions several times faster than fp32 (even
    with TF32), and half-width activations halve the memory traffic of every elementwise op.
    `torch.autocast` picks the precision per op: matmuls and convolutions in bf16, reductions,
    softmax and losses in fp32. bf16 keeps fp32's exponent range, so unlike fp16 it needs no
    `GradScaler`. The forward pass and the loss go inside the `with`; `backward()` and the
    optimizer step stay outside (the backward pass reuses the forward's precisions).

    ## Example
    ```python
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        output = model(x)
        loss = criterion(output, y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            output = model(x)
            loss = criterion(output, y)
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    Unsafe: the numbers change. bf16 has 8 mantissa bits, so losses and gradients differ from
    fp32 at the third significant digit; most models train to the same accuracy, but custom ops
    or extensions that assume fp32 inputs, losses computed by hand with large sums, and models
    trained close to fp32's precision limit can degrade. bf16 needs an Ampere or newer GPU (A100,
    RTX 30xx, H100; `torch.cuda.is_bf16_supported()`): older GPUs need fp16 with a
    `torch.amp.GradScaler`, which this fix does not write. Mixed precision can also use more
    memory with small batches (the fp32 weights stay, bf16 copies are added). `BCELoss` and
    `binary_cross_entropy` raise under autocast ("unsafe to autocast"): a script using them gets
    no fix until it moves to `BCEWithLogitsLoss` on the logits. Autocast runs cuDNN LSTM, GRU
    and RNN layers in fp16 whatever dtype is asked for (PyTorch's `_cudnn_rnn` autocast wrapper;
    cuDNN had no bf16 RNNs before 9.13), which needs a `GradScaler`: scripts with those layers
    get no fix either. The fix wraps the
    statements from the model call to the loss that `backward()` uses, when they sit next to it
    in the same block; elsewhere the finding has no fix. An autocast around the loss only gets
    the statements from the model call on moved into its block. An autocast that is off by
    default gets no fix: which option turns it on is the script's own choice. Verify with
    `speedfix apply --verify`.

    ## Impact
    High: mixed precision is one of the largest single gains in training speed and memory. Medium for
    a small model (under 10M parameters, counted from the layers it builds, or given by width
    options of 256 or less).

    ## Measured effect
    PyTorch's performance tuning guide: mixed precision gives "up to 3x overall speedup on Volta
    and newer GPU architectures"; Lightning's docs report up to 3x; the PyTorch 2.0 release
    measured larger `torch.compile` gains with AMP (51%) than in fp32 (21%).
    Sources: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html,
    https://pytorch.org/get-started/pytorch-2.0/
    """

    impact = "high"
    code = "SF202"
    name = "no-mixed-precision"
    summary = "CUDA training loop whose forward pass runs in fp32 (no autocast)"
    severity = Severity.WARNING
    requires = (b"backward",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = 'Run the forward pass and loss under `torch.autocast("cuda", dtype=torch.bfloat16)`'
    gpu_only = True
    min_torch = v("1.10")
    _gated_legacy = False  # the finding is a gated `torch.cuda.amp.autocast` (see as_upgrade_advice)
    upgrade_for = "`torch.autocast`"  # the biggest gain there is for an fp32 loop: worth an upgrade from an older torch
    effect = "bf16 matmuls and convolutions on tensor cores: up to 3x per the PyTorch tuning guide."

    VALID = [
        Valid(  # PPO's 64-wide actor and critic, each in a param group of one optimizer
            """
            import torch
            from torch import nn


            class ActorCritic(nn.Module):
                def __init__(self, state_dim, action_dim):
                    super().__init__()
                    self.actor = nn.Sequential(nn.Linear(state_dim, 64), nn.Tanh(), nn.Linear(64, action_dim))
                    self.critic = nn.Sequential(nn.Linear(state_dim, 64), nn.Tanh(), nn.Linear(64, 1))


            class PPO:
                def __init__(self, state_dim, action_dim):
                    self.policy = ActorCritic(state_dim, action_dim).cuda()
                    self.optimizer = torch.optim.Adam([
                        {"params": self.policy.actor.parameters(), "lr": 3e-4},
                        {"params": self.policy.critic.parameters(), "lr": 1e-3},
                    ])

                def update(self, states, returns):
                    for _ in range(80):
                        loss = (self.policy.critic(states).squeeze() - returns).pow(2).mean()
                        self.optimizer.zero_grad()
                        loss.backward()
                        self.optimizer.step()
            """
        ),
        Valid(NARROW_MLP),  # an RL agent's 256-wide MLPs (TD3): matmuls too small for tensor cores to matter
        Valid(TOY_MLP),  # a 2-4-1 MLP whose widths are its constructor's arguments
        Valid(DQN_BETWEEN_ENV_STEPS),  # a DQN learning between the emulator's steps: the run waits on the environment
        Valid(  # a sampler's regulariser (pix2pix-zero's DDIM inversion): gradients of a tensor it makes, no weights
            """
            import torch

            unet = UNet().cuda()

            @torch.no_grad()
            def invert(latents, timesteps):
                latents = latents.cuda()
                for t in timesteps:
                    noise_pred = unet(latents, t).sample
                    with torch.enable_grad():
                        for _ in range(5):
                            var = torch.autograd.Variable(noise_pred.detach().clone(), requires_grad=True)
                            loss = auto_corr_loss(var)
                            loss.backward()
                            grad = var.grad.detach() / 4
                            noise_pred = noise_pred - 20.0 * grad
                    latents = scheduler.step(noise_pred, t, latents).prev_sample
                return latents
            """,
        ),
        Valid(  # a helper of the project's utils that steps a loss its callers computed (sac-discrete)
            """
            import torch

            def update_params(optim, loss, retain_graph=False):
                optim.zero_grad()
                loss.backward(retain_graph=retain_graph)
                optim.step()

            def sync_device():
                torch.cuda.synchronize()
            """,
        ),
        Valid(  # PPO-Lagrangian: the multiplier's own update runs no network; the engine steps the policy
            """
            import torch

            class Trainer:
                def __init__(self, engine):
                    self.engine = engine
                    self.log_lambda = torch.nn.Parameter(torch.tensor(0.0, device="cuda"))
                    self.lambda_optimizer = torch.optim.SGD([self.log_lambda], lr=0.1)

                def train(self, loader):
                    for batch in loader:
                        lambda_loss = -(batch["cost"].mean() - 25.0) * self.log_lambda.exp()
                        self.lambda_optimizer.zero_grad()
                        lambda_loss.backward()
                        self.lambda_optimizer.step()
                        loss = self.engine(**batch).loss
                        self.engine.backward(loss)
                        self.engine.step()
            """,
        ),
        Valid(  # torch before 1.6: NVIDIA apex's amp is the mixed precision there
            """
            import torch
            from apex import amp
            model = FCN().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for images, masks in loader:
                loss = criterion(model(images.cuda()), masks.cuda())
                optimizer.zero_grad()
                with amp.scale_loss(loss, optimizer) as scaled:
                    scaled.backward()
                optimizer.step()
            """,
            torch="1.4",
        ),
        Valid(  # the device is an option that defaults to the CPU; CUDA is only named for a run that asks
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:1")
            args = parser.parse_args()
            model = CharTransformer(vocab_size=27).to(args.device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
            for step in range(10000):
                x, y = [t.to(args.device) for t in next(batches)]
                logits, loss = model(x, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
            """
        ),
        Valid(  # already mixed precision
            """
            import torch
            model = Net().cuda()
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # a context chosen at run time (nanoGPT) counts too
            """
            import torch
            from contextlib import nullcontext
            ctx = nullcontext() if device == "cpu" else torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16)
            for step in range(1000):
                with ctx:
                    loss = model(x.cuda(), y.cuda())
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # bf16 where the GPU supports it, chosen at run time (nanoGPT): unknown, so silent
            """
            import torch
            dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float16'
            ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
            ctx = torch.amp.autocast(device_type='cuda', dtype=ptdtype)
            for step in range(max_iters):
                with ctx:
                    logits, loss = model(X.cuda(), Y.cuda())
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # AMP on unless `--no-amp` is passed
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--no-amp", dest="amp", action="store_false")
            args = parser.parse_args()
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp):
                    loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # the model itself is converted to half precision
            """
            import torch
            model = Net().cuda().half()
            for x, y in loader:
                loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                opt.step()
            """
        ),
        Invalid(  # 16-bit only behind an option that is off by default: the default run is fp32
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--half", action="store_true", help="train in 16-bit")
            args = parser.parse_args()
            model = Net().cuda()
            if args.half:
                model.half()
            for x, y in loader:
                loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                opt.step()
            """,
            fixed="""
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--half", action="store_true", help="train in 16-bit")
            args = parser.parse_args()
            model = Net().cuda()
            if args.half:
                model.half()
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                opt.step()
            """,
        ),
        Valid(  # a CPU script: no GPU advice
            """
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                opt.step()
            """
        ),
    ]
    INVALID = [
        Invalid(  # DALLE-pytorch: a DeepSpeed-style config whose "fp16" section is off by default names no precision
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--fp16", action="store_true")
            args = parser.parse_args()
            deepspeed_config = {"train_batch_size": 8, "fp16": {"enabled": args.fp16}}
            model = torch.nn.Transformer().cuda()
            optimizer = torch.optim.Adam(model.parameters(), fused=True)
            for src, tgt in loader:
                loss = model(src.cuda(), tgt.cuda()).mean()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--fp16", action="store_true")
            args = parser.parse_args()
            deepspeed_config = {"train_batch_size": 8, "fp16": {"enabled": args.fp16}}
            model = torch.nn.Transformer().cuda()
            optimizer = torch.optim.Adam(model.parameters(), fused=True)
            for src, tgt in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(src.cuda(), tgt.cuda()).mean()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # NVIDIA apex only under `--fp16`, off by default: the default run trains in fp32
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--fp16", action="store_true")
            args = parser.parse_args()
            fp16 = args.fp16
            model = Net().cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            if fp16:
                from apex import amp
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x, y in loader:
                loss = model(x.cuda(), labels=y.cuda())
                if fp16:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            """,
            torch="1.4",
        ),
        Invalid(  # apex at its pure-fp32 level "O0", the option's default (vq-vae-2's PixelSNAIL): fp32
            """
            import argparse
            import torch
            from apex import amp
            parser = argparse.ArgumentParser()
            parser.add_argument("--amp", type=str, default="O0")
            parser.add_argument("--ckpt", type=str)
            args = parser.parse_args()
            if args.ckpt is not None:
                args = torch.load(args.ckpt)["args"]
            model = PixelSNAIL([32, 32], 512, 256).to("cuda")
            optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
            model, optimizer = amp.initialize(model, optimizer, opt_level=args.amp)
            for epoch in range(420):
                for top, label in loader:
                    top = top.to("cuda")
                    out, _ = model(top)
                    loss = torch.nn.functional.cross_entropy(out, top)
                    model.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
            torch="1.4",
        ),
        Invalid(  # an agent's critic and actor updates: two step methods of one class, one piece of advice
            """
            import torch

            class Agent:
                def __init__(self):
                    self.critic = Critic().cuda()
                    self.actor = Actor().cuda()
                    self.critic_opt = torch.optim.Adam(self.critic.parameters())
                    self.actor_opt = torch.optim.Adam(self.actor.parameters())

                def update_critic(self, obs, target):
                    critic_loss = (self.critic(obs) - target).pow(2).mean()
                    critic_loss.backward()
                    self.critic_opt.step()

                def update_actor(self, obs):
                    actor_loss = -self.critic(obs, self.actor(obs)).mean()
                    actor_loss.backward()
                    self.actor_opt.step()
            """,
            fixed="""
            import torch

            class Agent:
                def __init__(self):
                    self.critic = Critic().cuda()
                    self.actor = Actor().cuda()
                    self.critic_opt = torch.optim.Adam(self.critic.parameters())
                    self.actor_opt = torch.optim.Adam(self.actor.parameters())

                def update_critic(self, obs, target):
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        critic_loss = (self.critic(obs) - target).pow(2).mean()
                    critic_loss.backward()
                    self.critic_opt.step()

                def update_actor(self, obs):
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        actor_loss = -self.critic(obs, self.actor(obs)).mean()
                    actor_loss.backward()
                    self.actor_opt.step()
            """,
        ),
        Invalid(  # a project on a torch before autocast: the advice is to upgrade torch first, with no fix
            """
            import torch
            model = SegNet().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for images, masks in loader:
                loss = criterion(model(images.cuda()), masks.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            torch="1.4",
        ),
        Invalid(  # a critic trained several times per generator step, in an inner loop: one finding
            """
            import torch
            generator, critic = Generator().cuda(), Critic().cuda()
            opt_g = torch.optim.Adam(generator.parameters())
            opt_d = torch.optim.Adam(critic.parameters())
            for noise, real in loader:
                noise, real = noise.cuda(), real.cuda()
                loss_g = -critic(generator(noise)).mean()
                opt_g.zero_grad()
                loss_g.backward()
                opt_g.step()
                fake = generator(noise).detach()
                for _ in range(n_critic):
                    loss_d = critic(fake).mean() - critic(real).mean()
                    opt_d.zero_grad()
                    loss_d.backward()
                    opt_d.step()
            """,
            fixed="""
            import torch
            generator, critic = Generator().cuda(), Critic().cuda()
            opt_g = torch.optim.Adam(generator.parameters())
            opt_d = torch.optim.Adam(critic.parameters())
            for noise, real in loader:
                noise, real = noise.cuda(), real.cuda()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss_g = -critic(generator(noise)).mean()
                opt_g.zero_grad()
                loss_g.backward()
                opt_g.step()
                fake = generator(noise).detach()
                for _ in range(n_critic):
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss_d = critic(fake).mean() - critic(real).mean()
                    opt_d.zero_grad()
                    loss_d.backward()
                    opt_d.step()
            """,
        ),
        Invalid(  # a GAN: the critic's and the generator's backward calls are one finding, one fix for both
            """
            import torch
            for real in loader:
                real = real.cuda()
                fake = gen(torch.randn(real.size(0), 128, device="cuda"))
                d_loss = critic(fake.detach()).mean() - critic(real).mean()
                d_opt.zero_grad()
                d_loss.backward()
                d_opt.step()
                g_loss = -critic(gen(torch.randn(real.size(0), 128, device="cuda"))).mean()
                g_opt.zero_grad()
                g_loss.backward()
                g_opt.step()
                if step % 16 == 0:
                    penalty = r1(critic, real)
                    penalty.backward()
                    d_opt.step()
            """,
            fixed="""
            import torch
            for real in loader:
                real = real.cuda()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    fake = gen(torch.randn(real.size(0), 128, device="cuda"))
                    d_loss = critic(fake.detach()).mean() - critic(real).mean()
                d_opt.zero_grad()
                d_loss.backward()
                d_opt.step()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    g_loss = -critic(gen(torch.randn(real.size(0), 128, device="cuda"))).mean()
                g_opt.zero_grad()
                g_loss.backward()
                g_opt.step()
                if step % 16 == 0:
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        penalty = r1(critic, real)
                    penalty.backward()
                    d_opt.step()
            """,
        ),
        Invalid(  # autocast behind a constructor default that is off (`amp: bool = False`)
            """
            import torch

            class Trainer:
                def __init__(self, model, amp: bool = False):
                    self.model = model.cuda()
                    self.amp = amp
                    self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

                def fit(self, loader):
                    for x, y in loader:
                        with torch.autocast("cuda", enabled=self.amp):
                            loss = self.model(x.cuda()).sum()
                        loss.backward()
                        self.opt.step()
            """,
        ),
        Invalid(  # the scaler handed to the epoch function (torchvision's train_one_epoch)
            """
            import argparse
            import torch

            def train_one_epoch(model, optimizer, data_loader, scaler=None):
                for image, target in data_loader:
                    with torch.autocast("cuda", enabled=scaler is not None):
                        loss = criterion(model(image.cuda()), target.cuda())
                    loss.backward()
                    optimizer.step()

            def main(args):
                scaler = torch.amp.GradScaler("cuda") if args.amp else None
                for epoch in range(90):
                    train_one_epoch(model, optimizer, loader, scaler)

            if __name__ == "__main__":
                parser = argparse.ArgumentParser()
                parser.add_argument("--amp", action="store_true")
                args = parser.parse_args()
                main(args)
            """
        ),
        Invalid(  # torchvision references: AMP only with `--amp`, through the scaler
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--amp", action="store_true")
            args = parser.parse_args()
            scaler = torch.amp.GradScaler("cuda") if args.amp else None
            for x, y in loader:
                with torch.autocast("cuda", enabled=scaler is not None):
                    loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F

            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                optimizer.zero_grad()
                # forward
                output = model(x)
                loss = F.cross_entropy(output, y)
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            import torch.nn.functional as F

            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                optimizer.zero_grad()
                # forward
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    output = model(x)
                    loss = F.cross_entropy(output, y)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # the step in a function, the file's own alias, a scaled loss for accumulation
            """
            import torch as T

            def train_step(net, batch, opt):
                inputs, labels = batch
                logits = net(inputs.to('cuda'))
                loss = T.nn.functional.cross_entropy(logits, labels.to('cuda'))
                loss = loss / 4
                loss.backward()
                opt.step()

            for batch in loader:
                train_step(net, batch, opt)
            """,
            fixed="""
            import torch as T

            def train_step(net, batch, opt):
                inputs, labels = batch
                with T.autocast('cuda', dtype=T.bfloat16):
                    logits = net(inputs.to('cuda'))
                    loss = T.nn.functional.cross_entropy(logits, labels.to('cuda'))
                    loss = loss / 4
                loss.backward()
                opt.step()

            for batch in loader:
                train_step(net, batch, opt)
            """,
        ),
        Invalid(  # two optimisers (a GAN): each forward gets its own block, in one finding
            """
            import torch
            opt_d = torch.optim.Adam(disc.parameters())
            opt_g = torch.optim.Adam(gen.parameters())
            for real in loader:
                real = real.cuda()
                fake = gen(noise())
                loss_d = disc(real).mean() - disc(fake.detach()).mean()
                loss_d.backward()
                opt_d.step()
                loss_g = -disc(fake).mean()
                loss_g.backward()
                opt_g.step()
            """,
            fixed="""
            import torch
            opt_d = torch.optim.Adam(disc.parameters())
            opt_g = torch.optim.Adam(gen.parameters())
            for real in loader:
                real = real.cuda()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    fake = gen(noise())
                    loss_d = disc(real).mean() - disc(fake.detach()).mean()
                loss_d.backward()
                opt_d.step()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss_g = -disc(fake).mean()
                loss_g.backward()
                opt_g.step()
            """,
        ),
        Invalid(  # BCELoss raises under autocast: reported, no fix
            """
            import torch
            criterion = torch.nn.BCELoss()
            for x, y in loader:
                output = disc(x.cuda())
                loss = criterion(output, y.cuda())
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # a cuDNN LSTM would run in fp16 and need a GradScaler: no fix
            """
            import torch
            lstm = torch.nn.LSTM(8, 16, batch_first=True).cuda()
            for x, y in loader:
                output, _ = lstm(x.cuda())
                loss = criterion(output, y.cuda())
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # only the loss is next to backward, the model call is in an if/else: no fix
            """
            import torch
            for x, y in loader:
                if stateful:
                    output, hidden = model(x.cuda(), hidden)
                else:
                    output = model(x.cuda())
                loss = criterion(output, y.cuda())
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # the loss is computed in another block: reported, no fix
            """
            import torch
            for x, y in loader:
                if use_aux:
                    loss = model(x.cuda()).sum() + aux(x.cuda())
                else:
                    loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # nanoGPT-style precision table whose default is float32: autocast does nothing
            """
            import torch
            dtype = 'float32'
            ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
            ctx = torch.amp.autocast(device_type='cuda', dtype=ptdtype)
            for step in range(max_iters):
                with ctx:
                    logits, loss = model(X.cuda(), Y.cuda())
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # AMP behind a `store_true` flag: off unless `--amp` is passed
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--amp", action="store_true")
            args = parser.parse_args()
            scaler = torch.amp.GradScaler("cuda", enabled=args.amp)
            for x, y in loader:
                with torch.autocast("cuda", enabled=args.amp):
                    loss = criterion(model(x.cuda()), y.cuda())
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            """,
        ),
        Invalid(  # an fp32 branch and an autocast branch, chosen by a flag that is off by default (ConvNeXt)
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--use_amp", action="store_true")
            args = parser.parse_args()
            for x, y in loader:
                if args.use_amp:
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = criterion(model(x.cuda()), y.cuda())
                else:
                    loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # autocast handed around only under a flag that is off by default (timm's train.py)
            """
            import argparse
            from contextlib import suppress
            from functools import partial
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--amp", action="store_true", default=False)
            args = parser.parse_args()
            amp_autocast = suppress
            if args.amp:
                amp_autocast = partial(torch.autocast, device_type="cuda", dtype=torch.bfloat16)
            for x, y in loader:
                with amp_autocast():
                    loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # a linear probe (DINO): the frozen backbone's no_grad block goes under autocast too
            """
            import torch
            for x, y in loader:
                with torch.no_grad():
                    if use_cls_token:
                        features = backbone(x.cuda())[:, 0]
                    else:
                        features = backbone(x.cuda()).mean(1)
                output = head(features)
                loss = criterion(output, y.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    with torch.no_grad():
                        if use_cls_token:
                            features = backbone(x.cuda())[:, 0]
                        else:
                            features = backbone(x.cuda()).mean(1)
                    output = head(features)
                    loss = criterion(output, y.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # autocast around the loss only: the forward pass moves in
            """
            import torch
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                # forward
                output = model(x)
                # the loss in mixed precision
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = criterion(output, y)
                loss.backward()
                opt.step()
            """,
            fixed="""
            import torch
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                # forward
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    output = model(x)
                    # the loss in mixed precision
                    loss = criterion(output, y)
                loss.backward()
                opt.step()
            """,
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        return small_model(self.ctx, Impact.MEDIUM)

    def finish(self) -> None:
        ctx = self.ctx
        trains = backward_calls(ctx)
        if not trains or trains_narrow_mlps_only(ctx) or trains_between_env_steps(ctx):
            return  # (an MLP at most 256 wide: its matmuls are too small for tensor cores to matter)
        gated = gated_autocasts(ctx)
        if gated:  # the one the training steps run in, not an evaluation's
            stepping = {id(ctx.function_of(site.stack)) for site in trains}
            self._report_gated(next((cast for cast in gated if isinstance(cast, Autocast)
                                     and id(ctx.function_of(cast.site.stack)) in stepping), gated[0]))
            return
        if mixed_precision_by_default(ctx):
            self._check_loss_only_autocasts()
            return
        by_block: dict[int, list[tuple[CallSite, tuple[cst.CSTNode, list[cst.BaseStatement]] | None]]] = defaultdict(list)
        # not apex's `scaled_loss.backward()` under an `if args.fp16:` that no run turns on
        trains = [site for site in trains if not in_no_run(ctx, site.statement, site.stack)] or trains
        trains = [site for site in trains if not self._steps_tensors_only(site) and not self._handed_loss(site)]
        if not trains:
            return  # a Lagrange multiplier's update, or a helper's backward of a loss its callers computed
        for site in trains:
            owner = statement_owner(ctx, site.statement) if site.statement is not None else None
            key = id(owner[0]) if owner is not None else id(site.node)
            by_block[key].append((site, owner))
        # One finding per training loop (or function): a GAN's discriminator, generator and
        # regulariser steps are one piece of advice, with one fix that covers every block.
        by_loop: dict[int, list[list[tuple[CallSite, tuple[cst.CSTNode, list[cst.BaseStatement]] | None]]]] = defaultdict(list)
        for sites in by_block.values():
            by_loop[id(self._loop_of(sites[0][0]))].append(sites)
        for blocks in by_loop.values():
            self._report_loop(blocks)

    def _handed_loss(self, site: CallSite) -> bool:
        """`def update_params(optim, loss): ... loss.backward()` in a file that runs no network
        (sac-discrete's `utils.py`): the forward pass, and the place for autocast, is the caller's."""
        function = self.ctx.function_of(site.stack)
        receiver = site.node.func.value if isinstance(site.node.func, cst.Attribute) else None
        if not isinstance(function, cst.FunctionDef) or not isinstance(receiver, cst.Name):
            return False
        if receiver.value not in {param.name.value for param in (*function.params.params, *function.params.kwonly_params)}:
            return False
        return not any(runs_network(self.ctx, call) for call in self.ctx.calls)

    def _steps_tensors_only(self, site: CallSite) -> bool:
        """Is the backward's step (the first `opt.step()` after it in its block) one of an
        optimizer over standalone tensors (`SGD([self.log_lambda])`: PPO-Lagrangian's multiplier)?"""
        block = statement_block(self.ctx, site.statement)
        if block is None or site.statement not in block[1]:
            return False
        for statement in block[1][block[1].index(site.statement) + 1:]:
            for node in walk_expression(statement):
                if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "step":
                    name = dotted_name(node.func.value)
                    return name is not None and optimizes_tensors_only(self.ctx, name, site.stack)
        return False

    def _loop_of(self, site: CallSite) -> cst.CSTNode:
        """The training loop around a backward call (the outermost step loop of its function: a
        GAN's discriminator repeated in an inner loop of the generator's step loop is the same
        loop), else, for a method that takes a step of its own, its class (an agent's
        `update_critic()` and `update_actor()` are one piece of advice), else its function, else
        the module."""
        ctx = self.ctx
        start = max((i for i, frame in enumerate(site.stack) if frame.kind in (FrameKind.FUNCTION, FrameKind.CLASS)), default=-1)
        for frame in site.stack[start + 1:]:  # the loops of its function, outermost first
            if frame.kind is FrameKind.LOOP and frame.node in ctx.step_loops:
                return frame.node
        function = ctx.function_of(site.stack)
        owner = ctx.class_of(site.stack)
        if ctx.nearest_loop(site.stack) is None and owner is not None and function in ctx.step_functions:
            return owner
        return ctx.nearest_loop(site.stack) or function or ctx.module

    # ------------------------------------------------------------------ autocast off by default
    def as_upgrade_advice(self, version: TorchVersion) -> None:
        """The script's own `torch.cuda.amp.autocast` behind its option runs on torch 1.6 and
        newer: turning the option on needs no upgrade."""
        if self._gated_legacy and version >= _LEGACY_AUTOCAST_FROM:
            return
        if version < _LEGACY_AUTOCAST_FROM:
            super().as_upgrade_advice(version)
            return
        # torch 1.6 to 1.9: fp16 autocast is there, bf16 and the device-generic form are not
        fp16 = (f"this code targets torch {version}: fp16 autocast is there (`torch.cuda.amp.autocast()` with a "
                f"`torch.cuda.amp.GradScaler`), bf16 and `torch.autocast` need torch {self.min_torch}")
        for finding in self.findings:
            finding.message += f" ({fp16})"
            finding.fix = None
            finding.no_fix_reason = f"{fp16}; the fix writes bf16 autocast: use fp16 with a GradScaler, or upgrade torch"

    def _report_gated(self, cast: Autocast | Passing) -> None:
        """Autocast is there but its defaults turn it off: the default run is fp32."""
        self._gated_legacy = isinstance(cast, Autocast) and cast.legacy
        node = cast.node if isinstance(cast, Passing) else cast.site.node
        if cast.gate is not None:
            why = f"runs only when `{cast.gate}`, which is off by default"
        elif cast.precision is Precision.FP32:
            dtype = find_argument(self.ctx, cast.site, "dtype", 1).node
            why = f"asks for float32 by default (`dtype={code_of(dtype) if dtype is not None else '...'}`), which turns it off"
        else:
            enabled = find_argument(self.ctx, cast.site, "enabled", 0 if cast.legacy else 2).node
            why = f"is disabled by default (`enabled={code_of(enabled) if enabled is not None else '...'}`)"
        self.report(
            node,
            f"autocast {why}: with its defaults the script trains in fp32",
            no_fix_reason="make bf16 the default of the script's own precision option (or run it with bf16)",
        )

    # ------------------------------------------------------------------ autocast around the loss only
    def _check_loss_only_autocasts(self) -> None:
        ctx = self.ctx
        casts = {cast.site.node for cast in autocasts(ctx) if cast.on_by_default}
        for info in ctx.withs:
            call = next((c for item in info.items for c in self._autocast_calls(item, info) if c in casts), None)
            if call is None or not ctx.in_training_loop(info.stack):
                continue
            body = info.node.body
            if calls_model(ctx, body) or not any(isinstance(n, cst.Call) for n in walk_expression(body)):
                continue
            forward = self._forward_before(info.node, read_names(body))
            if forward is not None:
                block, start, end = forward
                self.report(
                    call,
                    "autocast covers only the loss: the model's forward pass runs before it, in fp32",
                    fix_ops=[Transform(block, lambda updated: _pull_into_with(updated, start, end))],
                    fix_title="Move the forward pass into the autocast block",
                    restructures=block,
                )

    def _autocast_calls(self, item: cst.BaseExpression, info: WithInfo) -> list[cst.Call]:
        """The calls a `with` item may enter: the call itself, or those in the value of the
        context variable it names (nanoGPT's `ctx = nullcontext() if ... else autocast(...)`)."""
        if isinstance(item, cst.Name):
            value = self.ctx.single_value(item.value, info.stack)
            return [n for n in walk_expression(value) if isinstance(n, cst.Call)] if value is not None else []
        return [item] if isinstance(item, cst.Call) else []

    def _forward_before(self, node: cst.With, needed: set[str]) -> tuple[cst.IndentedBlock, int, int] | None:
        """(the block, the index of the statement that runs the model and feeds the `with` body,
        the index of the `with`), when nothing in between steps the optimizer."""
        found = statement_block(self.ctx, node)
        if found is None:
            return None
        block, statements = found
        index = next(i for i, s in enumerate(statements) if s is node)
        for start in range(index - 1, -1, -1):
            statement = statements[start]
            if steps(statement):
                return None
            if calls_model(self.ctx, statement) and assigned_names(statement) & needed:
                return block, start, index
        return None

    # ------------------------------------------------------------------ the fix
    @cached_property
    def _file_refuses_autocast(self) -> str | None:
        """Why no block of this file gets the autocast fix, if something in it breaks under
        autocast (read once per file, not once per block)."""
        if self.ctx.calls_to(*_BANNED_UNDER_AUTOCAST):
            return _BCE_REASON
        if self.ctx.calls_to(*CUDNN_RNN_LAYERS) or any(project_builds_rnn(self.ctx, site.node) for site in self.ctx.calls):
            return _RNN_REASON  # here, or in a network of another file
        return None

    def _report_loop(
        self,
        blocks: list[list[tuple[CallSite, tuple[cst.CSTNode, list[cst.BaseStatement]] | None]]],
    ) -> None:
        first = blocks[0][0][0]
        receiver = dotted_name(first.node.func.value) if isinstance(first.node.func, cst.Attribute) else None
        others = sum(len(sites) for sites in blocks) - 1
        message = f"`{receiver or 'loss'}.backward()` follows a forward pass in fp32: no mixed precision (autocast)"
        if others:
            where = "this loop" if self.ctx.nearest_loop(first.stack) is not None else "this class's steps" \
                if isinstance(self._loop_of(first), cst.ClassDef) else "this function"
            message = (f"`{receiver or 'loss'}.backward()` and {others} other backward call{'s' if others > 1 else ''} of "
                       f"{where} follow forward passes in fp32: no mixed precision (autocast)")
        ops: list[FixOp] = []
        context = (
            f"{reference(self.ctx, 'torch.autocast', ops, first.stack)}({string_literal(self.ctx, 'cuda')}, "
            f"dtype={reference(self.ctx, 'torch.bfloat16', ops, first.stack)})"
        )
        wraps: list[FixOp] = []
        reasons: list[str] = []
        for sites in blocks:
            fix = self._block_fix([site for site, _ in sites], sites[0][1], context)
            if isinstance(fix, str):
                reasons.append(fix)
            else:
                wraps.append(fix)
        if not wraps:
            self.report(first.node, message, no_fix_reason=reasons[0])
            return
        first_block = blocks[0][0][1]
        restructures = first_block[0].body if len(blocks) == 1 and first_block is not None else self._loop_of(first)  # type: ignore[attr-defined]
        self.report(first.node, message, fix_ops=[*wraps, *ops], restructures=restructures)

    def _block_fix(
        self,
        sites: list[CallSite],
        owner: tuple[cst.CSTNode, list[cst.BaseStatement]] | None,
        context: str,
    ) -> Transform | str:
        """The edit that runs the forward passes of ``sites`` (backward calls of one block) under
        autocast, or why there is none."""
        block = getattr(owner[0], "body", None) if owner is not None else None
        if owner is None or not isinstance(block, cst.IndentedBlock):
            return "the backward call is not a statement of its own"
        if self._file_refuses_autocast is not None:
            return self._file_refuses_autocast
        ranges = [forward_range(self.ctx, owner[1], site) for site in sites]
        if any(r is None for r in ranges):
            return "the model call and the loss are not next to the backward call"
        spans = [r for r in ranges if r is not None]
        return Transform(block, lambda updated: wrap(updated, spans, context))


_BCE_REASON = (
    "`BCELoss`/`binary_cross_entropy` raise under autocast: "
    "use `BCEWithLogitsLoss` on the logits (drop the final sigmoid) first"
)


_RNN_REASON = (
    "autocast runs cuDNN LSTM/GRU/RNN layers in fp16 whatever dtype is asked for, "
    "which needs a GradScaler: no automatic fix"
)


def _pull_into_with(block: cst.CSTNode, start: int, index: int) -> cst.CSTNode:
    """``block`` with its statements from ``start`` up to the `with` at ``index`` moved to the top
    of that `with`'s body (the fix restructures the block alone: the analysed indices hold)."""
    assert isinstance(block, cst.IndentedBlock)
    body = list(block.body)
    moved, with_node = body[start:index], body[index]
    assert isinstance(with_node, cst.With) and isinstance(with_node.body, cst.IndentedBlock)
    inner = list(with_node.body.body)
    inner[0] = inner[0].with_changes(leading_lines=[*with_node.leading_lines, *inner[0].leading_lines])
    merged = with_node.with_changes(
        body=with_node.body.with_changes(body=[moved[0].with_changes(leading_lines=[]), *moved[1:], *inner]),
        leading_lines=moved[0].leading_lines,
    )
    return block.with_changes(body=[*body[:start], merged, *body[index + 1 :]])
