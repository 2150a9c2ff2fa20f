from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from functools import cached_property

import libcst as cst

from speedfix.engine.findings import Applicability, FixOp, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.engine.suppression import line_suppresses
from speedfix.model.arguments import find_argument
from speedfix.model.autograd import feeds_environment
from speedfix.model.branches import Branch, BranchTracker, element_loop, loop_iterable, rare_path
from speedfix.model.context import FileContext
from speedfix.model.flow import in_no_run
from speedfix.model.frames import Stack
from speedfix.model.overrides import overridden_method, owner_name
from speedfix.model.patterns import is_cpu_device
from speedfix.model.rl import generation_in_step
from speedfix.model.tensors import (HOST_CONVERSIONS, NO_WORK_METHODS, SYNC_METHODS, Tensors, has_sync_before,
                                    host_metric, is_library_value, is_summary_writer, tensors)
from speedfix.syntax.blocks import enclosing_block
from speedfix.syntax.names import dotted_name
from speedfix.rules._impact import Estimate, Finding, Impact, large_model
from speedfix.syntax.nodes import code_of, is_string, walk_expression

_NAMED_AT_MOST = 3
_MANY_WAITS = 3  # separate waits in one step from which the step can hardly run ahead (high impact)


# A meta-learning step after SF301's fix: the per-task syncs are gone, one per outer step is left.
_META_STEP_FIXED = """
import torch
for iteration in range(1000):
    optimizer.zero_grad()
    meta_error = 0.0
    for task in range(32):
        error = adapt(learner, tasks.sample(), device="cuda")
        error.backward()
        meta_error += error.detach()
    if rank == 0:
        print("meta train error", float(meta_error) / 32)
    optimizer.step()
"""


@dataclass
class _Load:
    node: cst.Name
    stack: Stack
    branches: tuple[Branch, ...]


@dataclass
class _Candidate:
    """Code that may wait for the GPU, as met in the traversal (so in source order)."""

    node: cst.CSTNode
    stack: Stack
    branches: tuple[Branch, ...]
    statement: cst.SimpleStatementLine | None
    kind: str  # "call", "f-string", "%", or the statement whose test it is ("if", "assert", ...)


@dataclass
class _ItemFix:
    """`total += t.item()`: keep the sum on the device, read it as `float(total)` where read."""

    call: cst.Call
    keep_tensor: bool  # a comparison carries no gradient: drop `.item()`, no `.detach()`
    reads: list[cst.Name]
    note: str | None = None  # a sync the fix leaves, said in its title


@dataclass
class _Sync:
    node: cst.CSTNode
    label: str  # how another finding names it
    message: str
    fix: _ItemFix | None = None
    no_fix_reason: str | None = None
    loop: cst.CSTNode | None = None  # a loop inside the step over a batch's elements, around the sync
    statement: cst.SimpleStatementLine | None = None  # where it is (None: the test of an `if`, `while`, ...)


