from __future__ import annotations

from collections import defaultdict
from functools import cached_property

import libcst as cst

from speedfix.engine.findings import Applicability, FixOp, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.engine.wording import name_all
from speedfix.fixes.codegen import reference
from speedfix.model.arguments import find_argument, literal_bool
from speedfix.model.autograd import (called_without_grad, feeds_environment, only_detached, outputs_leave_autograd,
                                     runs_network)
from speedfix.model.flow import comes_before
from speedfix.model.frameworks import lightning_hook_without_grad
from speedfix.model.forward import LOSS_NAME, calls_model, calls_model_with_grad, is_local_object, with_statement
from speedfix.model.frames import FrameKind, Stack, class_of_method, nearest_loop
from speedfix.model.index import CallSite, LoopInfo, entered
from speedfix.model.loaders import stops_at_once
from speedfix.model.networks import optimized_modules
from speedfix.model.patterns import is_dataloader, unwrap_iterable
from speedfix.model.rl import is_acting_function
from speedfix.model.scale import evaluation_script, named_for_evaluation, runs_once
from speedfix.project.steps import is_optimizer_name
from speedfix.rules._impact import Estimate, Finding, Impact, small_model
from speedfix.syntax.blocks import enclosing_block
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import walk_expression

GRAD_MODES = tuple(
    f"{module}.{name}"
    for module in ("torch", "torch.autograd", "torch.autograd.grad_mode")
    for name in ("no_grad", "inference_mode", "set_grad_enabled", "enable_grad")
)
# Calls and attributes inside a loop that need autograd there (or after it).
_NEEDS_GRAD_METHODS = frozenset({"backward", "requires_grad_", "retain_grad", "zero_grad"})
_NEEDS_GRAD_ATTRIBUTES = frozenset({"grad", "requires_grad"})
_NEEDS_GRAD_CALLS = ("torch.autograd.grad", "torch.autograd.backward")
# Words of a function's name (split at `_`) that say it evaluates: `evaluate`, `run_validation`,
# `val_epoch`, `test`, `predict`, `inference`.
_EVAL_PREFIXES = ("eval", "valid", "test", "predict", "infer")


