from __future__ import annotations

from functools import cached_property

import libcst as cst

from speedfix.engine.findings import Applicability, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, keyword_arg
from speedfix.model.arguments import find_argument, literal_int
from speedfix.model.flow import assigned_name
from speedfix.model.frameworks import lightning_iterates_per_epoch
from speedfix.model.context import FileContext
from speedfix.model.frames import Stack
from speedfix.model.index import CallSite
from speedfix.model.loaders import built_for_one_pass, iterated_per_epoch, not_for_training, returned_to_training
from speedfix.model.loader_classes import dataloader_calls
from speedfix.model.patterns import dataset_argument
from speedfix.model.scale import evaluation_feed, inference_feed
from speedfix.model.versions import v
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import code_of
from speedfix.rules._examples import NOTEBOOK_PEEKED_LOADERS, TEST_PASS_AFTER_TRAINING, VALIDATION_EVERY_EPOCH


_CPU_COUNTS = frozenset({"os.cpu_count", "multiprocessing.cpu_count", "torch.multiprocessing.cpu_count"})


def _per_core(ctx: FileContext, node: cst.BaseExpression | None, stack: Stack, shares: bool = True, depth: int = 0) -> bool:
    """`os.cpu_count()`, also through a constant (`workers = os.cpu_count()` at module level, or
    in every notebook cell that sets it) and with ``shares``, a share of it (`int(os.cpu_count() /
    2)`, `os.cpu_count() // 2`: 0 on one core)."""
    if shares and isinstance(node, cst.Call) and dotted_name(node.func) == "int" and len(node.args) == 1:
        node = node.args[0].value
    if shares and isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Divide, cst.FloorDivide)):
        node = node.left
    if isinstance(node, cst.Call):
        return ctx.qualname(node.func) in _CPU_COUNTS
    if not isinstance(node, cst.Name) or depth >= 5:
        return False
    assignments = ctx.assignments_in_scope(node.value, stack)
    return bool(assignments) and all(
        not a.augmented and not a.unpacked and _per_core(ctx, a.value, a.stack, shares, depth + 1) for a in assignments
    )


