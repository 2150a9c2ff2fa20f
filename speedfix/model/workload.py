"""What the training works on when the file does not show it: the kind of network, the kind of samples.

A model built elsewhere (`network.modeling.__dict__[opts.model](...)`, `self.model_class.from_pretrained(...)`,
`GeneratorResNet(...)` after `from models import *`) has layers the scan cannot count, and a
dataset made by a function of another module has a `__getitem__` it cannot read. The file still
gives the kind away:

- the network: the names that build it (an architecture name an option defaults to,
  `deeplabv3plus_mobilenet`; the class, `ViT`, `UNet_conditional`), a Hugging Face checkpoint
  (`from_pretrained` in a file that imports `transformers`), and the task (a step that feeds
  `input_ids` trains a sequence model over token ids); failing those, the default of an option
  that names the architecture (`--arch resnet18`, `--classifier resnet18`), even when the scan
  cannot follow it to the network (a LightningModule of another file that picks its network by
  that name);
- the samples: image files the file decodes (`Image.open`, an `ImageFolder`) or random image
  augmentations it composes (`RandomResizedCrop`, a random scale) mean each sample is decoded
  and transformed on the CPU; a step that feeds `input_ids`, a tokenizer, or a call given one
  (`DataCollator(tokenizer)`), means small batches of token ids, tokenized ahead unless a
  Dataset of the file tokenizes in its `__getitem__`.

These are estimates for a finding's impact (and for leaving pre-tokenized text loaders alone), not
facts a fix relies on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from enum import Enum

import libcst as cst

from speedfix.model.arguments import (find_argument, holds_parsed_options, literal_int, option_defaults, option_read,
                                      string_value)
from speedfix.model.context import FileContext
from speedfix.model.frames import Stack, nearest_loop
from speedfix.model.index import CallSite
from speedfix.model.launch import launches
from speedfix.model.loader_classes import dataloader_calls
from speedfix.model.networks import (network_assignments, peel, project_builds_rnn, project_conv_dims, step_networks,
                                     zoo_architecture)
from speedfix.model.patterns import dataset_argument, unwrap_iterable
from speedfix.model.project_classes import project_class
from speedfix.model.scale import conv_nets_only, matmul_nets, per_file
from speedfix.model.versions import required
from speedfix.project.steps import CONV_LAYERS
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import walk_expression


class Family(Enum):
    CONV = "conv"  # convolutions do the work: cuDNN already runs them in TF32
    MATMUL = "matmul"  # matmuls do the work: transformers, recurrent nets, MLPs


class Samples(Enum):
    IMAGES = "images"  # decoded and randomly augmented on the CPU, one by one
    TOKENS = "tokens"  # token ids: small integer tensors, usually tokenized ahead


# Layers cuDNN runs (switching it off sends them to PyTorch's own kernels).
_CUDNN_LAYERS = frozenset({*CONV_LAYERS, "torch.nn.LSTM", "torch.nn.GRU", "torch.nn.RNN", "torch.nn.BatchNorm1d",
                           "torch.nn.BatchNorm2d", "torch.nn.BatchNorm3d", "torch.nn.SyncBatchNorm"})
_RECURRENT_WORDS = ("lstm", "gru", "rnn")

# Architecture families, matched at the start of a word of a model's name (`deeplabv3plus_mobilenet`,
# `GeneratorResNet`, `UNet_conditional`, `ViT`, `bert-base-uncased`).
_CONV_WORDS = (
    "resnet", "resnext", "wide_resnet", "wideresnet", "mobilenet", "deeplab", "unet", "vgg", "efficientnet",
    "densenet", "inception", "googlenet", "squeezenet", "shufflenet", "regnet", "convnext", "hrnet", "fcn",
    "pspnet", "segnet", "alexnet", "darknet", "yolo", "lenet", "srcnn", "espcn", "edsr", "srgan", "dcgan",
    "mnasnet", "ghostnet", "xception", "cnn", "rcnn", "fasterrcnn", "maskrcnn", "retinanet",
)
_MATMUL_WORDS = (
    "bert", "roberta", "distilbert", "albert", "electra", "deberta", "xlnet", "gpt", "llama", "mistral", "qwen",
    "gemma", "bart", "t5", "transformer", "vit", "deit", "swin", "beit", "linformer", "perceiver", "whisper",
    "wav2vec", "clip", "lstm", "gru", "rnn", "mlp", "mixer", "attention",
)
# Graph networks (`GraphCNN`, `GCNII`): their "convolutions" are sparse and small dense matmuls,
# neither cuDNN's nor a transformer's; the name says no family, whatever else it holds.
_GRAPH_WORDS = ("graph", "gcn", "gnn")
_WORD = re.compile("|".join(sorted(_CONV_WORDS + _MATMUL_WORDS + _GRAPH_WORDS, key=len, reverse=True)))

# Options that name the architecture: `--model deeplabv3plus_mobilenet`, `--arch resnet50`,
# `--classifier resnet18`.
_ARCH_OPTIONS = frozenset({"model", "arch", "architecture", "backbone", "network", "net", "model_name", "model_type",
                           "classifier"})
# Keys a step feeds a sequence model over token ids.
_TOKEN_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids"})
# A batch's images by name (Hugging Face image datasets, diffusion and vision-language scripts).
_IMAGE_KEYS = frozenset({"pixel_values", "image", "images", "img", "imgs", "jpg", "png"})
# Random image augmentations (torchvision's and the many look-alikes): `RandomResizedCrop`,
# `ExtRandomScale`, `RandomHorizontalFlip`, `ColorJitter`, albumentations' `ShiftScaleRotate` (not a
# `RandomSampler`).
_AUGMENTATION = re.compile(
    r"Random(?:Resized|Sized)?(?:Crop|Scale|Flip|HorizontalFlip|VerticalFlip|Rotat|Affine|Erasing|Perspective|Grayscale"
    r"|Resize|Rescale|Brightness|Contrast|Gamma|Blur)|ColorJitter|RandAugment|AutoAugment|TrivialAugment|ShiftScaleRotate"
)

# Calls that read and decode an image file (a folder of JPEGs read through PIL counts too).
_IMAGE_READERS = frozenset({
    "PIL.Image.open", "cv2.imread", "imageio.imread", "imageio.v2.imread", "imageio.v3.imread", "skimage.io.imread",
    "torchvision.io.read_image", "torchvision.io.decode_image", "torchvision.io.decode_jpeg",
    "torchvision.datasets.ImageFolder", "torchvision.datasets.folder.ImageFolder",
})

# Calls, as a Dataset's `__getitem__` writes them, that read and decode a media file for each
# sample: an image, a video's frames, an audio clip (`Image.open`, `decord.VideoReader`,
# `torchaudio.load`). Such samples are no token ids tokenized ahead, whatever else the file loads.
_DECODES = re.compile(
    r"(?:^|\.)(?:Image\.open|imread|read_image|decode_image|decode_jpeg|VideoReader|read_video|VideoCapture"
    r"|VideoFileClip|torchaudio\.load|librosa\.load|soundfile\.read|wavfile\.read|load_audio|load_wav)$"
)

_DECODES_IMAGE = re.compile(r"(?:^|\.)(?:Image\.open|imread|read_image|decode_image|decode_jpeg)$")

# torchvision's data sets of small images held in memory as one array.
_SMALL_IMAGE_SETS = frozenset({"MNIST", "FashionMNIST", "KMNIST", "EMNIST", "QMNIST", "CIFAR10", "CIFAR100", "SVHN"})


def name_family(name: str) -> Family | None:
    """The family an architecture name or class names, when its words say it (and agree)."""
    found: set[Family] = set()
    lower = name.lower()
    for match in _WORD.finditer(lower):
        start = match.start()
        if start and lower[start - 1].isalpha() and not name[start].isupper():
            continue  # inside a word: `activation` is no ViT
        if match.group() in _GRAPH_WORDS:
            return None  # a graph "convolution" is no cuDNN convolution: `GraphCNN` is no CNN
        found.add(Family.CONV if match.group() in _CONV_WORDS else Family.MATMUL)
    return found.pop() if len(found) == 1 else None


@per_file
def trained_family(ctx: FileContext) -> tuple[Family, str | None] | None:
    """(family, what says so) of the networks the script trains. Their layers decide when the
    scan sees them (this file's classes or another scanned file's, a model zoo, the Hugging Face
    Hub: the evidence is then None); else their names, the task or the options do
    (``unseen_family``). None when nothing says, or the networks disagree. Every rule that
    weighs advice by the kind of network (TF32 for a conv net) asks this."""
    if conv_nets_only(ctx):
        return Family.CONV, None
    if matmul_nets(ctx):
        return Family.MATMUL, None
    return unseen_family(ctx)


# Graph learning libraries: their networks pass messages over batches of graphs whose node and
# edge counts change from batch to batch.
_GRAPH_LIBRARIES = ("torch_geometric", "dgl", "torch_scatter", "torch_cluster", "torch_sparse", "torchdrug")
_GRAPH_REQUIREMENT = re.compile(r"(?<![\w.-])(?:torch[-_]geometric|pyg|dgl|torch[-_]scatter|torch[-_]cluster|"
                                r"torch[-_]sparse|torchdrug)(?![\w.-])", re.IGNORECASE)


@per_file
def graph_library(ctx: FileContext) -> str | None:
    """The graph learning library the training runs on: one the file imports (GRACE's
    `torch_geometric.nn.GCNConv`), else one the project's requirement files name (QCNet's
    LightningModule, whose layers import `torch_geometric` and `torch_cluster` in other files).
    None when neither says."""
    for qualified in ctx.imports.bindings.values():
        if qualified.split(".", 1)[0] in _GRAPH_LIBRARIES:
            return qualified.split(".", 1)[0]
    return required(ctx.project, _GRAPH_REQUIREMENT) if ctx.project is not None else None


def runs_cudnn_layers(ctx: FileContext) -> bool | None:
    """Does the training run layers cuDNN implements: convolutions, recurrent layers, batch norm?
    True when the file (or a class of another scanned file it builds) has one, or its networks are
    conv nets; False when they are known to be matmul networks without them (a transformer, an
    MLP: their matmuls run on cuBLAS); None when the scan cannot tell."""
    for site in ctx.calls:
        if ctx.call_qualname(site) in _CUDNN_LAYERS or project_conv_dims(ctx, site.node) \
                or project_builds_rnn(ctx, site.node):
            return True
    family = trained_family(ctx)
    if family is None:
        return None
    return family[0] is Family.CONV or any(word in (family[1] or "").lower() for word in _RECURRENT_WORDS)


@per_file
def unseen_family(ctx: FileContext) -> tuple[Family, str] | None:
    """(family, what says so) for the networks the training runs, from their names, a
    checkpoint of the Hugging Face Hub, or a step over token ids; in a file without a training
    step of its own, the models it loads with a `transformers` class; failing all, the options
    that name the architecture. None when the evidence is missing or disagrees."""
    families: dict[Family, str] = {}
    networks = step_networks(ctx)
    for name, stack in networks.items():
        for assignment in network_assignments(ctx, name, stack):
            call = peel(ctx, assignment.value)
            if isinstance(call, cst.Call):
                for family, said in _call_evidence(ctx, call, assignment.stack):
                    families.setdefault(family, said)
    if feeds_token_ids(ctx):
        families.setdefault(Family.MATMUL, "a sequence model over token ids (`input_ids`)")
    if not networks:  # a framework's trainer runs them (`Trainer(model=model)`): the models the file loads say
        families = _loaded_models(ctx)
    if not families:  # the network is built where the scan cannot follow: the options still name it
        families = _option_evidence(ctx)
    if len(families) != 1:
        return None
    return next(iter(families.items()))


def _loaded_models(ctx: FileContext) -> dict[Family, str]:
    """The families of the models the file loads from the Hugging Face Hub with a model class of
    `transformers` (`AutoModelForSequenceClassification.from_pretrained(checkpoint)`; not a
    tokenizer or a config): a transformer, unless the checkpoint's name says a conv net
    (`microsoft/resnet-50`)."""
    found: dict[Family, str] = {}
    for site in ctx.calls:
        qualified = ctx.call_qualname(site) or ""
        if not (qualified.startswith("transformers.") and qualified.endswith(".from_pretrained")):
            continue
        leaf = qualified.split(".")[-2]
        if "Model" not in leaf:
            continue
        first = site.node.args[0].value if site.node.args and site.node.args[0].keyword is None else None
        checkpoint = string_value(ctx, first, site.stack) if first is not None else None
        named = name_family(checkpoint) if checkpoint else None
        if named is Family.CONV:
            found.setdefault(Family.CONV, f"`{checkpoint}`")
        else:
            found.setdefault(Family.MATMUL, f"`{leaf}` of the Hugging Face Hub")
    return found


def _option_evidence(ctx: FileContext) -> dict[Family, str]:
    """The families the defaults of the options that name the architecture say
    (`parser.add_argument("--arch", default="resnet18")`)."""
    found: dict[Family, str] = {}
    for dest, default in option_defaults(ctx).items():
        if dest in _ARCH_OPTIONS and isinstance(default, cst.SimpleString):
            name = str(default.evaluated_value)
            family = name_family(name)
            if family is not None:
                found.setdefault(family, f"`--{dest}` defaults to `{name}`")
    return found


def _imports_transformers(ctx: FileContext) -> bool:
    return any(target == "transformers" or target.startswith("transformers.") for target in ctx.imports.bindings.values())


def _call_evidence(ctx: FileContext, call: cst.Call, stack: Stack) -> list[tuple[Family, str]]:
    """What the call that builds a network says of its family."""
    func = call.func
    if isinstance(func, cst.Subscript):  # `network.modeling.__dict__[opts.model](...)`
        index = func.slice[0].slice if len(func.slice) == 1 else None
        key = string_value(ctx, index.value, stack) if isinstance(index, cst.Index) else None
        family = name_family(key) if key else None
        return [(family, f"`{key}`")] if family is not None else []
    dotted = dotted_name(func) or ""
    found: list[tuple[Family, str]] = []
    if dotted.endswith(".from_pretrained"):
        if _imports_transformers(ctx):
            found.append((Family.MATMUL, "a transformer of the Hugging Face Hub"))
        return found
    leaf = dotted.rpartition(".")[2]
    family = name_family(leaf) if leaf else None
    return found + ([(family, f"`{leaf}`")] if family is not None else [])


def feeds_token_ids(ctx: FileContext) -> bool:
    """Does a training step feed token ids (`input_ids`, `attention_mask`) to the model?"""
    for loop in ctx.step_loops:
        for node in walk_expression(loop):
            if isinstance(node, cst.SimpleString) and node.evaluated_value in _TOKEN_KEYS:
                return True
            if isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value in _TOKEN_KEYS:
                return True
    return False


def _image_key(ctx: FileContext) -> str | None:
    """A training step's read of its batch's images by name (`batch["pixel_values"]`), as written."""
    for loop in ctx.step_loops:
        for node in walk_expression(loop):
            if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index) \
                    and isinstance(key := node.slice[0].slice.value, cst.SimpleString) and key.evaluated_value in _IMAGE_KEYS:
                return ctx.module.code_for_node(node)
    return None


@per_file
def training_samples(ctx: FileContext) -> tuple[Samples, str] | None:
    """(kind, what says so) for the samples the training loaders yield, when the file shows it:
    images when it decodes image files or composes random augmentations (not for MNIST or
    CIFAR, small images held in memory), or a training step reads them from its batches by
    name (a Hugging Face image dataset's `batch["pixel_values"]`, even beside a prompt's token
    ids); token ids when a step feeds `input_ids` or the file loads a tokenizer."""
    tokenizer = images = None
    for site in ctx.calls:
        dotted = dotted_name(site.node.func) or ""
        leaf = dotted.rpartition(".")[2]
        qualified = ctx.call_qualname(site) or ""
        if qualified.rpartition(".")[2] in _SMALL_IMAGE_SETS and qualified.startswith("torchvision.datasets."):
            return None  # 32 px images held in memory: augmenting them is cheap
        if images is None and _AUGMENTATION.search(leaf):
            images = f"images decoded and augmented one by one (`{leaf}`)"
        elif images is None and qualified in _IMAGE_READERS:
            images = f"images decoded one by one (`{dotted}`)"
        if tokenizer is None and "tokenizer" in dotted.lower() and not _own_method(ctx, dotted):
            tokenizer = dotted
        if tokenizer is None:  # `DataCollator(tokenizer)`, `PromptDataset(path, tokenizer, max_len)`
            given = next((arg for arg in site.node.args if "tokenizer" in (dotted_name(arg.value) or "").lower()), None)
            tokenizer = f"{dotted}({dotted_name(given.value)})" if given is not None and dotted else None
    if images is None:  # a Dataset whose `__getitem__` reads an image file (OpenAI-CLIP's `cv2.imread`)
        decoding = next((call for call in _item_calls(ctx) if _DECODES_IMAGE.search(call)), None)
        images = f"images decoded one by one in the dataset's `__getitem__` (`{decoding}`)" if decoding else None
    if images is None:  # a Hugging Face image dataset's batches: `batch["pixel_values"]`, `batch["image"]`
        key = _image_key(ctx)
        images = f"images that the training step reads from its batches (`{key}`)" if key else None
    if images is not None:
        return Samples.IMAGES, images
    if feeds_token_ids(ctx):
        return Samples.TOKENS, "small batches of token ids"
    if tokenizer is not None:
        return Samples.TOKENS, f"small batches of token ids (`{tokenizer}`)"
    return None


def _own_method(ctx: FileContext, dotted: str) -> bool:
    """`self.ema_tokenizer.tokenize(...)` where `ema_tokenizer` is a method or property of the
    file's classes: the project's own tokenizer (meshgpt's mesh autoencoder, whose codes are no
    text), not a text tokenizer's."""
    parts = dotted.split(".")
    return len(parts) > 1 and parts[0] == "self" and any(info.class_name for info in ctx.functions.get(parts[1], ()))


