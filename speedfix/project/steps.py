"""What marks a training step, a batch source and a CUDA device, by name.

Shared by the per-file model (``speedfix.model.context``, on libcst trees) and the project facts
(``speedfix.project.facts``, on ``ast`` trees of the other files), so that a loop is a training
loop by the same test whichever file it is in. Everything here works on dotted names as written
(``opt.step``, ``metric_logger.log_every``), never on trees.
"""

from __future__ import annotations

import re

_OPTIMIZER_NAME = re.compile(r"(^|_)(optim|optimizer|optimiser|opt|scaler)(_|\d|$)", re.IGNORECASE)
_SCHEDULER_NAME = re.compile(r"sched|lr_", re.IGNORECASE)
# timm/Meta `NativeScaler`: `loss_scaler(loss, optimizer, clip_grad=..., parameters=...)` runs
# backward, unscale, clip and step in one call.
_LOSS_SCALER_NAME = re.compile(r"(^|_)scaler$", re.IGNORECASE)

# `enumerate(tqdm(loader))`, `iter(loader)`: the loader is the first argument; `list(enumerate(loader))`
# holds the same batches (for a progress bar that knows its length).
ITERABLE_WRAPPERS = frozenset({"enumerate", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "iter", "list"})
# `metric_logger.log_every(loader, print_freq, header)` (DeiT, MAE, torchvision references).
ITERABLE_WRAPPER_METHODS = frozenset({"log_every"})
# Helpers that return a GPU device when there is one (d2l's `try_gpu()`, `try_all_gpus()`).
CUDA_DEVICE_HELPERS = frozenset({"try_gpu", "try_all_gpus"})
# hydra's calls that build the object a config section names (`_target_:`).
INSTANTIATE = ("hydra.utils.instantiate", "hydra.utils.call", "hydra.instantiate")
# Calls that make a device the default for new tensors (`torch.cuda.FloatTensor`, "cuda").
CUDA_DEFAULT_CALLS = frozenset({"torch.set_default_tensor_type", "torch.set_default_device"})
# torch's DataLoader, and libraries' subclasses of it that take the same loader arguments
# (`num_workers`, `pin_memory`, `persistent_workers`): MONAI's, PyTorch Geometric's
DATALOADER = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader", "monai.data.DataLoader",
              "monai.data.dataloader.DataLoader", "torch_geometric.loader.DataLoader",
              "torch_geometric.loader.dataloader.DataLoader")
# DDP's switches of the gradient all-reduce: `model.no_sync()`, `model.require_backward_grad_sync = ...`.
SYNC_SWITCHES = frozenset({"no_sync", "require_backward_grad_sync"})
# Context managers and decorators that turn autograd off: code under them records no graph.
NO_GRAD_CALLS = frozenset(f"{module}.{name}" for module in ("torch", "torch.autograd", "torch.autograd.grad_mode")
                          for name in ("no_grad", "inference_mode"))
# Attributes that say CUDA: `torch.cuda`, `x.cuda()`, `torch.cuda.FloatTensor`, `torch.accelerator`,
# `d2l.try_gpu()`; and objects whose attributes do (Hugging Face Accelerate's
# `accelerator.device`, `accelerator.backward(loss)`).
CUDA_ATTRIBUTES = frozenset({"cuda", "accelerator"}) | CUDA_DEVICE_HELPERS
CUDA_OBJECTS = frozenset({"accelerator"})
# Settings that choose cuDNN's convolution algorithms (`torch.backends.cudnn.benchmark = True`) or switch it off,
# and the call that asks for deterministic ones.
CUDNN_CHOICES = ("cudnn.benchmark", "cudnn.deterministic", "cudnn.enabled")
DETERMINISTIC_ALGORITHMS = ("torch.use_deterministic_algorithms",)
# Calls that pad a batch's samples to its longest one: its shape changes from batch to batch.
PAD_TO_LONGEST = frozenset({"torch.nn.utils.rnn.pad_sequence"})
# Settings and calls that choose the fp32 matmul precision (TF32 or full fp32) for the process.
TF32_CHOICES = ("matmul.allow_tf32", "fp32_precision")
MATMUL_PRECISION_CALLS = frozenset({"torch.set_float32_matmul_precision"})
# Library helpers that seed and switch cuDNN to deterministic mode (benchmark off): MONAI's
# `set_determinism(seed=0)` (`seed=None` switches it back).
DETERMINISM_HELPERS = ("monai.utils.set_determinism", "monai.utils.misc.set_determinism")
# Convolution layers by qualified name -> their dimension (transposed ones included): a class
# that builds them is a conv net, in this file or, through the project facts, in another one.
CONV_LAYERS = {
    f"torch.nn.{prefix}{kind}{dims}d": dims
    for prefix in ("", "modules.conv.") for kind in ("Conv", "ConvTranspose") for dims in (1, 2, 3)
}

# Products of a sparse and a dense matrix (graph convolutions over a sparse adjacency matrix).
SPARSE_MATMULS = frozenset({"torch.spmm", "torch.sparse.mm", "torch.sparse.addmm", "torch.hspmm", "torch.smm"})

