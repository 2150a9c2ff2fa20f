"""Qualified names of torch APIs that both the scan (by the names a script calls) and the
benchmark's run-time advice (by the types a run made) decide on. Plain data: no libcst, so the
benchmark can read it without loading the analysis."""

from __future__ import annotations

# A DataLoader over tensors already in memory: workers only add inter-process copies.
TENSOR_DATASET = ("torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset")

# torch.optim classes with a fused CUDA implementation (`fused=True`) worth advising: never SGD.
FUSABLE_OPTIMIZERS = (
    "torch.optim.Adam",
    "torch.optim.AdamW",
    "torch.optim.adam.Adam",
    "torch.optim.adamw.AdamW",
)

# What takes DDP's `find_unused_parameters`: the wrapper itself, and the frameworks' objects that
# hand it on (Accelerate's kwargs handler, Lightning's strategy).
DDP_SETTINGS = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "accelerate.DistributedDataParallelKwargs",
    "accelerate.utils.DistributedDataParallelKwargs",
    "accelerate.utils.dataclasses.DistributedDataParallelKwargs",
    "lightning.pytorch.strategies.DDPStrategy",
    "lightning.pytorch.strategies.ddp.DDPStrategy",
    "pytorch_lightning.strategies.DDPStrategy",
    "pytorch_lightning.strategies.ddp.DDPStrategy",
    "lightning.fabric.strategies.DDPStrategy",
)
