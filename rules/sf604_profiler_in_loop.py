from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.model.arguments import find_argument, literal_bool
from speedfix.model.branches import BranchTracker, Frequency, frequency, opt_in_flag
from speedfix.model.flow import assigned_name
from speedfix.model.frames import FrameKind
from speedfix.model.index import CallSite, WithInfo
from speedfix.rules._impact import Estimate, Finding, Impact
from speedfix.syntax.names import dotted_name

# Context managers that record (or count) every operator while they are entered (or started).
_RECORDERS = frozenset(
    {
        "torch.profiler.profile", "torch.autograd.profiler.profile", "torch.autograd.profiler.emit_nvtx",
        "torch.autograd.profiler.emit_itt", "torch.utils.flop_counter.FlopCounterMode",
    }
)
# Calls that profile, count or re-run the model as soon as they are called.
_RUNNERS = frozenset(
    {
        "torch.autograd.gradcheck", "torch.autograd.gradgradcheck", "torch.autograd.gradcheck.gradcheck",
        "fvcore.nn.FlopCountAnalysis", "thop.profile", "ptflops.get_model_complexity_info",
        "deepspeed.profiling.flops_profiler.get_model_profile",
        "deepspeed.profiling.flops_profiler.profiler.get_model_profile",
    }
)
_PROFILERS = _RECORDERS | _RUNNERS
# Profilers whose `schedule=` limits recording to a few steps.
_SCHEDULED = frozenset({"torch.profiler.profile"})
# NVTX ranges are for an external profiler (Nsight Systems): its capture range limits them.
_NVTX = frozenset({"torch.autograd.profiler.emit_nvtx", "torch.autograd.profiler.emit_itt"})


