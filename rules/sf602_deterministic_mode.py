from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.model.arguments import find_argument, literal_bool
from speedfix.model.context import FileContext
from speedfix.model.flow import holds_in_every_run, taken_on_a_gpu
from speedfix.model.frames import Stack
from speedfix.model.frameworks import lightning_fits
from speedfix.model.patterns import DETERMINISM_HELPERS, DETERMINISTIC_ALGORITHMS
from speedfix.model.scale import trains_mlps_only
from speedfix.rules._examples import TOY_MLP
from speedfix.syntax.blocks import statement_owner
from speedfix.syntax.nodes import is_main_guard


class DeterministicMode(Rule):
    """
    ## What it does
    Finds deterministic mode switched on unconditionally in a CUDA training script:
    `torch.backends.cudnn.deterministic = True`, `torch.use_deterministic_algorithms(True)`, or
    MONAI's `set_determinism(seed=0)` (which also turns `cudnn.benchmark` off; no fix: it seeds too).
    A switch behind a condition (`if args.seed is not None:`, `if args.deterministic:`) is a
    choice the user makes per run and is left alone; one behind a test that holds wherever a GPU
    is (`if not args.disable_cuda and torch.cuda.is_available():`) or in every run (`if args.seed is
    not None:` after `if args.seed is None: args.seed = random_seed()`) is not a choice, and is
    reported.
    SF601 leaves a script that asks for determinism alone, so when the script does not turn
    `cudnn.benchmark` on either, the message says to do so with it gone (for fixed input shapes).
    `cudnn.deterministic` in a script whose trained models are all MLPs (`nn.Linear` layers) is
    left alone: no convolution or recurrent layer runs through cuDNN there.

    ## Why is this bad?
    Deterministic mode limits cuDNN and cuBLAS to the algorithms that give bit-identical results,
    which are often not the fastest, and makes some ops (scatter-add, index-add, some poolings'
    backward) fall back to slower implementations or raise. pytorch/examples warns: "This will
    turn on the CUDNN deterministic setting, which can slow down your training considerably!"
    Seeding alone makes runs comparable; bit-exact reruns are rarely needed during training.

    ## Example
    ```python
    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    ```

    ## Use instead
    ```python
    torch.manual_seed(0)
    if args.deterministic:  # bit-exact reruns when asked for
        torch.backends.cudnn.deterministic = True
    ```

    ## Fix safety
    No automatic fix: reproducibility is the user's contract, not ours to drop.

    ## Impact
    Medium: deterministic kernels are slower for some layers, and the setting is often left on
    from debugging. Nothing moves it.

    ## Measured effect
    Depends on the model: the cost is in the convolution and scatter kernels that determinism
    rules out. PyTorch's reproducibility notes: deterministic operations "are often slower than
    nondeterministic operations"; pytorch/examples imagenet warns of a considerable slowdown.
    Sources: https://pytorch.org/docs/stable/notes/randomness.html,
    https://github.com/pytorch/examples/blob/main/imagenet/main.py
    """

    impact = "medium"
    code = "SF602"
    name = "deterministic-mode"
    summary = "Deterministic cuDNN/algorithms switched on unconditionally in training"
    severity = Severity.INFO
    requires = (b"deterministic", b"set_determinism")
    gpu_only = True
    effect = "Determinism rules out the fastest conv and scatter kernels; the cost depends on the model."

    VALID = [
        Valid(  # behind a flag: the user's per-run choice
            """
            import torch
            if args.seed is not None:
                torch.backends.cudnn.deterministic = True
            model = Net().cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # switched off
            """
            import torch
            torch.use_deterministic_algorithms(False)
            model = Net().cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """
        ),
        Valid(  # an evaluation script: no training loop
            """
            import torch
            torch.backends.cudnn.deterministic = True
            model = Net().cuda()
            print(model(x.cuda()))
            """
        ),
        # an MLP (the UvA tutorial's classifier): no convolution for cuDNN to choose an algorithm for
        Valid(TOY_MLP + "torch.backends.cudnn.deterministic = True\n"),
    ]
    INVALID = [
        Invalid(  # MONAI's helper seeds and sets cuDNN's deterministic mode
            """
            import torch
            from monai.utils import set_determinism

            set_determinism(seed=0)
            model = UNet().cuda()
            for x, y in loader:
                loss_fn(model(x.cuda()), y.cuda()).backward()
                opt.step()
            """
        ),
        Invalid(
            """
            import torch
            torch.manual_seed(0)
            torch.backends.cudnn.deterministic = True
            torch.use_deterministic_algorithms(True)
            model = Net().cuda()
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """,
            count=2,
        ),
        Invalid(  # SimCLR: set whenever a GPU is there, which is where it costs
            """
            import argparse
            import torch
            import torch.backends.cudnn as cudnn
            parser = argparse.ArgumentParser()
            parser.add_argument("--disable-cuda", action="store_true")

            def main():
                args = parser.parse_args()
                if not args.disable_cuda and torch.cuda.is_available():
                    args.device = torch.device("cuda")
                    cudnn.deterministic = True
                    cudnn.benchmark = True
                for x, y in loader:
                    loss = model(x.to(args.device)).sum()
                    loss.backward()
                    opt.step()
            """,
        ),
        Invalid(  # a Lightning script: the Trainer keeps the flag the script set (and benchmark off)
            """
            import torch
            import lightning as L
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
            L.Trainer(max_epochs=90).fit(ConvNet(), train_loader)
            """
        ),
        Invalid(  # in the main guard and through an alias: still unconditional
            """
            import torch.backends.cudnn as cudnn

            def main():
                for x, y in loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    opt.step()

            if __name__ == "__main__":
                cudnn.deterministic = True
                main()
            """,
        ),
        Invalid(  # pointMLP: a seed drawn when none is given, so the test below holds in every run
            """
            import argparse
            import numpy as np
            import torch

            def main():
                parser = argparse.ArgumentParser()
                parser.add_argument("--seed", type=int)
                args = parser.parse_args()
                if args.seed is None:
                    args.seed = np.random.randint(1, 10000)
                if args.seed is not None:
                    torch.manual_seed(args.seed)
                    torch.backends.cudnn.deterministic = True
                for x, y in loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    opt.step()
            """,
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        if not ctx.drives_training and not lightning_fits(ctx):  # Lightning keeps the cuDNN flags the script set
            return
        for name, assignments in ctx.assignments.items():
            if not name.endswith("cudnn.deterministic") or trains_mlps_only(ctx):
                continue  # (an MLP runs no convolution: the flag chooses nothing there)
            for assignment in assignments:
                if literal_bool(ctx, assignment.value, assignment.stack) and not _conditional(ctx, assignment.statement, assignment.stack):
                    self.report(assignment.value, "`cudnn.deterministic = True` rules out the fastest convolution algorithms"
                                + ("" if _benchmark_on(ctx) else _BENCHMARK_TOO))
        for site in ctx.calls_to(*DETERMINISTIC_ALGORITHMS):
            mode = find_argument(ctx, site, "mode", 0)
            if literal_bool(ctx, mode.node, site.stack) and not _conditional(ctx, site.statement, site.stack):
                self.report(site.node, "`use_deterministic_algorithms(True)` rules out fast nondeterministic kernels")
        for site in ctx.calls_to(*DETERMINISM_HELPERS):
            seed = find_argument(ctx, site, "seed", 0).node
            if not (isinstance(seed, cst.Name) and seed.value == "None") and not _conditional(ctx, site.statement, site.stack):
                self.report(site.node, "MONAI's `set_determinism(seed=...)` sets `cudnn.deterministic = True` and turns "
                            "`cudnn.benchmark` off, which rules out the fastest convolution algorithms",
                            no_fix_reason="it also seeds the random generators: seed with `monai.utils.set_determinism(seed=..., "
                            "use_deterministic_algorithms=False)` and set `torch.backends.cudnn.deterministic = False` after it, "
                            "or seed with `torch.manual_seed` alone")


# SF601 leaves a script that asks for determinism alone: dropping it is this rule's advice, and
# autotuning is what a convolutional net then gains most from.
_BENCHMARK_TOO = "; without it, also set `cudnn.benchmark = True` when the input shapes are fixed (SF601)"


def _benchmark_on(ctx: FileContext) -> bool:
    """Does the script set `cudnn.benchmark = True` anywhere?"""
    return any(literal_bool(ctx, assignment.value, assignment.stack)
               for name, assignments in ctx.assignments.items() if name.endswith("cudnn.benchmark")
               for assignment in assignments)


def _conditional(ctx: FileContext, statement: cst.BaseStatement | None, stack: Stack) -> bool:
    """Is ``statement`` under an `if` (other than the `__main__` guard, and a test that holds
    on every GPU machine: `if not args.disable_cuda and torch.cuda.is_available():`)?"""
    if statement is None:
        return False
    owner = statement_owner(ctx, statement)
    if owner is None:
        return False
    node = owner[0]
    if isinstance(node, cst.If):
        return not (is_main_guard(node.test) or taken_on_a_gpu(ctx, node.test, stack) or holds_in_every_run(ctx, node, stack))
    return isinstance(node, cst.Else)