def tokenized_ahead(ctx: FileContext) -> str | None:
    """Why the training samples are token ids tokenized before training (the usual way: a
    `datasets.map`, a Dataset that tokenizes in `__init__`), so that a DataLoader only indexes
    and pads them; None when the file shows other samples, or a Dataset class of its own whose
    `__getitem__` calls a tokenizer on every item or decodes a media file (a text-to-video
    script loads a tokenizer for its prompts, and its samples are video frames)."""
    samples = training_samples(ctx)
    if samples is None or samples[0] is not Samples.TOKENS:
        return None
    if any("tokeniz" in call.lower() or _DECODES.search(call) for call in _item_calls(ctx)):
        return None  # each item is tokenized, or is an image, video or audio clip decoded from its file
    if any(_collate_tokenizes(ctx, site) for site in dataloader_calls(ctx)):
        return None  # raw text tokenized batch by batch in the collate function
    if any(_FEATURES.search(call) for call in ctx.calls_by_qualname) or any(
            _FEATURES.search(site.func or "") for site in ctx.calls if site.func and "." in site.func):
        return None  # spectrograms or pixels beside the tokens (`feature_extractor.pad(...)` in the collator)
    return samples[1]


def _collate_tokenizes(ctx: FileContext, site: CallSite) -> bool:
    """Is the loader's `collate_fn` handed a function that runs a tokenizer (word2vec's
    `partial(collate_cbow, text_pipeline=lambda x: vocab(tokenizer(x)))`), or a function of the
    file that runs one itself? A collator given the tokenizer object only pads (not counted)."""
    collate = find_argument(ctx, site, "collate_fn", 4).node
    if collate is None:
        return False
    given = [arg.value for arg in collate.args] if isinstance(collate, cst.Call) else [collate]
    for value in given:
        if isinstance(value, cst.Name):
            value = ctx.single_value(value.value, site.stack) or next(
                (info.node for info in ctx.functions.get(value.value, ()) if not info.stack), value)
        if isinstance(value, (cst.Lambda, cst.FunctionDef)) and any(
                isinstance(node, cst.Call) and "tokeniz" in (dotted_name(node.func) or "").lower()
                for node in walk_expression(value)):
            return True
    return False


