from __future__ import annotations

from speedfix.engine.findings import Applicability, LossCheck, Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.model.branches import BranchTracker
from speedfix.rules._impact import Estimate, Finding, spread_out
from speedfix.rules._loop_calls import report_loop_call


class GcCollectInLoop(BranchTracker, Rule):
    """
    ## What it does
    Finds `gc.collect()` inside the training loop. On every step it is a warning; "every N steps"
    under a `if step % N == 0:` guard, or under an opt-in debugging flag, is an info note (its cost
    is spread over N steps); every 1,000 steps or more, by a number the file states, it is left
    alone. In an `except` handler or a branch that runs once it is left alone, and under an
    option that is off by default and that no launch command passes (also around the call of
    the method that makes it).

    ## Why is this bad?
    A full collection walks every tracked Python object, and a training process holds many
    (modules, parameters, optimizer state, DataLoader machinery): each call costs milliseconds to
    seconds of pure CPU time during which no GPU work is queued. CPython already collects
    generations incrementally; tensors are freed by reference counting, not by the cycle
    collector. Once per epoch, outside the step loop, is left alone.

    ## Example
    ```python
    for batch in loader:
        loss = step(batch)
        gc.collect()
    ```

    ## Use instead
    ```python
    for batch in loader:
        loss = step(batch)
    ```

    ## Fix safety
    Unsafe: a program that creates reference cycles holding large host buffers may then keep
    them longer (host memory, not GPU memory); reference cycles through tensors are rare. No fix
    for a call under an opt-in debugging flag: it runs only when the user asks for it.

    ## Impact
    High: a full garbage collection every step costs milliseconds to tens of milliseconds on
    the CPU that should be queueing the step. Medium when it runs every few steps rather than
    on every one, low when only while an option is on.

    ## Measured effect
    Hugging Face PEFT: 108 s to 65 s (1.66x) for the same steps after removing per-step
    `gc.collect()`, with unchanged memory.
    Source: https://github.com/huggingface/peft/pull/2894
    """

    impact = "high"
    code = "SF304"
    name = "gc-collect-in-loop"
    summary = "`gc.collect()` in the training loop"
    severity = Severity.WARNING
    requires = (b"gc.collect", b"collect(")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.EXACT
    fix_title = "Remove the call from the training loop"
    effect = "No full garbage collection per step: 1.66x in PEFT."
    tracked_calls = frozenset({"collect"})

    VALID = [
        Valid(
            """
            import gc
            import torch
            for epoch in range(3):
                for x in loader:
                    loss = model(x).sum()
                    loss.backward()
                    opt.step()
                gc.collect()
            """
        ),
        Valid(  # not the gc module
            """
            import torch
            from myproject import gc
            for x in loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
                gc.collect()
            """
        ),
        Valid(  # after an error, before the retry
            """
            import gc
            import torch
            for x in loader:
                try:
                    loss = model(x).sum()
                    loss.backward()
                except RuntimeError:
                    gc.collect()
                    continue
                opt.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import gc
            from gc import collect
            import torch
            for x in loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
                gc.collect()
                if step % 10 == 0:
                    collect()
                else:
                    print(step)
            """,
            fixed="""
            import gc
            from gc import collect
            import torch
            for x in loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
                if step % 10 == 0:
                    pass
                else:
                    print(step)
            """,
            count=2,
        ),
        Invalid(  # under an opt-in profiling flag: an info note, no fix
            """
            import gc
            import torch
            for x in loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
                if profile_memory:
                    gc.collect()
                    log_memory()
            """,
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        return spread_out(finding)

    def finish(self) -> None:
        for site in self.ctx.calls_to("gc.collect"):
            report_loop_call(
                self, site, "`gc.collect()`",
                every_step="in the training loop walks every Python object while no GPU work is queued",
                each_call="walks every Python object while no GPU work is queued",
            )
