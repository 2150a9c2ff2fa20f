from __future__ import annotations

from speedfix.engine.findings import Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.model.arguments import find_argument, literal_bool, string_value
from speedfix.model.flow import in_no_run
from speedfix.model.frameworks import (accelerate_runs_deepspeed, accelerate_runs_fsdp, accelerate_single_process,
                                       lightning_manual_optimization)
from speedfix.model.networks import may_train, skips_submodules
from speedfix.model.torch_api import DDP_SETTINGS
from speedfix.project.steps import LIGHTNING_TRAINER


# Lightning's registered DDP strategies that set `find_unused_parameters=True`.
_FIND_UNUSED_STRATEGIES = frozenset({"ddp_find_unused_parameters_true", "ddp_spawn_find_unused_parameters_true",
                                     "ddp_fork_find_unused_parameters_true", "ddp_notebook_find_unused_parameters_true"})


class DdpFindUnusedParameters(Rule):
    """
    ## What it does
    Finds `DistributedDataParallel(..., find_unused_parameters=True)`, also handed on by
    Accelerate (`DistributedDataParallelKwargs(find_unused_parameters=True)`) or Lightning
    (`DDPStrategy(find_unused_parameters=True)`, or a `Trainer(strategy=
    "ddp_find_unused_parameters_true")` naming the registered strategy that sets it).

    ## Why is this bad?
    With it, DDP walks the whole autograd graph after every forward pass to find parameters that
    will get no gradient, and it cannot start all-reducing buckets as early. PyTorch's reducer
    warns when it finds none: "find_unused_parameters=True was specified in DDP constructor, but
    did not find any unused parameters ... this flag results in an extra traversal of the
    autograd graph every iteration, which can adversely affect performance." It is only needed
    when some parameters really go unused in a step (conditional branches, frozen heads).

    Not in a script that does not train (an evaluation that spreads its batches over the GPUs
    with Accelerate), nor where no run builds the wrapper: behind `if distributed:` with
    `distributed = False` set in the script, or an option off by default that no launch command
    of the project passes. Nor where a model class of the file, or of a scanned module it
    imports, calls one of its submodules only in some forward passes (`if not uncond_fwd:
    self.reference_unet(...)`, an `if` on an argument of `forward`, or code after one that
    returns), nor where a LightningModule of the file optimizes by hand
    (`self.automatic_optimization = False`: a GAN's generator and discriminator steps take turns,
    each backward leaving the other's parameters without gradients): the flag is needed there. Nor
    Accelerate's `DistributedDataParallelKwargs` where the `Accelerator` runs DeepSpeed or FSDP (a
    `deepspeed_plugin=` or `fsdp_plugin=`, or launch commands that all use it: `--use_deepspeed`,
    a `--config_file` whose `distributed_type` says so; a command naming a config file the project
    does not hold does not count): DeepSpeed's engine or FSDP, not DDP, wraps the model, and the
    handler is never read; nor where every launch command of the project starts one process
    (`accelerate launch --num_processes=1`, a config file saying so, or plain `python`): the
    `Accelerator` then wraps nothing in DDP.

    ## Example
    ```python
    model = DDP(model, device_ids=[rank], find_unused_parameters=True)
    ```

    ## Use instead
    ```python
    model = DDP(model, device_ids=[rank])
    ```

    ## Fix safety
    No automatic fix: if some parameters do go unused, DDP without the flag raises "Expected to
    have finished reduction in the prior iteration" at the next step. Remove it, run a few steps;
    keep it (or try `static_graph=True`) only if that error appears.

    ## Impact
    Medium: an extra traversal of the autograd graph on every step. Nothing moves it.

    ## Measured effect
    One extra traversal of the autograd graph per step plus later communication; lightly reported
    the flag "can slow down training considerably".
    Sources: https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html,
    https://github.com/lightly-ai/lightly/issues/1434
    """

    impact = "medium"
    code = "SF803"
    name = "ddp-find-unused-parameters"
    summary = "`DistributedDataParallel(find_unused_parameters=True)`"
    severity = Severity.INFO
    requires = (b"find_unused_parameters",)
    effect = "One autograd-graph traversal less per step, and earlier gradient all-reduce."

    VALID = [
        Valid(  # so-vits-svc: a GAN optimized by hand, generator and discriminator in turn
            """
            import lightning.pytorch as pl

            class VitsLightning(pl.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.automatic_optimization = False

                def training_step(self, batch, batch_idx):
                    optim_g, optim_d = self.optimizers()
                    ...

            trainer = pl.Trainer(strategy="ddp_find_unused_parameters_true", precision="bf16-mixed")
            trainer.fit(VitsLightning())
            """
        ),
        Valid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[rank], find_unused_parameters=False)
            """
        ),
        Valid(  # no run takes the distributed branch: the script sets `distributed = False`
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            if __name__ == "__main__":
                distributed = False
                if distributed:
                    model = DDP(model, device_ids=[rank], find_unused_parameters=True)
                else:
                    model = torch.nn.DataParallel(model)
            """
        ),
        Valid(  # decided at run time
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[rank], find_unused_parameters=args.find_unused)
            """
        ),
        Valid(  # the reference network runs only when `skip_reference` is false: its parameters go unused then
            """
            import torch
            from torch import nn
            from accelerate import Accelerator, DistributedDataParallelKwargs

            class Net(nn.Module):
                def __init__(self, reference, denoiser):
                    super().__init__()
                    self.reference, self.denoiser = reference, denoiser

                def forward(self, latents, timesteps, skip_reference=False):
                    if not skip_reference:
                        self.reference(latents, timesteps)
                    return self.denoiser(latents, timesteps)

            accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
            net = Net(reference, denoiser)
            optimizer = torch.optim.AdamW(net.parameters())
            net, optimizer, loader = accelerator.prepare(net, optimizer, loader)
            for batch in loader:
                accelerator.backward(net(batch, 10, skip_reference=random.random() < 0.1).mean())
                optimizer.step()
            """
        ),
        Valid(  # an evaluation script: without a backward pass DDP looks for no unused parameter
            """
            import torch
            from accelerate import Accelerator, DistributedDataParallelKwargs
            accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
            model = accelerator.prepare(model)
            with torch.no_grad():
                for batch in loader:
                    save(model.generate(**batch))
            """
        ),
    ]
    INVALID = [
        Invalid(  # DiGress: the registered strategy name that sets the flag
            """
            from lightning import Trainer

            trainer = Trainer(strategy="ddp_find_unused_parameters_true", accelerator="gpu", devices=2)
            trainer.fit(model, datamodule=datamodule)
            """
        ),
        Invalid(
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank], find_unused_parameters=True)
            optimizer = torch.optim.AdamW(model.parameters())
            """
        ),
        Invalid(  # through a kwargs dict
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            ddp_kwargs = {"device_ids": [rank], "find_unused_parameters": True}
            model = DDP(model, **ddp_kwargs)
            loss = model(batch).sum()
            loss.backward()
            """
        ),
        Invalid(  # the model's forward takes the same path every step (`self.training` alone decides)
            """
            import torch
            from torch import nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.body, self.aux = nn.Linear(8, 8), nn.Linear(8, 2)

                def forward(self, x):
                    if self.training:
                        return self.body(x), self.aux(x)
                    return self.body(x)

            model = torch.nn.parallel.DistributedDataParallel(Net().cuda(), find_unused_parameters=True)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """
        ),
        Valid(  # the Accelerator runs DeepSpeed: its engine wraps the model, the DDP handler is never read
            """
            from accelerate import Accelerator, DeepSpeedPlugin, DistributedDataParallelKwargs
            handlers = [DistributedDataParallelKwargs(find_unused_parameters=True)]
            plugin = DeepSpeedPlugin(hf_ds_config="ds_zero2.json")
            accelerator = Accelerator(kwargs_handlers=handlers, deepspeed_plugin=plugin)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                accelerator.backward(model(**batch).loss)
                optimizer.step()
            """
        ),
        Invalid(  # Accelerate hands it to the DDP wrapper it makes in `prepare`
            """
            from accelerate import Accelerator, DistributedDataParallelKwargs
            ddp_kwargs = DistributedDataParallelKwargs(find_unused_parameters=True)
            accelerator = Accelerator(kwargs_handlers=[ddp_kwargs])
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                accelerator.backward(model(**batch).loss)
                optimizer.step()
            """
        ),
    ]

    def finish(self) -> None:
        if not may_train(self.ctx):
            return  # an evaluation script sets it too; DDP looks for unused parameters only for a backward pass
        if skips_submodules(self.ctx) is not None:
            return  # some forward passes leave a submodule out: its parameters go unused, the flag is needed
        if lightning_manual_optimization(self.ctx):
            return  # steps taken in turns (a GAN's two networks): each backward leaves some parameters unused
        for site in self.ctx.calls_to(*DDP_SETTINGS):
            if (self.ctx.call_qualname(site) or "").startswith("accelerate.") and (
                    accelerate_runs_deepspeed(self.ctx) or accelerate_runs_fsdp(self.ctx)
                    or accelerate_single_process(self.ctx)):
                continue  # DeepSpeed's engine, FSDP or no wrapper at all: the DDP handler is never read
            flag = find_argument(self.ctx, site, "find_unused_parameters")
            if literal_bool(self.ctx, flag.node, site.stack) and not in_no_run(self.ctx, site.statement, site.stack):
                self.report(site.node, "`find_unused_parameters=True` walks the autograd graph again after every forward pass")
        for site in self.ctx.calls_to(*LIGHTNING_TRAINER):
            strategy = find_argument(self.ctx, site, "strategy")
            name = string_value(self.ctx, strategy.node, site.stack) if not strategy.missing else None
            if name in _FIND_UNUSED_STRATEGIES and not in_no_run(self.ctx, site.statement, site.stack):
                self.report(strategy.node or site.node, f'Lightning\'s `strategy="{name}"` walks the autograd graph '
                                                        "again after every forward pass")