# cuDNN recurrent layers: autocast runs them in fp16 whatever dtype it is asked for.
CUDNN_RNN_LAYERS = frozenset(f"torch.nn.{prefix}{kind}" for prefix in ("", "modules.rnn.") for kind in ("LSTM", "GRU", "RNN"))

# What makes a network's matmuls more than a classifier head: attention, transformer and
# recurrent layers, and matmuls written out (with `@` as well).
MATMUL_LAYERS = frozenset(
    f"torch.nn.{kind}" for kind in ("MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerDecoder",
                                    "TransformerEncoderLayer", "TransformerDecoderLayer", "LSTM", "GRU", "RNN",
                                    "LSTMCell", "GRUCell", "RNNCell")
) | frozenset({"torch.matmul", "torch.bmm", "torch.einsum", "torch.mm", "torch.baddbmm",
               "torch.nn.functional.scaled_dot_product_attention"})

# What multiplies matrices outside cuDNN's convolutions (which use TF32 by default): layers,
# functions and tensor methods. A network without any of them gains nothing from TF32 matmuls.
_MATMUL_LAYERS = ("Linear", "LazyLinear", "Bilinear", "MultiheadAttention", "Transformer", "TransformerEncoder",
                  "TransformerDecoder", "TransformerEncoderLayer", "TransformerDecoderLayer", "LSTMCell", "GRUCell",
                  "RNNCell")
MATMUL_CALLS = frozenset(
    {f"torch.nn.{name}" for name in _MATMUL_LAYERS}
    | {f"torch.{name}" for name in ("matmul", "mm", "bmm", "einsum", "addmm", "baddbmm", "tensordot", "inner")}
    | {f"torch.nn.functional.{name}" for name in ("linear", "bilinear", "scaled_dot_product_attention",
                                                    "multi_head_attention_forward")}
    | {"einops.einsum"}
)
MATMUL_METHODS = frozenset({"matmul", "mm", "bmm", "addmm", "baddbmm"})
# Libraries whose calls build no layers: a network that calls them is still known layer by layer.
_NO_LAYER_LIBRARIES = frozenset({"torch", "math", "numpy", "functools", "itertools", "collections", "typing", "copy",
                                 "warnings", "logging", "operator", "random", "os", "sys", "einops"})


# Model-zoo architectures that are not convolutional (vision transformers, MLP mixers); the
# other classification architectures of torchvision and timm are CNNs.
NOT_CONV_NETS = (
    "vit", "swin", "maxvit", "deit", "beit", "eva", "cait", "xcit", "mixer", "gmlp", "resmlp", "pit_",
    "crossvit", "twins", "tnt_", "convit", "sequencer", "hiera", "flexivit", "samvit", "vitamin",
)


def zoo_cnn(qualified: str | None) -> bool:
    """`torchvision.models.resnet50` (the builder, by qualified name): a torchvision image CNN,
    2-D convolutions and a classifier head (not the video nets' 3-D ones, nor a ViT)."""
    if not qualified or not qualified.startswith("torchvision.models."):
        return False
    module, _, leaf = qualified.rpartition(".")
    if any(part in module for part in (".video", ".optical_flow", ".quantization")):
        return False
    return leaf[:1].islower() and not leaf.startswith(("get_", "list_")) and not leaf.lower().startswith(NOT_CONV_NETS)


# diffusers' 2-D convolutional networks (U-Nets with attention blocks, VAEs).
DIFFUSERS_CONV_NETS = frozenset({"UNet2DModel", "UNet2DConditionModel", "AutoencoderKL", "VQModel", "ControlNetModel"})


def diffusers_conv_net(qualified: str | None) -> str | None:
    """`diffusers.UNet2DConditionModel` (or its `.from_pretrained` / `.from_config`): the class's
    name when it is one of diffusers' conv nets, else None."""
    built = (qualified or "").removesuffix(".from_pretrained").removesuffix(".from_config")
    leaf = built.rpartition(".")[2]
    return leaf if built.startswith("diffusers.") and leaf in DIFFUSERS_CONV_NETS else None


def layer_kind(qualified: str | None) -> int | str | None:
    """What a call of ``qualified`` (as the imports resolve it) adds to a network: a ConvNd's N,
    "rnn" (cuDNN LSTM/GRU/RNN), "matmul" (Linear, attention, `torch.matmul`), "sparse" (a
    sparse matrix product, `torch.spmm`), "opaque" (a
    network of another library, `torchvision.models.vgg19()`: its layers are unknown here), or
    None (a layer or function that multiplies no matrices, or a name of the file itself)."""
    if not qualified:
        return None
    if qualified in CUDNN_RNN_LAYERS:
        return "rnn"
    if qualified in CONV_LAYERS:
        return CONV_LAYERS[qualified]
    if qualified in SPARSE_MATMULS:
        return "sparse"
    if qualified in MATMUL_CALLS:
        return "matmul"
    return None if qualified.split(".", 1)[0] in _NO_LAYER_LIBRARIES else "opaque"


