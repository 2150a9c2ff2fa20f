from __future__ import annotations

from speedfix.findings import Applicability, LossCheck, Severity
from speedfix.removal import NOT_ALONE, call_removal
from speedfix.rule import Invalid, Rule, Valid


class GcCollectInLoop(Rule):
    """
    ## What it does
    Finds `gc.collect()` inside the training loop (guarded "every N steps" included).

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
    them longer (host memory, not GPU memory); reference cycles through tensors are rare.

    ## Measured effect
    Hugging Face PEFT: 108 s to 65 s (1.66x) for the same steps after removing per-step
    `gc.collect()`, with unchanged memory.
    Source: https://github.com/huggingface/peft/pull/2894
    """

    code = "SF304"
    name = "gc-collect-in-loop"
    summary = "`gc.collect()` in the training loop"
    severity = Severity.WARNING
    requires = (b"gc.collect", b"collect(")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.EXACT
    fix_title = "Remove the call from the training loop"
    effect = "No full garbage collection per step: 1.66x in PEFT."

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
    ]

    def finish(self) -> None:
        for site in self.ctx.calls_to("gc.collect"):
            if not self.ctx.in_training_loop(site.stack):
                continue
            self.report(
                site.node,
                "`gc.collect()` in the training loop walks every Python object while no GPU work is queued",
                fix_ops=call_removal(self.ctx, site),
                no_fix_reason=NOT_ALONE,
            )
