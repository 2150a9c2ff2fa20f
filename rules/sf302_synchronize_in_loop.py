from __future__ import annotations

from speedfix.findings import Severity
from speedfix.rule import Invalid, Rule, Valid

_SYNCHRONIZE = ("torch.cuda.synchronize", "torch.accelerator.synchronize")


class SynchronizeInLoop(Rule):
    """
    ## What it does
    Finds `torch.cuda.synchronize()` (or `torch.accelerator.synchronize()`) that runs on every
    training step. A call under a periodic `if step % N == 0:` guard, or outside the step loop,
    is left alone.

    ## Why is this bad?
    CUDA kernels run asynchronously: the CPU queues the next step's kernels while the GPU works
    on this one. A synchronize makes the CPU wait until the GPU is idle, so every step starts
    with an empty queue and the GPU idles while Python launches the next kernels. It is usually
    there to time each step; timing every N steps, or with CUDA events, measures the same
    without stalling the pipeline.

    ## Example
    ```python
    for x, y in loader:
        ...
        optimizer.step()
        torch.cuda.synchronize()
        step_times.append(time.perf_counter() - start)
    ```

    ## Use instead
    ```python
    for step, (x, y) in enumerate(loader):
        ...
        optimizer.step()
        if step % 100 == 0:
            torch.cuda.synchronize()
            log(time.perf_counter() - start)
    ```

    ## Fix safety
    No automatic fix: the call is usually there for timing, and the timings it guards become
    wrong without it. Move it under the logging condition by hand.

    ## Measured effect
    About 25% slower training with a per-step synchronize on an RTX 2080 Ti (KPConv). The effect
    depends on how launch-bound the step is; one report of a C++ LSTM ran faster with a sync, so
    measure with `speedfix bench`.
    Sources: https://github.com/HuguesTHOMAS/KPConv-PyTorch/issues/22,
    https://github.com/pytorch/pytorch/issues/63618
    """

    code = "SF302"
    name = "synchronize-in-loop"
    summary = "`torch.cuda.synchronize()` on every training step"
    severity = Severity.WARNING
    requires = (b"synchronize",)
    gpu_only = True
    effect = "The CPU queues work ahead of the GPU again: about 25% in one report (KPConv)."

    VALID = [
        Valid(  # every N steps, for logging
            """
            import torch
            for step, (x, y) in enumerate(loader):
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
                if step % 100 == 0:
                    torch.cuda.synchronize()
                    print(time.time() - start)
            """
        ),
        Valid(  # once, after training
            """
            import torch
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            torch.cuda.synchronize()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
                torch.cuda.synchronize()
            """
        ),
        Invalid(  # in the step function, through an alias
            """
            from torch import cuda

            def train_step(x):
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
                cuda.synchronize()

            for x in loader:
                train_step(x)
            """
        ),
    ]

    def finish(self) -> None:
        for site in self.ctx.calls_to(*_SYNCHRONIZE):
            if self.ctx.is_hot(site.stack):
                self.report(site.node, "`torch.cuda.synchronize()` on every step makes the CPU wait for the GPU to go idle")