# A feature extractor or image processor: audio features or pixels in the batches, not only token ids.
_FEATURES = re.compile(r"feature_?extractor|image_?processor", re.IGNORECASE)


def _item_calls(ctx: FileContext) -> list[str]:
    """The calls the `__getitem__` of the file's Dataset classes make, and of the Dataset class
    of another file of the project that a loader here is given."""
    item_calls = [dotted_name(node.func) or "" for function in ctx.functions.get("__getitem__", ())
                  for node in walk_expression(function.node) if isinstance(node, cst.Call)]
    return [*item_calls, *_dataset_item_calls(ctx)]


def _dataset_item_calls(ctx: FileContext) -> Iterator[str]:
    """The calls the `__getitem__` of a loader's dataset makes, when the dataset is an object of
    a class another file of the project defines (`PairedDataset(folder, tokenizer=...)`), and
    of the other classes of the project with a `__getitem__` that a file with DataLoaders builds
    (a LightningDataModule's `self.data_set = sets.RetinaImages(...)`, split with `random_split`
    into the datasets its loaders take)."""
    loaders = dataloader_calls(ctx)
    if ctx.project is None or not loaders:
        return
    built: list[str] = []
    for site in loaders:
        dataset = dataset_argument(site)
        if isinstance(dataset, cst.Name):
            dataset = ctx.single_value(dataset.value, site.stack)
        qualified = ctx.qualname(dataset.func) if isinstance(dataset, cst.Call) else None
        if qualified is not None and "." in qualified:
            built.append(qualified)
    for site in ctx.calls:
        qualified = ctx.call_qualname(site)
        if qualified is not None and "." in qualified and qualified.rpartition(".")[2][:1].isupper() \
                and not qualified.startswith(_LIBRARIES):
            built.append(qualified)
    for qualified in dict.fromkeys(built):
        defined = project_class(ctx.project, qualified)
        if defined is not None:
            yield from defined.item_calls


