from __future__ import annotations

import re

import libcst as cst

from speedfix.engine.findings import Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.model.branches import BranchTracker, frequency
from speedfix.model.index import CallSite
from speedfix.rules._impact import Estimate, Finding, Impact
from speedfix.syntax.comments import statement_comments

_SYNCHRONIZE = ("torch.cuda.synchronize", "torch.accelerator.synchronize")
# A comment that says the call is there to measure time.
_TIMING = re.compile(r"\btim(e|es|ed|ing|ings|er)\b|measur|benchmark|profil|latenc|throughput|deliberate|intentional|on purpose", re.IGNORECASE)


class SynchronizeInLoop(BranchTracker, Rule):
    """
    ## What it does
    Finds `torch.cuda.synchronize()` (or `torch.accelerator.synchronize()`) that runs on every
    training step, once per step (a timer that synchronizes at the start and at the end of the
    step is one finding, on the first call, which counts the others). A call under a periodic
    `if step % N == 0:` guard, outside the step loop, in a branch that runs once or in an
    `except` handler is left alone. One that a comment marks as deliberate timing (`# sync so
    the timer measures the GPU work`), or that only runs under an opt-in flag (`if
    args.synchronize_step:`), is an info note rather than a warning: measuring is a choice, but
    the measured run is slower than an unmeasured one.

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

    ## Impact
    Medium, as one host sync per step in SF301: the CPU waits for the GPU every step, which
    costs what CPU/GPU overlap would have hidden, a large share of a short step and noise in a
    long one. A `speedfix bench` result of the script measured on a GPU decides: high for a
    median step of 50 ms or less, low for 500 ms or more. Low for a sync that runs only while an
    option is on, or that a comment says times the step.

    ## Measured effect
    About 25% slower training with a per-step synchronize on an RTX 2080 Ti (KPConv). The effect
    depends on how launch-bound the step is; one report of a C++ LSTM ran faster with a sync, so
    measure with `speedfix bench`.
    Sources: https://github.com/HuguesTHOMAS/KPConv-PyTorch/issues/22,
    https://github.com/pytorch/pytorch/issues/63618
    """

    impact = "medium"
    measure = "host_sync"
    code = "SF302"
    name = "synchronize-in-loop"
    summary = "`torch.cuda.synchronize()` on every training step"
    severity = Severity.WARNING
    requires = (b"synchronize",)
    gpu_only = True
    effect = "The CPU queues work ahead of the GPU again: about 25% in one report (KPConv)."
    tracked_calls = frozenset({"synchronize"})

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
        Valid(  # a kernel benchmark: the backward it times runs in a lambda, it takes no training step
            """
            import time
            import torch

            def bench_backward(out, grad):
                backward = lambda: out.backward(grad, retain_graph=True)
                times = []
                for _ in range(10):
                    torch.cuda.synchronize()
                    start = time.time()
                    backward()
                    torch.cuda.synchronize()
                    times.append(time.time() - start)
                return times
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
        Valid(  # the first step only, and an error path
            """
            import torch
            for step, (x, y) in enumerate(loader):
                if step == 0:
                    torch.cuda.synchronize()
                    warmup_done = time.perf_counter()
                try:
                    loss = model(x.cuda()).sum()
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.synchronize()
                    raise
                loss.backward()
                opt.step()
            """
        ),
    ]
    INVALID = [
        Invalid(  # a step timer that waits at the start and at the end: one finding for the step
            """
            import time
            import torch
            for x, y in loader:
                torch.cuda.synchronize()
                begin = time.perf_counter()
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
                torch.cuda.synchronize()
                elapsed += time.perf_counter() - begin
            """
        ),
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
        Invalid(  # an opt-in flag (off by default): an info note
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--sync-timing", action="store_true")
            args = parser.parse_args()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
                if args.sync_timing:
                    torch.cuda.synchronize()
                step_times.append(time.perf_counter() - start)
            """
        ),
        Invalid(  # commented as deliberate timing: an info note
            """
            import torch
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
                torch.cuda.synchronize()  # wait for the GPU so the step time is measured
                step_times.append(time.perf_counter() - start)
            """
        ),
        Invalid(  # a flag the script turns on is no opt-in: a warning
            """
            import torch
            DEBUG = True
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
                if DEBUG:
                    torch.cuda.synchronize()
            """
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        if finding.severity is Severity.INFO:  # under a flag that is off by default, or to time the step
            return Estimate(Impact.LOW, "it runs only while an option is on, or to time a step", measurable=False)
        return None

    def finish(self) -> None:
        # A step's waits of one kind (a timer's start and stop): one finding, on the first
        steps: dict[tuple[object, str], list[CallSite]] = {}
        for site in self.ctx.calls_to(*_SYNCHRONIZE):
            how_often = frequency(self.ctx, site.stack, self.branches_at(site.node))
            if how_often is None or how_often.interval is not None:
                continue  # once, on an error path, or every N steps
            if how_often.flag is not None:
                kind = f"on every step {how_often.describe()}: runs with the flag are slower than without it"
            elif self._marked_as_timing(site):
                kind = "on every step, commented as timing: the timed run is slower than an untimed one"
            else:
                kind = "on every step makes the CPU wait for the GPU to go idle"
            scope = self.ctx.step_scope(site.stack)
            steps.setdefault((scope if scope is not None else site.node, kind), []).append(site)
        for (_, kind), sites in steps.items():
            more = f" (and {len(sites) - 1} more time{'s' if len(sites) > 2 else ''} in the same step)" \
                if len(sites) > 1 else ""
            severity = Severity.WARNING if kind.endswith("go idle") else Severity.INFO
            self.report(sites[0].node, f"`torch.cuda.synchronize()` {kind}{more}", severity=severity)

    def _marked_as_timing(self, site: CallSite) -> bool:
        """A comment on the call, or on an `if` around it inside the step, says it times the step."""
        scope = self.ctx.step_scope(site.stack)
        statements: list[cst.BaseStatement] = [site.statement] if site.statement is not None else []
        statements += [
            branch.node for branch in self.branches_at(site.node)
            if isinstance(branch.node, cst.If) and any(frame.node is scope for frame in branch.stack)
        ]
        return any(_TIMING.search(comment) for statement in statements for comment in statement_comments(statement))