def last_part(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def is_optimizer_name(name: str) -> bool:
    """`opt`, `optimizer`, `self.optim_g`, `scaler`: a receiver whose `.step()` is a training
    step (an LR scheduler's is not)."""
    last = last_part(name)
    return bool(_OPTIMIZER_NAME.search(last)) and not _SCHEDULER_NAME.search(last)


def is_loss_scaler_call(func: str | None, positional: list[str | None], keywords: set[str]) -> bool:
    """`loss_scaler(loss, optimizer, ...)`: a callable scaler that steps the optimizer.

    ``positional`` holds the dotted names of the positional arguments (None for other
    expressions); the second one, or an ``optimizer=`` keyword, must name an optimizer."""
    if func is None or not _LOSS_SCALER_NAME.search(last_part(func)) or not positional:
        return False
    if "optimizer" in keywords:
        return True
    return len(positional) >= 2 and positional[1] is not None and is_optimizer_name(positional[1])


def is_iterable_wrapper(func: str | None) -> bool:
    """A call whose first argument is what a `for` over it really iterates."""
    if func is None:
        return False
    return func in ITERABLE_WRAPPERS or last_part(func) in ITERABLE_WRAPPER_METHODS


LIGHTNING_MODULE = (
    "lightning.LightningModule",
    "lightning.pytorch.LightningModule",
    "lightning.pytorch.core.LightningModule",
    "pytorch_lightning.LightningModule",
)
LIGHTNING_DATAMODULE = (
    "lightning.LightningDataModule",
    "lightning.pytorch.LightningDataModule",
    "lightning.pytorch.core.LightningDataModule",
    "pytorch_lightning.LightningDataModule",
)
LIGHTNING_CALLBACK = ("lightning.pytorch.callbacks.Callback", "lightning.pytorch.Callback", "lightning.Callback",
                      "pytorch_lightning.callbacks.Callback", "pytorch_lightning.Callback",
                      "pytorch_lightning.callbacks.base.Callback")
# The hooks Lightning runs on every training batch besides `training_step`, in the LightningModule
# and in each `Callback` the Trainer is given (a gradient norm read in `on_after_backward` waits for
# the GPU on every step).
LIGHTNING_STEP_HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
                        "on_before_optimizer_step", "on_before_zero_grad")
# Calls that leave only LoRA adapters to train (the base model frozen): peft's, loralib's
# `mark_only_lora_as_trainable` (ChatGLM-finetune-LoRA's `get_lora_model` helper), and helpers known
# by their last name (DeepSpeed-Chat's `convert_linear_layer_to_lora`).
ADAPTER_MAKERS = frozenset({
    "peft.get_peft_model", "peft.LoraConfig", "peft.tuners.lora.LoraConfig", "peft.mapping.get_peft_model",
    "peft.PeftModel.from_pretrained", "loralib.mark_only_lora_as_trainable", "loralib.utils.mark_only_lora_as_trainable",
})
ADAPTER_HELPERS = ("convert_linear_layer_to_lora",)


def makes_adapters(qualified: str | None, written: str | None) -> bool:
    """Does a call of ``qualified`` (resolved through the imports; ``written``: as written)
    leave only LoRA adapters to train?"""
    return qualified in ADAPTER_MAKERS or (written or "").rsplit(".", 1)[-1] in ADAPTER_HELPERS


# Hugging Face trainers: a subclass's `compute_loss` / `training_step` runs on every training step.
LIGHTNING_TRAINER = (
    "lightning.Trainer",
    "lightning.pytorch.Trainer",
    "lightning.pytorch.trainer.Trainer",
    "lightning.pytorch.trainer.trainer.Trainer",
    "pytorch_lightning.Trainer",
    "pytorch_lightning.trainer.Trainer",
    "pytorch_lightning.trainer.trainer.Trainer",
)
LIGHTNING_CLI = (
    "lightning.pytorch.cli.LightningCLI",
    "pytorch_lightning.cli.LightningCLI",
    "pytorch_lightning.utilities.cli.LightningCLI",
)
HF_TRAINERS = (
    "transformers.Trainer", "transformers.trainer.Trainer", "transformers.Seq2SeqTrainer",
    "transformers.trainer_seq2seq.Seq2SeqTrainer", "trl.SFTTrainer", "trl.DPOTrainer", "trl.RewardTrainer",
    "trl.trainer.SFTTrainer", "trl.trainer.DPOTrainer", "trl.trainer.sft_trainer.SFTTrainer",
    "trl.trainer.dpo_trainer.DPOTrainer",
)
HF_STEP_METHODS = ("compute_loss", "training_step")


# What `torch.nn.Module` itself defines: calling one of these runs none of the model's own code.
MODULE_API = frozenset({
    "add_module", "apply", "bfloat16", "buffers", "children", "compile", "cpu", "cuda", "double", "eval", "extra_repr",
    "float", "get_buffer", "get_parameter", "get_submodule", "half", "load_state_dict", "modules", "named_buffers",
    "named_children", "named_modules", "named_parameters", "parameters", "register_buffer", "register_forward_hook",
    "register_forward_pre_hook", "register_full_backward_hook", "register_module", "register_parameter",
    "requires_grad_", "share_memory", "state_dict", "to", "to_empty", "train", "type", "zero_grad",
})
