from __future__ import annotations

import re

import libcst as cst

from speedfix.engine.findings import Applicability, FixOp, LossCheck, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, find_arg, keyword_arg, reference, replace_arg_value
from speedfix.model.arguments import find_argument, literal_int
from speedfix.model.context import FileContext
from speedfix.model.devices import one_process_per_gpu, trains_on_cpu_only
from speedfix.model.flow import assigned_name, int_in_every_run
from speedfix.model.frames import FrameKind
from speedfix.model.index import CallSite
from speedfix.model.hf_args import UNKNOWN, run_field_value
from speedfix.model.loaders import (Place, evaluation_only, iterated_per_epoch, late_value, not_for_training,
                                    samples_place)
from speedfix.model.loader_classes import dataloader_calls
from speedfix.model.patterns import (
    dataset_argument,
    held_items_class,
    is_in_memory_dataset,
    is_iterable_dataset,
    worker_start_refusal,
)
from speedfix.model.rl import reads_replay_buffer
from speedfix.model.scale import Role, inference_feed, loader_role
from speedfix.model.workload import Samples, tokenized_ahead, training_samples
from speedfix.rules._impact import Estimate, Finding, Impact, evaluation_loader
from speedfix.syntax.blocks import enclosing_block
from speedfix.syntax.comments import argument_comments, prose, statement_comments
from speedfix.rules._examples import NOTEBOOK_PEEKED_LOADERS, TEST_PASS_AFTER_TRAINING


