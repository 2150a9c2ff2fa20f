from __future__ import annotations

import libcst as cst

from speedfix.arguments import find_argument
from speedfix.codegen import append_args, keyword_arg
from speedfix.context import CallSite
from speedfix.findings import Applicability, LossCheck, Severity, Transform
from speedfix.patterns import DATALOADER, constructor_call, dataset_argument
from speedfix.rule import Invalid, Rule, Valid


class DataloaderNoPinMemory(Rule):
    """
    ## What it does
    Finds a `DataLoader` without `pin_memory=True` in a script that trains on CUDA.

    ## Why is this bad?
    A batch in ordinary (pageable) host memory is first copied by the driver into a pinned
    staging buffer and only then to the GPU, and the copy cannot overlap with compute. With
    `pin_memory=True` the DataLoader's pin thread puts batches in page-locked memory, so
    `x.to("cuda", non_blocking=True)` becomes a direct asynchronous DMA (see SF104).

    An explicit `pin_memory=False` is left alone (pinned memory is a limited host resource and
    may have been turned off on purpose), as are values speedfix cannot know.

    ## Example
    ```python
    loader = DataLoader(train_set, batch_size=64, num_workers=4)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
    ```

    ## Use instead
    ```python
    loader = DataLoader(train_set, batch_size=64, num_workers=4, pin_memory=True)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    ```

    ## Fix safety
    Safe: the data and the numerics are identical. Pinned memory is page-locked host RAM; with
    many workers, a large `prefetch_factor` and big batches it adds host memory pressure.
    PyTorch warns (and does nothing) when it is set without a GPU.

    ## Measured effect
    Small to moderate on its own, larger together with `non_blocking=True` copies: 9.5 to 9.8 it/s
    (about 3%) on top of persistent workers in one report; Hugging Face's Trainer pins by default
    because it "typically leads to much faster transfers".
    Sources: https://github.com/boreshkinai/delta-interpolator/pull/3,
    https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html
    """

    code = "SF102"
    name = "dataloader-no-pin-memory"
    summary = "CUDA training DataLoader without `pin_memory=True`"
    severity = Severity.WARNING
    requires = (b"DataLoader",)
    fix_applicability = Applicability.SAFE
    loss_check = LossCheck.EXACT
    fix_title = "Add `pin_memory=True`"
    gpu_only = True
    effect = "Faster, asynchronous host-to-GPU copies (together with SF104)."

    VALID = [
        Valid(  # CPU-only script: pinning only helps copies to a GPU
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32)
            for x, y in loader:
                pass
            """
        ),
        Valid(
            """
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda")
            loader = DataLoader(ds, batch_size=32, pin_memory=False)
            for x, y in loader:
                x = x.to(device)
            """
        ),
        Valid(  # the dataset already lives on the GPU: pinning would raise
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            ds = TensorDataset(x.cuda(), y.cuda())
            loader = DataLoader(ds, batch_size=32)
            """
        ),
        Valid(
            """
            import torch
            def make(use_cuda):
                return torch.utils.data.DataLoader(ds, batch_size=32, pin_memory=use_cuda)
            x = torch.zeros(1).cuda()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            loader = DataLoader(ds, batch_size=32, num_workers=4)
            for x, y in loader:
                x = x.to(device)
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            loader = DataLoader(ds, batch_size=32, num_workers=4, pin_memory=True)
            for x, y in loader:
                x = x.to(device)
            """,
        ),
        Invalid(
            """
            import torch.utils.data as tud
            loader = tud.DataLoader(
                ds,
                batch_size=32,
                num_workers=4
            )
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
            """,
            fixed="""
            import torch.utils.data as tud
            loader = tud.DataLoader(
                ds,
                batch_size=32,
                num_workers=4,
                pin_memory=True
            )
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
            """,
        ),
    ]

    def finish(self) -> None:
        if not any(True for _ in self.ctx.method_calls("to")) and not any(True for _ in self.ctx.method_calls("cuda")):
            return  # nothing is ever copied to a device
        for site in self.ctx.calls_to(*DATALOADER):
            self._check(site)

    def _check(self, site: CallSite) -> None:
        pin = find_argument(self.ctx, site, "pin_memory", 7)
        if not pin.missing or self._dataset_on_gpu(site):
            return
        self.report(
            site.node,
            "`DataLoader` without `pin_memory=True`: batches are copied to the GPU from pageable memory",
            fix_ops=[Transform(site.node, lambda call: append_args(call, keyword_arg("pin_memory", cst.Name("True")), indent=self.ctx.module.default_indent))],
        )

    def _dataset_on_gpu(self, site: CallSite) -> bool:
        """A TensorDataset of tensors already on the GPU cannot (and need not) be pinned."""
        call = constructor_call(self.ctx, dataset_argument(site), site.stack)
        if call is None:
            return False
        for arg in call.args:
            value = arg.value
            while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
                if value.func.attr.value in ("cuda", "to"):
                    return True
                value = value.func.value
        return False