# Classes of these packages are not the project's own (no file of the project is read for them).
_LIBRARIES = ("torch.", "torchvision.", "torchaudio.", "transformers.", "datasets.", "numpy.", "lightning.",
              "pytorch_lightning.", "accelerate.", "deepspeed.", "PIL.", "sklearn.", "pandas.")


def hand_written_batches(ctx: FileContext, stack: Stack) -> bool:
    """Does the loop around ``stack`` iterate an object of a class another file of the project
    defines with no base but `object` (the Transformers tutorial's `class SequenceLoader(object)`
    with its own `__next__`)? Its batches are whatever that class makes, in pageable memory: no
    DataLoader pins them, so a `non_blocking=True` copy of them blocks all the same."""
    loop = nearest_loop(stack)
    info = ctx.loops.get(loop) if loop is not None else None
    if info is None or info.iter is None or ctx.project is None:
        return False
    iterable = unwrap_iterable(info.iter)
    if not isinstance(iterable, cst.Name):
        return False
    made = [ctx.constructor_of(iterable, info.stack)]
    function = ctx.function_of(info.stack)
    if made[0] is None and isinstance(function, cst.FunctionDef):  # `def train(train_loader, ...)`: what callers pass
        params = [param.name.value for param in function.params.params]
        if iterable.value in params:
            index = params.index(iterable.value)
            made = [ctx.constructor_of(given.node, site.stack) if given.node is not None else None
                    for site in ctx.calls if site.func == function.name.value
                    for given in (find_argument(ctx, site, iterable.value, index),)]
    if not made or any(qualified is None or "." not in qualified for qualified in made):
        return False
    return all((defined := project_class(ctx.project, qualified)) is not None and set(defined.bases) <= {"object"}
               for qualified in made)  # type: ignore[arg-type]