class ProfilerInLoop(BranchTracker, Rule):
    """
    ## What it does
    Finds profilers in the training path: a `torch.profiler.profile(...)`, autograd profiler,
    `emit_nvtx()` or `FlopCounterMode` entered (`with`, or `prof.start()`) on every training
    step, directly or in a function the loop calls; a FLOP count (fvcore, thop, ptflops,
    DeepSpeed's flops profiler) or `gradcheck` called there; and a `with torch.profiler.profile(...):`
    around the whole training loop without a `schedule=`. Run every N steps
    (`if step % 50 == 0:`) it is an info note: those steps pay for it. Under an opt-in flag
    (`if args.profile:`, `enabled=args.profile`), with `enabled=False`, or never entered, it is
    left alone: profiling is what the flag asks for.

    ## Why is this bad?
    An active profiler records every operator launch (with shapes, stacks or FLOPs when asked),
    and a FLOP counter usually runs an extra forward pass of its own. Around a whole training
    loop the profiler records every step and keeps the events in memory until it exits. A
    `schedule=` records a few steps and skips the rest; a FLOP count of a fixed-shape model is
    the same on every step, so counting it once is enough.

    ## Example
    ```python
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for x, y in loader:
            train_step(x, y)
    ```

    ## Use instead
    ```python
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1)
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA], schedule=schedule) as prof:
        for x, y in loader:
            train_step(x, y)
            prof.step()
    ```

    ## Fix safety
    No automatic fix: the profile is there on purpose; where to limit it is the user's choice.

    ## Impact
    High: a profiler, FLOP counter or gradcheck on every step multiplies its time. Medium when
    it runs every few steps rather than on every one.

    ## Measured effect
    The PyTorch profiler recipe recommends `schedule=` for long jobs because recording every
    step adds overhead and memory. A 3-layer MLP training step (batch 32, one CPU thread, torch
    2.13, 2026-11-23) took 2.68-3.05 ms inside `torch.profiler.profile()` against 1.68-1.73 ms
    without it: 1.6-1.8x (`benchmarks/profiler_cost.py`). A launch-bound GPU step pays the
    per-operator recording the same way. Source:
    https://pytorch.org/tutorials/recipes/recipes/profiler_recipe.html
    """

    impact = "high"
    code = "SF604"
    name = "profiler-in-loop"
    summary = "Profiler, FLOP counter or gradcheck active on every training step"
    severity = Severity.WARNING
    requires = (b"profile", b"emit_nvtx", b"emit_itt", b"FlopCount", b"flop_counter", b"gradcheck")
    # A profiler may sit in a helper: the helper's call is what runs every N steps or under a flag.
    tracked_calls = None
    effect = "A small MLP step ran 1.6-1.8x slower inside `torch.profiler.profile()` (CPU, torch 2.13)."

    VALID = [
        Valid(  # a schedule limits what is recorded
            """
            import torch
            schedule = torch.profiler.schedule(wait=1, warmup=1, active=3)
            with torch.profiler.profile(schedule=schedule) as prof:
                for x, y in loader:
                    loss = model(x).sum()
                    loss.backward()
                    opt.step()
                    prof.step()
            """
        ),
        Valid(  # under an opt-in flag: what the flag asks for
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--profile", action="store_true")
            args = parser.parse_args()
            for x, y in loader:
                if args.profile:
                    with torch.profiler.profile() as prof:
                        loss = model(x).sum()
                else:
                    loss = model(x).sum()
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # `enabled=` a flag, or off; a profiler object that is never entered
            """
            import torch
            torch.autograd.profiler.emit_nvtx(enabled=False)
            with torch.autograd.profiler.emit_nvtx(enabled=args.profile):
                for x, y in loader:
                    torch.autograd.profiler.profile(enabled=False)
                    loss = model(x).sum()
                    loss.backward()
                    opt.step()
            """
        ),
        Valid(  # once, before training
            """
            import torch
            from torch.utils.flop_counter import FlopCounterMode
            with FlopCounterMode(display=False) as counter:
                model(example)
            flops = counter.get_total_flops()
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
            """
        ),
    ]
    INVALID = [
        Invalid(  # around the whole training loop, no schedule
            """
            import torch
            with torch.profiler.profile(record_shapes=True) as prof:
                for x, y in loader:
                    loss = model(x).sum()
                    loss.backward()
                    opt.step()
            print(prof.key_averages().table())
            """
        ),
        Invalid(  # every step
            """
            import torch
            for x, y in loader:
                with torch.autograd.profiler.profile() as prof:
                    loss = model(x).sum()
                    loss.backward()
                opt.step()
            """
        ),
        Invalid(  # a FLOP count every 50 steps, in a helper the loop calls: an info note
            """
            import torch

            def estimate_flops(model, batch):
                with torch.profiler.profile(with_flops=True) as prof:
                    with torch.no_grad():
                        model(batch)
                return sum(event.flops for event in prof.key_averages())

            for step, (x, y) in enumerate(loader):
                loss = model(x).sum()
                loss.backward()
                opt.step()
                if step % 50 == 0:
                    flops = estimate_flops(model, x)
            """
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        if "every training step" in finding.message:
            return None
        return Estimate(Impact.MEDIUM, "it runs every few steps, not on every one")

    def finish(self) -> None:
        ctx = self.ctx
        for site in ctx.calls_to(*_PROFILERS):
            if not self._active(site):
                continue
            how_often = self._how_often(site)
            if how_often is None or how_often.flag is not None:
                continue
            what = f"`{site.func}(...)`"
            if how_often.every_step:
                self.report(site.node, f"{what} profiles every training step: each step records (or re-runs) every "
                            "operator; profile a few steps, or count FLOPs once")
            else:
                self.report(site.node, f"{what} runs {how_often.describe()} in the training loop: each of those steps "
                            "pays for recording every operator (and a FLOP count for its extra forward pass)",
                            severity=Severity.INFO)
        for info in ctx.withs:
            self._check_wrapped_loop(info)

    def _active(self, site: CallSite) -> bool:
        """Does the call profile anything: not `enabled=False` or an opt-in `enabled=args.profile`,
        and, for a context manager, entered by a `with` or started (`prof.start()`)?"""
        ctx = self.ctx
        enabled = find_argument(ctx, site, "enabled")
        if not enabled.missing and literal_bool(ctx, enabled.node, site.stack) is not True:
            return False  # off, or a flag (opt-in, like `if args.profile:`)
        if ctx.call_qualname(site) in _RUNNERS:
            return True
        if any(site.node in info.items for info in ctx.withs):
            return True
        holder = assigned_name(site)
        return holder is not None and any(
            dotted_name(call.node.func.value) == holder  # type: ignore[attr-defined]
            for method in ("start", "__enter__") for call in ctx.method_calls(method)
        )

    def _how_often(self, site: CallSite) -> Frequency | None:
        """How often ``site`` runs in the training loop; for a call in a local function that is
        not itself hot, how often the loop calls that function (one level)."""
        ctx = self.ctx
        found = frequency(ctx, site.stack, self.branches_at(site.node))
        if found is not None:
            return found
        function = ctx.function_of(site.stack)
        if function is None:
            return None
        callers = ctx.local_callers(function)
        frequencies = [f for caller in callers if (f := frequency(ctx, caller.stack, self.branches_at(caller.node)))]
        return min(frequencies, key=_rank) if frequencies else None

    def _check_wrapped_loop(self, info: WithInfo) -> None:
        ctx = self.ctx
        for item in info.items:
            if not isinstance(item, cst.Call):
                continue
            site = ctx.site_of(item)
            qualified = ctx.qualname(item.func)
            if site is None or qualified not in _PROFILERS or not self._active(site):
                continue
            if frequency(ctx, site.stack, self.branches_at(item)):
                continue  # inside the loop: reported above
            if qualified in _SCHEDULED and not find_argument(ctx, site, "schedule").missing:
                continue
            wraps_loop = any(
                any(frame.kind is FrameKind.WITH and frame.node is info.node for frame in ctx.loops[loop].stack)
                for loop in ctx.step_loops if loop in ctx.loops
            )
            if wraps_loop and opt_in_flag(ctx, self.branches_at(item)) is None:
                if qualified in _NVTX:
                    how = ("limit the capture to a few steps (`nsys --capture-range=cudaProfilerApi` with "
                           "`torch.cuda.profiler.start()`/`stop()` around them)")
                elif qualified in _SCHEDULED:
                    how = "pass `schedule=torch.profiler.schedule(...)` and call `prof.step()` each step"
                else:
                    how = "use `torch.profiler.profile(schedule=torch.profiler.schedule(...))` and call `prof.step()` each step"
                self.report(item, f"`{site.func}(...)` around the training loop records every step until it exits: {how}")


def _rank(found: Frequency) -> int:
    """Most often first: every step, then every N steps, then under a flag."""
    return 0 if found.every_step else 1 if found.flag is None else 2
