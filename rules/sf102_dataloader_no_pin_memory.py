from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Applicability, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, keyword_arg
from speedfix.model.arguments import find_argument
from speedfix.model.devices import copies_to_device
from speedfix.model.frameworks import framework_uses_cuda
from speedfix.model.index import CallSite
from speedfix.model.loaders import Place, evaluation_only, late_value, not_for_training, samples_place
from speedfix.model.loader_classes import dataloader_calls
from speedfix.model.scale import evaluation_feed, inference_feed
from speedfix.model.workload import Samples, training_samples
from speedfix.rules._impact import Estimate, Finding, Impact, evaluation_loader, large_model
from speedfix.rules._examples import NOTEBOOK_PEEKED_LOADERS, TEST_PASS_AFTER_TRAINING, VALIDATION_EVERY_EPOCH


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
    may have been turned off on purpose), as are values speedfix cannot know, and loaders whose
    samples are already CUDA tensors (a `TensorDataset` of CUDA tensors, a Dataset whose methods
    call `.to(device)` or `.cuda()`, a `collate_fn` that does or that builds its batches with
    `device=`, also one of another scanned file, and any loader of a run that makes CUDA the
    default for new tensors: `torch.set_default_tensor_type(torch.cuda.FloatTensor)` in the script
    or a module it imports): they cannot be pinned, and the
    DataLoader would raise `cannot pin 'torch.cuda.FloatTensor'`. Nor is a loader that only
    evaluation reads: iterated only in loops that take no optimizer step (a validation loop every
    epoch, a test pass after training), or, when the file iterates it nowhere, named for it
    (`val_loader`, `test_loader`, a function `val_dataloader()` that returns it), or handed on
    only as a validation loader in a file that trains with Lightning (`System(...,
    val_loader=val_loader)` fitted by `trainer.fit(system)`). Its copies
    hold up no training step, and a validation pass is a small share of the run: pinning it
    gains next to nothing. A loader that is also handed to a training function of another file
    (`train_one_epoch(model, loader)`) is still checked. Nor is the loader of a script that never
    trains and evaluates (`model.eval()`, `torch.no_grad()`, no step anywhere): an evaluation or
    feature-extraction script, not a training run.

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
    Safe where speedfix sees that the samples are CPU data (a torchvision dataset, a
    `TensorDataset` of CPU tensors, a Dataset class of the file that never moves data to a device):
    the data and the numerics are identical. Unsafe when the dataset comes from elsewhere (a
    function, another module): if it yields CUDA tensors, pinning raises. Pinned memory is
    page-locked host RAM; with many workers, a large `prefetch_factor` and big batches it adds
    host memory pressure. PyTorch warns (and does nothing) when it is set without a GPU.

    ## Impact
    Medium: pinned memory makes the batch copies asynchronous, a real but modest gain. Low for
    an evaluation loader that is still reported (where the scan does not see the training: a
    framework's `val_dataloader()`), and for batches of token ids (a step that
    feeds `input_ids`, a tokenizer): pinning a copy of kilobytes gains next to nothing; low for
    a model of a billion parameters or more, whose steps of a second or more dwarf the copy.
    (A loader that keeps the GPU waiting needs workers first: SF101, which a `speedfix bench`
    measurement of the data wait decides.)

    ## Measured effect
    Small to moderate on its own, larger together with `non_blocking=True` copies: 9.5 to 9.8 it/s
    (about 3%) on top of persistent workers in one report; Hugging Face's Trainer pins by default
    because it "typically leads to much faster transfers".
    Sources: https://github.com/boreshkinai/delta-interpolator/pull/3,
    https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html
    """

    impact = "medium"
    code = "SF102"
    name = "dataloader-no-pin-memory"
    summary = "CUDA training DataLoader without `pin_memory=True`"
    severity = Severity.WARNING
    requires = (b"Loader",)  # `DataLoader`, or a subclass of the project (`WaveLoader`)
    fix_applicability = Applicability.SAFE
    loss_check = LossCheck.EXACT
    fix_title = "Add `pin_memory=True`"
    gpu_only = True
    effect = "Faster, asynchronous host-to-GPU copies (together with SF104)."

    VALID = [
        Valid(  # a trainer base class: only its `eval()` reads the evaluation loader; subclasses define the steps
            """
            import torch
            from torch.utils.data import DataLoader

            class Trainer:
                def __init__(self, train_set, eval_set):
                    self.train_dataloader = DataLoader(train_set, batch_size=8, num_workers=4, pin_memory=True)
                    self.eval_dataloader = DataLoader(eval_set, batch_size=8, num_workers=4)

                def train_step(self, batch):
                    raise NotImplementedError

                def ptx_step(self, batch):
                    loss = self.model(**batch).loss
                    self.model.backward(loss)
                    self.model.step()

                def train(self):
                    for batch in self.train_dataloader:
                        self.train_step({k: v.cuda(non_blocking=True) for k, v in batch.items()})

                def eval(self):
                    scores = []
                    for batch in self.eval_dataloader:
                        with torch.no_grad():
                            scores.append(self.model(**{k: v.cuda() for k, v in batch.items()}))
                    return scores
            """,
        ),
        Valid(  # the dataset's tensors are made on the GPU when there is one: pinning them would raise
            """
            import torch

            def make_loader(inputs, targets, batch_size):
                Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor
                data = torch.utils.data.TensorDataset(Tensor(inputs), Tensor(targets))
                return torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True)

            for x, y in make_loader(train_x, train_y, 64):
                loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # made only to count the steps of the schedule: `len()` reads no batch
            """
            import torch
            from torch.utils.data import DataLoader
            counting_loader = DataLoader(train_ds, batch_size=32)
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(counting_loader) * epochs)
            for epoch in range(epochs):
                for x, y in DataLoader(train_ds, batch_size=32, sampler=make_sampler(epoch), pin_memory=True):
                    loss = model(x.cuda(), y.cuda())
                    loss.backward()
                    optimizer.step()
            """
        ),
        Valid(  # Lightning trains; this loader is handed on only as the module's validation loader
            """
            import lightning as L
            from torch.utils.data import DataLoader
            from recipes import Separator

            train_loader = DataLoader(mixtures, batch_size=6, shuffle=True, num_workers=4, pin_memory=True)
            val_loader = DataLoader(held_out, batch_size=6, num_workers=4)
            system = Separator(net, optimizer, train_loader=train_loader, val_loader=val_loader)
            L.Trainer(max_epochs=100, accelerator="gpu").fit(system)
            """
        ),
        Valid(  # a subclass with a constructor of its own: its parameters are not DataLoader's
            """
            import torch
            from torch.utils.data import DataLoader

            class ShardLoader(DataLoader):
                def __init__(self, shards, workers):
                    super().__init__(shards, batch_size=None, num_workers=workers, pin_memory=True)

            for batch in ShardLoader(shard_list, 4):
                step(batch.cuda())
            """
        ),
        Valid(  # Lightning iterates the test and predict loaders only in trainer.test()/predict(): one pass
            """
            from functools import partial
            import lightning as L
            from torch.utils.data import DataLoader

            class Images(L.LightningDataModule):
                def __init__(self, holdout=None):
                    super().__init__()
                    if holdout is not None:
                        self.predict_dataloader = partial(self._holdout_loader, shuffle=False)

                def test_dataloader(self):
                    return DataLoader(self.test_set, batch_size=64, num_workers=4)

                def _holdout_loader(self, shuffle):
                    return DataLoader(self.holdout_set, batch_size=64, num_workers=4, shuffle=shuffle)
            """
        ),
        Valid(  # methods the data module assigns to Lightning's hooks: the validation one feeds no step (latent diffusion)
            """
            from functools import partial
            import pytorch_lightning as pl
            from torch.utils.data import DataLoader

            class DataModuleFromConfig(pl.LightningDataModule):
                def __init__(self, batch_size, validation=None):
                    super().__init__()
                    self.batch_size = batch_size
                    self.train_dataloader = self._train_dataloader
                    if validation is not None:
                        self.val_dataloader = partial(self._val_dataloader, shuffle=False)

                def _train_dataloader(self):
                    return DataLoader(self.datasets["train"], batch_size=self.batch_size, num_workers=8,
                                      pin_memory=True, persistent_workers=True)

                def _val_dataloader(self, shuffle=False):
                    return DataLoader(self.datasets["validation"], batch_size=self.batch_size, num_workers=8,
                                      shuffle=shuffle, persistent_workers=True)
            """
        ),
        Valid(NOTEBOOK_PEEKED_LOADERS),  # shown and peeked at in a notebook; a later parameter shares the name
        Valid(TEST_PASS_AFTER_TRAINING),  # a test loader read once after training
        Valid(VALIDATION_EVERY_EPOCH),  # a validation loader read every epoch, no training step
        Valid(  # one batch drawn to look at the model's outputs, outside any loop
            """
            import torch
            from torch.utils.data import DataLoader
            sample_loader = DataLoader(train_set, batch_size=128, shuffle=False)
            imgs, _ = next(iter(sample_loader))
            with torch.no_grad():
                probs = model(imgs.to("cuda")).softmax(dim=1)
            """
        ),
        Valid(  # a test loader made and never used
            """
            import torch
            from torch.utils.data import DataLoader

            def main():
                train_loader = DataLoader(train_set, batch_size=64, num_workers=4, pin_memory=True)
                test_loader = DataLoader(test_set, batch_size=1000, num_workers=4)
                for epoch in range(10):
                    for x, y in train_loader:
                        loss = model(x.cuda()).sum()
                        loss.backward()
                        optimizer.step()
            """
        ),
        Valid(  # a test loader made only when `--test_dataset` is given, which it is not by default (BERT-pytorch)
            """
            import argparse
            import torch
            from torch.utils.data import DataLoader

            parser = argparse.ArgumentParser()
            parser.add_argument("-t", "--test_dataset", type=str, default=None)
            args = parser.parse_args()
            test_set = TextDataset(args.test_dataset) if args.test_dataset is not None else None
            train_loader = DataLoader(train_set, batch_size=64, num_workers=4, pin_memory=True)
            test_loader = DataLoader(test_set, batch_size=64, num_workers=4) if test_set is not None else None
            for epoch in range(10):
                for x, y in train_loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    optimizer.step()
                if test_loader is not None:
                    for x, y in test_loader:
                        evaluate(model(x.cuda()), y)
            """
        ),
        Valid(  # pinned after the loader exists (SF105 says to pass it to the call)
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, num_workers=4)
            loader.pin_memory = True
            for x, y in loader:
                x = x.cuda(non_blocking=True)
            """
        ),
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
        Valid(  # __getitem__ returns CUDA tensors: `cannot pin 'torch.cuda.FloatTensor'`
            """
            import torch
            from torch.utils.data import DataLoader, Dataset

            class Windows(Dataset):
                def __init__(self, series, device):
                    self.series, self.device = series, device

                def __len__(self):
                    return len(self.series) - 32

                def __getitem__(self, i):
                    return self.series[i:i + 32].to(self.device)

            loader = DataLoader(Windows(series, "cuda"), batch_size=64, shuffle=True)
            for x in loader:
                loss = model(x).sum()
            """
        ),
        Valid(  # a collate_fn that moves the batch to the GPU, and tensors made there
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            device = torch.device("cuda")
            table = TensorDataset(torch.randn(1000, 8, device=device))
            loader = DataLoader(table, batch_size=64)
            other = DataLoader(rows, batch_size=64, collate_fn=lambda b: torch.stack(b).to(device))
            """
        ),
    ]
    INVALID = [
        Invalid(  # a DataLoader subclass that forwards DataLoader's own arguments
            """
            import torch
            from torch.utils.data import DataLoader

            class PaddedLoader(DataLoader):
                def __init__(self, *args, **kwargs):
                    super().__init__(*args, **kwargs)
                    self.collate_fn = pad_batch

            for waves, labels in PaddedLoader(clips, batch_size=8, num_workers=4):
                step(waves.cuda(), labels.cuda())
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader

            class PaddedLoader(DataLoader):
                def __init__(self, *args, **kwargs):
                    super().__init__(*args, **kwargs)
                    self.collate_fn = pad_batch

            for waves, labels in PaddedLoader(clips, batch_size=8, num_workers=4, pin_memory=True):
                step(waves.cuda(), labels.cuda())
            """,
        ),
        Invalid(  # a torchvision dataset yields CPU tensors: the fix is safe
            """
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets, transforms
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            train_set = datasets.CIFAR10("data", train=True, download=True, transform=transforms.ToTensor())
            loader = DataLoader(train_set, batch_size=32, num_workers=4)
            for x, y in loader:
                x = x.to(device)
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets, transforms
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            train_set = datasets.CIFAR10("data", train=True, download=True, transform=transforms.ToTensor())
            loader = DataLoader(train_set, batch_size=32, num_workers=4, pin_memory=True)
            for x, y in loader:
                x = x.to(device)
            """,
        ),
        Invalid(  # a Dataset of this file that stays on the host, split; a multi-line call
            """
            import torch.utils.data as tud

            class Tokens(tud.Dataset):
                def __init__(self, ids):
                    self.ids = torch.tensor(ids)

                def __len__(self):
                    return len(self.ids) // 128

                def __getitem__(self, i):
                    return self.ids[i * 128:(i + 1) * 128].long()

            train_set, val_set = tud.random_split(Tokens(ids), [0.9, 0.1])
            loader = tud.DataLoader(
                train_set,
                batch_size=32,
                num_workers=4
            )
            for x in loader:
                x = x.cuda()
            """,
            fixed="""
            import torch.utils.data as tud

            class Tokens(tud.Dataset):
                def __init__(self, ids):
                    self.ids = torch.tensor(ids)

                def __len__(self):
                    return len(self.ids) // 128

                def __getitem__(self, i):
                    return self.ids[i * 128:(i + 1) * 128].long()

            train_set, val_set = tud.random_split(Tokens(ids), [0.9, 0.1])
            loader = tud.DataLoader(
                train_set,
                batch_size=32,
                num_workers=4,
                pin_memory=True
            )
            for x in loader:
                x = x.cuda()
            """,
        ),
        Invalid(  # a dataset built elsewhere may yield CUDA tensors: the fix is unsafe
            """
            import torch
            from torch.utils.data import DataLoader
            from project.data import build_dataset
            loader = DataLoader(build_dataset("train"), batch_size=32, num_workers=4)
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            from project.data import build_dataset
            loader = DataLoader(
                build_dataset("train"),
                batch_size=32,
                num_workers=4,
                pin_memory=True,
            )
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
            """,
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        samples = training_samples(self.ctx)
        if samples is not None and samples[0] is Samples.TOKENS:
            small = Estimate(Impact.LOW, f"{samples[1]}: pinning a copy this small gains little")
            return evaluation_loader(self.ctx, finding) or small
        return evaluation_loader(self.ctx, finding) or large_model(self.ctx, Impact.LOW)

    def finish(self) -> None:
        if not (copies_to_device(self.ctx) or framework_uses_cuda(self.ctx)):
            # nothing is ever copied to a device, here, in a loop of another file it calls, or by a
            # framework (Lightning, Accelerate and the HF Trainer move the batches themselves)
            return
        for site in dataloader_calls(self.ctx):
            self._check(site)

    def _check(self, site: CallSite) -> None:
        pin = find_argument(self.ctx, site, "pin_memory", 7)
        if not pin.missing or late_value(self.ctx, site, "pin_memory") is not None:
            return  # chosen, in the call or afterwards (`loader.pin_memory = True`: SF105)
        if evaluation_only(self.ctx, site) or evaluation_feed(self.ctx, site) or inference_feed(self.ctx, site):
            return  # one evaluation pass after training, or a loader only evaluation reads
        if not_for_training(self.ctx, site):
            return  # a loader made and never used, or used for a look at one batch
        place = samples_place(self.ctx, site)
        if place is Place.DEVICE:
            return  # CUDA (or sparse) samples cannot be pinned: the DataLoader would raise
        indent = self.ctx.module.default_indent
        ops = [Transform(site.node, lambda call: append_args(call, keyword_arg("pin_memory", cst.Name("True")), indent=indent))]
        title, applicability = self.fix_title, Applicability.SAFE
        if place is None:
            title += " (unsafe: speedfix cannot see the dataset; pinning raises if it yields CUDA tensors)"
            applicability = Applicability.UNSAFE
        self.report(
            site.node,
            "`DataLoader` without `pin_memory=True`: batches are copied to the GPU from pageable memory",
            fix_ops=ops, fix_title=title, applicability=applicability,
        )
