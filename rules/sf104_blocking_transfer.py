from __future__ import annotations

from functools import cached_property

import libcst as cst

from speedfix.engine.findings import Applicability, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, keyword_arg
from speedfix.model.arguments import find_argument
from speedfix.model.flow import comes_before, if_chain_top
from speedfix.model.frames import Stack
from speedfix.model.workload import Samples, hand_written_batches, training_samples
from speedfix.model.index import CallSite, LoopInfo
from speedfix.model.loader_classes import dataloader_calls
from speedfix.model.patterns import (BatchNames, device_placing_call, draws_next, is_cpu_device, is_dtype, narrow_to_class,
                                     unwrap_iterable, without_layout_calls)
from speedfix.rules._impact import Estimate, Finding, Impact, unpinned_training_loaders
from speedfix.syntax.blocks import statement_owner
from speedfix.project.steps import is_iterable_wrapper
from speedfix.syntax.comments import has_noqa
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import code_of


class BlockingTransfer(Rule):
    """
    ## What it does
    Finds host-to-GPU copies of a DataLoader batch in the training loop (`x.to(device)`,
    `x.cuda()`) without `non_blocking=True`, legacy copies to a CUDA tensor type included
    (`imgs.type(Tensor)` with `Tensor = torch.cuda.FloatTensor`, which takes `non_blocking` too).
    Also a batch handed, in the training loop, to a helper function of another scanned file that
    copies that parameter with a blocking copy (`real = to_gpu(real)`, where `to_gpu` does
    `x.cuda()`): the finding is on the call, and the change (`non_blocking=True`) belongs inside
    the helper, so no fix is offered there.

    ## Why is this bad?
    A blocking copy makes the CPU wait until the transfer is done before it can queue the next
    kernels, so the GPU idles between steps. With a pinned batch (`pin_memory=True`, SF102) and
    `non_blocking=True` the copy is queued on the CUDA stream like any kernel; stream ordering
    still guarantees the forward pass sees the data.

    The copies of one batch in one block of the step (`x, y = x.to(device), y.to(device)`, also
    with the forward pass between them: the labels copied just before the loss, inside a
    `with torch.no_grad():` of the step, or in the branches of an `if` there, of which one runs:
    `if mixup: t1, t2 = t1.to(device), t2.to(device)` / `else: targets = targets.to(device)`) are
    one finding whose fix covers each copy; a line with `# noqa` stays apart, so that its comment suppresses
    its own copy alone. A function
    or method the loop hands the batch to (`self.process_batch(x, y)`) copies a batch too.

    Only copies of tensors that come straight from a DataLoader are reported: they are on the
    CPU, so the copy is host-to-device. A loader that Accelerate prepared (`accelerator.prepare`)
    moves its batches to the device itself: there is no copy in the loop to change, and it is
    not reported. Nor are the batches of a project's own iterator (a class of another file with
    no base but `object` and its own `__next__`): no DataLoader pins them, and a non-blocking copy
    from pageable memory blocks all the same. Device-to-host copies (`.cpu()`, `.to("cpu")`) are never
    made non-blocking: the host could read the tensor before the data arrived.

    ## Example
    ```python
    for x, y in loader:
        x, y = x.to(device), y.to(device)
    ```

    ## Use instead
    ```python
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    ```

    ## Fix safety
    Safe for a tensor from the batch (`x, y = batch`, `batch["input_ids"]`): a host-to-device copy
    on the current stream is ordered before every kernel that uses it, so results are identical.
    Without pinned memory the copy stays synchronous (the gain needs SF102 too); the code is
    still correct. Unsafe for a whole batch (`for batch in loader: batch.to(device)`) or a
    parameter: it may be an object of the collate function's making whose `.to()` takes no
    `non_blocking` (transformers' `BatchEncoding` before 4.48 raises a `TypeError`). No fix where
    the project itself defines such a class (a `.to(self, device)`, as DETR's `NestedTensor`): a
    name taken from the batch may then hold one, and only the values of a dict or list batch
    (`{k: v.to(device) for k, v in t.items()}`) are known to be tensors. A second `.cuda()` of a
    batch already copied above in the loop is a no-op on a GPU tensor: not reported.

    ## Impact
    Medium: the CPU waits for each batch's copy instead of queueing the step's kernels; with
    pinned memory (SF102) the copy overlaps with compute. Low when the file's DataLoaders that
    may feed training are not pinned (for a file that builds none, a trainer class handed its
    loaders: those of the file that imports it): a copy from pageable memory stays synchronous with
    `non_blocking=True`, so the gain comes with SF102's fix, which carries it. Low for batches of
    token ids (a step that feeds `input_ids`, a tokenizer the file loads): a few kilobytes of
    integers per step.

    ## Measured effect
    Removes one host synchronisation per copied tensor per step; the PyTorch tutorial on pinned
    memory shows many small non-blocking copies beating blocking ones. pytorch/examples' ImageNet
    script copies this way (`images.to(device, non_blocking=True)`).
    Source: https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html
    """

    impact = "medium"
    code = "SF104"
    name = "blocking-transfer"
    summary = "Host-to-GPU batch copy in the training loop without `non_blocking=True`"
    severity = Severity.WARNING
    requires = (b".to(", b".cuda(", b".type(")
    fix_applicability = Applicability.SAFE
    loss_check = LossCheck.EXACT
    fix_title = "Add `non_blocking=True`"
    gpu_only = True
    effect = "The CPU keeps queueing work while the batch is copied."

    VALID = [
        Valid(  # Accelerate told to copy without blocking
            """
            from accelerate import Accelerator
            from accelerate.utils import DataLoaderConfiguration
            accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))
            model, optimizer, train_dl = accelerator.prepare(model, optimizer, train_dl)
            for batch in train_dl:
                accelerator.backward(model(**batch).loss)
                optimizer.step()
            """
        ),
        Valid(  # Accelerate placed the batches already (without blocking): the `.to()` is a no-op
            """
            from accelerate import Accelerator
            from accelerate.utils import DataLoaderConfiguration
            accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))
            model, optimizer, train_dl = accelerator.prepare(model, optimizer, train_dl)
            for epoch in range(3):
                active = accelerator.skip_first_batches(train_dl, 10) if epoch == 0 else train_dl
                for batch in active:
                    batch.to(accelerator.device)
                    accelerator.backward(model(**batch).loss)
                    optimizer.step()
            """
        ),
        Valid(  # outside the training loop
            """
            import torch
            device = torch.device("cuda")
            for x, y in val_loader:
                x = x.to(device)
                out = model(x)
            """
        ),
        Valid(  # dtype conversion and device-to-host copies are not host-to-device copies
            """
            import torch
            for x, y in train_loader:
                x = x.to(torch.float16)
                y = y.to("cpu")
                loss = model(x.cuda(non_blocking=True)).sum()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # tensors that do not come from a DataLoader (nanoGPT's get_batch)
            """
            import torch
            for it in range(1000):
                x, y = get_batch("train")
                x = x.to("cuda")
                loss = model(x, y)
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # `non_blocking` given positionally: a keyword would raise
            """
            import torch
            for x, y in train_loader:
                x = x.to("cuda", torch.float16, True)
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
            """
        ),
    ]
    INVALID = [
        Invalid(  # one of a dict of loaders, a train and a val phase per epoch (the transfer-learning tutorial):
                  # the labels copied inside the `with` are the same transfer of the batch, one finding
            """
            import torch
            device = torch.device("cuda")
            loaders = {split: torch.utils.data.DataLoader(sets[split], batch_size=32, shuffle=True)
                       for split in ("train", "val")}
            for epoch in range(10):
                for split in ("train", "val"):
                    for images, targets in loaders[split]:
                        images = images.to(device)
                        with torch.set_grad_enabled(split == "train"):
                            loss = criterion(model(images), targets.to(device))
                            if split == "train":
                                optimizer.zero_grad()
                                loss.backward()
                                optimizer.step()
            """,
            fixed="""
            import torch
            device = torch.device("cuda")
            loaders = {split: torch.utils.data.DataLoader(sets[split], batch_size=32, shuffle=True)
                       for split in ("train", "val")}
            for epoch in range(10):
                for split in ("train", "val"):
                    for images, targets in loaders[split]:
                        images = images.to(device, non_blocking=True)
                        with torch.set_grad_enabled(split == "train"):
                            loss = criterion(model(images), targets.to(device, non_blocking=True))
                            if split == "train":
                                optimizer.zero_grad()
                                loss.backward()
                                optimizer.step()
            """,
        ),
        Invalid(  # the branches of an if-chain in a helper, one of which runs per batch: one finding
            """
            import torch
            from torch.utils.data import DataLoader

            def to_device(targets, device):
                if mixup:
                    t1, t2, lam = targets
                    targets = (t1.to(device), t2.to(device), lam)
                elif ricap:
                    targets = [t.to(device) for t in targets]
                return targets

            loader = DataLoader(train_set, batch_size=64, num_workers=4, pin_memory=True)
            for x, targets in loader:
                x = x.to("cuda", non_blocking=True)
                loss = criterion(model(x), to_device(targets, "cuda"))
                loss.backward()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader

            def to_device(targets, device):
                if mixup:
                    t1, t2, lam = targets
                    targets = (t1.to(device, non_blocking=True), t2.to(device, non_blocking=True), lam)
                elif ricap:
                    targets = [t.to(device, non_blocking=True) for t in targets]
                return targets

            loader = DataLoader(train_set, batch_size=64, num_workers=4, pin_memory=True)
            for x, targets in loader:
                x = x.to("cuda", non_blocking=True)
                loss = criterion(model(x), to_device(targets, "cuda"))
                loss.backward()
            """,
        ),
        Invalid(  # a dict batch copied key by key (Hugging Face scripts)
            """
            import torch
            device = torch.device("cuda")
            for epoch in range(3):
                for batch in train_loader:
                    batch = {k: v.to(device) for k, v in batch.items()}
                    loss = model(**batch).loss
                    loss.backward()
                    optimizer.step()
                for step, batch in enumerate(train_loader):
                    for k, v in batch.items():
                        batch[k] = v.to(device)
                    model(**batch).loss.backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            device = torch.device("cuda")
            for epoch in range(3):
                for batch in train_loader:
                    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                    loss = model(**batch).loss
                    loss.backward()
                    optimizer.step()
                for step, batch in enumerate(train_loader):
                    for k, v in batch.items():
                        batch[k] = v.to(device, non_blocking=True)
                    model(**batch).loss.backward()
                    optimizer.step()
            """,
            count=2,
        ),
        Invalid(  # the loader comes in as a keyword-only parameter, renamed and maybe cut short for a quick epoch
            """
            from itertools import islice
            import torch

            def fit(model, opt, *, loader, steps_per_epoch=None, gpu=torch.cuda.is_available()):
                batches = loader
                if steps_per_epoch:
                    batches = islice(batches, steps_per_epoch)
                for i, (images, labels) in enumerate(batches):
                    if gpu:
                        images, labels = images.cuda(), labels.cuda()
                    model(images, labels).backward()
                    opt.step()
            """,
            fixed="""
            from itertools import islice
            import torch

            def fit(model, opt, *, loader, steps_per_epoch=None, gpu=torch.cuda.is_available()):
                batches = loader
                if steps_per_epoch:
                    batches = islice(batches, steps_per_epoch)
                for i, (images, labels) in enumerate(batches):
                    if gpu:
                        images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
                    model(images, labels).backward()
                    opt.step()
            """,
        ),
        Invalid(  # the collate function packs images into an object of the project whose `.to()` takes
                  # only a device: `non_blocking=True` would raise, so no fix; the label dicts' values
                  # are tensors and keep theirs
            """
            import torch

            class PaddedImages:
                def __init__(self, pixels, mask):
                    self.pixels, self.mask = pixels, mask

                def to(self, device):
                    return PaddedImages(self.pixels.to(device), self.mask.to(device))

            def train_one_epoch(model, loader, optimizer, device):
                for images, labels in loader:
                    images = images.to(device)
                    model(images, labels).backward()
                    optimizer.step()

            train_one_epoch(detector, train_loader, optimizer, torch.device("cuda"))
            """,
        ),
        Invalid(  # a batch copied once, then `.cuda()` again where it is used: the second is a no-op
            """
            import torch
            for epoch in range(10):
                for i, wave in enumerate(train_loader):
                    wave = wave.cuda()
                    spec = stft(wave)
                    loss = critic(wave.cuda()).mean() + critic(spec).mean()
                    loss.backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            for epoch in range(10):
                for i, wave in enumerate(train_loader):
                    wave = wave.cuda(non_blocking=True)
                    spec = stft(wave)
                    loss = critic(wave.cuda()).mean() + critic(spec).mean()
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # the batches listed first so that a progress bar knows their number
            """
            import torch
            for epoch in range(5):
                progress = tqdm(list(enumerate(train_loader)))
                for i, (seq, label) in progress:
                    loss = criterion(model(seq.to("cuda")), label.to("cuda"))
                    loss.backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            for epoch in range(5):
                progress = tqdm(list(enumerate(train_loader)))
                for i, (seq, label) in progress:
                    loss = criterion(model(seq.to("cuda", non_blocking=True)), label.to("cuda", non_blocking=True))
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # a list batch drawn with next() and copied element by element
            """
            import torch
            batches = iter(loader)
            while True:
                pair = next(batches)
                pair = [t.to("cuda") for t in pair]
                loss = model(*pair)
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            batches = iter(loader)
            while True:
                pair = next(batches)
                pair = [t.to("cuda", non_blocking=True) for t in pair]
                loss = model(*pair)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # a batch drawn and copied in one expression (step-based training over an iterator; unsafe fix)
            """
            import torch
            batches = iter(loader)
            for step in range(100_000):
                loss = model(next(batches).to("cuda")).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            """,
            fixed="""
            import torch
            batches = iter(loader)
            for step in range(100_000):
                loss = model(next(batches).to("cuda", non_blocking=True)).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            """,
        ),
        Valid(  # a prepared loader: Accelerate moves each batch to the device itself, nothing to copy
            """
            from accelerate import Accelerator
            accelerator = Accelerator(mixed_precision="bf16")
            model, optimizer, train_dl = accelerator.prepare(model, optimizer, train_dl)
            for epoch in range(3):
                for batch in train_dl:
                    accelerator.backward(model(**batch).loss)
                    optimizer.step()
            """
        ),
        Valid(  # audiolm: unpacked from next() of a trainer's iterator over the loader it prepared (the same
            # name drawn from an unprepared validation loader every 100 steps)
            """
            import torch
            from accelerate import Accelerator
            from torch import nn

            def cycle(dl):
                while True:
                    for data in dl:
                        yield data

            class Trainer(nn.Module):
                def __init__(self, model, dataloader, valid_dataloader, optim):
                    super().__init__()
                    self.accelerator = Accelerator(mixed_precision="bf16")
                    (self.model, self.optim, self.dl) = self.accelerator.prepare(model, optim, dataloader)
                    self.dl_iter = cycle(self.dl)
                    self.valid_dl_iter = cycle(valid_dataloader)
                    self.steps = 0

                def train_step(self):
                    wave, = next(self.dl_iter)
                    wave = wave.to(self.accelerator.device)
                    self.accelerator.backward(self.model(wave).mean())
                    self.optim.step()
                    self.steps += 1
                    if self.steps % 100 == 0:
                        wave, = next(self.valid_dl_iter)
                        wave = wave.to(self.accelerator.device, non_blocking=True)
                        with torch.no_grad():
                            print(self.model(wave).mean())

                def train(self):
                    while True:
                        self.train_step()
            """
        ),
        Valid(  # drawn with next() from a prepared loader that a generator repeats: on the device already
            """
            from accelerate import Accelerator

            def cycle(dl):
                while True:
                    for data in dl:
                        yield data

            accelerator = Accelerator(mixed_precision="bf16")
            model, optimizer = accelerator.prepare(model, optimizer)
            batches = cycle(accelerator.prepare(train_dl))
            for step in range(1000):
                data = next(batches).to(accelerator.device)
                accelerator.backward(model(data).mean())
                optimizer.step()
            """
        ),
        Invalid(  # a legacy tensor-type copy (PyTorch-GAN style)
            """
            import torch
            cuda = torch.cuda.is_available()
            Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
            for i, (imgs, _) in enumerate(dataloader):
                real = imgs.type(Tensor)
                loss = criterion(model(real))
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            cuda = torch.cuda.is_available()
            Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
            for i, (imgs, _) in enumerate(dataloader):
                real = imgs.type(Tensor, non_blocking=True)
                loss = criterion(model(real))
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for epoch in range(10):
                for i, (x, y) in enumerate(train_loader):
                    x, y = x.to(device), y.to(device)
                    loss = criterion(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for epoch in range(10):
                for i, (x, y) in enumerate(train_loader):
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    loss = criterion(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # a batch flattened before its copy (pytorch-tutorial's MLPs); its two parts are
            # copied on consecutive lines: one transfer, one finding, both copies fixed
            """
            import torch
            for images, labels in train_loader:
                images = images.reshape(-1, 28 * 28).to("cuda")
                loss = criterion(model(images), labels.cuda())
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            for images, labels in train_loader:
                images = images.reshape(-1, 28 * 28).to("cuda", non_blocking=True)
                loss = criterion(model(images), labels.cuda(non_blocking=True))
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # EAGLE: the target copied inside a `with torch.no_grad():` of the same step: one transfer
            """
            import torch
            rank = torch.device("cuda")
            for data in train_loader:
                predict = model(data["hidden_states"].to(rank))
                with torch.no_grad():
                    target = head(data["target"].to(rank))
                loss = criterion(predict, target)
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            rank = torch.device("cuda")
            for data in train_loader:
                predict = model(data["hidden_states"].to(rank, non_blocking=True))
                with torch.no_grad():
                    target = head(data["target"].to(rank, non_blocking=True))
                loss = criterion(predict, target)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # wavenet_vocoder: a step function's parameters, two copied in one statement, one on the next line
            """
            import torch

            def train_step(device, model, optimizer, x, y, input_lengths):
                x, y = x.to(device), y.to(device)
                input_lengths = input_lengths.to(device)
                loss = model(x, input_lengths).sub(y).pow(2).mean()
                loss.backward()
                optimizer.step()

            for x, y, input_lengths in torch.utils.data.DataLoader(dataset, num_workers=4, pin_memory=True):
                train_step(torch.device("cuda"), model, optimizer, x, y, input_lengths)
            """,
            fixed="""
            import torch

            def train_step(device, model, optimizer, x, y, input_lengths):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                input_lengths = input_lengths.to(device, non_blocking=True)
                loss = model(x, input_lengths).sub(y).pow(2).mean()
                loss.backward()
                optimizer.step()

            for x, y, input_lengths in torch.utils.data.DataLoader(dataset, num_workers=4, pin_memory=True):
                train_step(torch.device("cuda"), model, optimizer, x, y, input_lengths)
            """,
        ),
        Invalid(  # Wave-U-Net: the input, then each target of a dict in a loop over its keys: one transfer
            """
            import torch
            for x, targets in train_loader:
                x = x.cuda()
                for k in list(targets.keys()):
                    targets[k] = targets[k].cuda()
                loss = sum(criterion(model(x)[k], targets[k]) for k in targets)
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            for x, targets in train_loader:
                x = x.cuda(non_blocking=True)
                for k in list(targets.keys()):
                    targets[k] = targets[k].cuda(non_blocking=True)
                loss = sum(criterion(model(x)[k], targets[k]) for k in targets)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # both copies in an `if` on one line (TCN's `if args.cuda: data, target = ...`): one finding
            """
            import torch
            for data, target in train_loader:
                if torch.cuda.is_available(): data, target = data.cuda(), target.cuda()
                loss = criterion(model(data), target)
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            for data, target in train_loader:
                if torch.cuda.is_available(): data, target = data.cuda(non_blocking=True), target.cuda(non_blocking=True)
                loss = criterion(model(data), target)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # the inputs copied first, the labels after the forward pass: one transfer of the batch,
                  # one finding fixing every copy but the one whose line says `# noqa`
            """
            import torch
            for batch in train_loader:
                encoder_input = batch["encoder_input"].to("cuda")
                decoder_input = batch["decoder_input"].to("cuda")
                output = model(encoder_input, decoder_input)
                label = batch["label"].to("cuda")
                mask = batch["mask"].to("cuda")  # noqa: SF104
                loss = criterion(output[mask], label[mask])
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            for batch in train_loader:
                encoder_input = batch["encoder_input"].to("cuda", non_blocking=True)
                decoder_input = batch["decoder_input"].to("cuda", non_blocking=True)
                output = model(encoder_input, decoder_input)
                label = batch["label"].to("cuda", non_blocking=True)
                mask = batch["mask"].to("cuda")  # noqa: SF104
                loss = criterion(output[mask], label[mask])
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # dict batches, `.cuda()`, and a same-file step function called per batch
            """
            import torch

            def train_step(model, batch, optimizer):
                inputs = batch["input_ids"].cuda()
                loss = model(inputs).loss
                loss.backward()
                optimizer.step()

            def train(model, loader, optimizer):
                for batch in loader:
                    train_step(model, batch, optimizer)
            """,
            fixed="""
            import torch

            def train_step(model, batch, optimizer):
                inputs = batch["input_ids"].cuda(non_blocking=True)
                loss = model(inputs).loss
                loss.backward()
                optimizer.step()

            def train(model, loader, optimizer):
                for batch in loader:
                    train_step(model, batch, optimizer)
            """,
        ),
        Invalid(  # a method of the trainer gets the batch's parts, converts and copies them; the
                  # target's conversion between the copies does not split the transfer: one finding
            """
            import torch

            class Runner:
                def step(self, inputs, marks, target):
                    inputs = inputs.float().to(self.device)
                    target = target.float()
                    marks = marks.float().to(self.device)
                    return self.net(inputs, marks), target

                def fit(self, train_loader, optimizer):
                    for inputs, marks, target in train_loader:
                        out, target = self.step(inputs, marks, target)
                        self.loss(out, target.cuda()).backward()
                        optimizer.step()
            """,
            fixed="""
            import torch

            class Runner:
                def step(self, inputs, marks, target):
                    inputs = inputs.float().to(self.device, non_blocking=True)
                    target = target.float()
                    marks = marks.float().to(self.device, non_blocking=True)
                    return self.net(inputs, marks), target

                def fit(self, train_loader, optimizer):
                    for inputs, marks, target in train_loader:
                        out, target = self.step(inputs, marks, target)
                        self.loss(out, target.cuda(non_blocking=True)).backward()
                        optimizer.step()
            """,
            count=2,
        ),
        Invalid(  # a progress bar entered with `with`: the loop iterates the loader through it
            """
            import torch
            from tqdm import tqdm
            for epoch in range(4):
                with tqdm(enumerate(train_loader)) as bar:
                    for _, (features, labels) in bar:
                        features = features.to("cuda").float()
                        loss = criterion(model(features), labels.to("cuda"))
                        loss.backward()
                        optimizer.step()
            """,
            fixed="""
            import torch
            from tqdm import tqdm
            for epoch in range(4):
                with tqdm(enumerate(train_loader)) as bar:
                    for _, (features, labels) in bar:
                        features = features.to("cuda", non_blocking=True).float()
                        loss = criterion(model(features), labels.to("cuda", non_blocking=True))
                        loss.backward()
                        optimizer.step()
            """,
        ),
        Invalid(  # a whole batch may be a BatchEncoding: the fix is unsafe
            """
            import torch
            device = torch.device("cuda")
            for step, batch in enumerate(train_loader):
                batch = batch.to(device)
                loss = model(**batch).loss
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            device = torch.device("cuda")
            for step, batch in enumerate(train_loader):
                batch = batch.to(device, non_blocking=True)
                loss = model(**batch).loss
                loss.backward()
                optimizer.step()
            """,
        ),
    ]

    @cached_property
    def batches(self) -> BatchNames:
        return BatchNames(self.ctx)

    @cached_property
    def _block_order(self) -> dict[int, int]:
        return {}

    def impact_here(self, finding: Finding) -> Estimate | None:
        if unpinned_training_loaders(self.ctx):
            return Estimate(Impact.LOW, "an unpinned loader: the copy stays synchronous until SF102 pins it")
        samples = training_samples(self.ctx)
        if samples is not None and samples[0] is Samples.TOKENS:
            return Estimate(Impact.LOW, f"{samples[1]}: a few kilobytes of integers, copied in microseconds")
        return None

    def finish(self) -> None:
        pinned = self._all_loaders_pinned()
        uploads = [site for attr in ("to", "cuda") for site in self.ctx.method_calls(attr) if self._is_blocking_upload(site)]
        for group in self._transfer_sites(uploads):
            self._report_transfer(group, pinned)

        for site in self.ctx.calls:
            self._check_helper_copy(site)

        indent = self.ctx.module.default_indent
        for site in self.ctx.method_calls("type"):
            if self._is_legacy_upload(site):
                ops = [Transform(site.node, lambda call: append_args(call, keyword_arg("non_blocking", cst.Name("True")), indent=indent))]
                self.report(site.node, "`.type()` to a CUDA tensor type copies the batch to the GPU in the training "
                            "loop and blocks the CPU until the copy is done", fix_ops=ops)

    def _transfer_sites(self, uploads: list[CallSite]) -> list[list[CallSite]]:
        """The copies grouped by where the batch is moved: the copies of one block, `with` blocks
        inside it included (the step's `x = x.cuda()` and `y = y.cuda()`, also with the forward
        pass between them: the labels copied just before the loss) are one transfer of the batch,
        reported once. Copies whose fix is unsafe go apart from safe ones, and so does a line with
        `# noqa`, which then suppresses its own copy alone."""
        groups: dict[tuple[int, str, int], list[CallSite]] = {}
        for site in sorted(uploads, key=lambda s: self._place(s)):
            block, unsafe, index = self._place(site)
            apart = block < 0 or has_noqa(site.statement)
            groups.setdefault((block, unsafe, id(site) if apart else 0), []).append(site)
        return list(groups.values())

    def _place(self, site: CallSite) -> tuple[int, str, int]:
        """(the block holding the copy's statement, how safe its fix is, the statement's index there)."""
        unsafe = self._fix_kind(site)
        if site.statement is None:  # `if args.cuda: data, target = data.cuda(), target.cuda()`: one suite
            return self._block_order.setdefault(id(site.stack), len(self._block_order)), unsafe, 0
        statement: cst.CSTNode = site.statement
        owner = statement_owner(self.ctx, statement)
        # a `with torch.no_grad():` inside the step: the step's block (EAGLE); the branches of an
        # if-chain, only one of which runs: the chain's place (one helper's `if mixup: ... else:`);
        # a loop over the batch's parts that takes no step itself (Wave-U-Net's `for k in
        # list(targets.keys()): targets[k] = targets[k].cuda()` after `x = x.cuda()`)
        while owner is not None and (isinstance(owner[0], (cst.With, cst.If, cst.Else)) or isinstance(
                owner[0], cst.For) and owner[0] not in self.ctx.training_loops):
            around = if_chain_top(self.ctx, owner[0]) if isinstance(owner[0], (cst.If, cst.Else)) else owner[0]
            outer = statement_owner(self.ctx, around)
            if outer is None:
                break
            statement, owner = around, outer
        if owner is None:
            return -1, unsafe, id(site.node)  # never grouped
        index = next(i for i, found in enumerate(owner[1]) if found is statement)
        return self._block_order.setdefault(id(owner[0]), len(self._block_order)), unsafe, index

    def _report_transfer(self, sites: list[CallSite], pinned: bool) -> None:
        indent = self.ctx.module.default_indent
        first = sites[0]
        attr = first.node.func.attr.value  # type: ignore[attr-defined]
        receivers = [code_of(site.node.func.value) for site in sites]  # type: ignore[attr-defined]
        if len(sites) == 1:
            message = f"`.{attr}()` of a batch in the training loop blocks the CPU until the copy is done"
        else:
            shown = ", ".join(f"`{receiver}`" for receiver in receivers)
            message = f"`.{attr}()` of the batch ({shown}) in the training loop blocks the CPU until each copy is done"
        if not pinned:
            message += " (pin the DataLoader's memory too, SF102)"
        ops = [Transform(site.node, lambda call: append_args(call, keyword_arg("non_blocking", cst.Name("True")), indent=indent))
               for site in sites]
        kind = self._fix_kind(first)
        if kind == "none":
            self.report(first.node, message, no_fix_reason=f"`{self._narrow_class}.to()` of this project takes no "
                        f"`non_blocking`, and `{receivers[0]}` may be one: pass `non_blocking=True` to the copies of "
                        "its tensors inside that method")
        elif kind == "unsafe":
            title = f"{self.fix_title} (unsafe: `{receivers[0]}` may be a batch object whose `.{attr}()` takes no `non_blocking`)"
            self.report(first.node, message, fix_ops=ops, fix_title=title, applicability=Applicability.UNSAFE)
        else:
            self.report(first.node, message, fix_ops=ops)

    def _check_helper_copy(self, site: CallSite) -> None:
        """`real_images = tensor2var(real_images)` in the training loop, where the helper (a
        function of another scanned file) copies that parameter with a blocking `x.cuda()`: the
        copy to change is inside the helper, so the finding names it and gives no fix here."""
        ctx = self.ctx
        if not isinstance(site.node.func, cst.Name) or not ctx.is_hot(site.stack):
            return
        callee = ctx.project_callee(site)
        if callee is None or not callee.blocking_copies:
            return
        for index, arg in enumerate(site.node.args):
            if arg.star or arg.keyword is not None or index >= len(callee.params):
                break
            if callee.params[index] in callee.blocking_copies and self.batches.is_host_batch(arg.value, site.stack):
                helper = site.node.func.value
                self.report(site.node, f"`{helper}()` copies the batch (`{code_of(arg.value)}`) to the GPU in the training "
                            "loop and blocks the CPU until the copy is done",
                            no_fix_reason=f"the copy is inside `{helper}()`, in another file: pass `non_blocking=True` to it there")
                return

    def _is_legacy_upload(self, site: CallSite) -> bool:
        """`imgs.type(Tensor)` with `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`
        (the PyTorch-GAN scripts), or `x.type(torch.cuda.FloatTensor)`, on a batch in the loop."""
        ctx, args = self.ctx, site.node.args
        if not ctx.is_hot(site.stack) or len(args) != 1 or args[0].keyword is not None:
            return False
        if not self.batches.is_host_batch(site.node.func.value, site.stack):  # type: ignore[attr-defined]
            return False  # (after `x = x.cuda()`, `.type(torch.cuda.HalfTensor)` is a cast on the GPU)
        value = args[0].value
        if isinstance(value, cst.Name):
            value = ctx.single_value(value.value, site.stack) or value
        options = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
        return any((ctx.qualname(option) or "").startswith("torch.cuda.") for option in options)

    @cached_property
    def _narrow_class(self) -> str | None:
        return narrow_to_class(self.ctx)

    def _fix_kind(self, site: CallSite) -> str:
        """"safe": a tensor of the batch; "unsafe": a whole batch or a parameter, maybe an object
        of the collate function's making; "none": a name that may hold an object of a project class
        whose `.to()` takes no `non_blocking` (only the values of a dict or list batch are tensors)."""
        receiver = site.node.func.value  # type: ignore[attr-defined]
        if draws_next(receiver):  # `next(batches).to(device)`: a whole batch, whatever the collate function made
            return "none" if self._narrow_class is not None else "unsafe"
        if self._narrow_class is not None and isinstance(receiver, cst.Name) and receiver.value not in self.batches.values:
            return "none"
        return "unsafe" if self._may_be_batch_object(receiver, site) else "safe"

    def _may_be_batch_object(self, receiver: cst.BaseExpression, site: CallSite) -> bool:
        """A whole batch (`for batch in loader: batch.to(device)`) or a parameter is whatever
        the collate function made: transformers' `BatchEncoding.to()` took no `non_blocking`
        before 4.48. Parts of a batch (`x, y = batch`, `batch["input_ids"]`) are tensors; the
        copy's own statement says nothing of where the name comes from (wavenet_vocoder's
        `x, y = x.to(device), y.to(device)` of two parameters)."""
        if not isinstance(receiver, cst.Name):
            return False
        ctx, name = self.ctx, receiver.value
        if name in self.batches.values:  # `v` of `batch.items()`: a tensor of the batch
            return False
        function = ctx.function_of(site.stack)
        for assignment in ctx.assignments_in(function, name):
            if assignment.statement is site.statement and site.statement is not None:
                continue
            if assignment.unpacked or isinstance(assignment.value, (cst.Subscript, cst.Attribute)):
                return False
        info = self._for_loops.get((function, name))
        return _whole_target(info, name) if info is not None else True

    @cached_property
    def _for_loops(self) -> dict[tuple[cst.CSTNode | None, str], LoopInfo]:
        """(function, name) -> the first `for` loop of that function that binds the name (found
        once per file, not once per call)."""
        found: dict[tuple[cst.CSTNode | None, str], LoopInfo] = {}
        for info in self.ctx.loops.values():
            if isinstance(info.node, cst.For):
                function = self.ctx.function_of(info.stack)
                for target in info.targets:
                    found.setdefault((function, target), info)
        return found

    def _is_blocking_upload(self, site: CallSite) -> bool:
        ctx = self.ctx
        if not ctx.is_hot(site.stack):
            return False
        func = site.node.func
        assert isinstance(func, cst.Attribute)
        receiver = without_layout_calls(func.value)
        if not self.batches.is_batch(receiver, site.stack) or self.batches.moved_before(receiver, site.stack, site.statement):
            return False  # (a batch moved above already: copying it again is a no-op)
        if self._drawn_placed(receiver, site):
            return False
        if hand_written_batches(ctx, site.stack):
            return False  # batches of a project's own iterator: nothing pins them
        if not find_argument(ctx, site, "non_blocking").missing or _sets_more_positionally(site):
            return False
        if func.attr.value == "cuda":
            return True
        device = find_argument(ctx, site, "device", 0)
        if device.missing or device.node is None:
            return False  # `.to(dtype=...)`, `.to(memory_format=...)`
        if is_dtype(ctx, device.node) or is_cpu_device(ctx, device.node, site.stack):
            return False
        return True

    def _drawn_placed(self, receiver: cst.BaseExpression, site: CallSite) -> bool:
        """Does the name's last assignment before the copy draw it with `next()` from a loader
        whose batches a framework moves to the device (audiolm's `wave, = next(self.dl_iter)` of an
        `accelerator.prepare`d loader), though the same name is drawn from another loader elsewhere
        in the function (its validation batches, every N steps)?"""
        if not isinstance(receiver, cst.Name) or site.statement is None:
            return False
        before = [a for a in self.ctx.assignments_in(self.ctx.function_of(site.stack), receiver.value)
                  if a.statement is not None and a.statement is not site.statement
                  and comes_before(self.ctx, a.statement, site.statement)]
        last = before[-1].value if before else None
        return last is not None and draws_next(last) and device_placing_call(
            self.ctx, unwrap_iterable(last.args[0].value)) is not None  # type: ignore[attr-defined]

    def _all_loaders_pinned(self) -> bool:
        loaders = dataloader_calls(self.ctx)
        return bool(loaders) and all(not find_argument(self.ctx, s, "pin_memory", 7).missing for s in loaders)


def _sets_more_positionally(site: CallSite) -> bool:
    """`x.to(device, dtype, True)`, `x.cuda(0, True)`, `x.to(*args)`: `non_blocking` may already be
    given (a keyword would then raise "got multiple values")."""
    args = site.node.args
    if any(arg.star for arg in args):
        return True
    positional = sum(1 for arg in args if arg.keyword is None)
    return positional >= (3 if site.node.func.attr.value == "to" else 2)  # type: ignore[attr-defined]


def _whole_target(info: LoopInfo, name: str) -> bool:
    """`for batch in loader` or `for i, batch in enumerate(loader)`: ``name`` is the whole batch."""
    target = info.node.target
    if isinstance(target, cst.Name):
        return target.value == name
    iterable = info.iter  # `tqdm(enumerate(loader), total=...)`: what the wrapper iterates
    while isinstance(iterable, cst.Call) and dotted_name(iterable.func) != "enumerate" \
            and is_iterable_wrapper(dotted_name(iterable.func)) and iterable.args:
        iterable = iterable.args[0].value
    enumerated = isinstance(iterable, cst.Call) and dotted_name(iterable.func) == "enumerate"
    if enumerated and isinstance(target, cst.Tuple) and len(target.elements) == 2:
        second = target.elements[1].value
        return isinstance(second, cst.Name) and second.value == name
    return False