class EvalWithoutNoGrad(Rule):
    """
    ## What it does
    Finds evaluation loops that run the model with autograd on: a loop over a DataLoader that
    calls the model (itself, or through a method of its class that runs it outside
    `torch.no_grad()`: `self.eval_step(batch)`), with no `backward()`, optimizer step or gradient
    access in it, in a function
    named like `evaluate`/`validate`/`test`/`predict` or after `model.eval()` (in the function, or
    before every call of it in the file: `model.eval()`, then `extract(loader, model)`), and no
    `torch.no_grad()`/`torch.inference_mode()` around it (as a `with`, a decorator of the
    function or around the call of the function, also when another scanned file makes that call:
    `with torch.no_grad(): validate(...)` in the training script; for a method, a call of its
    name under no_grad on an object whose class that file cannot name, such as an agent built
    from a config: `self.agent.act(obs)`). A loop over a loader named for evaluation
    (`test_loader`, `val_dl`) counts too, whatever its function is called. In a script that
    never trains, a loop over batches it cuts itself (`for step in range(len(samples) //
    batch_size):`) after `model.eval()` counts too, when it calls the model (`model(x)`,
    `model.forward(x)`) and keeps an output in autograd (`total_loss += loss`); one that keeps
    only host values or detached copies is left to the check below.

    Also finds a forward pass, run again and again (in a loop, in a function called in one, in
    a policy's `act`/`select_action`, in a trainer class's per-batch evaluation method beside the
    step method another file's loop calls: `trainer.eval(x, y)` after `model.eval()`), whose
    outputs only leave as host values, indices or detached copies: acting in reinforcement
    learning (`q_network(obs)` whose argmax goes to `env.step`), samples saved as images (`save_image(G(z))`), a GAN's generator run again for the
    discriminator step whose output is only used `.detach()`ed. An output that is stored, returned,
    handed to unknown code or reaches a `backward()` is never reported (REINFORCE keeps each
    action's log-probability for its loss).

    Also finds the call that evaluates with a loop shared with training: a function whose loop
    over a loader trains only under `if not cross_valid:` (every backward, optimizer step and
    gradient read of the function under that test of one of its parameters), called with
    `cross_valid=True` outside `torch.no_grad()` (Conv-TasNet's `_run_one_epoch`); the fix runs
    that call under `torch.no_grad()`.

    Not reported: a loop whose models are frozen whole (`model.requires_grad_(False)`, in its
    function or in every caller that hands the model to it): with no parameter that needs a
    gradient, and inputs that need none, autograd records nothing.

    Lightning runs its validation, test and predict loops with autograd off, hooks included
    (`validation_step`, `on_validation_epoch_end`, `on_test_batch_end` of a LightningModule or
    Callback): code there is never reported.

    ## Why is this bad?
    `model.eval()` switches dropout and batch norm to inference behaviour; it does not turn
    autograd off. Every forward pass then records its graph and keeps the activations that a
    backward pass would need, until the outputs are dropped: more memory (often more than
    training itself, since evaluation batches are larger) and the bookkeeping of every op.
    PyTorch's tuning guide lists `torch.no_grad()` for validation and inference.

    ## Example
    ```python
    def evaluate(model, loader):
        model.eval()
        correct = 0
        for x, y in loader:
            correct += (model(x.cuda()).argmax(1) == y.cuda()).sum().item()
        return correct
    ```

    ## Use instead
    ```python
    def evaluate(model, loader):
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in loader:
                correct += (model(x.cuda()).argmax(1) == y.cuda()).sum().item()
        return correct
    ```

    ## Fix safety
    Unsafe: tensors made in the loop no longer carry a graph, so code that later runs
    `backward()` through them (gradient-based attribution, outputs reused in a loss) raises. A
    loop that touches `.grad`/`requires_grad`, calls `torch.autograd.grad`, steps an optimizer,
    or is followed by a `backward()` in the same function is not reported. The fix wraps the loop
    in `torch.no_grad()` rather than `torch.inference_mode()`: inference mode saves a little more
    (no version counters), but the tensors it makes can never be used by autograd or modified in
    place outside it, which raises where a metric or a cached output is reused later; `no_grad`
    gives the main saving (no graph, no saved activations) without that risk. A forward whose
    outputs only go to the host gets `with torch.no_grad():` around its statement.

    ## Impact
    High: without `no_grad()` evaluation builds the autograd graph and keeps the activations of
    every batch, which costs memory and time. Medium for a small model (under 10M parameters,
    counted from the layers it builds, or given by width options of 256 or less), and for
    a loop that runs once in a script that trains (a test pass after the epochs, at the top of
    the script or in the function that runs them): one pass costs a fraction of the run, while a
    validation loop inside the epoch loop (or in a function called from it) pays every epoch.
    Low when both hold. A loop in a function whose callers the file does not show keeps the
    usual impact.

    ## Measured effect
    Mostly memory: fairchem's validation fell from 3.3-8.1 GB to 1.1-2.3 GB of allocated GPU
    memory with `no_grad`, which lets evaluation use larger batches; the time saved is the
    autograd bookkeeping of each op (the tuning guide: it "accelerates execution").
    Sources: https://github.com/facebookresearch/fairchem/pull/199,
    https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    """

    impact = "high"
    code = "SF702"
    name = "eval-without-no-grad"
    summary = "Evaluation loop without `torch.no_grad()` / `torch.inference_mode()`"
    severity = Severity.WARNING
    requires = (b"val", b"test", b"pred", b"infer", b"step(", b"action")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.EXACT
    fix_title = "Run the evaluation loop under `torch.no_grad()`"
    effect = "No autograd graph or saved activations in evaluation: fairchem's fell from up to 8 GB to 2 GB."

    VALID = [
        Valid(  # SR-GNN: the output read through a lambda goes on into the loss (no host-only forward)
            """
            import torch
            from torch import nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(8, 8)

                def forward(self, x):
                    return self.fc(x)

            net = Net().cuda()
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for x in loader:
                hidden = net(x.cuda(non_blocking=True))
                get = lambda i: hidden[i]
                loss = torch.stack([get(i) for i in range(4)]).sum()
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # trlx: the loop's only forward pass is a method of the class that runs it under no_grad
            """
            import torch

            class Trainer:
                def generate_eval(self, input_ids):
                    with torch.no_grad():
                        return self.model.generate(input_ids=input_ids.cuda())

                def evaluate(self):
                    self.model.eval()
                    samples = []
                    for prompts in self.eval_dataloader:
                        samples.append(self.generate_eval(prompts["input_ids"]))
                    return samples
            """
        ),
        Valid(  # vall-e: the module keeps its losses on itself; the step drops the outputs and steps `model.loss`
            """
            import torch

            model = AR(1024).cuda()
            optimizer = torch.optim.Adam(model.parameters())
            for step in range(100):
                optimizer.zero_grad()
                _ = model(text_list, proms_list, resp_list)
                sum(model.loss.values()).backward()
                optimizer.step()
            """,
        ),
        Valid(  # MTGNN: the forward pass under no_grad; the loss modules handed in (`nn.MSELoss`) have no weights
            """
            import torch
            import torch.nn as nn

            def evaluate(loader, model, evaluateL2, evaluateL1):
                model.eval()
                total = total_l1 = 0
                for X, Y in loader:
                    with torch.no_grad():
                        output = model(X.cuda())
                    total += evaluateL2(output, Y.cuda()).item()
                    total_l1 += evaluateL1(output, Y.cuda()).item()
                return total, total_l1

            model = Net().cuda()
            evaluateL2 = nn.MSELoss(reduction="sum").cuda()
            evaluateL1 = nn.L1Loss(reduction="sum").cuda()
            optimizer = torch.optim.Adam(model.parameters())
            for epoch in range(10):
                for X, Y in train_loader:
                    loss = nn.functional.mse_loss(model(X.cuda()), Y.cuda())
                    loss.backward()
                    optimizer.step()
                print(evaluate(val_loader, model, evaluateL2, evaluateL1))
            """,
        ),
        Valid(  # the model is frozen whole before the evaluation it is handed to: no graph is recorded
            """
            import torch

            def evaluate(model, loader):
                for x, y in loader:
                    print((model(x.cuda()).argmax(1) == y.cuda()).float().mean())

            model = build_model().cuda()
            model.load_state_dict(torch.load("weights.pt"))
            model.requires_grad_(False)
            model.eval()
            evaluate(model, val_loader)
            """
        ),
        Valid(  # a preprocessing script whose loop keeps only detached copies of the outputs
            """
            import numpy as np
            import torch
            from torch import nn


            class Speaker(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(80, 256)

                def forward(self, x):
                    return self.fc(x).mean(0)


            encoder = Speaker().eval().cuda()
            embeddings = []
            for clip in clips:
                emb = encoder(torch.from_numpy(np.load(clip)).cuda())
                embeddings.append(emb.detach().cpu().numpy())
            """
        ),
        Valid(  # the shared loop's validation call already runs under no_grad; the training call trains
            """
            import torch

            def run_epoch(model, loader, optimizer, train=True):
                for x, y in loader:
                    loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
                    if train:
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()

            for epoch in range(10):
                run_epoch(model, train_loader, optimizer)
                with torch.no_grad():
                    run_epoch(model, val_loader, optimizer, train=False)
            """
        ),
        Valid(  # a Lightning hook of the validation loop: Lightning runs it under inference mode
            """
            import lightning as L

            class Classifier(L.LightningModule):
                def on_validation_epoch_end(self):
                    for split_name in self.val_loader_names:
                        for batch in self.cached_loaders[split_name]:
                            self.log("val/score", self.net(batch).mean())
            """
        ),
        Valid(  # after training, a notebook prints the shape of one batch's embeddings and stops
            """
            import torch
            from torch.utils.data import DataLoader
            optimizer = torch.optim.Adam(encoder.parameters())
            for x, y in train_loader:
                loss = criterion(encoder(x), y)
                loss.backward()
                optimizer.step()
            preview = DataLoader(test_set, batch_size=4)
            for batch in preview:
                images, labels = batch
                print(encoder(images).shape)
                break
            """
        ),
        Valid(  # decorated (DeiT's engine.evaluate)
            """
            import torch

            @torch.no_grad()
            def evaluate(data_loader, model, device):
                model.eval()
                for images, target in metric_logger.log_every(data_loader, 10, header):
                    output = model(images.to(device))
            """
        ),
        Valid(  # the loop under inference_mode (torchvision references)
            """
            import torch

            def evaluate(model, criterion, data_loader, device):
                model.eval()
                with torch.inference_mode():
                    for image, target in data_loader:
                        output = model(image.to(device))
                        loss = criterion(output, target.to(device))
            """
        ),
        Valid(  # no_grad around the forward pass inside the loop (Hugging Face Accelerate examples)
            """
            import torch
            model.eval()
            for step, batch in enumerate(eval_dataloader):
                with torch.no_grad():
                    outputs = model(**batch)
                predictions = outputs.logits.argmax(dim=-1)
            """
        ),
        Valid(  # `a and b` enters `b` only: autograd is off (tango's evaluation loop)
            """
            import torch
            from accelerate import Accelerator


            def main():
                accelerator = Accelerator()
                model = Net()
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
                model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
                    model, optimizer, train_dataloader, eval_dataloader)
                for epoch in range(epochs):
                    model.train()
                    for batch in train_dataloader:
                        with accelerator.accumulate(model):
                            loss = model(batch.to(accelerator.device))
                            accelerator.backward(loss)
                            optimizer.step()
                            optimizer.zero_grad()
                    model.eval()
                    total_val_loss = 0
                    for step, batch in enumerate(eval_dataloader):
                        with accelerator.accumulate(model) and torch.no_grad():
                            device = model.device
                            val_loss = model(batch.to(device), validation_mode=True)
                            total_val_loss += val_loss.detach().float()
            """
        ),
        Valid(  # the caller turns autograd off
            """
            import torch

            def evaluate(model, loader):
                return [model(x) for x in loader]

            def test(model, loader):
                total = 0
                for x, y in loader:
                    total += (model(x) == y).sum()
                return total

            with torch.no_grad():
                score = test(model, val_loader)
            """
        ),
        Valid(  # gradients of the inputs: saliency needs autograd
            """
            import torch

            def evaluate_saliency(model, loader):
                model.eval()
                for x, y in loader:
                    x.requires_grad_(True)
                    model(x).gather(1, y[:, None]).sum().backward()
                    maps.append(x.grad.abs())
            """
        ),
        Valid(  # a training loop
            """
            import torch
            model.train()
            for x, y in train_loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # REINFORCE keeps the log-probability of each action for the loss at the episode's end
            """
            import torch
            from torch.distributions import Categorical
            policy = Policy()
            optimizer = torch.optim.Adam(policy.parameters())
            for episode in range(1000):
                state, done = env.reset(), False
                while not done:
                    prob = policy(torch.from_numpy(state).float())
                    m = Categorical(prob)
                    action = m.sample()
                    state, reward, done, _ = env.step(action.item())
                    policy.put_data((reward, prob[action]))
                policy.train_net()
            """
        ),
        Valid(  # acting under no_grad (CleanRL's PPO rollout); the update uses the outputs
            """
            import torch
            agent = Agent(envs).to(device)
            optimizer = torch.optim.Adam(agent.parameters())
            for update in range(100):
                for step in range(128):
                    with torch.no_grad():
                        action, logprob = agent.get_action(next_obs)
                    next_obs, reward, done, info = envs.step(action.cpu().numpy())
                new_logprob = agent.get_log_prob(b_obs, b_actions)
                loss = -(new_logprob * advantages).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # `torch` comes from a star import of the project's model module; the forward is
                # under no_grad inside the loop and only the loss is computed outside it
            """
            from models import *

            def validation(model, val_loader, criterion):
                model.eval()
                total = 0.0
                for image, target in val_loader:
                    with torch.no_grad():
                        output = model(image.cuda())
                    total += criterion(output, target.cuda()).item()
                return total
            """
        ),
    ]
    INVALID = [
        Invalid(  # a method of the class runs the model with autograd on, batch by batch
            """
            import torch

            class Trainer:
                def eval_step(self, batch):
                    return self.model(batch["input_ids"].cuda())

                def evaluate(self):
                    self.model.eval()
                    scores = []
                    for batch in self.eval_dataloader:
                        scores.append(self.eval_step(batch).mean().item())
                    return scores
            """,
            fixed="""
            import torch

            class Trainer:
                def eval_step(self, batch):
                    return self.model(batch["input_ids"].cuda())

                def evaluate(self):
                    self.model.eval()
                    scores = []
                    with torch.no_grad():
                        for batch in self.eval_dataloader:
                            scores.append(self.eval_step(batch).mean().item())
                    return scores
            """,
        ),
        Invalid(  # an evaluation script that cuts its own batches: every loss stays in the graph it sums
            """
            import torch
            from torch import nn


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(512, 512)

                def forward(self, x):
                    return self.fc(x).pow(2).mean()


            model = Net().cuda()
            model.load_state_dict(torch.load("net.pt"))
            model.eval()
            total = 0
            for step in range(len(samples) // 8):
                batch = torch.tensor(samples[step * 8:(step + 1) * 8]).cuda()
                loss = model.forward(batch)
                total += loss
            print(total / (len(samples) // 8))
            """,
            """
            import torch
            from torch import nn


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(512, 512)

                def forward(self, x):
                    return self.fc(x).pow(2).mean()


            model = Net().cuda()
            model.load_state_dict(torch.load("net.pt"))
            model.eval()
            total = 0
            with torch.no_grad():
                for step in range(len(samples) // 8):
                    batch = torch.tensor(samples[step * 8:(step + 1) * 8]).cuda()
                    loss = model.forward(batch)
                    total += loss
            print(total / (len(samples) // 8))
            """,
        ),
        Invalid(  # a trainer's per-batch evaluation method, beside its step method: another file's loops call both
            """
            import torch

            class Trainer:
                def __init__(self, model):
                    self.model = model  # (Graph-WaveNet, MTGNN: the model handed in, moved afterwards)
                    self.model.cuda()
                    self.optimizer = torch.optim.Adam(self.model.parameters())

                def train(self, x, y):
                    self.model.train()
                    self.optimizer.zero_grad()
                    loss = self.criterion(self.model(x), y)
                    loss.backward()
                    self.optimizer.step()
                    return loss.item()

                def eval(self, x, y):
                    self.model.eval()
                    out = self.model(x)
                    loss = self.criterion(self.scaler.inverse(out), y)
                    return loss.item()
            """,
            fixed="""
            import torch

            class Trainer:
                def __init__(self, model):
                    self.model = model  # (Graph-WaveNet, MTGNN: the model handed in, moved afterwards)
                    self.model.cuda()
                    self.optimizer = torch.optim.Adam(self.model.parameters())

                def train(self, x, y):
                    self.model.train()
                    self.optimizer.zero_grad()
                    loss = self.criterion(self.model(x), y)
                    loss.backward()
                    self.optimizer.step()
                    return loss.item()

                def eval(self, x, y):
                    self.model.eval()
                    with torch.no_grad():
                        out = self.model(x)
                    loss = self.criterion(self.scaler.inverse(out), y)
                    return loss.item()
            """,
        ),
        Invalid(  # one loop for both: it trains only under `if not cross_valid:`, and the validation call turns that off
            """
            import torch

            class Solver:
                def train(self, epochs):
                    for epoch in range(epochs):
                        self.model.train()
                        self._run_one_epoch(epoch)
                        self.model.eval()
                        val_loss = self._run_one_epoch(epoch, cross_valid=True)

                def _run_one_epoch(self, epoch, cross_valid=False):
                    total = 0.0
                    for mixture, source in (self.cv_loader if cross_valid else self.tr_loader):
                        loss = self.criterion(self.model(mixture.cuda()), source.cuda())
                        if not cross_valid:
                            self.optimizer.zero_grad()
                            loss.backward()
                            self.optimizer.step()
                        total += loss.item()
                    return total
            """,
            fixed="""
            import torch

            class Solver:
                def train(self, epochs):
                    for epoch in range(epochs):
                        self.model.train()
                        self._run_one_epoch(epoch)
                        self.model.eval()
                        with torch.no_grad():
                            val_loss = self._run_one_epoch(epoch, cross_valid=True)

                def _run_one_epoch(self, epoch, cross_valid=False):
                    total = 0.0
                    for mixture, source in (self.cv_loader if cross_valid else self.tr_loader):
                        loss = self.criterion(self.model(mixture.cuda()), source.cuda())
                        if not cross_valid:
                            self.optimizer.zero_grad()
                            loss.backward()
                            self.optimizer.step()
                        total += loss.item()
                    return total
            """,
        ),
        Invalid(  # a metric helper named for neither, but the loader it walks is the test set's
            """
            import torch

            def hit_rate(model, test_loader, k):
                hits = []
                for users, items in test_loader:
                    scores = model(users.cuda(), items.cuda())
                    top = torch.topk(scores, k).indices.cpu().tolist()
                    hits.append(int(0 in top))
                return sum(hits) / len(hits)
            """,
            fixed="""
            import torch

            def hit_rate(model, test_loader, k):
                hits = []
                with torch.no_grad():
                    for users, items in test_loader:
                        scores = model(users.cuda(), items.cuda())
                        top = torch.topk(scores, k).indices.cpu().tolist()
                        hits.append(int(0 in top))
                return sum(hits) / len(hits)
            """,
        ),
        Invalid(
            """
            import torch

            def validate(model, val_loader, criterion):
                model.eval()
                total = 0.0
                # the whole validation set
                for x, y in val_loader:
                    output = model(x.cuda())
                    total += criterion(output, y.cuda()).item()
                return total / len(val_loader)
            """,
            fixed="""
            import torch

            def validate(model, val_loader, criterion):
                model.eval()
                total = 0.0
                # the whole validation set
                with torch.no_grad():
                    for x, y in val_loader:
                        output = model(x.cuda())
                        total += criterion(output, y.cuda()).item()
                return total / len(val_loader)
            """,
        ),
        Invalid(  # a loop of a helper that every caller runs after `model.eval()` (vq-vae-2's extract_code.py)
            """
            import torch

            def extract(loader, model, device):
                for images, names in tqdm(loader):
                    store(names, model(images.to(device)).argmax(1).cpu().numpy())

            model = VQVAE().to("cuda").eval()
            extract(DataLoader(dataset, batch_size=128), model, "cuda")
            """,
            fixed="""
            import torch

            def extract(loader, model, device):
                with torch.no_grad():
                    for images, names in tqdm(loader):
                        store(names, model(images.to(device)).argmax(1).cpu().numpy())

            model = VQVAE().to("cuda").eval()
            extract(DataLoader(dataset, batch_size=128), model, "cuda")
            """,
        ),
        Invalid(  # after model.eval() in the epoch loop, with the file's own alias
            """
            import torch as T

            for epoch in range(epochs):
                model.train()
                for x, y in train_loader:
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
                model.eval()
                for i, (x, y) in enumerate(test_loader):
                    preds.append(model(x).argmax(1))
            """,
            fixed="""
            import torch as T

            for epoch in range(epochs):
                model.train()
                for x, y in train_loader:
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
                model.eval()
                with T.no_grad():
                    for i, (x, y) in enumerate(test_loader):
                        preds.append(model(x).argmax(1))
            """,
        ),
        Invalid(  # an evaluation on held-out tensors after each epoch, no DataLoader in sight
            """
            import torch

            def evaluate(model, x_val, y_val):
                model.eval()
                out = model(x_val)
                return criterion(out, y_val).item(), (out.argmax(1) == y_val).float().mean().item()

            model = Net().cuda()
            optimizer = torch.optim.Adam(model.parameters())
            for epoch in range(100):
                model.train()
                loss = criterion(model(x_train), y_train)
                loss.backward()
                optimizer.step()
                val_loss, val_acc = evaluate(model, x_val, y_val)
            """,
            fixed="""
            import torch

            def evaluate(model, x_val, y_val):
                model.eval()
                with torch.no_grad():
                    out = model(x_val)
                return criterion(out, y_val).item(), (out.argmax(1) == y_val).float().mean().item()

            model = Net().cuda()
            optimizer = torch.optim.Adam(model.parameters())
            for epoch in range(100):
                model.train()
                loss = criterion(model(x_train), y_train)
                loss.backward()
                optimizer.step()
                val_loss, val_acc = evaluate(model, x_val, y_val)
            """,
        ),
        Invalid(  # DQN acting: the Q-values only pick the action the environment steps with
            """
            import torch
            q_network = QNetwork().to(device)
            optimizer = torch.optim.Adam(q_network.parameters())
            obs = envs.reset()
            for global_step in range(100000):
                q_values = q_network(torch.as_tensor(obs, device=device))
                actions = torch.argmax(q_values, dim=1).cpu().numpy()
                obs, rewards, dones, infos = envs.step(actions)
                loss = td_loss(q_network, rb.sample(128))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            q_network = QNetwork().to(device)
            optimizer = torch.optim.Adam(q_network.parameters())
            obs = envs.reset()
            for global_step in range(100000):
                with torch.no_grad():
                    q_values = q_network(torch.as_tensor(obs, device=device))
                actions = torch.argmax(q_values, dim=1).cpu().numpy()
                obs, rewards, dones, infos = envs.step(actions)
                loss = td_loss(q_network, rb.sample(128))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # a policy's select_action (TD3), called by another file's training loop
            """
            import torch
            import torch.nn as nn

            class Actor(nn.Module):
                def forward(self, state):
                    return torch.tanh(self.l3(self.l2(self.l1(state))))

            class Agent:
                def __init__(self):
                    self.actor = Actor().to("cuda")

                def select_action(self, state):
                    state = torch.as_tensor(state.reshape(1, -1), device="cuda")
                    return self.actor(state).cpu().data.numpy().flatten()
            """,
            fixed="""
            import torch
            import torch.nn as nn

            class Actor(nn.Module):
                def forward(self, state):
                    return torch.tanh(self.l3(self.l2(self.l1(state))))

            class Agent:
                def __init__(self):
                    self.actor = Actor().to("cuda")

                def select_action(self, state):
                    state = torch.as_tensor(state.reshape(1, -1), device="cuda")
                    with torch.no_grad():
                        return self.actor(state).cpu().data.numpy().flatten()
            """,
        ),
        Invalid(  # GAN samples saved as images every few hundred steps (PyTorch-GAN's sample_images)
            """
            import torch
            from torchvision.utils import make_grid, save_image

            def sample_images(step):
                generator.eval()
                fake = generator(fixed_noise)
                save_image(make_grid(fake, nrow=5, normalize=True), f"images/{step}.png")

            generator = Generator().cuda()
            optimizer = torch.optim.Adam(generator.parameters())
            for i, (imgs, _) in enumerate(loader):
                loss = generator_loss(generator, imgs.cuda())
                loss.backward()
                optimizer.step()
                if i % 400 == 0:
                    sample_images(i)
            """,
            fixed="""
            import torch
            from torchvision.utils import make_grid, save_image

            def sample_images(step):
                generator.eval()
                with torch.no_grad():
                    fake = generator(fixed_noise)
                save_image(make_grid(fake, nrow=5, normalize=True), f"images/{step}.png")

            generator = Generator().cuda()
            optimizer = torch.optim.Adam(generator.parameters())
            for i, (imgs, _) in enumerate(loader):
                loss = generator_loss(generator, imgs.cuda())
                loss.backward()
                optimizer.step()
                if i % 400 == 0:
                    sample_images(i)
            """,
        ),
        Invalid(  # a GAN's discriminator step: the generator runs again with autograd on, but only
                  # its detached output is used, so the graph it records is thrown away
            """
            import torch
            net_g = UpsamplingGenerator().cuda()
            net_d = PatchDiscriminator().cuda()
            optim_g = torch.optim.AdamW(net_g.parameters(), lr=2e-4)
            optim_d = torch.optim.AdamW(net_d.parameters(), lr=2e-4)
            for z, images in loader:
                z, images = z.cuda(), images.cuda()
                loss_g = ((net_d(net_g(z)) - 1) ** 2).mean()
                loss_g.backward()
                optim_g.step()
                fake_images = net_g(z)
                fake_images = fake_images.detach()
                loss_d = (net_d(fake_images) ** 2).mean() + ((net_d(images) - 1) ** 2).mean()
                loss_d.backward()
                optim_d.step()
            """,
            fixed="""
            import torch
            net_g = UpsamplingGenerator().cuda()
            net_d = PatchDiscriminator().cuda()
            optim_g = torch.optim.AdamW(net_g.parameters(), lr=2e-4)
            optim_d = torch.optim.AdamW(net_d.parameters(), lr=2e-4)
            for z, images in loader:
                z, images = z.cuda(), images.cuda()
                loss_g = ((net_d(net_g(z)) - 1) ** 2).mean()
                loss_g.backward()
                optim_g.step()
                with torch.no_grad():
                    fake_images = net_g(z)
                fake_images = fake_images.detach()
                loss_d = (net_d(fake_images) ** 2).mean() + ((net_d(images) - 1) ** 2).mean()
                loss_d.backward()
                optim_d.step()
            """,
        ),
    ]

    @cached_property
    def _calls_by_function(self) -> dict[cst.CSTNode | None, list[CallSite]]:
        index: dict[cst.CSTNode | None, list[CallSite]] = defaultdict(list)
        for site in self.ctx.calls:
            index[self.ctx.function_of(site.stack)].append(site)
        return index

    @cached_property
    def _calls_by_name(self) -> dict[str, list[CallSite]]:
        """`evaluate(...)` and `self.evaluate(...)` calls by the called name."""
        index: dict[str, list[CallSite]] = defaultdict(list)
        for site in self.ctx.calls:
            if site.func is not None:
                index[site.func.rsplit(".", 1)[-1]].append(site)
        return index

    def impact_here(self, finding: Finding) -> Estimate | None:
        info = self.ctx.loops.get(finding.node)
        once = info is not None and runs_once(self.ctx, info.stack)
        small = small_model(self.ctx, Impact.LOW if once else Impact.MEDIUM)
        if once and small is not None:
            return Estimate(Impact.LOW, f"one pass after or outside the training loop, {small.reason}")
        if once:
            return Estimate(Impact.MEDIUM, "one pass after or outside the training loop, not every epoch")
        return small

    def finish(self) -> None:
        reported: set[cst.CSTNode] = set()
        for info in self.ctx.loops.values():
            if any(frame.node in reported for frame in info.stack):
                continue  # inside a loop that is already reported
            if self._evaluation_loop(info) and not self._grad_off(info.stack) and not self._grad_after(info) \
                    and not self._runs_frozen_models(info):
                reported.add(info.node)
                self._report(info)
        self._report_shared_loops()
        self._report_host_only_forwards(reported)

    # ------------------------------------------------------------------ one loop for training and evaluation
    def _report_shared_loops(self) -> None:
        """Conv-TasNet's `_run_one_epoch(epoch, cross_valid=False)`: one loop over a loader that
        trains only under `if not cross_valid:`, called with `cross_valid=True` for validation. The
        call that turns training off runs every forward pass with autograd on."""
        ctx = self.ctx
        for function, gate in self._gated_training_functions().items():
            name, trains_when = gate
            for site in self._calls_by_name.get(function.name.value, ()):  # type: ignore[attr-defined]
                if ctx.function_of(site.stack) is function or self._grad_off(site.stack, callers=False):
                    continue
                positional = [p.name.value for p in function.params.params]  # type: ignore[attr-defined]
                index = positional.index(name) if name in positional else None
                if index is not None and positional[:1] == ["self"]:
                    index -= 1  # `self` is not passed
                passed = find_argument(ctx, site, name, index)
                value = literal_bool(ctx, passed.node, site.stack) if not passed.missing else None
                if value is None or value == trains_when:
                    continue
                self._report_evaluation_call(site, function, name, trains_when)

    def _gated_training_functions(self) -> dict[cst.CSTNode, tuple[str, bool]]:
        """Functions with a loop over a DataLoader that calls the model, whose every use of
        autograd (a backward, an optimizer step, gradients) sits under `if not <param>:` or
        `if <param>:` of one parameter: that parameter and the truth it needs for training."""
        ctx = self.ctx
        found: dict[cst.CSTNode, tuple[str, bool]] = {}
        for info in ctx.loops.values():
            function = ctx.function_of(info.stack)
            if not isinstance(function, cst.FunctionDef) or function in found or not isinstance(info.node, cst.For) \
                    or info.iter is None or function.name.value not in self._calls_by_name:
                continue  # the cheap questions first: a loop of a function this file calls
            params = {p.name.value for p in (*function.params.params, *function.params.kwonly_params)
                      if p.default is not None}
            if not params or not self._needs_grad(info.node) or not calls_model(ctx, info.node.body):
                continue
            gates: dict[tuple[str, bool], set[int]] = defaultdict(set)
            for node in walk_expression(info.node.body):
                if isinstance(node, cst.If):
                    test, wanted = node.test, True
                    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
                        test, wanted = test.expression, False
                    if isinstance(test, cst.Name) and test.value in params:
                        gates[(test.value, wanted)].update(id(inner) for inner in walk_expression(node.body))
            needing = {id(node) for node in walk_expression(function.body) if self._needs_grad_node(node)}
            gate = next((key for key, inside in gates.items() if needing and needing <= inside), None)
            if gate is not None:
                found[function] = gate
        return found

    def _needs_grad_node(self, node: cst.CSTNode) -> bool:
        """One use of autograd, as ``_needs_grad`` looks for them."""
        if isinstance(node, cst.Attribute) and node.attr.value in _NEEDS_GRAD_ATTRIBUTES:
            return True
        if not isinstance(node, cst.Call):
            return False
        func = node.func
        if isinstance(func, cst.Attribute) and (func.attr.value in _NEEDS_GRAD_METHODS
                                                or func.attr.value == "step" and is_optimizer_name(dotted_name(func.value) or "")):
            return True
        return self.ctx.qualname(func) in (*_NEEDS_GRAD_CALLS, *GRAD_MODES)

    def _report_evaluation_call(self, site: CallSite, function: cst.CSTNode, name: str, trains_when: bool) -> None:
        ops = self._statements_under_no_grad([site])
        gate = f"if {'' if trains_when else 'not '}{name}:"
        self.report(
            site.node,
            f"`{dotted_name(site.node.func)}(...)` evaluates with the loop of `{function.name.value}` (it trains only "  # type: ignore[attr-defined]
            f"under `{gate}`) without `torch.no_grad()`: every forward pass records its autograd graph",
            fix_ops=ops or None,
            fix_title="Run the call under `torch.no_grad()`",
            no_fix_reason=None if ops else "the call is not a statement of its own",
        )

    # ------------------------------------------------------------------ forwards whose outputs go to the host
    def _report_host_only_forwards(self, reported: set[cst.CSTNode]) -> None:
        """Acting in RL (`q_network(obs).argmax(1).cpu().numpy()` for `env.step`), a sample saved
        as an image: a forward pass, run again and again, whose outputs only leave as host values.
        One finding per function; the fix runs each such call's statement under `no_grad`."""
        ctx = self.ctx
        trains = ctx.drives_training or bool(optimized_modules(ctx))  # not a test of a module's outputs
        by_function: dict[cst.CSTNode | None, list[CallSite]] = defaultdict(list)
        for site in ctx.calls:  # the cheap questions first: most calls are not forwards run again
            if any(frame.node in reported for frame in site.stack):
                continue
            if not trains and not is_acting_function(ctx.function_of(site.stack)):
                continue
            if self._runs_again(site) and runs_network(ctx, site) and not self._grad_off(site.stack) \
                    and not self._callee_grad_off(site) and (outputs_leave_autograd(ctx, site)
                                                             or self._evaluation_method(site.stack)) \
                    and not self._loop_runs_backward(site):
                by_function[ctx.function_of(site.stack)].append(site)
        for sites in by_function.values():
            self._report_forwards(sites)

    def _loop_runs_backward(self, site: CallSite) -> bool:
        """Is ``site`` a forward whose outputs its statement drops (`_ = model(...)`, a bare
        call) in a loop that calls `backward()`: a training step whose module keeps its loss on
        itself (vall-e's `sum(model.loss.values()).backward()` after it)?"""
        loop = nearest_loop(site.stack)
        if loop is None or site.statement is None or len(site.statement.body) != 1:
            return False
        small = site.statement.body[0]
        dropped = isinstance(small, cst.Expr) and small.value is site.node or isinstance(small, cst.Assign) \
            and small.value is site.node and all(isinstance(target.target, cst.Name) and target.target.value == "_"
                                                 for target in small.targets)
        return dropped and any(any(frame.node is loop for frame in call.stack) for call in self.ctx.method_calls("backward"))

    def _runs_again(self, site: CallSite) -> bool:
        """In a loop, in a function called in a loop of the file, or in a policy's `act` /
        `select_action` (called by the training loop of another file)."""
        ctx = self.ctx
        for frame in reversed(site.stack):
            if frame.kind in (FrameKind.FUNCTION, FrameKind.CLASS):
                break
            if frame.kind is FrameKind.LOOP and not (isinstance(frame.node, cst.For) and stops_at_once(frame.node)):
                return True  # a loop that stops after its first pass (a look at one batch) runs it once
        function = ctx.function_of(site.stack)
        if not isinstance(function, cst.FunctionDef):
            return False
        if is_acting_function(function) or self._per_batch_evaluation(function, site.stack):
            return True
        return any(ctx.nearest_loop(call.stack) is not None for call in self._calls_by_name.get(function.name.value, ()))

    def _evaluation_method(self, stack: Stack) -> bool:
        """A trainer's per-batch evaluation method (``_per_batch_evaluation``) that puts the model
        in eval mode and needs no autograd: every forward pass in it is evaluation."""
        function = self.ctx.function_of(stack)
        return isinstance(function, cst.FunctionDef) and self._per_batch_evaluation(function, stack) \
            and any(self.ctx.function_of(site.stack) is function and not site.node.args
                    for site in self.ctx.method_calls("eval")) and not self._needs_grad(function)

    def _per_batch_evaluation(self, function: cst.FunctionDef, stack: Stack) -> bool:
        """An evaluation method of a trainer class beside the method that takes its training step
        for another file's loop (Graph-WaveNet's `trainer.eval(input, real_val)` beside
        `trainer.train(input, real_val)`): that file's validation loop calls it once per batch."""
        owner = class_of_method(stack)
        if owner is None or not self._named_for_evaluation(function) or len(function.params.params) < 2:
            return False
        return any(isinstance(method, cst.FunctionDef) and method in self.ctx.step_functions
                   and not self.ctx.local_callers(method) for method in owner.body.body)

    def _callee_grad_off(self, site: CallSite) -> bool:
        """`model.generate(...)` whose def is decorated with `@torch.no_grad()`."""
        callees = self.ctx.local_callees(site)
        return bool(callees) and all(
            any(self._grad_mode(decorator.decorator, info.stack) for decorator in info.node.decorators)  # type: ignore[union-attr]
            for info in callees
        )

    def _report_forwards(self, sites: list[CallSite]) -> None:
        ops = self._statements_under_no_grad(sites)
        statements = {id(site.statement) for site in sites}
        labels = list(dict.fromkeys(f"`{dotted_name(site.node.func)}(...)`" for site in sites))
        calls = name_all(labels)
        acting = any(feeds_environment(self.ctx, site) or is_acting_function(self.ctx.function_of(site.stack))
                     for site in sites)
        if acting:
            what = "to pick actions"
        elif all(only_detached(self.ctx, site) for site in sites):  # a GAN's fakes for the discriminator step
            what = "but only detached copies of its outputs are used (`.detach()`)"
        else:
            what = "but the outputs only leave as host values (an image, a logged number)"
        self.report(
            sites[0].node,
            f"{calls} {'runs' if len(labels) == 1 else 'run'} with autograd on {what}: every call records an autograd "
            "graph that no backward uses",
            fix_ops=ops or None,
            fix_title="Run the call under `torch.no_grad()`" if len(statements) == 1 else "Run the calls under `torch.no_grad()`",
            no_fix_reason=None if ops else "a call is not a statement of its own",
        )

    def _statements_under_no_grad(self, sites: list[CallSite]) -> list[FixOp]:
        """The edits that run the statements of ``sites`` under `torch.no_grad()` (and import it
        where needed); none when a call is not a statement of its own block."""
        if not all(site.statement is not None and enclosing_block(self.ctx, site.statement) is not None for site in sites):
            return []
        ops: list[FixOp] = []
        context = f"{reference(self.ctx, 'torch.no_grad', ops, sites[0].stack)}()"
        statements = {id(site.statement): site.statement for site in sites}.values()
        return [*(Transform(statement, lambda node: with_statement(context, [node])) for statement in statements), *ops]

    def _evaluation_loop(self, info: LoopInfo) -> bool:
        ctx = self.ctx
        loop = info.node
        if not isinstance(loop, cst.For) or info.iter is None or loop in ctx.step_loops:
            return False
        # batches a script makes itself (`for step in range(len(samples) // batch_size):`) are
        # evaluated, in a script that never trains, after the model's `eval()`
        loader = is_dataloader(ctx, unwrap_iterable(info.iter), info.stack)
        if not (loader or evaluation_script(ctx)) or self._needs_grad(loop):
            return False
        function = ctx.function_of(info.stack)
        if function is not None and function in ctx.hot_functions:
            return False  # called on every training step: its outputs may feed the loss
        if not loader:  # and a forward's outputs stay in autograd (`total_loss += loss` keeps every graph)
            return self._after_eval_call(info) and any(
                _model_name(site) is not None and runs_network(ctx, site) and not outputs_leave_autograd(ctx, site)
                for site in ctx.calls if any(frame.node is loop for frame in site.stack))
        owner = class_of_method(info.stack)
        return calls_model_with_grad(ctx, loop.body, owner.name.value if owner is not None else None) and (
            self._named_for_evaluation(function) or self._after_eval_call(info)
            or named_for_evaluation(dotted_name(unwrap_iterable(info.iter))))

    def _needs_grad(self, loop: cst.CSTNode) -> bool:
        """Does the loop use autograd (gradients, a backward, an optimizer) or pick a grad mode?"""
        return any(self._needs_grad_node(node) for node in walk_expression(loop))

    @staticmethod
    def _named_for_evaluation(function: cst.CSTNode | None) -> bool:
        if not isinstance(function, cst.FunctionDef):
            return False
        words = function.name.value.lower().split("_")
        return any(word.startswith(_EVAL_PREFIXES) or word == "val" for word in words)

    def _after_eval_call(self, info: LoopInfo) -> bool:
        """Is the last `x.eval()` / `x.train(...)` before the loop, in its function, an `eval()`?
        With none there: does every call of that function in the file come after an `eval()` in
        its caller (vq-vae-2's `extract(env, loader, model, device)` after `model.eval()`)?"""
        ctx = self.ctx
        function = ctx.function_of(info.stack)
        last = self._last_mode_switch(function, info.node)
        if last is not None or not isinstance(function, cst.FunctionDef):
            return last is not None and _turns_eval_on(last)
        calls = [site for site in self._calls_by_name.get(function.name.value, ())
                 if site.statement is not None and ctx.function_of(site.stack) is not function]
        return bool(calls) and all(
            (switch := self._last_mode_switch(ctx.function_of(site.stack), site.statement)) is not None  # type: ignore[arg-type]
            and _turns_eval_on(switch) for site in calls)

    def _last_mode_switch(self, function: cst.CSTNode | None, before: cst.CSTNode) -> CallSite | None:
        """The last `x.eval()` / `x.train(...)` of ``function`` that runs before the statement
        ``before`` (not one inside a loop around it)."""
        ctx = self.ctx
        last: CallSite | None = None
        for site in self._calls_by_function.get(function, ()):
            statement = site.statement
            if statement is None or not _switches_mode(site):
                continue
            if before in ctx.enclosing_loops(site.stack) or not comes_before(ctx, statement, before):
                continue
            if last is None or comes_before(ctx, last.statement, statement):  # type: ignore[arg-type]
                last = site
        return last

    def _grad_off(self, stack: Stack, *, callers: bool = True) -> bool:
        """Is autograd already off (or chosen) for code at ``stack``: a grad-mode `with` or
        decorator around it, a `set_grad_enabled` call in its function, or, one level up, at
        every call of its function?"""
        ctx = self.ctx
        for frame in stack:
            if frame.kind is FrameKind.WITH and any(self._grad_mode(item, stack) for item in frame.node.items):  # type: ignore[attr-defined]
                return True
            if frame.kind is FrameKind.FUNCTION and any(
                self._grad_mode(decorator.decorator, stack) for decorator in frame.node.decorators  # type: ignore[attr-defined]
            ):
                return True
        function = ctx.function_of(stack)
        if any(site.statement is not None and ctx.function_of(site.stack) is function for site in ctx.calls_to(*GRAD_MODES)):
            return True  # `torch.set_grad_enabled(False)` as a statement (not a `with` item)
        if not isinstance(function, cst.FunctionDef):
            return False
        if called_without_grad(ctx, function):
            return True  # `with torch.no_grad(): validate(...)` in the training script, `validate` here
        if lightning_hook_without_grad(ctx, stack):
            return True  # Lightning runs `validation_step`, `on_test_epoch_end`... under inference mode
        if not callers:
            return False
        calls = self._calls_by_name.get(function.name.value, ())
        return any(self._grad_off(site.stack, callers=False) for site in calls)

    @cached_property
    def _frozen(self) -> frozenset[str]:
        """Names the file freezes whole: `model.requires_grad_(False)`."""
        return frozenset(dotted_name(site.node.func.value) or "" for site in self.ctx.method_calls("requires_grad_")  # type: ignore[attr-defined]
                         if len(site.node.args) == 1 and isinstance(site.node.args[0].value, cst.Name)
                         and site.node.args[0].value.value == "False")

    def _runs_frozen_models(self, info: LoopInfo) -> bool:
        """Does every model the loop calls have all its parameters frozen (`model.requires_grad_(False)`
        here, or in every caller that hands it to the loop's function: EfficientDet's `coco_eval.py`)?
        No parameter needs a gradient, so no graph is recorded: nothing for `no_grad` to save."""
        if not self._frozen:
            return False
        ctx = self.ctx
        called = {name for site in ctx.calls if any(frame.node is info.node for frame in site.stack)
                  if (name := _model_name(site)) is not None and is_local_object(ctx, name)
                  and not LOSS_NAME.search(name)}
        function = ctx.function_of(info.stack)
        params = [p.name.value for p in function.params.params] if isinstance(function, cst.FunctionDef) else []
        callers = self._calls_by_name.get(function.name.value, ()) if isinstance(function, cst.FunctionDef) else ()
        for name in called:
            if name in self._frozen:
                continue
            if name not in params or not callers:
                return False
            passed = [find_argument(ctx, site, name, params.index(name)) for site in callers]
            if any(given.missing or dotted_name(given.node) not in self._frozen for given in passed):
                return False
        return bool(called)

    def _grad_mode(self, node: cst.CSTNode, stack: Stack) -> bool:
        """A `with` item or decorator that sets the grad mode (also through a variable)."""
        if isinstance(node, cst.WithItem):
            node = entered(node.item)
        if isinstance(node, cst.Call):
            node = node.func
        if isinstance(node, cst.Name) and self.ctx.qualname(node) is None:
            value = self.ctx.single_value(node.value, stack)
            node = value.func if isinstance(value, cst.Call) else node
        return self.ctx.qualname(node) in GRAD_MODES  # type: ignore[arg-type]

    def _grad_after(self, info: LoopInfo) -> bool:
        """A backward or optimizer step later in the same function (the loop's outputs may feed it)."""
        ctx = self.ctx
        for site in self._calls_by_function.get(ctx.function_of(info.stack), ()):
            func = site.node.func
            marker = isinstance(func, cst.Attribute) and (
                func.attr.value == "backward" or func.attr.value == "step" and ctx.is_optimizer_like(func.value, site.stack)
            )
            if not marker or site.statement is None:
                continue
            if info.node in ctx.enclosing_loops(site.stack) or comes_before(ctx, info.node, site.statement):
                return True
        return False

    def _report(self, info: LoopInfo) -> None:
        ops: list[FixOp] = []
        context = f"{reference(self.ctx, 'torch.no_grad', ops, info.stack)}()"
        ops.insert(0, Transform(info.node, lambda loop: with_statement(context, [loop])))  # type: ignore[list-item]
        self.report(
            info.node,
            "evaluation loop without `torch.no_grad()`: every forward pass records its autograd graph",
            fix_ops=ops,
        )


def _model_name(site: CallSite) -> str | None:
    """`model` of `model(x)` or `model.forward(x)`, `self.net` of `self.net(x)` (None for other
    calls: `model.generate(...)` is often decorated with `@torch.no_grad()` where the scan does not look)."""
    func = site.node.func
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute) and func.attr.value == "forward":
        return dotted_name(func.value)
    name = dotted_name(func)
    return name if name is not None and name.startswith("self.") and name.count(".") == 1 else None


def _switches_mode(site: CallSite) -> bool:
    """`model.eval()`, `model.train()`, `model.train(False)`: nn.Module's mode switches."""
    func = site.node.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in ("eval", "train"):
        return False
    return len(site.node.args) <= (1 if func.attr.value == "train" else 0)


def _turns_eval_on(site: CallSite) -> bool:
    """`model.eval()`, or `model.train(False)`."""
    func = site.node.func
    assert isinstance(func, cst.Attribute)
    if func.attr.value == "eval":
        return True
    args = site.node.args
    return bool(args) and isinstance(args[0].value, cst.Name) and args[0].value.value == "False"