# A transformer holds about 12 d^2 parameters per layer; one whose stated width is at most this
# is small (under 10M parameters) at the depths such models use (up to 12 layers).
SMALL_WIDTH = 256
_WIDTH_KEYS = frozenset({"dim", "hidden_size", "d_model", "embed_dim", "n_embd"})


# Command-line options that set a network's width (`--nhid 200`, `--hidRNN 100`, `--d_model 256`,
# `--emsize 200`, `--latent_dim 64`), by the words of their destination; not a batch, a
# sequence, an image, a kernel or a vocabulary size, nor a conv net's channels (they double from
# level to level)
_WIDTH_WORDS = frozenset({"hidden", "emsize", "embd", "embed", "emb", "embedding", "width", "units", "ninp", "dim",
                          "dmodel", "latent", "rnn"})
_NOT_WIDTH_WORDS = frozenset({"batch", "seq", "len", "length", "img", "image", "window", "kernel", "vocab", "patch",
                              "pool", "step", "steps", "sample", "samples", "crop", "input", "in", "out", "output",
                              "classes", "class", "head", "heads", "channels", "filters", "max", "min", "time"})
_DEPTH_WORDS = frozenset({"layer", "layers", "nlayers", "depth", "blocks"})
_SMALL_DEPTH = 12