class DataloaderNoPersistentWorkers(Rule):
    """
    ## What it does
    Finds a `DataLoader` with worker processes (`num_workers` resolves to more than 0) that is
    iterated once per epoch (inside an outer loop, or by a function called in one, or cycled by
    a generator of the project: `datalooper = infiniteloop(loader)` whose `while True:` loop
    iterates the loader again and again) without `persistent_workers=True`. The worker count
    may be a constructor argument the class reads back (`num_workers=self.num_workers` in a LightningDataModule), set by the project's
    LightningCLI config (`data: {num_workers: 8}`) or left at the `__init__` default.

    Not reported on a loader that only evaluation reads (iterated only in loops that take no
    optimizer step, or named for it when the file iterates it nowhere: `val_loader`, a
    `test_dataloader()` that returns it): restarting its workers delays a validation pass, not
    the training steps, and a worker pool kept alive for it holds memory for the whole run; nor
    on the loader of a script that never trains and evaluates (an evaluation script), nor on
    one made anew in every epoch and used only there (`for epoch in ...: loader =
    DataLoader(...); train_epoch(epoch, loader)`): its workers end with it whatever the flag says.

    ## Why is this bad?
    Without it, every `for batch in loader:` starts `num_workers` new processes, each importing
    the script's modules and copying the dataset, and shuts them down at the end of the epoch.
    The GPU waits for the first batches of every epoch. With `persistent_workers=True` the
    workers live for the whole run.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=64, num_workers=8)
    for epoch in range(epochs):
        for x, y in loader:
            ...
    ```

    ## Use instead
    ```python
    loader = DataLoader(dataset, batch_size=64, num_workers=8, persistent_workers=True)
    for epoch in range(epochs):
        for x, y in loader:
            ...
    ```

    ## Fix safety
    Unsafe: the workers keep their own copy of the dataset, so changes the main process makes to
    it between epochs (`dataset.set_epoch(epoch)`, curriculum or resampling attributes) are no
    longer seen; a loader whose dataset is changed inside a loop gets no fix. The workers' memory
    stays allocated for the whole run. When `num_workers` is not a literal in the call (an
    argparse option, say), the fix writes `persistent_workers=<that value> > 0`, because
    `persistent_workers=True` with `num_workers=0` raises a `ValueError`.

    ## Impact
    Low: the workers start again once per epoch, a pause per epoch rather than per step.
    Nothing moves it. (A loader that only evaluation reads is not reported at all.)

    ## Measured effect
    Worker start-up per epoch went from 7 minutes to 35 s of data initialisation in MMHuman3D;
    7.6 to 9.5 it/s on Windows (spawn start method) with no difference on Linux in another
    project: the gain is largest where workers are slow to start (spawn, big datasets, short
    epochs). Sources: https://github.com/open-mmlab/mmhuman3d/pull/233,
    https://github.com/boreshkinai/delta-interpolator/pull/3
    """

    impact = "low"
    code = "SF103"
    name = "dataloader-no-persistent-workers"
    summary = "DataLoader workers restarted every epoch (no `persistent_workers=True`)"
    severity = Severity.INFO
    requires = (b"num_workers",)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.RNG  # workers that persist keep their random state across epochs
    fix_title = "Keep the workers between epochs: `persistent_workers=True`"
    min_torch = v("1.7")
    effect = "No worker start-up per epoch (MMHuman3D: 7 min to 35 s of data set-up)."

    VALID = [
        Valid(  # the validation loader of `trainer.fit(model, train_loader, val_loader)` (Lightning 1.x)
            """
            import pytorch_lightning as pl
            from torch.utils.data import DataLoader
            train_loader = DataLoader(train_set, batch_size=32, shuffle=True, num_workers=8, persistent_workers=True)
            val_loader = DataLoader(val_set, batch_size=32, num_workers=8)
            trainer = pl.Trainer.from_argparse_args(args, gpus=1)
            trainer.fit(model, train_loader, val_loader)
            """
        ),
        Valid(  # a new loader every epoch (to skip the batches a resumed run has done): nothing to keep alive
            """
            import torch
            from torch.utils.data import DataLoader

            def train_epoch(epoch, loader):
                for x, y in loader:
                    loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
                    loss.backward()
                    optimizer.step()

            for epoch in range(10):
                sampler = ResumeSampler(indices, 32, done if epoch == 0 else 0)
                loader = DataLoader(train_ds, batch_sampler=sampler, num_workers=8, pin_memory=True)
                train_epoch(epoch, loader)
            """
        ),
        Valid(NOTEBOOK_PEEKED_LOADERS),  # shown and peeked at in a notebook; a later parameter shares the name
        Valid(TEST_PASS_AFTER_TRAINING),  # a test loader read once after training
        Valid(VALIDATION_EVERY_EPOCH),  # a validation loader read every epoch, no training step
        Valid(  # iterated once: nothing to keep alive
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=4)
            for x, y in loader:
                train(x, y)
            """
        ),
        Valid(  # the attribute is set again outside the constructor: its value at run time is unknown
            """
            import lightning as L
            from torch.utils.data import DataLoader

            class TilesData(L.LightningDataModule):
                def __init__(self, tiles, num_workers=6):
                    super().__init__()
                    self.tiles = tiles
                    self.num_workers = num_workers

                def setup(self, stage=None):
                    self.num_workers = 0 if stage == "predict" else self.num_workers

                def train_dataloader(self):
                    return DataLoader(self.tiles, batch_size=16, num_workers=self.num_workers)
            """
        ),
        Valid(  # no workers
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32)
            for epoch in range(10):
                for x, y in loader:
                    train(x, y)
            """
        ),
        Valid(  # Lightning runs one epoch: the workers start once anyway
            """
            import lightning as L
            from torch.utils.data import DataLoader
            loader = DataLoader(images, batch_size=128, num_workers=6)
            L.Trainer(max_epochs=1).fit(Net(), loader)
            """
        ),
        Valid(  # already persistent (or explicitly not)
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=4, persistent_workers=False)
            for epoch in range(10):
                for x, y in loader:
                    train(x, y)
            """
        ),
    ]
    INVALID = [
        Invalid(  # a DataModule method the class hands to Lightning as its train_dataloader hook
            """
            import lightning as L
            from torch.utils.data import DataLoader

            class Clips(L.LightningDataModule):
                def _make_train_loader(self):
                    return DataLoader(self.clips, num_workers=6, pin_memory=True)

                def setup(self, stage=None):
                    self.train_dataloader = self._make_train_loader
            """,
            fixed="""
            import lightning as L
            from torch.utils.data import DataLoader

            class Clips(L.LightningDataModule):
                def _make_train_loader(self):
                    return DataLoader(self.clips, num_workers=6, pin_memory=True, persistent_workers=True)

                def setup(self, stage=None):
                    self.train_dataloader = self._make_train_loader
            """,
        ),
        Invalid(  # a module constant of one worker per core
            """
            import os
            from torch.utils.data import DataLoader

            workers = os.cpu_count()

            def main():
                loader = DataLoader(ds, batch_size=64, num_workers=workers)
                for epoch in range(10):
                    for x, y in loader:
                        train(x, y)
            """,
            fixed="""
            import os
            from torch.utils.data import DataLoader

            workers = os.cpu_count()

            def main():
                loader = DataLoader(ds, batch_size=64, num_workers=workers, persistent_workers=True)
                for epoch in range(10):
                    for x, y in loader:
                        train(x, y)
            """,
        ),
        Invalid(  # MAE/DeiT: the parser comes from a function, `args` is bound twice
            """
            import argparse
            import torch

            def get_args_parser():
                parser = argparse.ArgumentParser("pre-training", add_help=False)
                parser.add_argument("--num_workers", default=10, type=int)
                return parser

            def main(args):
                loader = torch.utils.data.DataLoader(dataset, num_workers=args.num_workers)
                for epoch in range(100):
                    for x in loader:
                        train_step(x)

            if __name__ == "__main__":
                args = get_args_parser()
                args = args.parse_args()
                main(args)
            """,
            fixed="""
            import argparse
            import torch

            def get_args_parser():
                parser = argparse.ArgumentParser("pre-training", add_help=False)
                parser.add_argument("--num_workers", default=10, type=int)
                return parser

            def main(args):
                loader = torch.utils.data.DataLoader(
                    dataset,
                    num_workers=args.num_workers,
                    persistent_workers=args.num_workers > 0,
                )
                for epoch in range(100):
                    for x in loader:
                        train_step(x)

            if __name__ == "__main__":
                args = get_args_parser()
                args = args.parse_args()
                main(args)
            """,
        ),
        Invalid(  # handed to a trainer class of this file that loops over it every epoch
            """
            from torch.utils.data import DataLoader

            class Trainer:
                def __init__(self, model, train_loader):
                    self.model = model
                    self.train_loader = train_loader

                def fit(self, epochs):
                    for epoch in range(epochs):
                        for x, y in self.train_loader:
                            self.model.step(x, y)

            loader = DataLoader(ds, batch_size=64, num_workers=4)
            Trainer(model, loader).fit(10)
            """,
            fixed="""
            from torch.utils.data import DataLoader

            class Trainer:
                def __init__(self, model, train_loader):
                    self.model = model
                    self.train_loader = train_loader

                def fit(self, epochs):
                    for epoch in range(epochs):
                        for x, y in self.train_loader:
                            self.model.step(x, y)

            loader = DataLoader(ds, batch_size=64, num_workers=4, persistent_workers=True)
            Trainer(model, loader).fit(10)
            """,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=4)
            for epoch in range(10):
                for step, (x, y) in enumerate(loader):
                    train(x, y)
            """,
            fixed="""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=4, persistent_workers=True)
            for epoch in range(10):
                for step, (x, y) in enumerate(loader):
                    train(x, y)
            """,
        ),
        Invalid(  # iterated through another name each epoch (a resumable run)
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, num_workers=4)
            for epoch in range(10):
                active = skip(loader, start) if epoch == 0 else loader
                for x, y in active:
                    train(x, y)
            """,
            fixed="""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, num_workers=4, persistent_workers=True)
            for epoch in range(10):
                active = skip(loader, start) if epoch == 0 else loader
                for x, y in active:
                    train(x, y)
            """,
        ),
        Invalid(  # one worker per core (Pytorch-UNet)
            """
            import os
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, num_workers=os.cpu_count())
            for epoch in range(10):
                for x, y in loader:
                    train(x, y)
            """,
            fixed="""
            import os
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, num_workers=os.cpu_count(), persistent_workers=True)
            for epoch in range(10):
                for x, y in loader:
                    train(x, y)
            """,
        ),
        Invalid(  # passed to a per-epoch function; the worker count is an argparse option
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--workers", type=int, default=4)
            args = parser.parse_args()

            def train_epoch(model, loader):
                for x, y in loader:
                    step(model, x, y)

            train_loader = torch.utils.data.DataLoader(train_set, batch_size=64, num_workers=args.workers)
            for epoch in range(args.epochs):
                train_epoch(model, train_loader)
            """,
            fixed="""
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--workers", type=int, default=4)
            args = parser.parse_args()

            def train_epoch(model, loader):
                for x, y in loader:
                    step(model, x, y)

            train_loader = torch.utils.data.DataLoader(
                train_set,
                batch_size=64,
                num_workers=args.workers,
                persistent_workers=args.workers > 0,
            )
            for epoch in range(args.epochs):
                train_epoch(model, train_loader)
            """,
        ),
        Invalid(  # iterated through a progress bar made in the epoch loop (minDiffusion)
            """
            from torch.utils.data import DataLoader
            from tqdm import tqdm
            loader = DataLoader(ds, batch_size=512, num_workers=16)
            for epoch in range(100):
                pbar = tqdm(loader)
                for x, _ in pbar:
                    train(x)
            """,
            fixed="""
            from torch.utils.data import DataLoader
            from tqdm import tqdm
            loader = DataLoader(ds, batch_size=512, num_workers=16, persistent_workers=True)
            for epoch in range(100):
                pbar = tqdm(loader)
                for x, _ in pbar:
                    train(x)
            """,
        ),
        Invalid(  # iterated through a progress bar opened as a context manager in each epoch
            """
            from torch.utils.data import DataLoader
            from tqdm import tqdm
            def fit(config):
                loader = DataLoader(ds, batch_size=64, num_workers=6)
                for epoch in range(config["epochs"]):
                    with tqdm(loader, leave=False) as bar:
                        for x, _ in bar:
                            step(x)
            """,
            fixed="""
            from torch.utils.data import DataLoader
            from tqdm import tqdm
            def fit(config):
                loader = DataLoader(ds, batch_size=64, num_workers=6, persistent_workers=True)
                for epoch in range(config["epochs"]):
                    with tqdm(loader, leave=False) as bar:
                        for x, _ in bar:
                            step(x)
            """,
        ),
        Invalid(  # a notebook: handed by keyword to `train()`, whose epoch loop hands it to `train_step()`;
            # the worker count is set again in a later cell
            """
            import os
            from torch.utils.data import DataLoader
            NUM_WORKERS = os.cpu_count()
            loader = DataLoader(images, num_workers=NUM_WORKERS)

            def train_step(model, dataloader):
                for x, y in dataloader:
                    step(model, x, y)

            def train(model, train_dataloader, epochs=5):
                for epoch in range(epochs):
                    train_step(model=model, dataloader=train_dataloader)

            results = train(model=net, train_dataloader=loader, epochs=5)
            NUM_WORKERS = os.cpu_count()
            """,
            fixed="""
            import os
            from torch.utils.data import DataLoader
            NUM_WORKERS = os.cpu_count()
            loader = DataLoader(images, num_workers=NUM_WORKERS, persistent_workers=True)

            def train_step(model, dataloader):
                for x, y in dataloader:
                    step(model, x, y)

            def train(model, train_dataloader, epochs=5):
                for epoch in range(epochs):
                    train_step(model=model, dataloader=train_dataloader)

            results = train(model=net, train_dataloader=loader, epochs=5)
            NUM_WORKERS = os.cpu_count()
            """,
        ),
        Invalid(  # Lightning iterates a DataModule's train loader every epoch; half the cores may be 0
            """
            import os
            import lightning as L
            from torch.utils.data import DataLoader
            WORKERS = os.cpu_count() // 2
            class Digits(L.LightningDataModule):
                def train_dataloader(self):
                    return DataLoader(self.data, batch_size=64, num_workers=WORKERS)
            """,
            fixed="""
            import os
            import lightning as L
            from torch.utils.data import DataLoader
            WORKERS = os.cpu_count() // 2
            class Digits(L.LightningDataModule):
                def train_dataloader(self):
                    return DataLoader(
                        self.data,
                        batch_size=64,
                        num_workers=WORKERS,
                        persistent_workers=WORKERS > 0,
                    )
            """,
        ),
        Invalid(  # the worker count is a constructor argument the module reads back as an attribute
            """
            import lightning as L
            from torch.utils.data import DataLoader

            class TilesData(L.LightningDataModule):
                def __init__(self, tiles, batch_size=16, num_workers=6):
                    super().__init__()
                    self.tiles = tiles
                    self.batch_size = batch_size
                    self.num_workers = num_workers

                def train_dataloader(self):
                    return DataLoader(self.tiles, batch_size=self.batch_size, num_workers=self.num_workers)
            """,
            fixed="""
            import lightning as L
            from torch.utils.data import DataLoader

            class TilesData(L.LightningDataModule):
                def __init__(self, tiles, batch_size=16, num_workers=6):
                    super().__init__()
                    self.tiles = tiles
                    self.batch_size = batch_size
                    self.num_workers = num_workers

                def train_dataloader(self):
                    return DataLoader(
                        self.tiles,
                        batch_size=self.batch_size,
                        num_workers=self.num_workers,
                        persistent_workers=self.num_workers > 0,
                    )
            """,
        ),
        Invalid(  # a loader handed to `trainer.fit`, for 20 epochs
            """
            import lightning as L
            from torch.utils.data import DataLoader
            loader = DataLoader(images, batch_size=128, num_workers=6)
            L.Trainer(max_epochs=20).fit(Net(), loader)
            """,
            fixed="""
            import lightning as L
            from torch.utils.data import DataLoader
            loader = DataLoader(images, batch_size=128, num_workers=6, persistent_workers=True)
            L.Trainer(max_epochs=20).fit(Net(), loader)
            """,
        ),
        Invalid(  # an absl flag's default worker count; an endless generator starts a new pass each time one ends
            """
            import torch
            from absl import flags

            FLAGS = flags.FLAGS
            flags.DEFINE_integer("workers", 6, help="loader processes")

            def forever(batches):
                while True:
                    for images, _ in iter(batches):
                        yield images

            def train():
                loader = torch.utils.data.DataLoader(pictures, batch_size=128, num_workers=FLAGS.workers)
                stream = forever(loader)
                for step in range(FLAGS.steps):
                    loss = unet(next(stream).cuda()).mean()
                    loss.backward()
                    opt.step()
            """,
            fixed="""
            import torch
            from absl import flags

            FLAGS = flags.FLAGS
            flags.DEFINE_integer("workers", 6, help="loader processes")

            def forever(batches):
                while True:
                    for images, _ in iter(batches):
                        yield images

            def train():
                loader = torch.utils.data.DataLoader(
                    pictures,
                    batch_size=128,
                    num_workers=FLAGS.workers,
                    persistent_workers=FLAGS.workers > 0,
                )
                stream = forever(loader)
                for step in range(FLAGS.steps):
                    loss = unet(next(stream).cuda()).mean()
                    loss.backward()
                    opt.step()
            """,
        ),
        Invalid(  # the dataset changes between epochs: reported, no fix
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=32, num_workers=4)
            for epoch in range(10):
                train_set.set_epoch(epoch)
                for x, y in loader:
                    train(x, y)
            """,
        ),
    ]

    def finish(self) -> None:
        for site in dataloader_calls(self.ctx):
            self._check(site)

    def _check(self, site: CallSite) -> None:
        ctx = self.ctx
        workers = find_argument(ctx, site, "num_workers", 5)
        if workers.missing or workers.unknown or not find_argument(ctx, site, "persistent_workers").missing:
            return
        count = literal_int(ctx, workers.node, site.stack)
        per_core = _per_core(ctx, workers.node, site.stack)  # never 0
        if not per_core and (count is None or count <= 0):
            return
        if not_for_training(ctx, site):
            return  # a loader made and never used, or used for a look at one batch
        if built_for_one_pass(ctx, site):
            return  # a new loader every epoch: persistent workers would not outlive it
        if evaluation_feed(ctx, site) or inference_feed(ctx, site):
            return  # only evaluation reads it: a restart per validation pass holds up no training step
        loader = assigned_name(site)
        returned = returned_to_training(ctx, site)  # `return DataLoader(...)` to another file's loop
        if not (returned[0] if returned is not None else loader is not None and iterated_per_epoch(ctx, loader)) \
                and not lightning_iterates_per_epoch(ctx, site):
            return
        # a parameter of a factory whose loader another file iterates: its callers may pass another count
        shown = f"`{code_of(workers.node)}`" if per_core or (returned is not None and isinstance(workers.node, cst.Name)) else count
        message = f"`DataLoader` starts its {shown} worker {'process' if shown == 1 else 'processes'} again every epoch"
        given = dataset_argument(site)
        dataset = dotted_name(given) if given is not None else None
        if (dataset is not None and self._changed_in_a_loop(dataset)) or (returned is not None and returned[2]):
            self.report(site.node, message, no_fix_reason="the dataset is changed between epochs: persistent workers would not see it")
            return
        if (isinstance(workers.node, cst.Integer) and not workers.passed) or _per_core(ctx, workers.node, site.stack, shares=False):
            value: cst.BaseExpression = cst.Name("True")
        elif workers.arg is not None and isinstance(workers.node, (cst.Name, cst.Attribute)):
            value = cst.Comparison(workers.node, [cst.ComparisonTarget(cst.GreaterThan(), cst.Integer("0"))])
        else:
            self.report(site.node, message, no_fix_reason="`num_workers` is set outside the call and may be 0 at run time")
            return
        indent = ctx.module.default_indent
        ops = [Transform(site.node, lambda call: append_args(call, keyword_arg("persistent_workers", value), indent=indent))]
        self.report(site.node, message, fix_ops=ops)

    def _changed_in_a_loop(self, dataset: str) -> bool:
        """`dataset.set_epoch(e)` or `dataset.attr = ...` inside some loop."""
        return dataset in self._changed_in_loops

    @cached_property
    def _changed_in_loops(self) -> set[str]:
        """Every name whose method is called, or one of whose attributes is set, inside a loop
        (read once: a file of many loaders asked it of every call for each)."""
        ctx = self.ctx
        changed = {
            name for site in ctx.calls if isinstance(site.node.func, cst.Attribute)
            and (name := dotted_name(site.node.func.value)) is not None and ctx.enclosing_loops(site.stack)
        }
        for name, assignments in ctx.assignments.items():
            if "." in name and any(ctx.enclosing_loops(a.stack) for a in assignments):
                parts = name.split(".")
                changed.update(".".join(parts[:end]) for end in range(1, len(parts)))
        return changed
