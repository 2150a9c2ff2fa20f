from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Category, Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.model.arguments import find_argument, literal_bool, literal_int
from speedfix.model.flow import assigned_name, comes_before
from speedfix.model.index import Assignment, CallSite
from speedfix.model.loaders import FROZEN_ATTRIBUTES, IGNORED_ATTRIBUTES, late_attributes
from speedfix.model.patterns import DATALOADER, unwrap_iterable
from speedfix.model.versions import v
from speedfix.rules._impact import Estimate, Finding, Impact
from speedfix.syntax.names import dotted_name


class DataloaderAttributeAfterCreation(Rule):
    """
    ## What it does
    Finds attributes of a `DataLoader` assigned after the loader is created
    (`train_loader.num_workers = 16`), and tells what the assignment does:

    - `batch_size`, `batch_sampler`, `sampler`, `drop_last`, `dataset` and `persistent_workers`
      cannot change: `DataLoader` raises `ValueError` (an error);
    - `num_workers` raised above 0 on a loader created without workers, and no `prefetch_factor`
      given: the loader's `prefetch_factor` is `None`, and the first worker iterator raises
      `TypeError` (an error);
    - `shuffle` does nothing (the sampler was chosen at creation), and a `multiprocessing_context`
      on a loader without workers raises `ValueError`;
    - set inside the loop over that same loader, or after a loop over a loader with
      `persistent_workers=True`: the running iterator (with persistent workers, the only one)
      never sees it (a warning);
    - otherwise it works from the next `iter(loader)` on (an info note: pass it to the call).

    An assignment after the name is bound to something else (`loader = Wrapper(loader)`) is
    that object's business and left alone. The `TypeError` is torch 2.0 and later (before,
    `prefetch_factor` defaulted to 2).

    ## Why is this bad?
    A `DataLoader` reads `num_workers`, `prefetch_factor` and `pin_memory` when it makes an
    iterator, at the start of each `for batch in loader:`. A value set later is read only by the
    iterators made after it, never by the one that is running, and with persistent workers the
    first iterator is kept for the whole run. The checks `DataLoader(...)` makes on its arguments
    (a `prefetch_factor` without workers, `persistent_workers` without workers) are skipped, which
    is how a worker count set afterwards ends in a `TypeError`. Passing the value to the call says
    what the loader does where a reader looks for it.

    ## Example
    ```python
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
    train_loader.num_workers = 8
    ```

    ## Use instead
    ```python
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True, num_workers=8)
    ```

    ## Fix safety
    No automatic fix: the value is often computed between the call and the assignment.

    ## Impact
    High when the assignment raises (`ValueError`, or `TypeError` at the first iteration).
    Medium when it does nothing or never reaches the running iterator, low when it works from
    the next `iter(loader)` on.

    ## Measured effect
    None in speed by itself; it decides whether the workers the script asks for exist at all.
    The attributes guarded by `DataLoader.__setattr__`, and the `prefetch_factor=None` of a
    loader made without workers, are in torch/utils/data/dataloader.py. Source:
    https://github.com/pytorch/pytorch/blob/main/torch/utils/data/dataloader.py
    """

    impact = "high"
    code = "SF105"
    name = "dataloader-attribute-after-creation"
    summary = "DataLoader setting assigned after the loader exists (`loader.num_workers = 8`)"
    severity = Severity.WARNING
    category = Category.CORRECTNESS
    requires = (b"DataLoader",)
    effect = "Workers that exist, and no ValueError or TypeError from a setting assigned too late."

    VALID = [
        Valid(  # a wrapper's property setter forwards what its caller sets (uni2ts: Lightning sets it before iterating)
            """
            from torch.utils.data import DataLoader

            class Loader:
                def __init__(self, dataset, num_workers=8):
                    self.dataloader = DataLoader(dataset, batch_size=32, num_workers=num_workers)

                @property
                def worker_init_fn(self):
                    return self.dataloader.worker_init_fn

                @worker_init_fn.setter
                def worker_init_fn(self, worker_init_fn):
                    self.dataloader.worker_init_fn = worker_init_fn
            """
        ),
        Valid(  # passed to the call
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=8)
            for x in loader:
                step(x)
            """
        ),
        Valid(  # another object's attribute of the same name
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32)
            config.num_workers = 8
            """
        ),
        Valid(  # the name is bound to a wrapper first: the attribute is the wrapper's
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32)
            loader = DeviceLoader(loader, "cuda")
            loader.batch_size = 64
            """
        ),
        Valid(  # a new loader bound to the name: the attribute belongs to that one
            """
            from torch.utils.data import DataLoader
            loader.num_workers = 8
            loader = DataLoader(ds, batch_size=32)
            """
        ),
    ]
    INVALID = [
        Invalid(  # works from the next iterator on: an info note
            """
            import os
            from torch.utils.data import DataLoader
            train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
            train_loader.num_workers = min(os.cpu_count(), 16)
            train_loader.prefetch_factor = 2
            for epoch in range(10):
                for x in train_loader:
                    step(x)
            """,
        ),
        Invalid(  # a guarded attribute: ValueError
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32)
            loader.batch_size = 64
            """
        ),
        Invalid(  # workers without a prefetch_factor: TypeError at the first iteration
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32)
            loader.num_workers = 4
            for x in loader:
                step(x)
            """
        ),
        Invalid(  # inside the loop over the same loader: the running iterator never sees it
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=2)
            for i, x in enumerate(loader):
                if i == 100:
                    loader.num_workers = 8
                step(x)
            """
        ),
        Invalid(  # persistent workers that already started: the new count never arrives
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=2, persistent_workers=True)
            for x in loader:
                calibrate(x)
            loader.num_workers = 8
            for epoch in range(10):
                for x in loader:
                    step(x)
            """
        ),
        Invalid(  # ignored, and a ValueError: two reports
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32)
            loader.shuffle = True
            loader.multiprocessing_context = "spawn"
            """,
            count=2,
        ),
        Invalid(  # a trainer's loader, set in another method before it is iterated: an info note
            """
            from torch.utils.data import DataLoader

            class Trainer:
                def __init__(self, ds):
                    self.loader = DataLoader(ds, batch_size=32, num_workers=2, persistent_workers=True)

                def tune(self):
                    self.loader.num_workers = 8
            """
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        if finding.severity is Severity.ERROR:
            return None  # it raises
        if finding.severity is Severity.INFO:
            return Estimate(Impact.LOW, "the setting works from the next `iter(loader)` on")
        return Estimate(Impact.MEDIUM, "the setting does nothing, but nothing raises")

    def finish(self) -> None:
        for site in self.ctx.calls_to(*DATALOADER):
            working = [a for a in late_attributes(self.ctx, site)
                       if not self._in_setter(a) and not self._reported_alone(site, a)]
            if working:  # they work: one note per loader names them all
                names = " and ".join(f"`{a.target}`" for a in working)
                keywords = ", ".join(f"`{a.target.rpartition('.')[2]}=`" for a in working)
                checked = any(a.target.rpartition(".")[2] in _CHECKED for a in working)
                self.report(working[0].value, f"{names} {'is' if len(working) == 1 else 'are'} set after the loader "
                            "is created: that applies only from the next `iter(loader)` on"
                            f"{', and skips the checks `DataLoader(...)` makes' if checked else ''}; pass {keywords} "
                            "to the call", severity=Severity.INFO)

    def _in_setter(self, assignment: Assignment) -> bool:
        """Is the assignment a property setter's (`@worker_init_fn.setter`, uni2ts' loader wrapper):
        it forwards what its caller sets, before the first `iter(loader)`?"""
        function = self.ctx.function_of(assignment.stack)
        return isinstance(function, cst.FunctionDef) and any(
            isinstance(d.decorator, cst.Attribute) and d.decorator.attr.value == "setter" for d in function.decorators)

    def _reported_alone(self, site: CallSite, assignment: Assignment) -> bool:
        """Report an assignment that raises or never takes effect; False for one that works."""
        ctx = self.ctx
        attribute = assignment.target.rpartition(".")[2]
        where = f"`{assignment.target} = ...` after the loader is created"
        if attribute in FROZEN_ATTRIBUTES:
            self.report(assignment.value, f"{where} raises `ValueError`: a `DataLoader`'s `{attribute}` cannot change "
                        "once it exists; pass it to `DataLoader(...)`", severity=Severity.ERROR)
            return True
        if attribute in IGNORED_ATTRIBUTES:
            self.report(assignment.value, f"{where} does nothing: `DataLoader(...)` turned `{attribute}` into its "
                        "sampler when it was created; pass it to the call")
            return True
        if attribute == "multiprocessing_context" and self._without_workers(site, before=assignment):
            self.report(assignment.value, f"{where} raises `ValueError`: a loader without worker processes takes no "
                        "multiprocessing context; pass it to `DataLoader(...)` with `num_workers=`",
                        severity=Severity.ERROR)
            return True
        if attribute == "num_workers" and ctx.torch_version >= v("2.0") and self._workers_without_prefetch(site, assignment):
            count = literal_int(ctx, assignment.value, assignment.stack)
            self.report(assignment.value, f"{where}: the loader was made without workers, so its `prefetch_factor` "
                        f"is `None` and the first iteration {'raises' if count else 'raises, if it is above 0,'} "
                        "`TypeError`; pass `num_workers=` to `DataLoader(...)`",
                        severity=Severity.ERROR if count else Severity.WARNING)
            return True
        running = self._running_reason(site, assignment)
        if running is not None:
            self.report(assignment.value, f"{where} never reaches the running iterator: {running}; "
                        f"pass `{attribute}=` to `DataLoader(...)`")
            return True
        return False

    def _made_without_workers(self, site: CallSite) -> bool:
        """`num_workers` left out of the call, or 0."""
        workers = find_argument(self.ctx, site, "num_workers", 5)
        return workers.missing or (not workers.unknown and literal_int(self.ctx, workers.node, site.stack) == 0)

    def _without_workers(self, site: CallSite, before: Assignment) -> bool:
        """Made with no workers, and none set up to ``before``."""
        ctx = self.ctx
        late = [a for a in late_attributes(ctx, site) if a.target.endswith(".num_workers") and a is not before
                and before.statement is not None and a.statement is not None
                and comes_before(ctx, a.statement, before.statement)]
        return self._made_without_workers(site) and not late

    def _workers_without_prefetch(self, site: CallSite, assignment: Assignment) -> bool:
        ctx = self.ctx
        if (count := literal_int(ctx, assignment.value, assignment.stack)) is not None and count <= 0:
            return False
        prefetch_given = not find_argument(ctx, site, "prefetch_factor").missing or any(
            other.target.endswith(".prefetch_factor") for other in late_attributes(ctx, site)
        )
        return self._made_without_workers(site) and not prefetch_given

    def _running_reason(self, site: CallSite, assignment: Assignment) -> str | None:
        """Why the assignment cannot reach an iterator that already exists: it is inside the loop
        over the loader, or the loader keeps persistent workers and was iterated before it."""
        ctx = self.ctx
        loader = assigned_name(site)
        loops = [info for info in ctx.loops.values()
                 if info.iter is not None and dotted_name(unwrap_iterable(info.iter)) == loader]
        if any(any(frame.node is info.node for frame in assignment.stack) for info in loops):
            return "it is set inside the loop over this loader"
        persistent = find_argument(ctx, site, "persistent_workers")
        if persistent.missing or persistent.unknown or not literal_bool(ctx, persistent.node, site.stack):
            return None
        if assignment.statement is not None and any(comes_before(ctx, info.node, assignment.statement) for info in loops):
            return "with `persistent_workers=True` the loader kept the iterator of its first loop"
        return None


# Settings whose values `DataLoader(...)` checks against each other when it is created.
_CHECKED = frozenset({"num_workers", "prefetch_factor", "pin_memory_device", "timeout"})