def _option_words(dest: str) -> set[str]:
    """The words of an option's destination, lower case (`hidRNN`: hid, rnn; `d_model`: dmodel)."""
    split = re.split(r"[_\W]+|(?<=[a-z])(?=[A-Z])", dest.strip("_").replace("d_model", "dmodel"))
    return {word.lower() for word in split} - {""}


def _width_option(dest: str) -> bool:
    words = _option_words(dest)
    return not words & _NOT_WIDTH_WORDS and (bool(words & _WIDTH_WORDS)
                                              or any(word.startswith(("hid", "nhid")) for word in words))


@per_file
def small_option_width(ctx: FileContext) -> int | None:
    """The largest default of the width options (``_width_option``: `--nhid 200`, `--hidRNN 100`)
    of a script whose trained networks are built from its options (handed the parsed options, or
    one of them), when every width default is small (at most 256), every depth option's at most
    12, and no launch command of the project gives either more; None otherwise, and for a conv
    net (its channels double from level to level). LSTNet's `Model(args, Data)` with `--hidRNN
    100 --hidCNN 100`: a model of a few hundred thousand parameters the scan cannot count."""
    family = trained_family(ctx)
    if family is not None and family[0] is Family.CONV:
        return None
    defaults = {dest: value for dest, value in option_defaults(ctx).items() if isinstance(value, cst.Integer)}
    widths = {dest: int(value.value) for dest, value in defaults.items() if _width_option(dest)}
    depths = {dest: int(value.value) for dest, value in defaults.items() if _option_words(dest) & _DEPTH_WORDS}
    if not widths or max(widths.values()) > SMALL_WIDTH or max(depths.values(), default=0) > _SMALL_DEPTH \
            or not _built_from_options(ctx, set(widths)):
        return None
    for command in launches(ctx):
        for dest, limit in [*((dest, SMALL_WIDTH) for dest in widths), *((dest, _SMALL_DEPTH) for dest in depths)]:
            given = str(command.options.get(dest, "0"))
            if not given.isdigit() or int(given) > limit:
                return None
    return max(widths.values())


