from __future__ import annotations

from speedfix.engine.findings import Applicability, LossCheck, Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.model.branches import BranchTracker
from speedfix.model.forward import before_evaluation
from speedfix.rules._impact import Estimate, Finding, spread_out
from speedfix.rules._loop_calls import report_loop_call

_EMPTY_CACHE = ("torch.cuda.empty_cache", "torch.cuda.memory.empty_cache")


class EmptyCacheInLoop(BranchTracker, Rule):
    """
    ## What it does
    Finds `torch.cuda.empty_cache()` inside the training loop. On every step it is a warning;
    "every N batches" under a `if step % N == 0:` guard, or under an opt-in debugging flag, is an
    info note (its cost is spread over N steps); every 1,000 steps or more, by a number the file
    states, it is left alone (a thousandth of the run at most). After an out-of-memory error (an `except`
    handler) or in a branch that runs once it is left alone: that is what the call is for. So it
    is under an option that is off by default and that no launch command passes (`if
    args.use_ema:`, also around the call of the method that makes it: an `EMAModel.step`).

    ## Why is this bad?
    `empty_cache()` hands cached blocks back to the driver. It "doesn't increase the amount of GPU
    memory available for PyTorch": the next step has to `cudaMalloc` the same memory again, and
    the call synchronises the device. Lightning's speed guide: "Don't call
    `torch.cuda.empty_cache` unnecessarily! Every time you call this, ALL your GPUs have to wait
    to sync." A call before evaluation or after training, outside the step loop, is left alone,
    and so is one in a branch of the step loop that also runs an evaluation pass (`if steps %
    validation_interval == 0:` with a loop under `torch.no_grad()` or after `model.eval()`) or
    calls something named for an evaluation, a test, a save or sampling (`eval_step(...)`,
    `torch.save(...)`, `save_image(...)`, a diffusers `pipeline(...)`, `generate(...)`): that
    branch is a pause in the training, not a step.

    ## Example
    ```python
    for step, batch in enumerate(loader):
        ...
        optimizer.step()
        if step % 100 == 0:
            torch.cuda.empty_cache()
    ```

    ## Use instead
    ```python
    for step, batch in enumerate(loader):
        ...
        optimizer.step()
    ```

    ## Fix safety
    Unsafe: without it PyTorch keeps more memory reserved. Workloads with very variable shapes
    can fragment the cache and run out of memory where the call had rescued them (PEFT measured
    reserved memory rising from 12.0 to 22.1 GB), and other processes sharing the GPU get less
    memory back. Run the benchmark and watch the peak memory column. No fix for a call under an
    opt-in debugging flag: it runs only when the user asks for it.

    ## Impact
    High: every step syncs and hands the cached blocks back, which the allocator then gets
    again from the driver. Medium when it runs every few steps rather than on every one, low
    when only while an option is on.

    ## Measured effect
    Hugging Face PEFT: 250 steps took 65 s with the call every step, 45 s without (1.44x), 50 s
    with it every 10 steps; Hugging Face's Trainer added the call and removed it again after
    users reported slowdowns.
    Sources: https://github.com/huggingface/peft/pull/2894, https://github.com/huggingface/transformers/pull/31530
    """

    impact = "high"
    code = "SF303"
    name = "empty-cache-in-loop"
    summary = "`torch.cuda.empty_cache()` in the training loop"
    severity = Severity.WARNING
    requires = (b"empty_cache",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.EXACT
    fix_title = "Remove the call from the training loop"
    gpu_only = True
    effect = "No re-allocation and device sync per call: 1.44x over 250 steps in PEFT."
    tracked_calls = frozenset({"empty_cache"})

    VALID = [
        Valid(  # an EMA helper's `step()` empties the cache, but only `--use_ema` runs it, and no launch passes it
            """
            import argparse
            import torch

            class EMAModel:
                def step(self, parameters):
                    for shadow, param in zip(self.shadow, parameters):
                        shadow.sub_(0.01 * (shadow - param))
                    torch.cuda.empty_cache()

            parser = argparse.ArgumentParser()
            parser.add_argument("--use_ema", action="store_true")
            args = parser.parse_args()
            ema = EMAModel()
            for x in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                if args.use_ema:
                    ema.step(model.parameters())
            """,
        ),
        Valid(  # once, before evaluation
            """
            import torch
            for epoch in range(10):
                for x, y in loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    opt.step()
                torch.cuda.empty_cache()
                evaluate(model)
            """
        ),
        Valid(  # recovering from an out-of-memory error, and once before the first step
            """
            import torch
            for step, (x, y) in enumerate(loader):
                if step == 0:
                    torch.cuda.empty_cache()
                try:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                except torch.cuda.OutOfMemoryError:
                    optimizer.zero_grad(set_to_none=True)
                    torch.cuda.empty_cache()
                    continue
                opt.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for step, (x, y) in enumerate(loader):
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
                # free cached blocks
                torch.cuda.empty_cache()
                opt.zero_grad()
            """,
            fixed="""
            import torch
            for step, (x, y) in enumerate(loader):
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
                # free cached blocks
                opt.zero_grad()
            """,
        ),
        Valid(  # every N steps, after the validation videos a diffusers pipeline sampled (SVD_Xtend)
            """
            import torch

            for step, batch in enumerate(loader):
                loss = unet(batch.cuda()).sum()
                accelerator.backward(loss)
                optimizer.step()
                if step % args.validation_steps == 0:
                    pipeline = StableVideoDiffusionPipeline.from_pretrained(args.model, unet=unet).to("cuda")
                    frames = pipeline(image, num_frames=14).frames[0]
                    export_to_gif(frames, f"{step}.gif")
                    del pipeline
                    torch.cuda.empty_cache()
            """,
        ),
        Valid(  # every N steps, before the validation pass that branch runs (HiFi-GAN)
            """
            import torch

            def train(model, opt, loader, valid_loader, interval=1000):
                for step, (x, y) in enumerate(loader):
                    loss = torch.nn.functional.l1_loss(model(x.cuda()), y.cuda())
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    if step % interval == 0:
                        torch.cuda.empty_cache()
                        model.eval()
                        with torch.no_grad():
                            for vx, vy in valid_loader:
                                model(vx.cuda())
                        model.train()
            """
        ),
        Valid(  # around the samples and the checkpoint saved every `eval_interval` steps (U-ViT)
            """
            import torch
            from torchvision.utils import save_image
            for step, batch in enumerate(loader):
                loss = model(batch.cuda()).sum()
                loss.backward()
                opt.step()
                if step % config.train.eval_interval == 0:
                    torch.cuda.empty_cache()
                    save_image(sampler(ema_model), f"{step}.png")
                    torch.cuda.empty_cache()
            """
        ),
        Valid(  # every 5,000 steps: a thousandth of the run or less, whatever one call costs
            """
            import torch
            for step, batch in enumerate(loader):
                loss = model(batch.cuda()).sum()
                loss.backward()
                opt.step()
                if step % 5000 == 0:
                    torch.cuda.empty_cache()
            """
        ),
        Invalid(  # "every N batches" (the brief's advice): the whole guard goes
            """
            import torch
            for batch_idx, batch in enumerate(loader):
                loss = model(batch.cuda()).sum()
                loss.backward()
                opt.step()
                if batch_idx % 100 == 0 and torch.cuda.is_available():
                    torch.cuda.empty_cache()
            print("done")
            """,
            fixed="""
            import torch
            for batch_idx, batch in enumerate(loader):
                loss = model(batch.cuda()).sum()
                loss.backward()
                opt.step()
            print("done")
            """,
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        return spread_out(finding)

    def finish(self) -> None:
        for site in self.ctx.calls_to(*_EMPTY_CACHE):
            if before_evaluation(self.ctx, site):
                continue  # every N steps, to make room for a validation pass: what it is for
            report_loop_call(
                self, site, "`torch.cuda.empty_cache()`",
                every_step="in the training loop syncs the GPU and frees memory the next step allocates again",
                each_call="syncs the GPU and frees cached memory that later steps allocate again",
            )