class SyncInLoop(BranchTracker, Rule):
    """
    ## What it does
    Finds code in the training loop that makes the CPU wait for the GPU on every step:
    `t.item()`, `t.cpu()`, `t.tolist()`, `t.to("cpu")`, `float(t)`/`int(t)`/`bool(t)`,
    `math.isfinite(t)`, and the hidden ones: `print(t)`, `str(t)`, an f-string, `"%g" % t` or
    `"{}".format(t)` of a tensor, a tensor logged to TensorBoard (`writer.add_scalar("loss",
    loss, step)`, or in the dict of `add_scalars`: the `SummaryWriter` turns it into a number on
    the host), and
    `if`/`while`/`assert` on a tensor (`if torch.isfinite(loss):`
    needs its truth value on the host); in a LightningModule the batch `training_step` receives
    (and passes on to a method: `self.shared_step(batch)`) is already on the GPU, so checking
    its values (`assert mask.max() <= 1`) waits too. Several syncs in one step are one finding, on the first;
    the message names the others, and those of a subclass's override of the method (a run
    builds one trainer class or the other). The per-batch hooks Lightning runs beside
    `training_step` (`on_train_batch_end`, `on_after_backward`, `on_before_optimizer_step`... of
    the module or of a `Callback`) are step code too. The step's code includes the helpers it calls (of
    this file or another scanned one) and a function handed to a call on the step, which runs
    it every step (`run_step(batch, loss_fn=masked_loss)`, Megatron's `train_step(...,
    forward_step_func=forward_step)` in another file), and the `@property` of a class whose getter
    syncs (Tacotron's `r`, `return self.decoder.r.item()`), at each read of `self.r` in the step.
    A helper of another file that syncs once per pass of a loop gives the step's one finding its
    high impact.

    Not reported: code under a periodic logging guard (`if step % log_every == 0:`, unless
    `log_every` is 1 in every run: a constant, or an option that defaults to 1 and that no launch
    command sets, also through a name it is copied to: `accumulation = args.gradient_accumulation`;
    also through flags set just before: `step_eval = step % interval == 0`,
    then `if epoch_eval or step_eval:`), a branch that
    runs once (`if step == 0:`, or one that ends the run: `print(loss.item()); sys.exit(1)`), an
    `except` handler, code under an opt-in debugging, timing or plotting flag (`if args.debug:`,
    also around the call of a helper: `if args.visdom: update_plot(...)`; any `store_true` flag
    that no launch command passes: `if args.print_loss:`; Accelerate's
    `if accelerator.sync_gradients:` is no such flag: it holds on every optimizer step), a helper that the step
    loop calls on one pass only (`if i == len(loader) - 1: validate(model, val_loader)`: once per
    epoch), a module's evaluation-mode branch (`if not self.training:` in a `forward`, also around
    the call of a helper: OmniGen's `if offload_model and not self.training:`), and names
    that hold a Python number (`lossf = loss.item()` makes formatting `lossf` free; the `.item()`
    is the sync).

    ## Why is this bad?
    CUDA runs asynchronously: the CPU queues kernels and moves on. Reading a value on the host
    forces the CPU to wait until every queued kernel has finished, so it cannot queue the next
    step while the GPU works, and the GPU then idles while the CPU catches up. One sync per step
    is enough to lose that overlap, which is why the others in the same step are named in one
    finding rather than reported again.

    ## Example
    ```python
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running_loss += loss.item()
        if step % 100 == 99:
            print(f"loss {running_loss / 100:.3f}")
            running_loss = 0.0
    ```

    ## Use instead
    ```python
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running_loss += loss.detach()
        if step % 100 == 99:
            print(f"loss {float(running_loss) / 100:.3f}")
            running_loss = 0.0
    ```

    ## Fix safety
    Unsafe, and only offered where it is mechanical: `total += t.item()` becomes
    `total += t.detach()` (the sum stays on the GPU), and every read of `total` becomes
    `float(total)`, so it syncs once at the existing logging point. The sum is then accumulated in
    float32 on the GPU instead of a Python float, so logged values can differ in the last digits.
    No fix when `total` is read on every step (a progress bar: `float(total)` there would sync as
    before), nor when the value itself is needed every step (an early stop, a NaN guard, a list of
    per-step values): there the sync is the price of the feature, or the code needs restructuring
    by hand. No fix either when another sync of the same step has none (super_resolution's
    `print(... loss.item())` on every iteration): the step would still wait there, so moving the
    sum to the device would gain nothing. A fix that leaves a sync once per outer step (a sum over
    the micro-steps of a meta-learning step) says so in its title.

    ## Impact
    Medium: one sync per step costs what CPU/GPU overlap would have hidden, the time the CPU
    spends between the sync and its next kernel launch (the loader's next batch, the Python of
    the step), a few milliseconds. That is a large share of a short step and noise in a long
    one, and a step that copies its batch without `non_blocking` (SF104) waits for the GPU there
    anyway. So one sync per step ranks below the precision, compile and data-loading wins.

    High when the sync sits in a loop inside the step over the elements of a batch, a sequence
    or a list of tensors (`for i in range(batch_size): if mask[i].item():`, `[p.item() for p in
    preds]`): one round trip to the GPU per element, many per step, can take longer than the
    step's own kernels (a loop over a few named values, `losses.items()` or `range(3)`, does not
    count). Low for a large model (a billion parameters or more, as its checkpoint, config or
    layers say): its steps take a second or more; low too where every step first generates its
    samples (`model.generate(...)`, `rollout_engine.rollout(...)`: RLHF, GRPO): decoding waits
    for the GPU at every token already. Otherwise high for three or more separate
    waits in one step: each sync that launches work before it reads (`(out.argmax(1) ==
    y).sum().item()`, `bool(loss == 0)`), or that follows other GPU work of the step, waits for
    the GPU again, and so does each call of a helper of another scanned file that computes a
    tensor and reads it (`acc += get_accuracy(pred, target)`, whose body does `float(torch.sum(
    ...))`): with a dozen such metrics a short step spends most of its time with one side idle.
    Values the step already computed, read one statement after another (`meter.update(
    loss_a.item())`, then `loss_b.item()`, or `float(loss)` twice), wait once: after the first
    read the GPU has nothing queued. So four loss meters after a long detector or SAM step stay
    medium, below the mixed-precision and compile findings of the same file. A metric computed
    on the host from copies of the step's tensors (`roc_auc_score(y.cpu().numpy(), ...)`, a
    project's `metric_fn(...)` on `.numpy()` arrays) counts as one more: the GPU idles while the
    CPU scores the batch, so two waits and a host metric every step are high too; copies only
    kept for later (`outputs.append(out.cpu().numpy())`) are not. A `speedfix bench` result
    of the script measured on a GPU decides over all of these: high for a median step of 50 ms
    or less, low for 500 ms or more.

    ## Measured effect
    torchtune measured 40-50 ms of `cudaStreamSynchronize` per step from `loss.item()` and moved it
    under its logging interval; an honest A/B elsewhere found 4% in a microbenchmark and under 1% in
    real training, because a sync only costs what CPU/GPU overlap would have hidden. Measure it.
    Sources: https://github.com/meta-pytorch/torchtune/pull/522,
    https://github.com/lnccbrown/LANfactory/pull/120
    """

    impact = "medium"
    measure = "host_sync"
    code = "SF301"
    one_per_step = True
    name = "sync-in-loop"
    summary = "CPU-GPU synchronisation (`.item()`, `.cpu()`, `print(t)`) on every training step"
    severity = Severity.WARNING
    # No byte prefilter: the step may be marked by a call whose name says nothing (`loss_scaler(loss,
    # optimizer)`), and the syncs take many forms (f-strings, `%`, `if t:`).
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.EXACT
    fix_title = "Accumulate on the device and read the value once, at the logging point"
    gpu_only = True
    effect = "The CPU queues the next step while the GPU works (0-50 ms/step)."

    VALID = [
        Valid(  # a custom optimizer's `if grad.is_sparse:` (tabular-dl's RAdam): a Python bool, no sync
            """
            import torch

            def step(params, lr):
                for p in params:
                    grad = p.grad
                    if grad.is_sparse:
                        raise RuntimeError("sparse gradients are not supported")
                    p.data.add_(grad, alpha=-lr)

            model = torch.nn.Linear(8, 8).cuda()
            for x in loader:
                model(x.cuda(non_blocking=True)).sum().backward()
                step(model.parameters(), 0.1)
            """
        ),
        Valid(  # lucidrains' trainers (meshgpt, audiolm): a step counter buffer of a trainer module nothing moves
            """
            import torch
            from accelerate import Accelerator
            from torch import nn

            class Trainer(nn.Module):
                def __init__(self, model, dataloader, optimizer):
                    super().__init__()
                    self.accelerator = Accelerator(mixed_precision="bf16")
                    self.model, self.optimizer, self.dataloader = self.accelerator.prepare(model, optimizer, dataloader)
                    self.register_buffer("step", torch.tensor(0))

                def load(self, path):
                    self.step = torch.tensor([torch.load(path)["step"]], device=self.accelerator.device)

                def train(self, num_steps):
                    while self.step.item() < num_steps:
                        for batch in self.dataloader:
                            self.accelerator.backward(self.model(batch).mean())
                            self.optimizer.step()
                            self.accelerator.log({"lr": 1e-4}, step=self.step.item())
                            self.step.add_(1)
            """
        ),
        Valid(  # a coin flip made on the host (no `device=`): its truth value and `.item()` wait for nothing
            """
            import torch
            for images, masks in loader:
                images, masks = images.cuda(non_blocking=True), masks.cuda(non_blocking=True)
                if torch.rand(1) < mask_prob:
                    images = images * masks
                scale = 0.5 + torch.rand(1).item()
                loss = model(images * scale).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # rewards a function of the file makes on the host from Python numbers (simple_GRPO's gen_samples)
            """
            import torch

            def gen_samples(prompts):
                answers = generate(prompts)
                return answers, torch.tensor([score(a) for a in answers], dtype=torch.float32)

            for prompts in loader:
                answers, rewards = gen_samples(prompts)
                if (rewards.max() - rewards.min()).item() < 0.01:
                    continue
                loss = policy_loss(model, answers, (rewards - rewards.mean()).cuda(non_blocking=True))
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a periodic guard through a flag set just before it (Real-Time-Voice-Cloning's samples)
            """
            import torch
            for step, (x, y) in enumerate(loader):
                loss = model(x.cuda()).mean()
                loss.backward()
                optimizer.step()
                step_eval = interval > 0 and step % interval == 0
                if step_eval:
                    print(loss.item())
            """
        ),
        Valid(  # a property that syncs, read once before training; a cached one runs its `.item()` once
            """
            import functools
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.register_buffer("scale_buffer", torch.tensor(2.0))
                    self.fc = nn.Linear(8, 8)

                @property
                def scale(self):
                    return self.scale_buffer.item()

                @functools.cached_property
                def width(self):
                    return self.fc.weight.shape[0] * self.scale_buffer.item()

                def forward(self, x):
                    return self.fc(x) * self.width

                def describe(self):
                    return f"scale {self.scale}"

            model = Net().cuda()
            print(model.describe())
            for x in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """
        ),
        Valid(  # a module's evaluation-mode branch never runs in a training step (OmniGen's layer offload)
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

                def evict(self, index):
                    for param in self.layers[index].parameters():
                        param.data = param.data.to("cpu")

                def forward(self, x, offload=False):
                    for index, layer in enumerate(self.layers):
                        if offload and not self.training:
                            self.evict(index)
                        x = layer(x)
                    return x

            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a validation pass on the last batch of each epoch: once per epoch, not on every step
            """
            import torch

            def evaluate(net, batches):
                net.eval()
                total = 0.0
                with torch.no_grad():
                    for images, targets in batches:
                        total += criterion(net(images.to("cuda")), targets.to("cuda")).item()
                return total / len(batches)

            for epoch in range(20):
                net.train()
                for i, (images, targets) in enumerate(train_loader):
                    criterion(net(images.cuda()), targets.cuda()).backward()
                    optimizer.step()
                    if i == len(train_loader) - 1:
                        score = evaluate(net, val_loader)
            """
        ),
        Valid(  # a policy's select_action hands the action back for the environment step
            """
            import torch

            class Agent:
                def select_action(self, state):
                    with torch.no_grad():
                        action = self.dqn(torch.as_tensor(state, device="cuda")).argmax()
                    return action.cpu().numpy()

                def train(self, frames):
                    for frame in range(frames):
                        action = self.select_action(self.state)
                        self.state, reward, done = self.step(action)
                        loss = self.compute_loss()
                        loss.backward()
                        self.optimizer.step()
            """
        ),
        Valid(  # acting: the environment steps with the action on the host (CleanRL's DQN)
            """
            import torch
            for global_step in range(100000):
                with torch.no_grad():
                    q_values = q_network(torch.as_tensor(obs, device="cuda"))
                actions = torch.argmax(q_values, dim=1).cpu().numpy()
                obs, rewards, dones, infos = envs.step(actions)
                loss = td_loss(q_network, rb.sample(128))
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # Accelerate's idiom: `accelerator` is no tensor, `torch.mean(...)` no tensor name
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator(mixed_precision="bf16")
            for batch in loader:
                with accelerator.accumulate(model):
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    torch.mean(torch.stack([loss])).backward()
                    if torch.backends.cudnn.benchmark:
                        print(f"rank {accelerator.process_index}")
            """
        ),
        Valid(  # under the logging guard
            """
            import torch
            for step, (x, y) in enumerate(loader):
                x = x.cuda()
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
                if step % 100 == 0:
                    print(f"step {step} loss {loss.item():.4f}")
            """
        ),
        Valid(  # once per epoch, not per step
            """
            import torch
            for epoch in range(10):
                for x, y in loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    optimizer.step()
                print(epoch, loss.item())
            """
        ),
        Valid(  # CPU-only script: .item() costs nothing there
            """
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
                total += loss.item()
            """
        ),
        Valid(  # labels straight from the DataLoader are still on the CPU
            """
            import torch
            for x, y in train_loader:
                labels.extend(y.tolist())
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # branches that do not run every step: the first step, an error path, a flag
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--debug", action="store_true")
            parser.add_argument("--print_loss", action="store_true")
            args = parser.parse_args()
            for step, (x, y) in enumerate(loader):
                try:
                    loss = model(x.cuda()).sum()
                except RuntimeError:
                    print("failed at", loss.item())
                    raise
                if step == 0:
                    print(f"initial loss {loss}")
                if args.debug:
                    print("grad norm", torch.norm(model.weight.grad).item())
                if args.print_loss:  # (Yi's SFT: a flag no launch command passes)
                    print(f"step {step} loss {loss}")
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a plotting helper the loop calls only with an opt-in flag that is off by default
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--plot", action="store_true")
            args = parser.parse_args()

            def draw_curves(step, loss):
                board.append(step, loss.detach().cpu().numpy())

            for step, (x, y) in enumerate(loader):
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                if args.plot:
                    draw_curves(step, loss)
            """
        ),
        Valid(  # a guard that ends the run: its sync happens at most once
            """
            import sys
            import torch
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                if step > max_steps:
                    print("final loss", loss.item())
                    sys.exit(0)
            """
        ),
        Valid(  # devices, modules and flags are not tensors
            """
            import torch
            device = torch.device("cuda")
            use_cuda = torch.cuda.is_available()
            net = torch.nn.Linear(4, 2).to(device)
            for x, y in loader:
                loss = net(x.to(device)).sum()
                loss.backward()
                optimizer.step()
                if use_cuda:
                    print(device, net, f"{loss.shape}")
            """
        ),
    ]
    INVALID = [
        Invalid(  # a GAN's iteration: discriminator steps in an inner loop, then the generator's: one finding
            """
            import torch
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter()
            for step in range(100000):
                for _ in range(5):
                    real = next(looper).cuda()
                    loss_d = net_D(real).mean() - net_D(net_G(torch.randn(64, 128, device="cuda")).detach()).mean()
                    optim_D.zero_grad()
                    loss_d.backward()
                    optim_D.step()
                    pbar.set_postfix(loss="%.4f" % loss_d)
                writer.add_scalar("loss", loss_d, step)
                loss_g = -net_D(net_G(torch.randn(128, 128, device="cuda"))).mean()
                optim_G.zero_grad()
                loss_g.backward()
                optim_G.step()
            """,
        ),
        Invalid(  # Python's `max` of a CUDA tensor compares its elements one by one (End-to-end-ASR's text lengths)
            """
            import torch

            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for feat, txt in loader:
                feat, txt = feat.cuda(), txt.cuda()
                txt_len = torch.sum(txt != 0, dim=-1)
                loss = model(feat, max(txt_len)).sum()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # the lengths come back from the trainer's own method, as one element of the tuple it returns
            """
            import torch

            class Solver:
                def __init__(self):
                    self.model = Net().cuda()

                def fetch_data(self, data):
                    feat, txt = data
                    txt = txt.cuda()
                    return feat.cuda(), txt, torch.sum(txt != 0, dim=-1)

                def exec(self):
                    for data in self.loader:
                        feat, txt, txt_len = self.fetch_data(data)
                        loss = self.model(feat, max(txt_len)).sum()
                        loss.backward()
                        self.optimizer.step()
            """,
        ),
        Invalid(  # a hand-written gradient norm (LSTNet's `Optim.step`): one wait per parameter, every step
            """
            import math
            import torch

            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                grad_norm = 0
                for param in model.parameters():
                    grad_norm += math.pow(param.grad.data.norm(), 2)
                optimizer.step()
            """,
        ),
        Invalid(  # an accumulation guard whose period is an option that is 1 by default: every step
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--gradient_accumulation", type=int, default=1)
            args = parser.parse_args()
            accumulation = args.gradient_accumulation
            model = Net().cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            running_loss = 0.0
            for step, (x, y) in enumerate(loader):
                loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()) / accumulation
                loss.backward()
                if (step + 1) % accumulation == 0:
                    optimizer.step()
                    optimizer.zero_grad()
                    running_loss += loss.item()
            """,
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--gradient_accumulation", type=int, default=1)
            args = parser.parse_args()
            accumulation = args.gradient_accumulation
            model = Net().cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            running_loss = 0.0
            for step, (x, y) in enumerate(loader):
                loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()) / accumulation
                loss.backward()
                if (step + 1) % accumulation == 0:
                    optimizer.step()
                    optimizer.zero_grad()
                    running_loss += loss.detach()
            """,
        ),
        Invalid(  # a helper that one step calls syncs too: one finding for the step (CMGAN's trainer)
            """
            import torch

            class Trainer:
                def metric_loss(self, out, clean):
                    score = pesq(clean.cpu().numpy(), out.detach().cpu().numpy())
                    return self.discriminator(out.detach(), score)

                def train_step(self, noisy, clean):
                    out = self.model(noisy.cuda())
                    loss = (out - clean.cuda()).abs().mean()
                    loss.backward()
                    self.optimizer.step()
                    disc_loss = self.metric_loss(out, clean.cuda())
                    disc_loss.backward()
                    self.optimizer_disc.step()
                    return loss.item(), disc_loss.item()

                @torch.no_grad()
                def test_step(self, noisy, clean):
                    out = self.model(noisy.cuda())
                    return self.metric_loss(out, clean.cuda()).item()

                def train(self, loader):
                    for noisy, clean in loader:
                        self.train_step(noisy, clean)
            """,
        ),
        Invalid(  # a Hugging Face Trainer subclass: its compute_loss runs on every step, and so do its helpers
            """
            import torch
            from transformers import Trainer

            class PairTrainer(Trainer):
                def metrics(self, loss):
                    return {"loss": loss.detach().cpu()}

                def compute_loss(self, model, inputs, return_outputs=False):
                    chosen, rejected = model(**inputs).logits.chunk(2)
                    loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
                    self.store_metrics(self.metrics(loss))
                    return loss

            PairTrainer(model=model, args=args, train_dataset=data).train()
            """
        ),
        Invalid(  # a Lightning step's helper hands tensors to another method, which tests one's truth value
            """
            import torch
            import lightning as L

            class LM(L.LightningModule):
                def training_step(self, batch, batch_idx):
                    return self._step(batch, "train")

                def _step(self, batch, stage):
                    logits = self.model(batch["x"])
                    self.log(f"{stage}/acc", self.accuracy(logits, batch["y"]))
                    return torch.nn.functional.cross_entropy(logits, batch["y"])

                def accuracy(self, logits, labels):
                    mask = labels != -100
                    if mask.sum() == 0:
                        return torch.tensor(0.0, device=logits.device)
                    return (logits.argmax(-1) == labels)[mask].float().mean()

            L.Trainer(accelerator="gpu").fit(LM())
            """
        ),
        Invalid(  # Accelerate's `sync_gradients` is True on every optimizer step: no debugging switch
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator(mixed_precision="bf16")
            for batch in loader:
                with accelerator.accumulate(model):
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                if accelerator.sync_gradients:
                    progress.set_postfix(loss=loss.detach().item())
            """
        ),
        Invalid(  # a loss function handed to the step helper runs every step with it (Megatron's `forward_step_func`)
            """
            import torch
            from trainer_lib import run_step

            def masked_loss(model, batch):
                loss = (model(batch["x"].cuda()) - batch["y"].cuda()).pow(2) * batch["mask"].cuda()
                if batch["mask"].sum().item() > 0:
                    loss = loss.sum() / batch["mask"].sum()
                return loss

            def train(model, optimizer, loader):
                for batch in loader:
                    loss = run_step(model, batch, loss_fn=masked_loss)
                    loss.backward()
                    optimizer.step()
            """
        ),
        Invalid(  # TensorBoard turns a tensor into a number on the host; the learning rate is one already
            """
            import torch
            from torch.utils.tensorboard import SummaryWriter

            class Learner:
                def __init__(self, logdir):
                    self.writer = SummaryWriter(logdir)

                def update(self, batches):
                    for step, (x, y) in enumerate(batches):
                        loss = torch.nn.functional.mse_loss(self.net(x.cuda()), y.cuda())
                        self.writer.add_scalar("train/loss", loss, step)
                        self.writer.add_scalar("train/lr", self.optimizer.param_groups[0]["lr"], step)
                        self.optimizer.zero_grad()
                        loss.backward()
                        self.optimizer.step()
            """
        ),
        Invalid(  # Transformer-TTS: `add_scalars` with a dict of loss tensors (an `nn.L1Loss()` called), every step
            """
            import torch
            from torch.utils.tensorboard import SummaryWriter

            def main(loader, model, optimizer):
                writer = SummaryWriter()
                for step, (text, mel) in enumerate(loader):
                    out = model(text.cuda(non_blocking=True))
                    mel = mel.cuda(non_blocking=True)
                    mel_loss = torch.nn.L1Loss()(out, mel)
                    post_loss = torch.nn.L1Loss()(out.cumsum(1), mel)
                    loss = mel_loss + post_loss
                    loss.backward()
                    optimizer.step()
                    writer.add_scalars("training_loss", {"mel_loss": mel_loss}, step)
            """
        ),
        Invalid(  # Lightning hands `training_step` its batch on the GPU: checking its values waits for it
            """
            import lightning as L

            class Segmenter(L.LightningModule):
                def step(self, batch):
                    target = batch["target"]
                    assert target.min() >= 0, "labels must be non-negative"
                    return self.net(batch["image"], target)

                def training_step(self, batch, batch_idx):
                    return self.step(batch)
            """
        ),
        Invalid(  # a Callback's per-batch hook runs every step: a norm read per gradient waits each time (OminiControl)
            """
            import lightning as L

            class GradientLogger(L.Callback):
                def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                    total = 0.0
                    for _, param in pl_module.named_parameters():
                        if param.grad is not None:
                            total += param.grad.norm(2).item()
                    self.total = total

            trainer = L.Trainer(accelerator="gpu", callbacks=[GradientLogger()])
            """
        ),
        Valid(  # the same hook, every 100 steps
            """
            import lightning as L

            class GradientLogger(L.Callback):
                def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                    if trainer.global_step % 100 == 0:
                        norms = [p.grad.norm(2).item() for p in pl_module.parameters() if p.grad is not None]
                        pl_module.log("grad_norm", sum(norms))

            trainer = L.Trainer(accelerator="gpu", callbacks=[GradientLogger()])
            """
        ),
        Valid(  # a demo hook that returns early except every `demo_every` steps (stable-audio-tools)
            """
            import lightning as L

            class DemoCallback(L.Callback):
                def __init__(self, demo_every=2000):
                    self.demo_every = demo_every

                def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                    if (trainer.global_step - 1) % self.demo_every != 0:
                        return
                    print(outputs["loss"].item())

            trainer = L.Trainer(accelerator="gpu", callbacks=[DemoCallback()])
            """
        ),
        Invalid(  # the same early return, but the period defaults to 1: every step
            """
            import lightning as L

            class Monitor(L.Callback):
                def __init__(self, every=1):
                    self.every = every

                def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                    if batch_idx % self.every or module.kl is None:
                        return
                    self.kl = module.kl.cpu()

            trainer = L.Trainer(accelerator="gpu", callbacks=[Monitor()])
            """
        ),
        Valid(  # the steps between two logging steps skip the rest of the loop body
            """
            import torch
            for i, (x, y) in enumerate(loader):
                loss = model(x.cuda(), y.cuda())
                loss.backward()
                opt.step()
                if i % 100:
                    continue
                print(loss.item())
            """
        ),
        Invalid(  # d2l's loop: the loss is a tensor because `l.mean().backward()` runs on it
            """
            import torch

            def train_epoch(net, train_iter, loss, updater, metric):
                for X, y in train_iter:
                    X, y = X.cuda(), y.cuda()
                    l = loss(net(X), y)
                    updater.zero_grad()
                    l.mean().backward()
                    updater.step()
                    metric.add(float(l.sum()), y.numel())
            """
        ),
        Invalid(
            """
            import torch
            device = "cuda"
            for epoch in range(3):
                running_loss = 0.0
                for i, (x, y) in enumerate(loader):
                    loss = criterion(model(x.to(device)), y.to(device))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    running_loss += loss.item()
                    if i % 100 == 99:
                        print(f"[{epoch}, {i}] loss: {running_loss / 100:.3f}")
                        running_loss = 0.0
            """,
            fixed="""
            import torch
            device = "cuda"
            for epoch in range(3):
                running_loss = 0.0
                for i, (x, y) in enumerate(loader):
                    loss = criterion(model(x.to(device)), y.to(device))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    running_loss += loss.detach()
                    if i % 100 == 99:
                        print(f"[{epoch}, {i}] loss: {float(running_loss) / 100:.3f}")
                        running_loss = 0.0
            """,
        ),
        Invalid(  # two syncs in one step: one finding; its fix removes both
            """
            import torch

            def train_epoch(model, loader, optimizer):
                total, correct = 0.0, 0
                for x, y in loader:
                    x, y = x.cuda(), y.cuda()
                    out = model(x)
                    loss = torch.nn.functional.cross_entropy(out, y)
                    loss.backward()
                    optimizer.step()
                    total += loss.item() * x.size(0)
                    correct += (out.argmax(1) == y).sum().item()
                return total / len(loader.dataset), correct
            """,
            fixed="""
            import torch

            def train_epoch(model, loader, optimizer):
                total, correct = 0.0, 0
                for x, y in loader:
                    x, y = x.cuda(), y.cuda()
                    out = model(x)
                    loss = torch.nn.functional.cross_entropy(out, y)
                    loss.backward()
                    optimizer.step()
                    total += loss.detach() * x.size(0)
                    correct += (out.argmax(1) == y).sum()
                return float(total) / len(loader.dataset), float(correct)
            """,
        ),
        Invalid(  # summed over a meta-batch: one sync per outer step is left (and still reported)
            _META_STEP_FIXED.replace("error.detach()", "error.item()").replace("float(meta_error)", "meta_error"),
            fixed=_META_STEP_FIXED,
        ),
        Invalid(_META_STEP_FIXED),  # the fixed code: its per-outer-step read is the finding now, no fix
        Invalid(  # a name bound to a float is no tensor: only the .item() is a sync
            """
            import torch
            for k in range(100):
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                lossf = loss.item()
                print(f"{k} loss: {lossf:.4f}")
                print(lossf)
            """,
        ),
        Invalid(  # needed every step (progress bar, per-batch predictions): one finding, no fix
            """
            import torch
            for x, y in pbar:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                pbar.set_postfix(loss=loss.item())
                preds.append(model(x.cuda()).argmax(1).cpu())
                print(loss)
            """,
        ),
        Invalid(  # a sum read by a progress bar every step: `float(total)` there is no fix
            """
            import torch
            for i, (x, y) in enumerate(pbar):
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                for part in parts:
                    total += part.item()
                pbar.set_postfix(loss=total / (i + 1))
            """,
        ),
        Invalid(  # a sync the fix cannot remove stays every step (super_resolution prints
            # `loss.item()` each iteration): keeping the sum on the device would gain nothing, no fix
            """
            import torch
            for step, (x, y) in enumerate(loader):
                out = model(x.cuda())
                loss = criterion(out, y.cuda())
                loss.backward()
                optimizer.step()
                running += loss.item()
                pbar.set_postfix(acc=(out.argmax(1) == y.cuda()).float().mean().item())
                if step % 50 == 0:
                    log(running / 50)
            """,
        ),
        Invalid(  # a NaN check on the tensor is the sync; the .item() in the exit branch is not
            """
            import math
            import sys
            import torch
            for x, y in loader:
                loss = model(x.cuda()).sum()
                if not math.isfinite(loss):
                    print("loss is", loss.item())
                    sys.exit(1)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # hidden syncs: truth value, %-formatting, f-string of an expression, .tolist()
            """
            import torch

            def check(model, x):
                loss = model(x.cuda()).sum()
                loss.backward()
                if torch.isfinite(loss):
                    optimizer.step()

            def log_percent(model, x):
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                logger.info("loss %g" % loss)

            def log_fstring(model, x):
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                logger.info(f"loss {loss.mean()}")

            def keep_predictions(model, x):
                out = model(x.cuda())
                out.sum().backward()
                optimizer.step()
                predictions.extend(out.argmax(1).tolist())

            for x, y in loader:
                check(model, x)
                log_percent(model, x)
                log_fstring(model, x)
                keep_predictions(model, x)
            """,
            count=4,
        ),
        Invalid(  # the model's own forward reads a mask element by element: one sync per token, every step
            """
            import torch

            class Tagger(torch.nn.Module):
                def forward(self, ids, keep):
                    hidden = self.encoder(ids)
                    out = torch.zeros_like(hidden)
                    for b in range(hidden.size(0)):
                        n = 0
                        for t in range(hidden.size(1)):
                            if keep[b][t].item() == 1:
                                out[b][n] = hidden[b][t]
                                n += 1
                    return self.head(out)

            model = Tagger().cuda()
            for ids, keep, labels in loader:
                loss = criterion(model(ids.cuda(), keep.cuda()), labels.cuda())
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # a logger called every step hands each image to a helper that copies it to the host
            """
            import torch

            def to_picture(t):
                return (t[0].cpu().numpy() * 255).astype("uint8")

            class Board:
                def show(self, images):
                    for name, image in images.items():
                        self.window(name, to_picture(image))

            board = Board()
            for real, _ in loader:
                fake = gen(torch.randn(real.size(0), 64, device="cuda"))
                loss = critic(fake).mean()
                loss.backward()
                optimizer.step()
                board.show({"fake": fake})
            """,
        ),
        Invalid(  # a sync the user accepted (noqa) does not hide the next one in the step
            """
            import torch
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                history.append(loss.item())  # noqa: SF301
                print(loss)
            """,
        ),
        Invalid(  # a logging guard whose interval is 1 holds on every step
            """
            import torch
            log_every = 1
            def train(model, loader, optimizer):
                for step, (x, y) in enumerate(loader):
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    optimizer.step()
                    if step % log_every == 0:
                        print(f"step {step}: loss {loss.item():.4f}")
            """,
        ),
        Invalid(  # a trainer and its subclass each read the clipped norm: a run builds one of them, one finding
            """
            import torch

            class Trainer:
                def clip_gradient(self):
                    return torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0).item()

                def train(self, loader):
                    for x, y in loader:
                        self.model(x.cuda()).sum().backward()
                        self.history.append(self.clip_gradient())
                        self.optimizer.step()

            class ShardedTrainer(Trainer):
                def clip_gradient(self):
                    return self.model.clip_grad_norm_(1.0).item()
            """,
        ),
        Invalid(  # a property that reads a buffer with `.item()`, read at every decoder step (Tacotron's `self.r`)
            """
            import torch
            import torch.nn as nn

            class Tacotron(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.register_buffer("r_buffer", torch.tensor(2))
                    self.cell = nn.GRUCell(8, 8)

                @property
                def r(self):
                    return self.r_buffer.item()

                def forward(self, x, steps):
                    frames = []
                    h = torch.zeros_like(x)
                    for t in range(steps):
                        h = self.cell(x, h)
                        frames.extend([h] * self.r)
                    return torch.stack(frames).sum()

            model = Tacotron().cuda()
            for x in loader:
                model(x.cuda(), 100).backward()
                optimizer.step()
            """,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._loads: dict[str, list[_Load]] = {}
        self._not_loads: set[int] = set()
        self._candidates: list[_Candidate] = []
        # `self.r` read where `r` may be a property: (where it goes among the candidates, the read)
        self._self_reads: list[tuple[int, _Candidate]] = []
        self._stores: set[int] = set()
        self._properties = False  # the file defines a `@property`
        self._statement: cst.SimpleStatementLine | None = None
        # a step's first sync -> the overrides of its method that sync too (`FSDPTrainer.clip_gradient`)
        self._overriding: dict[int, list[tuple[cst.CSTNode, list[_Sync]]]] = {}
        # a step's first sync (where its finding is) -> a sync in a loop over elements; how many times the
        # step waits for the GPU, and the helpers of other files it calls that wait
        self._looped: dict[int, tuple[str, cst.CSTNode]] = {}
        self._waits: dict[int, tuple[int, list[str]]] = {}
        self._metrics: dict[int, list[str]] = {}  # the metrics a step computes on host copies of its tensors

    # ------------------------------------------------------------------ collection
    def _candidate(self, node: cst.CSTNode, kind: str) -> None:
        self._candidates.append(_Candidate(node, self.ctx.stack, self.branches, self._statement, kind))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._statement = node

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self._statement = None

    def visit_Call(self, node: cst.Call) -> None:
        self._candidate(node, "call")

    def visit_FormattedStringExpression(self, node: cst.FormattedStringExpression) -> None:
        self._candidate(node.expression, "f-string")

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if isinstance(node.operator, cst.Modulo) and is_string(node.left):
            self._candidate(node, "%")

    def visit_If(self, node: cst.If) -> None:
        self._candidate(node.test, "if")

    def visit_While(self, node: cst.While) -> None:
        self._candidate(node.test, "while")

    def visit_Assert(self, node: cst.Assert) -> None:
        self._candidate(node.test, "assert")

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._candidate(node.test, "if ... else")

    def visit_Decorator(self, node: cst.Decorator) -> None:
        if isinstance(node.decorator, cst.Name) and node.decorator.value == "property":
            self._properties = True

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._not_loads.add(id(node.attr))
        if isinstance(node.value, cst.Name) and node.value.value == "self" and id(node) not in self._stores:
            self._self_reads.append((len(self._candidates), _Candidate(node, self.ctx.stack, self.branches,
                                                                       self._statement, "property")))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._not_loads.add(id(node.keyword))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._stores.add(id(node.target))
        for name in _names_in(node.target):
            self._not_loads.add(id(name))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._stores.add(id(node.target))
        self._not_loads.add(id(node.target))

    def visit_Param(self, node: cst.Param) -> None:
        self._not_loads.add(id(node.name))

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self._not_loads:
            self._loads.setdefault(node.value, []).append(_Load(node, self.ctx.stack, self.branches))

    # ------------------------------------------------------------------ decisions
    @cached_property
    def tensors(self) -> Tensors:
        return tensors(self.ctx)

    def finish(self) -> None:
        ctx = self.ctx
        steps: dict[cst.CSTNode | None, list[_Sync]] = {}
        helpers: dict[cst.CSTNode | None, list[str]] = {}
        for candidate in self._with_property_reads():
            if not ctx.is_hot(candidate.stack) or _accepted(candidate.statement):
                continue
            scope = ctx.step_scope(candidate.stack)
            if rare_path(ctx, candidate.branches, scope) is not None:
                continue
            scope = ctx.iteration_scope(candidate.stack)  # a GAN's inner discriminator loop: the same iteration
            if candidate.statement is not None and in_no_run(ctx, candidate.statement, candidate.stack):
                continue  # `if args.print_loss:` with a `store_true` flag that no launch command passes
            sync = self._sync(candidate)
            call = candidate.node if sync is None and candidate.kind == "call" else None
            site = ctx.site_of(call) if isinstance(call, cst.Call) else None
            if site is not None:
                callee = ctx.project_callee(site)
                if callee is not None and callee.syncs:  # `acc += get_accuracy(out, y)` of a metrics module
                    helpers.setdefault(scope, []).append(_code(candidate.node.func))  # type: ignore[attr-defined]
            if sync is not None:
                sync.statement = candidate.statement
                sync.loop = element_loop(ctx, candidate.stack, candidate.statement, candidate.node)
                if sync.loop is not None:  # `valid_ids[i][j].item()` in a loop over a batch's tokens in `forward`
                    sync.message += f", once per pass of the Python loop `{_loop_head(sync.loop)}`"
                steps.setdefault(scope, []).append(sync)
        steps = self._callers_steps(steps)
        overrides: dict[cst.CSTNode | None, list[cst.CSTNode]] = {}  # a method -> its overrides that sync too
        for scope in steps:
            base = overridden_method(ctx, scope)
            if base is not scope and base in steps and scope is not None:
                overrides.setdefault(base, []).append(scope)
        for scope, syncs in steps.items():
            if any(scope in replacing for replacing in overrides.values()):
                continue  # told with the method it overrides: a run calls one or the other
            self._overriding[id(syncs[0].node)] = [(override, steps[override]) for override in overrides.get(scope, [])]
            self._waits[id(syncs[0].node)] = (self._count_waits(syncs) + len(helpers.get(scope, ())), helpers.get(scope, []))
            metrics = (host_metric(ctx, sync.statement, sync.node) for sync in syncs)
            self._metrics[id(syncs[0].node)] = list(dict.fromkeys(m for m in metrics if m is not None))
            self._report_step(syncs)

    def _callers_steps(self, steps: dict[cst.CSTNode | None, list[_Sync]]) -> dict[cst.CSTNode | None, list[_Sync]]:
        """The syncs of a helper of the file that one step calls (CMGAN's `train_step` calling
        `calculate_discriminator_loss`) join that step's: one step, one finding. A helper that
        several steps call keeps its own."""
        merged: dict[cst.CSTNode | None, list[_Sync]] = {}
        for scope, syncs in steps.items():
            target = scope
            for _ in range(3):  # a helper of a helper (a function that takes a step of its own is a step)
                if target is None or target in self.ctx.step_functions:
                    break
                callers = self.ctx.local_callers(target)
                scopes = {self.ctx.step_scope(site.stack) for site in callers if self.ctx.is_hot(site.stack)}
                if len(scopes) != 1 or None in scopes:
                    break  # (calls outside the training loop, an evaluation's, do not count)
                target = scopes.pop()
            merged.setdefault(target, []).extend(syncs)
        return merged

    def _count_waits(self, syncs: list[_Sync]) -> int:
        """How many times the step waits for the GPU: a sync that reads a value already computed
        (`float(loss)`, `loss_dice.item()`) in the statement of the previous sync or the one right
        after it waits for nothing more (the queue is already drained); any other starts a wait."""
        waits = 0
        previous: cst.SimpleStatementLine | None = None
        for sync in syncs:
            if not (_reads_ready_value(sync.node) and self._next_to(previous, sync.statement)):
                waits += 1
            previous = sync.statement
        return waits

    def _next_to(self, previous: cst.SimpleStatementLine | None, statement: cst.SimpleStatementLine | None) -> bool:
        if previous is None or statement is None:
            return False
        if previous is statement:
            return True
        block = enclosing_block(self.ctx, statement)
        if block is None or not any(node is previous for node in block):
            return False
        index = next(i for i, node in enumerate(block) if node is statement)
        return index > 0 and block[index - 1] is previous

    def _with_property_reads(self) -> list[_Candidate]:
        """The candidates, with the reads of `self.<property>` of the class's properties that
        wait for the GPU (`return self.decoder.r.item()`) in their place in the file."""
        syncing = self._syncing_properties
        reads = [(at, read) for at, read in self._self_reads
                 if (id(self.ctx.class_of(read.stack)), read.node.attr.value) in syncing]  # type: ignore[attr-defined]
        if not reads:
            return self._candidates
        merged: list[_Candidate] = []
        taken = 0
        for at, read in reads:
            merged.extend(self._candidates[taken:at])
            merged.append(read)
            taken = at
        merged.extend(self._candidates[taken:])
        return merged

    @cached_property
    def _syncing_properties(self) -> dict[tuple[int, str], _Sync]:
        """(class, property name) -> the sync its getter returns: a `@property` whose `return`
        converts a tensor to a Python number (`self.decoder.r.item()`)."""
        found: dict[tuple[int, str], _Sync] = {}
        if not self._properties or not self._self_reads:
            return found
        for site in self.ctx.calls:
            function = self.ctx.function_of(site.stack)
            if function is None or not _is_property(function) or not isinstance(site.statement, cst.SimpleStatementLine) \
                    or not any(isinstance(small, cst.Return) for small in site.statement.body):
                continue
            cls = self.ctx.class_of(site.stack)
            key = (id(cls), function.name.value)
            if cls is None or key in found:
                continue
            sync = self._call_sync(site.node, site.stack)
            if sync is not None:
                found[key] = sync
        return found

    def _property_sync(self, read: cst.Attribute, stack: Stack) -> _Sync | None:
        getter = self._syncing_properties.get((id(self.ctx.class_of(stack)), read.attr.value))
        if getter is None:
            return None
        what = f"`self.{read.attr.value}`"
        return _Sync(read, f"{what} (a property returning {getter.label})",
                     f"{what} reads a property that returns {getter.label}: in the training loop it makes the CPU wait "
                     "for the GPU every time it is read",
                     no_fix_reason="the property returns a Python number: keep the value as one where it is set, or read "
                     "it once before the loop")

    def _sync(self, candidate: _Candidate) -> _Sync | None:
        node, stack, kind = candidate.node, candidate.stack, candidate.kind
        if isinstance(node, cst.Call) and kind == "call":
            return self._call_sync(node, stack)
        if isinstance(node, cst.Attribute) and kind == "property":
            return self._property_sync(node, stack)
        if isinstance(node, cst.BinaryOperation) and kind == "%":
            tensor = next((e for e in _operands(node.right) if self.tensors.is_tensor(e, stack)), None)
            return None if tensor is None else self._formatting(node, tensor, "with `%`")
        assert isinstance(node, cst.BaseExpression)
        if kind == "f-string":
            return self._formatting(node, node, "in an f-string") if self.tensors.is_tensor(node, stack) else None
        tested = self.tensors.truth_tested(node, stack)
        if tested is None or self.tensors.made_on_host(tested, stack):
            return None
        what = _code(tested)
        return _Sync(tested, f"`{kind}` on `{what}`",
                     f"`{kind}` on tensor `{what}` in the training loop waits for the GPU every step (Python needs its truth value)",
                     no_fix_reason="the value decides what the step does")

    def _formatting(self, node: cst.CSTNode, tensor: cst.CSTNode, how: str) -> _Sync:
        what = f"`{_code(tensor)}`"
        return _Sync(node, f"{what} formatted {how}",
                     f"formatting tensor {what} {how} in the training loop copies it to the host every step",
                     no_fix_reason="the value is formatted every step")

    def _call_sync(self, call: cst.Call, stack: Stack) -> _Sync | None:
        func = call.func
        qualified = self.ctx.qualname(func)
        if qualified is None and isinstance(func, cst.Attribute):
            return self._method_sync(call, func, stack)
        arguments = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        if qualified is not None:  # an imported function: `math`'s convert a tensor to a float
            if qualified.startswith("math.") and arguments and self.tensors.is_tensor(arguments[0], stack):
                label = f"`{qualified}({_code(arguments[0])})`"
                return _Sync(call, label, f"{label} in the training loop converts a tensor to a Python number, waiting for the GPU every step",
                             no_fix_reason="the value is needed every step")
            return None
        name = dotted_name(func)
        if name in HOST_CONVERSIONS and arguments and self.tensors.is_tensor(arguments[0], stack):
            label = f"`{name}({_code(arguments[0])})`"
            return _Sync(call, label, f"{label} of a tensor in the training loop waits for the GPU every step",
                         no_fix_reason="the value is needed every step")
        if name in ("max", "min", "sorted") and len(arguments) == 1 and not call.args[0].star \
                and self.tensors.is_tensor(arguments[0], stack) and not self.tensors.batches.is_host_batch(arguments[0], stack):
            label = f"`{name}({_code(arguments[0])})`"  # Python compares the elements: a `bool()` of each
            return _Sync(call, label, f"{label} of a tensor in the training loop reads its elements to the host one "
                         "by one, waiting for the GPU every step", no_fix_reason="the value is needed every step")
        if name == "print":
            tensor = next((arg for arg in arguments if self.tensors.is_tensor(arg, stack)), None)
            if tensor is not None:
                return _Sync(call, f"`print({_code(tensor)})`",
                             f"printing tensor `{_code(tensor)}` in the training loop waits for the GPU every step",
                             no_fix_reason="the value is printed every step")
        return None

    def _method_sync(self, call: cst.Call, func: cst.Attribute, stack: Stack) -> _Sync | None:
        method, receiver = func.attr.value, func.value
        if method == "format" and is_string(receiver):
            tensor = next((arg.value for arg in call.args if self.tensors.is_tensor(arg.value, stack)), None)
            return None if tensor is None else self._formatting(call, tensor, "with `.format()`")
        if method == "to":
            if call.args and call.args[0].keyword is None and is_cpu_device(self.ctx, call.args[0].value, stack):
                if not self.tensors.batches.is_host_batch(receiver, stack) and not has_sync_before(receiver):
                    return _Sync(call, "`.to(\"cpu\")`",
                                 "`.to(\"cpu\")` in the training loop copies to the host and waits for the GPU every step",
                                 no_fix_reason="the host copy is used every step")
            return None
        if method in ("add_scalar", "add_scalars"):
            return self._logged_tensor(call, receiver, stack)
        if method not in SYNC_METHODS or call.args:
            return None
        if self.tensors.batches.is_host_batch(receiver, stack) or has_sync_before(receiver) \
                or is_library_value(self.ctx, receiver) or self.tensors.made_on_host(receiver, stack):
            return None
        site = self.ctx.site_of(call)
        if site is not None and feeds_environment(self.ctx, site):
            return None  # an action for `env.step()`: the environment needs it on the host
        what = f"`{_short(call)}`"
        message = f"{what} in the training loop makes the CPU wait for the GPU every step"
        if method != "item":
            return _Sync(call, what, message, no_fix_reason="the host copy is used every step")
        fix, reason = self._item_fix(call, receiver, stack)
        return _Sync(call, what, message, fix=fix, no_fix_reason=reason)

    def _logged_tensor(self, call: cst.Call, writer: cst.BaseExpression, stack: Stack) -> _Sync | None:
        """`writer.add_scalar("loss", loss, step)`: TensorBoard turns the tensor into a number on the
        host; so does `writer.add_scalars("loss", {"mel": mel_loss, ...}, step)` for each tensor of
        its dict (Transformer-TTS)."""
        site = self.ctx.site_of(call)
        many = isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_scalars"
        value = find_argument(self.ctx, site, "tag_scalar_dict" if many else "scalar_value", 1) if site is not None else None
        if value is None or value.node is None or not is_summary_writer(self.ctx, writer, stack):
            return None
        logged = value.node
        if many:  # the first tensor among the dict's values
            logged = next((element.value for element in value.node.elements if isinstance(element, cst.DictElement)
                           and self.tensors.is_tensor(element.value, stack)), None) \
                if isinstance(value.node, cst.Dict) else None
            if logged is None:
                return None
        elif not self.tensors.is_tensor(logged, stack):
            return None
        value = replace(value, node=logged)
        label = f"`{_code(writer)}.{call.func.attr.value}(..., {_code(value.node)})`"  # type: ignore[attr-defined]
        return _Sync(call, label, f"{label} in the training loop copies tensor `{_code(value.node)}` to the host for "
                     "TensorBoard and waits for the GPU every step",
                     no_fix_reason="the writer needs the number: log every N steps, or add up the values on the device "
                     "and write their mean at the logging point")

    # ------------------------------------------------------------------ the finding of a step
    def impact_here(self, finding: Finding) -> Estimate | None:
        generation = generation_in_step(self.ctx)
        if generation is not None:
            return Estimate(Impact.LOW, f"each step generates its samples first (`{generation}`): decoding waits for "
                                        "the GPU at every token already")
        looped = self._looped.get(id(finding.node))
        if looped is not None:
            iterable = loop_iterable(looped[1])
            over = f"a loop over `{_code(iterable)}`" if iterable is not None else "a `while` loop"
            return Estimate(Impact.HIGH, f"{looped[0]} syncs in {over} inside the step: once per element, many times "
                                         "per step")
        large = large_model(self.ctx, Impact.LOW)
        if large is not None:
            return large
        waits, helpers = self._waits.get(id(finding.node), (1, []))
        metrics = self._metrics.get(id(finding.node), [])
        if waits + bool(metrics) >= _MANY_WAITS:
            called = f" ({len(helpers)} in the helpers it calls: {_name_all([f'`{h}`' for h in helpers])})" if helpers else ""
            computed = f", then the CPU computes {_name_all([f'`{m}`' for m in metrics])} on host copies" if metrics else ""
            return Estimate(Impact.HIGH, f"{waits} separate waits for the GPU in one step{called}{computed}")
        return None

    def _report_step(self, syncs: list[_Sync]) -> None:
        for sync in syncs:
            if sync.loop is not None:
                self._looped[id(syncs[0].node)] = (sync.label, sync.loop)
                break
        first, others = syncs[0], syncs[1:]
        message = first.message
        if others:
            message += f"; the same step also syncs at {_name_all([sync.label for sync in others])}"
        for override, replacing in self._overriding.get(id(first.node), []):  # `FSDPTrainer.clip_gradient`
            message += (f"; `{owner_name(self.ctx, override)}`, which overrides it, syncs at "
                        f"{_name_all([sync.label for sync in replacing])}")
        fixes = [sync.fix for sync in syncs if sync.fix is not None]
        if not fixes:
            self.report(first.node, message, no_fix_reason=first.no_fix_reason)
            return
        left = [sync.label for sync in syncs if sync.fix is None]
        if left:  # the step would wait there anyway: the fix would gain nothing (super_resolution's print)
            self.report(first.node, message, no_fix_reason=(
                f"{_name_all(left)} also sync{'s' if len(left) == 1 else ''} every step, so keeping the others on the "
                "device would not remove the wait: log every N steps to drop them all"))
            return
        notes = [fix.note for fix in fixes if fix.note]
        title = f"{self.fix_title} ({'; '.join(notes)})" if notes else self.fix_title
        self.report(first.node, message, fix_ops=_fix_ops(fixes), fix_title=title)

    # ------------------------------------------------------------------ the mechanical fix
    def _item_fix(self, call: cst.Call, receiver: cst.BaseExpression, stack: Stack) -> tuple[_ItemFix | None, str | None]:
        site = self.ctx.site_of(call)
        statement = site.statement if site is not None else None
        small = statement.body[0] if statement is not None and len(statement.body) == 1 else None
        if not (
            isinstance(small, cst.AugAssign)
            and isinstance(small.operator, cst.AddAssign)
            and isinstance(small.target, cst.Name)
            and _only_arithmetic_around(small.value, call)
        ):
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
                return None, f"`{small.targets[0].target.value}` is used every step, not only summed for logging"
            return None, "the value is used every step, not only summed for logging"
        total = small.target.value
        reads = self._reads_of(total, stack, exclude=small)
        if isinstance(reads, str):
            return None, reads
        loads, outer = reads
        note = f"`{total}` is still read once per outer step" if outer else None
        return _ItemFix(call, _needs_no_detach(receiver), [load.node for load in loads], note), None

    def _reads_of(self, name: str, stack: Stack, exclude: cst.AugAssign) -> tuple[list[_Load], bool] | str:
        """Reads of ``name`` in the same function and whether one is once per outer step (a
        meta-learning step summing over tasks); a reason when one runs every step."""
        ctx = self.ctx
        function = ctx.function_of(stack)
        scope = ctx.step_scope(stack)
        reads, outer = [], False
        for load in self._loads.get(name, ()):
            if ctx.function_of(load.stack) is not function or _inside(exclude, load.node):
                continue
            if ctx.is_hot(load.stack):
                where = ctx.step_scope(load.stack)
                if rare_path(ctx, load.branches, where) is None:
                    if where is scope or not any(frame.node is where for frame in stack):
                        return f"`{name}` is read every step: `float({name})` there would sync as often"
                    outer = True
            reads.append(load)
        return reads, outer


def _reads_ready_value(node: cst.CSTNode) -> bool:
    """Does the sync read a tensor the step already computed (`loss.item()`, `float(loss)`,
    `print(self.loss)`), rather than launch work first (`(out.argmax(1) == y).sum().item()`,
    `bool(loss == 0)`)?"""
    if isinstance(node, cst.Call):
        func = node.func
        if isinstance(func, cst.Attribute) and dotted_name(_without_no_work(func.value)) is not None:
            return not node.args or func.attr.value == "to"
        args = [arg.value for arg in node.args if arg.keyword is None and not arg.star]
        return bool(args) and dotted_name(args[0]) is not None
    return dotted_name(node) is not None  # type: ignore[arg-type]


def _without_no_work(node: cst.BaseExpression) -> cst.BaseExpression:
    """`loss` for `loss.detach()`: methods that queue no GPU work read the same ready value."""
    while (isinstance(node, cst.Call) and not node.args and isinstance(node.func, cst.Attribute)
           and node.func.attr.value in NO_WORK_METHODS):
        node = node.func.value
    return node


def _loop_head(loop: cst.CSTNode) -> str:
    """`for j in range(max_len)` (also a comprehension's), or `while ...` for a while loop."""
    if isinstance(loop, cst.While):
        return f"while {_code(loop.test)}"
    head = loop.for_in if not isinstance(loop, cst.For) else loop
    return f"for {_code(head.target)} in {_code(head.iter)}"

def _name_all(labels: list[str]) -> str:
    """`a`, `b` (x2) and 3 more: each label once, with how often it occurs."""
    counts = Counter(labels)
    named = [f"{label} (x{counts[label]})" if counts[label] > 1 else label for label in counts]
    text = ", ".join(named[:_NAMED_AT_MOST])
    return text + (f" and {len(named) - _NAMED_AT_MOST} more" if len(named) > _NAMED_AT_MOST else "")


def _is_property(function: cst.FunctionDef) -> bool:
    """A getter run on every read (not `functools.cached_property`, which runs once)."""
    return any(isinstance(decorator.decorator, cst.Name) and decorator.decorator.value == "property"
               for decorator in function.decorators)


def _accepted(statement: cst.SimpleStatementLine | None) -> bool:
    """A sync marked `# noqa: SF301` is accepted: it must not hide the next one of its step."""
    comment = statement.trailing_whitespace.comment if statement is not None else None
    return comment is not None and line_suppresses(comment.value, SyncInLoop.code)


def _fix_ops(fixes: list[_ItemFix]) -> list[FixOp]:
    ops: list[FixOp] = [Transform(fix.call, _drop_item(fix.keep_tensor)) for fix in fixes]
    wrapped: set[int] = set()
    for fix in fixes:
        for read in fix.reads:
            if id(read) not in wrapped:  # two sums into one total share its reads
                wrapped.add(id(read))
                ops.append(Transform(read, _wrap_in_float))
    return ops


def _drop_item(keep_tensor: bool):  # type: ignore[no-untyped-def]
    def rewrite(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
        if keep_tensor:
            return node.func.value
        return node.with_changes(func=node.func.with_changes(attr=cst.Name("detach")))

    return rewrite


def _code(node: cst.CSTNode, limit: int = 40) -> str:
    """The code of ``node`` on one line; a long one keeps its end (`...float().mean().item()`)."""
    text = " ".join(code_of(node).split())
    return text if len(text) <= limit else "..." + text[3 - limit:]


def _short(call: cst.Call, limit: int = 40) -> str:
    """A method chain as its reader knows it: `loss.item()`, and when long, its last calls on
    a placeholder (`(...).float().mean().item()`)."""
    text = _code(call, limit=10_000)
    if len(text) <= limit:
        return text
    parts: list[str] = []
    node: cst.BaseExpression = call
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and len(parts) < 3:
        parts.insert(0, f".{node.func.attr.value}({'' if not node.args else '...'})")
        node = node.func.value
    base = dotted_name(node) if not isinstance(node, cst.Call) else None
    return (base or "(...)") + "".join(parts)


def _operands(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The values `%` formats: one, or the elements of a tuple."""
    if isinstance(node, cst.Tuple):
        return [element.value for element in node.elements]
    return [node]


def _names_in(target: cst.BaseExpression) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _names_in(element.value)]
    return []


def _only_arithmetic_around(value: cst.BaseExpression, call: cst.Call) -> bool:
    """`x.item()` or `x.item() * n`: replacing .item() keeps the expression meaningful."""
    if value is call:
        return True
    if isinstance(value, cst.BinaryOperation):
        return _only_arithmetic_around(value.left, call) or _only_arithmetic_around(value.right, call)
    return False


def _needs_no_detach(receiver: cst.BaseExpression) -> bool:
    """Comparisons (`(pred == y).sum()`) carry no gradient: dropping `.item()` is enough."""
    return any(isinstance(node, cst.Comparison) for node in walk_expression(receiver))


def _inside(outer: cst.CSTNode, node: cst.CSTNode) -> bool:
    return any(child is node for child in walk_expression(outer))


def _wrap_in_float(node: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(node, cst.BaseExpression)
    return cst.Call(func=cst.Name("float"), args=[cst.Arg(node.with_changes(lpar=[], rpar=[]))],
                    lpar=node.lpar, rpar=node.rpar)