def _built_from_options(ctx: FileContext, widths: set[str]) -> bool:
    """Is every network the training runs built by a call handed the parsed options (LSTNet's
    `eval('models.' + args.model).Model(args, Data)`) or a width option (`RNNModel(args.model,
    ntokens, args.emsize, args.nhid)`)? Not a model zoo's, nor a factory picked from a dict or
    a module by a name option (MAR's `mar.__dict__[args.model](vae_embed_dim=args.vae_embed_dim)`:
    the name `mar_large` sets its widths, not the options handed over)."""
    calls = []
    for name, stack in step_networks(ctx).items():
        for assignment in network_assignments(ctx, name, stack):
            call = peel(ctx, assignment.value)
            if isinstance(call, cst.Call):
                calls.append((call, assignment.stack))
    for call, stack in calls:
        if zoo_architecture(ctx, call, stack) is not None:
            return False
        whole = any(holds_parsed_options(ctx, arg.value, stack) for arg in call.args)
        picked = isinstance(call.func, cst.Subscript) or dotted_name(call.func) == "getattr"
        if not (whole or not picked and any((read := option_read(arg.value)) is not None and read[1] in widths
                                            for arg in call.args)):
            return False
    return bool(calls)


@per_file
def small_stated_width(ctx: FileContext) -> int | None:
    """The width a network the training runs states in its constructor (`ViT(dim=128, ...)`),
    when every stated width is small; None otherwise."""
    widths: list[int | None] = []
    for name, stack in step_networks(ctx).items():
        for assignment in network_assignments(ctx, name, stack):
            call = peel(ctx, assignment.value)
            if not isinstance(call, cst.Call):
                continue
            for arg in call.args:
                if arg.keyword is not None and arg.keyword.value in _WIDTH_KEYS:
                    widths.append(literal_int(ctx, arg.value, assignment.stack))
    if not widths or None in widths or max(widths) > SMALL_WIDTH:  # type: ignore[type-var]
        return None
    return max(widths)  # type: ignore[type-var]