class DataloaderNoWorkers(Rule):
    """
    ## What it does
    Finds a `torch.utils.data.DataLoader` that loads batches in the training process itself:
    `num_workers` is not set, or set to 0. A small literal (1 or 2) is reported at lower severity.
    The value may come from a constant, an argparse default, a parameter's default (or what the
    calls in the project's other scanned files pass to it, when they all pass the same: a loader
    factory's `num_workers=2` default is not the run's when `main.py` passes `--num_workers`,
    default 8; or what every call in its own file passes: `make_loader(..., args.workers)`), or a
    constructor argument the class reads back (`num_workers=self.num_workers` in a
    LightningDataModule: the `__init__` default, or what the project's LightningCLI configs give it).
    An argparse default of 0 is the run's only where no launch command of the project (a shell
    script, a README command, `deepspeed --module pkg.train`) passes the option another value.

    ## Why is this bad?
    With `num_workers=0`, every `__getitem__` call, augmentation and `collate_fn` runs in the main
    process between two training steps, so the GPU sits idle while the next batch is prepared.
    Worker processes prepare batches ahead of time, in parallel with the training step.

    Not reported: data already in memory as tensors (a `TensorDataset`, or a Dataset whose
    `__getitem__` only indexes tensors it holds), where PyTorch's own guidance is to keep
    `num_workers=0` because worker IPC costs more than it saves; samples that are CUDA tensors
    (`.to(device)` in `__getitem__`, or a run that makes CUDA the default tensor type), which
    forked workers cannot make; a low worker count with a
    comment that gives its reason (`num_workers=0,  # h5py handles cannot be forked`); a script
    that trains with no sign of a GPU (no CUDA, no device it copies batches to, no framework that
    picks the GPU); token ids tokenized ahead (a step that feeds `input_ids`, a tokenizer or a
    collator given one, and no Dataset that tokenizes or decodes an image, video or audio file
    in `__getitem__`, in this file or, for a loader's dataset, in the file of the project that
    defines its class, nor a feature extractor or image processor whose features the batches
    carry beside the tokens, nor a training step that reads images from its batches by name,
    `batch["pixel_values"]`, nor a `collate_fn` handed a function that runs the tokenizer on raw
    text, batch by batch): a worker would only index and pad them; a loader that a script which
    trains reads once, after training, outside any loop (a final test pass: workers would start
    up for a single pass); a loader of a script that never trains (no step, backward pass or
    optimizer, no training file imports it) and evaluates (`model.eval()`, `torch.no_grad()`): an
    evaluation, feature-extraction or synthesis script, whose speed is not a training run's; and
    values speedfix cannot know (`num_workers=args.workers`, unresolved `**kwargs`). A worker
    count taken from the `TrainingArguments` an `HfArgumentParser` fills
    (`num_workers=training_args.dataloader_num_workers`) is what the runs give it, else
    transformers' default, 0.

    ## Example
    ```python
    loader = DataLoader(train_set, batch_size=64, shuffle=True)
    ```

    ## Use instead
    ```python
    loader = DataLoader(
        train_set, batch_size=64, shuffle=True,
        num_workers=min(8, os.cpu_count() or 1), persistent_workers=True,
    )
    ```

    ## Fix safety
    Unsafe. Workers change how a script runs: with the `spawn`/`forkserver` start method (Windows,
    macOS, Linux on Python 3.14+) each worker re-imports the script, so the fix is refused when the
    DataLoader is built at import time without an `if __name__ == "__main__":` guard, and when
    `collate_fn`/`worker_init_fn` is a lambda (not picklable). An `IterableDataset` that does not
    shard itself with `get_worker_info()` yields every sample once per worker, so the fix is refused
    for those too. Random augmentations draw from per-worker seeds, so augmented samples differ from a
    `num_workers=0` run. `persistent_workers=True` is added only to a loader iterated every epoch
    (a test loader used once gets none); it keeps workers (and their copy of the dataset) alive
    between epochs. The count is per process: in a script that runs one process per GPU (DDP,
    `mp.spawn`, a `DistributedSampler`) the node's cores are divided among them,
    `min(8, (os.cpu_count() or 1) // max(1, torch.cuda.device_count()))`, so that 8 GPUs do not
    start 64 workers on a 32-core node.

    ## Impact
    High: without worker processes the GPU waits while every batch is loaded and transformed in
    the training process. Medium when the call asks for 1 or 2 workers (a deliberate count),
    but high again when the file decodes image files (`Image.open`, an `ImageFolder`; also in
    the `__getitem__` of a Dataset class of the project that the file builds) or
    composes random image augmentations (`RandomResizedCrop`, a random scale): decoding and
    transforming images one by one outruns 2 workers (not MNIST or CIFAR, small images held in
    memory). Medium for token ids that a Dataset of the file tokenizes item by item in
    `__getitem__`: a fast tokenizer is cheap next to a transformer step. Low for a Dataset of the
    file whose `__getitem__` only picks, crops, pads and reshapes arrays it already holds (loaded
    in `__init__`; numpy's and torch's array functions, random draws, no file read, no transform). Low for a loader that
    only evaluation or testing reads: a validation pass every epoch loaded in the main process
    costs its share of the run, not a stalled training step (one read once after training is
    not reported), and an explicit count of 1 or 2 workers for it is a choice left alone. Its pinning
    and persistent workers are not advised at all (SF102, SF103).

    A `speedfix bench` result of the script decides for a training loader, in a scan and in the
    benchmark's own run-time advice: high when it measured 20% or more of the step time waiting
    for data, medium from 8%, low under 5% on a GPU.

    ## Measured effect
    Workload-dependent: near zero for in-memory tensors, large when `__getitem__` decodes or augments.
    PyTorch's Performance Tuning Guide ("Enable asynchronous data loading and augmentation") and
    the profiler's `SynchronizedDataLoaderPattern` recommend it; `speedfix bench` measures it on your
    script (see docs/benchmarks.md for the data-loading-bound fixture).
    Source: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    """

    impact = "high"
    measure = "data_wait"
    code = "SF101"
    name = "dataloader-no-workers"
    summary = "DataLoader loads batches in the main process (`num_workers` unset or 0)"
    severity = Severity.WARNING
    requires = (b"Loader",)  # `DataLoader`, or a subclass of the project (`WaveLoader`)
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.RNG  # workers keep the batch order but draw augmentation randomness in their own processes
    fix_title = "Load batches in worker processes (`num_workers` from the CPU count, persistent workers)"
    effect = "Overlaps data loading with compute; large when `__getitem__` decodes or augments."

    VALID = [
        Valid(  # a loader made anew for each data set and drawn from once: a plot, not training
            """
            import torch
            from torch.utils.data import DataLoader

            for name, dataset in DATASETS.items():
                loader = DataLoader(dataset(10000))
                x = next(iter(loader))
                plot(name, x.cuda())
            """
        ),
        Valid(  # a script that never trains: it evaluates, and its loader feeds inference only
            """
            import torch
            from torch.utils.data import DataLoader

            def extract(loader, model):
                pbar = tqdm(loader)
                for images, names in pbar:
                    save(names, model(images.cuda()).argmax(1).cpu())

            model = Net().cuda()
            model.eval()
            loader = DataLoader(dataset, batch_size=128)
            with torch.no_grad():
                extract(loader, model)
            """
        ),
        Valid(  # one pass, once, consumed in place: a dataset's mean and std computed before training
            """
            import torch
            from torch.utils.data import DataLoader

            def statistics(train_set):
                data = torch.cat([d[0] for d in DataLoader(train_set)])
                return data.mean(dim=[0, 2, 3]), data.std(dim=[0, 2, 3])

            model = Net().cuda()
            """
        ),
        Valid(  # a causal LM fine-tuned on token ids tokenized ahead; the collator only pads them
            """
            import torch
            from torch.utils.data import DataLoader
            from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq
            tokenizer = AutoTokenizer.from_pretrained(args.model)
            model = AutoModelForCausalLM.from_pretrained(args.model).cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
            train_set = load_tokenized(args.data, tokenizer)
            loader = DataLoader(train_set, batch_size=8, shuffle=True, collate_fn=DataCollatorForSeq2Seq(tokenizer))
            for batch in loader:
                out = model(**{k: v.cuda() for k, v in batch.items()})
                out.loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            """
        ),
        Valid(NOTEBOOK_PEEKED_LOADERS),  # shown and peeked at in a notebook; a later parameter shares the name
        Valid(TEST_PASS_AFTER_TRAINING),  # a test loader read once after training
        Valid(  # a Dataset over the replay buffer the agent fills while it trains (Lightning's DQN)
            """
            import lightning as L
            from torch.utils.data import DataLoader
            class Agent(L.LightningModule):
                def train_dataloader(self):
                    experience = ExperienceSource(self.replay_buffer, 200)
                    return DataLoader(experience, batch_size=16)
            """
        ),
        Valid(  # a notebook looks at one batch: a shape check, no training
            """
            import torch
            from torch.utils.data import DataLoader
            preview = DataLoader(images, batch_size=4)
            for picture, label in preview:
                print(encoder(picture.cuda()).shape)
                break
            """
        ),
        Valid(  # a tutorial that trains on the CPU only: no GPU waits for the batches
            """
            import torch
            import torchvision
            train_set = torchvision.datasets.MNIST("data", train=True, download=True)
            train_loader = torch.utils.data.DataLoader(train_set, batch_size=100, shuffle=True)
            model = torch.nn.Linear(784, 10)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
            for images, labels in train_loader:
                loss = torch.nn.functional.cross_entropy(model(images.reshape(-1, 784)), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a test loader made and never used
            """
            import torch
            from torch.utils.data import DataLoader

            def main():
                train_loader = DataLoader(train_set, batch_size=64, num_workers=4, pin_memory=True)
                test_loader = DataLoader(test_set, batch_size=1000)
                for epoch in range(10):
                    for x, y in train_loader:
                        loss = model(x.cuda()).sum()
                        loss.backward()
                        optimizer.step()
            """
        ),
        Valid(  # a test loader that Accelerate prepares and nothing reads after (tango)
            """
            import torch
            from accelerate import Accelerator
            from torch.utils.data import DataLoader

            def main():
                accelerator = Accelerator()
                train_loader = DataLoader(train_set, batch_size=64, num_workers=4, pin_memory=True)
                test_loader = DataLoader(test_set, batch_size=1000)
                train_loader, test_loader = accelerator.prepare(train_loader, test_loader)
                for epoch in range(10):
                    for x, y in train_loader:
                        loss = model(x).sum()
                        accelerator.backward(loss)
                        optimizer.step()
            """
        ),
        Valid(  # workers set after the loader exists (SF105 says to pass them to the call)
            """
            import multiprocessing
            from torch.utils.data import DataLoader
            train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
            train_loader.num_workers = min(multiprocessing.cpu_count(), 16)
            train_loader.prefetch_factor = 2
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=4)
            """
        ),
        Valid(  # the only call asks for a holdout: the `else:` loader is never built
            """
            from torch.utils.data import DataLoader, random_split
            from torchvision import datasets, transforms

            def make_loader(batch_size, holdout=None):
                data = datasets.MNIST("data", transform=transforms.ToTensor())
                if holdout:
                    kept, _ = random_split(data, [1 - holdout, holdout])
                    loader = DataLoader(kept, batch_size=batch_size, shuffle=True, num_workers=4)
                else:
                    loader = DataLoader(data, batch_size=batch_size, shuffle=True)
                return loader

            loader = make_loader(128, holdout=0.2)
            for epoch in range(10):
                for x, y in loader:
                    model(x.cuda(), y.cuda()).backward()
                    opt.step()
            """
        ),
        Valid(
            """
            import torch
            from torch.utils.data import TensorDataset, DataLoader
            ds = TensorDataset(torch.randn(100, 3), torch.randn(100))
            loader = DataLoader(ds, batch_size=32)
            """
        ),
        Valid(  # features computed once, returned as a TensorDataset and handed to the probe's trainer
            """
            import torch
            from torch.utils import data

            def encode_all(encoder, dataset):
                feats = torch.cat([encoder(x) for x, _ in data.DataLoader(dataset, batch_size=64, num_workers=4)])
                labels = torch.cat([y for _, y in data.DataLoader(dataset, batch_size=64, num_workers=4)])
                return data.TensorDataset(feats, labels)

            def train_probe(train_feats, epochs=100):
                loader = data.DataLoader(train_feats, batch_size=64, shuffle=True, num_workers=0)
                for epoch in range(epochs):
                    for x, y in loader:
                        loss = criterion(probe(x.cuda()), y.cuda())
                        loss.backward()
                        optimizer.step()

            features = encode_all(encoder, train_images)
            train_probe(features)
            """
        ),
        Valid(  # Lightning's bug-report template: __getitem__ only indexes a tensor it holds
            """
            import torch
            from torch.utils.data import DataLoader, Dataset

            class RandomDataset(Dataset):
                def __init__(self, size, length):
                    self.data = torch.randn(length, size)

                def __getitem__(self, index):
                    return self.data[index]

                def __len__(self):
                    return len(self.data)

            train_data = DataLoader(RandomDataset(32, 64), batch_size=2)
            """
        ),
        Valid(  # the UvA tutorial's XOR data: generated in memory, each item read into a name first
            """
            import torch
            from torch.utils import data

            class XORDataset(data.Dataset):
                def __init__(self, size):
                    self.data = torch.randint(0, 2, (size, 2)).float()
                    self.label = (self.data.sum(dim=1) == 1).long()

                def __getitem__(self, idx):
                    \"\"\"The idx-th point and its label.\"\"\"
                    data_point = self.data[idx]
                    data_label = self.label[idx]
                    return data_point, data_label

            train_data_loader = data.DataLoader(XORDataset(size=1000), batch_size=128, shuffle=True)
            """
        ),
        Valid(  # an index loader: shuffling a range of indices costs nothing
            """
            from torch.utils.data import DataLoader
            index_loader = DataLoader(range(len(X_train)), batch_size=128, shuffle=True)
            """
        ),
        Valid(  # unknowable values mean silence
            """
            import torch
            def main(args, kwargs):
                a = torch.utils.data.DataLoader(ds, num_workers=args.workers)
                b = torch.utils.data.DataLoader(ds, **kwargs)
            """
        ),
        Valid(  # pytorch/examples' mnist: num_workers only set when CUDA is there
            """
            import torch
            train_kwargs = {"batch_size": 64}
            if use_cuda:
                cuda_kwargs = {"num_workers": 1, "pin_memory": True, "shuffle": True}
                train_kwargs.update(cuda_kwargs)
            loader = torch.utils.data.DataLoader(dataset1, **train_kwargs)
            """
        ),
        Valid(  # a low worker count with a comment that justifies it
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(
                h5_set,
                batch_size=64,
                num_workers=0,  # h5py file handles cannot be shared with forked processes
            )
            # one worker: more processes each load the whole index into memory
            other = DataLoader(index_set, batch_size=64, num_workers=1)
            """
        ),
        Valid(  # End-to-end-ASR: one comment above the loaders written one under the other gives the reason
            """
            from torch.utils.data import DataLoader
            # Dataloader (Text data stored in RAM, no need num_workers)
            tr_set = DataLoader(tr_set, batch_size=32, shuffle=True, num_workers=0)
            dv_set = DataLoader(dv_set, batch_size=32, shuffle=False, num_workers=0)
            """
        ),
        Valid(  # the dataset yields CUDA tensors: forked workers cannot use CUDA
            """
            import torch
            from torch.utils.data import DataLoader, Dataset

            class OnDevice(Dataset):
                def __init__(self, frames):
                    self.frames = frames

                def __len__(self):
                    return len(self.frames)

                def __getitem__(self, i):
                    return torch.as_tensor(self.frames[i]).cuda()

            def main():
                loader = DataLoader(OnDevice(frames), batch_size=16)

            if __name__ == "__main__":
                main()
            """
        ),
        Valid(  # a project's own DataLoader class
            """
            import torch
            from mylib.data import DataLoader
            loader = DataLoader(ds, batch_size=8)
            """
        ),
        Valid(
            """
            import torch
            class DataLoader:
                def __init__(self, ds, batch_size):
                    self.ds = ds
            loader = DataLoader(ds, batch_size=8)
            """
        ),
    ]
    INVALID = [
        Invalid(  # meshgpt: the trainer's own `tokenize()` runs the mesh autoencoder; its samples are no text tokenized ahead
            """
            import torch
            from torch.utils.data import DataLoader

            class MeshTransformerTrainer:
                def __init__(self, model, autoencoder, dataset, batch_size):
                    self.model = model.cuda()
                    self.autoencoder = autoencoder.cuda()
                    self.dataloader = DataLoader(dataset, batch_size=batch_size, shuffle=True, pin_memory=True)
                    self.optimizer = torch.optim.Adam(model.parameters(), fused=True)

                @property
                def ema_tokenizer(self):
                    return self.autoencoder

                def tokenize(self, *args, **kwargs):
                    return self.ema_tokenizer.tokenize(*args, **kwargs)

                def train(self):
                    for epoch in range(10):
                        for vertices, faces in self.dataloader:
                            codes = self.tokenize(vertices.cuda(non_blocking=True), faces.cuda(non_blocking=True))
                            loss = self.model(codes).mean()
                            loss.backward()
                            self.optimizer.step()
            """
        ),
        Invalid(  # a library's DataLoader subclass takes the same arguments (PyTorch Geometric's, MONAI's)
            """
            import torch
            from torch_geometric.loader import DataLoader

            if __name__ == "__main__":
                loader = DataLoader(dataset, batch_size=64, shuffle=True)
                model = GIN().cuda()
                for data in loader:
                    model(data.to("cuda")).sum().backward()
                    opt.step()
            """,
            fixed="""
            import torch
            from torch_geometric.loader import DataLoader
            import os

            if __name__ == "__main__":
                loader = DataLoader(
                    dataset,
                    batch_size=64,
                    shuffle=True,
                    num_workers=min(8, os.cpu_count() or 1),
                )
                model = GIN().cuda()
                for data in loader:
                    model(data.to("cuda")).sum().backward()
                    opt.step()
            """,
        ),
        Invalid(  # one process per GPU: the node's cores are shared, the worker count is per process
            """
            import torch
            import torch.distributed as dist
            from torch.utils.data import DataLoader, DistributedSampler

            def main():
                dist.init_process_group("nccl")
                loader = DataLoader(train_set, batch_size=32, sampler=DistributedSampler(train_set))
                for epoch in range(10):
                    for x, y in loader:
                        step(x, y)

            if __name__ == "__main__":
                main()
            """,
            fixed="""
            import torch
            import torch.distributed as dist
            from torch.utils.data import DataLoader, DistributedSampler
            import os

            def main():
                dist.init_process_group("nccl")
                loader = DataLoader(
                    train_set,
                    batch_size=32,
                    sampler=DistributedSampler(train_set),
                    num_workers=min(8, (os.cpu_count() or 1) // max(1, torch.cuda.device_count())),
                    persistent_workers=True,
                )
                for epoch in range(10):
                    for x, y in loader:
                        step(x, y)

            if __name__ == "__main__":
                main()
            """,
        ),
        Invalid(  # a constructor default that no call in the file overrides
            """
            import torch
            from torch.utils.data import DataLoader

            class Trainer:
                def __init__(self, model, dataset, batch_size: int = 32, num_workers: int = 0):
                    self.model = model.cuda()
                    self.loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers)

            trainer = Trainer(Net(), train_set, batch_size=64)
            """,
        ),
        Invalid(  # a loader factory that every call of the file gives `--workers`, default 0
            """
            import argparse
            import torch
            from torch.utils.data import DataLoader

            def make_loader(dataset, batch_size, workers):
                return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)

            parser = argparse.ArgumentParser()
            parser.add_argument("--workers", type=int, default=0)
            args = parser.parse_args()
            train_loader = make_loader(train_set, 64, args.workers)
            val_loader = make_loader(val_set, 64, workers=args.workers)
            model = Net().cuda()
            """,
        ),
        Invalid(  # a data module keeps its constructor's default and reads it back in its loader hook
            """
            import lightning as L
            from torch.utils.data import DataLoader

            class ImageFolderData(L.LightningDataModule):
                def __init__(self, root: str, batch_size: int = 256, workers: int = 0):
                    super().__init__()
                    self.root = root
                    self.batch_size = batch_size
                    self.workers = workers

                def train_dataloader(self):
                    return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.workers)
            """,
        ),
        Invalid(  # a collate function defined inside another: reported, no fix (it cannot be pickled)
            """
            from torch.utils.data import DataLoader

            def get_loader(ds, pad_id):
                def collate_fn(batch):
                    return pad(batch, pad_id)
                return DataLoader(ds, batch_size=32, collate_fn=collate_fn)
            """
        ),
        Invalid(  # raw text tokenized batch by batch in the collate function (word2vec): no fix (a lambda)
            """
            from functools import partial
            import torch
            from torch.utils.data import DataLoader

            def collate(batch, text_pipeline):
                return torch.nn.utils.rnn.pad_sequence([torch.tensor(text_pipeline(text)) for text in batch])

            tokenizer = get_tokenizer("basic_english")
            text_pipeline = lambda x: vocab(tokenizer(x))
            loader = DataLoader(corpus, batch_size=96, collate_fn=partial(collate, text_pipeline=text_pipeline))
            model = CBOW().cuda()
            for batch in loader:
                model(batch.cuda()).sum().backward()
                optimizer.step()
            """
        ),
        Invalid(  # a lambda in the transforms: reported, no fix (spawned workers cannot unpickle it)
            """
            from torch.utils.data import DataLoader
            from torchvision import datasets, transforms
            transform = transforms.Compose([transforms.ToTensor(), transforms.Lambda(lambda x: x.mul(255))])
            loader = DataLoader(datasets.ImageFolder("data", transform), batch_size=4)
            """
        ),
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader

            def main():
                loader = DataLoader(train_set, batch_size=64, shuffle=True)
                for epoch in range(10):
                    for x, y in loader:
                        train_step(x, y)

            if __name__ == "__main__":
                main()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            import os

            def main():
                loader = DataLoader(
                    train_set,
                    batch_size=64,
                    shuffle=True,
                    num_workers=min(8, os.cpu_count() or 1),
                    persistent_workers=True,
                )
                for epoch in range(10):
                    for x, y in loader:
                        train_step(x, y)

            if __name__ == "__main__":
                main()
            """,
        ),
        Invalid(  # alias forms, an explicit 0, a multi-line call, an existing `import os as _os`;
            # a test loader iterated once gets no persistent workers
            """
            import os as _os
            import torch.utils.data as tud

            def main():
                test_loader = tud.DataLoader(
                    test_set,
                    batch_size=64,
                    num_workers=0,
                )
                evaluate(model, test_loader)

            if __name__ == "__main__":
                main()
            """,
            fixed="""
            import os as _os
            import torch.utils.data as tud

            def main():
                test_loader = tud.DataLoader(
                    test_set,
                    batch_size=64,
                    num_workers=min(8, _os.cpu_count() or 1),
                )
                evaluate(model, test_loader)

            if __name__ == "__main__":
                main()
            """,
        ),
        Invalid(  # **kwargs from a dict literal is resolved
            """
            from torch.utils import data

            def main():
                kwargs = {"batch_size": 32, "num_workers": 0}
                loader = data.DataLoader(train_set, **kwargs)
                return loader

            if __name__ == "__main__":
                main()
            """,
        ),
        Invalid(  # open-unmix: the keywords a CUDA run passes, `{...} if use_cuda else {}`, give 0 workers
            """
            import torch
            from torch.utils import data

            def main():
                parser = argparse.ArgumentParser()
                parser.add_argument("--nb-workers", type=int, default=0)
                parser.add_argument("--no-cuda", action="store_true")
                args = parser.parse_args()
                use_cuda = not args.no_cuda and torch.cuda.is_available()
                kwargs = {"num_workers": args.nb_workers, "pin_memory": True} if use_cuda else {}
                return data.DataLoader(train_set, batch_size=16, **kwargs)

            if __name__ == "__main__":
                main()
            """,
        ),
        Invalid(  # module level, no __main__ guard: spawn workers would re-run the script
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=64)
            for x, y in loader:
                pass
            """,
        ),
        Invalid(  # IterableDataset: each worker would yield the whole stream
            """
            import torch
            from torch.utils.data import DataLoader, IterableDataset

            class Stream(IterableDataset):
                def __iter__(self):
                    yield from range(10)

            def main():
                loader = DataLoader(Stream(), batch_size=4)
                return sum(len(batch) for batch in loader)

            if __name__ == "__main__":
                main()
            """,
        ),
        Invalid(  # the old call, commented out above the new one, is no reason (`workers` in it is code)
            """
            from torch.utils.data import DataLoader
            from torchvision.datasets import MNIST
            import torchvision.transforms as T

            def main():
                mnist = MNIST("data", train=True, transform=T.ToTensor(), download=True)
                # sampler = DistributedSampler(mnist)
                # loader = DataLoader(mnist, batch_size=100,
                #                     num_workers=0, sampler=sampler)
                loader = DataLoader(mnist, batch_size=100, num_workers=0, pin_memory=True)
                for epoch in range(5):
                    for images, labels in loader:
                        train_step(images.cuda(), labels.cuda())

            if __name__ == "__main__":
                main()
            """,
            fixed="""
            from torch.utils.data import DataLoader
            from torchvision.datasets import MNIST
            import torchvision.transforms as T
            import os

            def main():
                mnist = MNIST("data", train=True, transform=T.ToTensor(), download=True)
                # sampler = DistributedSampler(mnist)
                # loader = DataLoader(mnist, batch_size=100,
                #                     num_workers=0, sampler=sampler)
                loader = DataLoader(
                    mnist,
                    batch_size=100,
                    num_workers=min(8, os.cpu_count() or 1),
                    pin_memory=True,
                    persistent_workers=True,
                )
                for epoch in range(5):
                    for images, labels in loader:
                        train_step(images.cuda(), labels.cuda())

            if __name__ == "__main__":
                main()
            """,
        ),
        Invalid(  # a TODO is no reason: still reported
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(
                train_set,
                batch_size=64,
                num_workers=0,  # TODO: try more workers
            )
            """,
        ),
        Valid(  # an explicit worker or two for the validation pass every N steps (HiFi-GAN): a choice
            """
            import torch
            from torch.utils.data import DataLoader

            def main(model, opt, train_set, valid_set, interval=1000):
                train_loader = DataLoader(train_set, batch_size=16, num_workers=4, pin_memory=True)
                validation_loader = DataLoader(valid_set, batch_size=1, num_workers=1)
                steps = 0
                for epoch in range(100):
                    for x, y in train_loader:
                        loss = torch.nn.functional.l1_loss(model(x.cuda()), y.cuda())
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
                        steps += 1
                        if steps % interval == 0:
                            model.eval()
                            with torch.no_grad():
                                for vx, vy in validation_loader:
                                    model(vx.cuda())
                            model.train()
            """
        ),
        Invalid(  # a small explicit number is reported at lower severity, without a fix
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=64, num_workers=1)
            """,
        ),
    ]

    def impact_here(self, finding: Finding) -> Estimate | None:
        evaluation = evaluation_loader(self.ctx, finding)
        if evaluation is not None:
            return evaluation
        site = next((site for site in dataloader_calls(self.ctx) if site.node is finding.node), None)
        held = held_items_class(self.ctx, dataset_argument(site), site.stack) if site is not None else None
        if held is not None:
            return Estimate(Impact.LOW, f"`{held}` only crops and reshapes arrays it holds in memory: a worker saves little")
        samples = training_samples(self.ctx)
        if samples is not None and samples[0] is Samples.IMAGES:
            return Estimate(Impact.HIGH, samples[1])  # even 2 workers fall behind a GPU
        if samples is not None:
            return Estimate(Impact.MEDIUM, f"{samples[1]}, tokenized item by item: cheap next to a transformer step")
        if finding.severity is Severity.INFO:  # an explicit count of 1 or 2 workers
            return Estimate(Impact.MEDIUM, "an explicit worker count")
        return None

    def finish(self) -> None:
        for site in dataloader_calls(self.ctx):
            self._check(site)

    def _check(self, site: CallSite) -> None:
        ctx = self.ctx
        dataset = dataset_argument(site)
        if is_in_memory_dataset(ctx, dataset, site.stack) or samples_place(ctx, site) is Place.DEVICE:
            return  # nothing for workers to do; with CUDA samples, forked workers would fail
        if reads_replay_buffer(ctx, dataset, site.stack):
            return  # workers would sample from stale copies of the buffer
        if tokenized_ahead(ctx) is not None:
            return  # token ids tokenized ahead: a worker would only index and pad them
        if evaluation_only(ctx, site) or inference_feed(ctx, site):
            return  # one evaluation pass after training; a script that never trains
        if not_for_training(ctx, site):
            return  # a loader made and never used, used for a look at one batch, or for one pass (statistics)
        if trains_on_cpu_only(ctx):
            return  # no GPU waits for the batches
        workers = find_argument(ctx, site, "num_workers", 5)
        if workers.unknown or _justified(ctx, site, workers.arg):
            return
        late = late_value(ctx, site, "num_workers")
        if late is not None and literal_int(ctx, late.value, late.stack) != 0:
            return  # `loader.num_workers = 16` afterwards: SF105 says where the value belongs
        if workers.missing and workers.passed:  # `**kwargs` some callers fill with `num_workers=` and others do not
            self.report(site.node, "`DataLoader` loads every batch in the main process where its callers leave "
                        "`num_workers` out of the `**kwargs` they pass",
                        no_fix_reason="the callers that pass `num_workers` would get it twice: pass it in the others")
            return
        if workers.missing:
            self._report_with_fix(site, "`DataLoader` loads every batch in the main process (`num_workers` is not set)")
            return
        count = int_in_every_run(ctx, workers.node, site.stack)  # a launch command passing `--workers 8` wins
        if count is None:  # `num_workers=training_args.dataloader_num_workers`, filled by an HfArgumentParser
            field = run_field_value(ctx, workers.node) if workers.node is not None else UNKNOWN
            count = field if isinstance(field, int) and not isinstance(field, bool) else None
        if count is None:
            return
        if count == 0:
            if workers.arg is not None and isinstance(workers.node, cst.Integer):
                self._report_with_fix(site, "`DataLoader` loads every batch in the main process (`num_workers=0`)")
            else:
                self.report(
                    site.node,
                    "`DataLoader` loads every batch in the main process (`num_workers` resolves to 0)",
                    no_fix_reason="the value is set outside the call (a constant, a parameter's default, **kwargs or an argparse default)",
                )
        elif count <= 2 and loader_role(ctx, site) is not Role.EVALUATION:  # chosen for a validation pass: left alone
            self.report(
                site.node,
                f"`DataLoader` uses only {count} worker process{'es' if count > 1 else ''}",
                severity=Severity.INFO,
                no_fix_reason="an explicit worker count is a deliberate choice; raise it if data loading is the bottleneck",
            )

    def _report_with_fix(self, site: CallSite, message: str) -> None:
        reason = self._refusal(site)
        if reason:
            self.report(site.node, message, no_fix_reason=reason)
            return
        ops: list[FixOp] = []
        cpu_count = reference(self.ctx, "os.cpu_count", ops, site.stack)
        if one_process_per_gpu(self.ctx):  # every process of the node starts its own workers
            device_count = reference(self.ctx, "torch.cuda.device_count", ops, site.stack)
            value = cst.parse_expression(f"min(8, ({cpu_count}() or 1) // max(1, {device_count}()))")
        else:
            value = cst.parse_expression(f"min(8, {cpu_count}() or 1)")
        loader = assigned_name(site)
        # Persistent workers only pay off for a loader iterated again (every epoch): a test
        # loader used once would just keep its workers alive.
        add_persistent = bool(
            find_argument(self.ctx, site, "persistent_workers").missing
            and loader is not None
            and iterated_per_epoch(self.ctx, loader)
        )
        original = find_argument(self.ctx, site, "num_workers", 5).arg
        indent = self.ctx.module.default_indent

        def rewrite(call: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(call, cst.Call)
            existing = find_arg(call, original) if original is not None else None
            if existing is not None:
                call = replace_arg_value(call, existing, value)
                extra = []
            else:
                extra = [keyword_arg("num_workers", value)]
            if add_persistent:
                extra.append(keyword_arg("persistent_workers", cst.Name("True")))
            return append_args(call, *extra, indent=indent) if extra else call

        ops.insert(0, Transform(site.node, rewrite))
        title = self.fix_title if add_persistent else "Load batches in worker processes (`num_workers` from the CPU count)"
        self.report(site.node, message, fix_ops=ops, fix_title=title)

    def _refusal(self, site: CallSite) -> str | None:
        ctx = self.ctx
        started = worker_start_refusal(ctx, site.stack)
        if started:
            return started
        if ctx.nearest_loop(site.stack) is not None or ctx.in_training_loop(site.stack):
            return "the loader is created again and again: each one would start its worker processes anew"
        if is_iterable_dataset(ctx, dataset_argument(site), site.stack):
            return "the dataset is an IterableDataset: without get_worker_info() sharding each worker repeats it"
        for keyword in ("collate_fn", "worker_init_fn"):
            value = find_argument(ctx, site, keyword)
            if isinstance(value.node, cst.Lambda):
                return f"`{keyword}` is a lambda, which worker processes cannot unpickle under spawn"
            if isinstance(value.node, cst.Name) and any(info.stack and any(
                    f.kind is FrameKind.FUNCTION for f in info.stack) for info in ctx.functions.get(value.node.value, ())):
                return f"`{keyword}` is a function defined inside another one, which worker processes cannot unpickle under spawn"
        if any((site.func or "").endswith("Lambda") and any(isinstance(a.value, cst.Lambda) for a in site.node.args)
               for site in ctx.calls):
            return "a `transforms.Lambda(lambda ...)` in the file cannot be pickled for worker processes under spawn"
        return None


# A comment above or after a DataLoader that explains its worker count.
_WORKER_REASON = re.compile(r"worker|process|fork|spawn|pickl|deadlock|hang|freez|main thread|single.?thread", re.IGNORECASE)
# Comments on the argument that give no reason (`# TODO: more workers`, `# noqa`).
_NOT_A_REASON = re.compile(r"^#\s*(todo|fixme|xxx|noqa|type:)|^#\s*$", re.IGNORECASE)


def _justified(ctx: FileContext, site: CallSite, workers: cst.Arg | None) -> bool:
    """`num_workers=0,  # h5py handles cannot be shared` or a comment on the statement that
    explains the choice: a deliberate worker count is left alone. Commented-out code (an old
    `# loader = DataLoader(..., num_workers=0)` above the new one) explains nothing."""
    if workers is not None and any(not _NOT_A_REASON.search(c) for c in prose(argument_comments(site.node, workers))):
        return True
    comments = prose(statement_comments(_first_of_run(ctx, site))) if site.statement is not None else []
    return any(_WORKER_REASON.search(comment) for comment in comments)


def _first_of_run(ctx: FileContext, site: CallSite) -> cst.BaseStatement:
    """The first of the loader statements written one under the other (no blank or comment line
    between them) that ends with ``site``'s: a comment above the first explains them all (End-to-
    end-ASR: `# Dataloader (Text data stored in RAM, no need num_workers)` above the train and
    dev loaders)."""
    statement = site.statement
    assert statement is not None
    block = enclosing_block(ctx, statement)
    if block is None:
        return statement
    loaders = {id(other.statement) for other in dataloader_calls(ctx)}
    index = next(i for i, child in enumerate(block) if child is statement)
    while index > 0 and not getattr(block[index], "leading_lines", ()) and id(block[index - 1]) in loaders:
        index -= 1
    return block[index]
