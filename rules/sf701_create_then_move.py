from __future__ import annotations

import re
from dataclasses import replace as changed

import libcst as cst

from speedfix.engine.findings import Applicability, Finding, LossCheck, Severity, replace
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, keyword_arg, string_literal
from speedfix.model.context import FileContext
from speedfix.model.devices import communication_helper
from speedfix.model.flow import comes_before, in_no_run
from speedfix.model.frames import Stack, in_inference_branch, nearest_loop
from speedfix.model.index import CallSite
from speedfix.model.patterns import is_dtype, without_layout_calls
from speedfix.model.rl import HostBuffer, filled_once, host_buffer, in_rollout, is_buffer_sampler
from speedfix.model.tensors import host_constant
from speedfix.syntax.blocks import enclosing_block
from speedfix.syntax.comments import has_noqa
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import walk_expression

_FACTORIES = frozenset(
    f"torch.{name}" for name in ("zeros", "ones", "empty", "full", "arange", "eye", "linspace", "logspace",
                                 # the STFT's windows (a speech model's loss takes one every step)
                                 "hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window")
)
# They build the tensor in host memory and copy it whatever the device (`device=` saves no copy).
_BUILDERS = frozenset({"torch.tensor", "torch.as_tensor"})
# Same values on any device only for the factories above: CPU and CUDA random generators differ.
_RANDOM = frozenset(f"torch.{name}" for name in ("rand", "randn", "randint", "randperm", "normal"))
_KEEP_AS_IS = frozenset({"device", "requires_grad", "pin_memory", "out"})
_JOINS = frozenset({"torch.cat", "torch.concat", "torch.stack"})
_DEVICE_NAME = re.compile(r"device|^dev$|_dev$|gpu|rank", re.IGNORECASE)


# Legacy tensor types that convert data (`torch.FloatTensor(np_array)`) -> the dtype they make.
_LEGACY_TYPES = {
    "torch.Tensor": "torch.float32", "torch.FloatTensor": "torch.float32", "torch.DoubleTensor": "torch.float64",
    "torch.LongTensor": "torch.int64", "torch.IntTensor": "torch.int32", "torch.BoolTensor": "torch.bool",
    "torch.ByteTensor": "torch.uint8",
}
_CASTS = frozenset({"float", "double", "long", "int", "bool"})


def _made(finding: Finding) -> str:
    """What a finding's message names first (`torch.zeros(...)`)."""
    match = re.match(r"`([^`]+)`", finding.message)
    return match.group(1) if match else "another tensor"


def _converted_data(ctx: FileContext, call: cst.Call) -> cst.BaseExpression | None:
    """`data` of `torch.from_numpy(data)` or `torch.FloatTensor(data)`, with an optional cast
    (`.float()`): data the program has turned into a CPU tensor, not a tensor made to be moved.
    Not a legacy type given a size (`torch.BoolTensor(x.size())`) or numbers written in the code
    (`torch.Tensor([[0.1, 0.1, 0.2, 0.2]])`): those are made to be moved."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in _CASTS and not call.args \
            and isinstance(call.func.value, cst.Call):
        call = call.func.value
    qualified = ctx.qualname(call.func)
    if qualified in _BUILDERS:  # `torch.tensor(ints, dtype=torch.long)`
        data = _built_from(call)
        return data if data is not None and not _written_out(data) else None
    if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
        return None
    data = call.args[0].value
    return data if qualified == "torch.from_numpy" or (qualified in _LEGACY_TYPES and not _written_out(data)) else None


def _built_from(call: cst.Call) -> cst.BaseExpression | None:
    """The data of `torch.tensor(data, ...)`: its first positional argument."""
    first = call.args[0] if call.args else None
    return first.value if first is not None and first.keyword is None and not first.star else None


def _converts_data(ctx: FileContext, call: cst.Call) -> bool:
    return _converted_data(ctx, call) is not None or ctx.qualname(call.func) in _BUILDERS


def _one_fill(value: cst.BaseExpression, written: Stack, copied: Stack) -> bool:
    """`self_loop_attr[:, 0] = 4` once per copy (no loop of its own): one fill with a number,
    a single kernel on the GPU too, not a write element by element."""
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
        value = value.expression
    return isinstance(value, (cst.Integer, cst.Float)) and nearest_loop(written) is nearest_loop(copied)


def _written_out(value: cst.BaseExpression) -> bool:
    """A size (`3`, `x.size()`, `x.shape`) or numbers written out (`[[0.1, 0.2], [1, -1]]`)."""
    if isinstance(value, cst.UnaryOperation):
        value = value.expression
    if isinstance(value, (cst.Integer, cst.Float)):
        return True
    if isinstance(value, (cst.List, cst.Tuple)):
        return bool(value.elements) and all(_written_out(element.value) for element in value.elements)
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        return value.func.attr.value == "size"
    return isinstance(value, cst.Attribute) and value.attr.value == "shape"


# In-place fills of a tensor just made (`torch.BoolTensor(n, m).fill_(0)`): still made on the CPU.
_FILLS = frozenset({"fill_", "zero_"})


def _made_from(value: cst.BaseExpression) -> cst.BaseExpression:
    """The factory call under a fill, a reshape or arithmetic with a number: `torch.ones(s) * -1`,
    `torch.BoolTensor(x.size()).fill_(0)` -> the factory call."""
    while True:
        if isinstance(value, cst.BinaryOperation):
            numbers = [side for side in (value.left, value.right) if _written_out(side)]
            if len(numbers) != 1 or isinstance(numbers[0], (cst.List, cst.Tuple)):
                return value
            value = value.right if numbers[0] is value.left else value.left
        elif isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in _FILLS:
            value = value.func.value
        else:
            layout = without_layout_calls(value)
            if layout is value:
                return value
            value = layout


class CreateThenMove(Rule):
    """
    ## What it does
    Finds tensors created on the CPU and moved straight to the GPU, `torch.zeros(...).cuda()`
    or `torch.ones(...).to(device)`, also after a reshape (`torch.arange(n).unsqueeze(0).to(device)`)
    or torch math on the CPU (`torch.exp(torch.arange(n)).to(device)`, or a causal mask
    `torch.tril(torch.ones(n, n)).type(torch.ByteTensor).to(device)` turned into a CPU dtype
    first; reported without a fix), numbers written in the code made into a legacy tensor type
    (`torch.Tensor([[0.1, 0.2]]).cuda()`, without a fix: `torch.Tensor` takes the default dtype),
    or made into a variable a few statements before the copy (`t = torch.LongTensor(b, n)`, used,
    then `t = t.cuda()`, also filled or scaled first: `torch.BoolTensor(x.size()).fill_(0)`,
    `torch.ones(shape) * -1`, or one column filled with a number: `t[:, 0] = 4`; without a fix,
    and not when the statements between write it element by element; writes after the copy run on
    the GPU and do not count),
    where it runs on every step: in the training loop, in a function it calls or one that takes
    the step itself (an agent's `learn()`), or in a module's `forward` and the methods and
    functions of the file it calls (SimCSE's `cl_forward(self, ...)`). Not in a helper that hands
    tensors to torch.distributed's collectives and takes no step (the `all_gather(data)` that
    detection codebases copy: the sizes and pickled bytes it copies are small, and the collective
    after them waits for every process anyway).

    ## Why is this bad?
    The tensor is allocated and filled on the CPU, then copied to the GPU: one extra allocation,
    one host-to-device copy and a synchronisation point per call, where `device=` makes it on the
    GPU directly. `torch.tensor(data, device=...)` still builds the tensor in host memory and
    copies it (torch stages such data on the CPU), so `torch.tensor(ints).to(device)` is not
    reported: `device=` would save nothing. Numbers written in the code and made into a tensor on
    every step (`torch.tensor([[0.1, 0.2]]).cuda()`) are reported without a fix: such a constant
    is cheapest made once (a registered buffer).

    Not data the program turned into a tensor (`torch.from_numpy(x).float().to(device)` in a
    replay buffer's `sample`, `torch.FloatTensor(obs).to(device)` per environment step): that
    data has to reach the GPU anyway, and a blocking copy converts the dtype on the CPU however it
    is written, so `torch.as_tensor(x, dtype=..., device=...)` would save nothing. Pinned memory
    and `non_blocking=True`, or keeping the buffer on the GPU, is what helps there. A legacy type
    given a size (`torch.BoolTensor(x.size())`) or numbers written out is no such data.

    One exception: a replay buffer that keeps its storage in numpy arrays (`self.state =
    np.zeros((size, dim))`), is loaded whole once (TD3+BC's `convert_D4RL` of an offline dataset:
    a method that replaces the arrays, called on the buffer) and never written row by row while it
    trains (no scanned file calls its `add`), gathers each batch on the host and copies it over
    on every update, for data that never changes: its `sample` is reported once, without a fix
    (keep the arrays on the GPU and index them there). An online buffer, filled as the agent acts,
    is left alone: its rows reach the GPU either way. The same for host data that a module's
    `__init__` sets once and nothing changes (pytorch-fm's `self.offsets = np.array(...)`), made
    into a tensor on the GPU in every `forward` (`x.new_tensor(self.offsets)`, `torch.tensor(
    self.offsets, device=x.device)`): reported without a fix (register it once as a buffer).

    Not in a module's eval-mode branch (`if not self.training:`, the `else:` of `if
    self.training:`, or what follows `if self.training: return loss`), nor in a method that its
    `forward` calls only there (Autoformer's `time_delay_agg_inference`): what a detector builds
    there to collect its boxes never runs while it trains. Tensors made by statements right after
    one another (an LSTM's `h0` and `c0`) are one finding, at the first, that fixes them all. Nor in
    code that no run takes: a
    branch behind an option that is off by default and that no launch script or README of the
    project passes (LTSF-Linear's `if self.individual:`, `--individual` a `store_true` flag), also
    when the options reach a model under another name (`Model(args)` reading `configs.individual`).

    ## Example
    ```python
    def forward(self, x):
        h0 = torch.zeros(self.num_layers, x.size(0), self.hidden).to(x.device)
    ```

    ## Use instead
    ```python
    def forward(self, x):
        h0 = torch.zeros(self.num_layers, x.size(0), self.hidden, device=x.device)
    ```

    ## Fix safety
    Safe for the deterministic factories (`zeros`, `ones`, `empty`, `full`, `arange`, `eye`,
    `linspace`, `logspace`): the values are the same on any device. Random factories
    (`rand`, `randn`, `randint`, `randperm`, `normal`) are reported without a fix: the CUDA
    generator gives different numbers than the CPU one, so results would change. A factory that
    already names a device or asks for `requires_grad=True` (moving it makes a non-leaf copy,
    creating it on the device a leaf), and a move that also changes the dtype, are left alone.

    ## Impact
    Medium: the tensor is made on every step and copied from pageable memory, a blocking copy.
    Nothing moves it.

    ## Measured effect
    Small per call (one allocation and copy); it adds up in `forward` and per-step code. PyTorch's
    tuning guide: "create tensors directly on the target device"; the profiler's pattern matcher
    flags the same shape as `ExtraCUDACopyPattern`.
    Sources: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html,
    https://github.com/pytorch/pytorch/blob/main/torch/profiler/_pattern_matcher.py
    """

    impact = "medium"
    code = "SF701"
    name = "create-then-move"
    summary = "Tensor created on the CPU and moved to the GPU (`torch.zeros(...).cuda()`)"
    severity = Severity.INFO
    requires = (b".to(", b".cuda(")
    fix_applicability = Applicability.SAFE
    loss_check = LossCheck.EXACT
    fix_title = "Create the tensor on the device: `device=`"
    gpu_only = True
    effect = "One allocation, host-to-device copy and sync less per call."

    VALID = [
        Valid(  # a collective's helper, called every step: small copies, and the all_gather waits anyway
            """
            import pickle
            import torch
            import torch.distributed as dist

            def all_gather(data):
                tensor = torch.ByteTensor(torch.ByteStorage.from_buffer(pickle.dumps(data))).to("cuda")
                local_size = torch.IntTensor([tensor.numel()]).to("cuda")
                sizes = [torch.IntTensor([0]).to("cuda") for _ in range(dist.get_world_size())]
                dist.all_gather(sizes, local_size)
                return sizes

            for x in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                optimizer.step()
                all_gather({"loss": loss.detach()})
            """
        ),
        Valid(  # a method `forward` calls only in eval mode: it never runs while the model trains
            """
            import torch

            class AutoCorrelation(torch.nn.Module):
                def aggregate_for_inference(self, values):
                    index = torch.arange(values.shape[-1]).repeat(values.shape[0], 1).cuda()
                    return torch.gather(values, -1, index)

                def forward(self, values):
                    if self.training:
                        return values.roll(1, -1)
                    else:
                        return self.aggregate_for_inference(values)
            """
        ),
        Valid(  # made on the device already
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    h = torch.zeros(2, x.size(0), 8, device=x.device)
                    return self.rnn(x.cuda(), h)
            """
        ),
        Valid(  # behind a flag that is off by default: no run takes the branch
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--noise", action="store_true")
            args = parser.parse_args()
            for x, y in loader:
                x = x.cuda()
                if args.noise:
                    x = x + torch.randn(64, 10).cuda()
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a dtype conversion, not a move
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    mask = torch.ones(4).to(torch.bool)
                    return x.cuda() * mask
            """
        ),
        Valid(  # `.cuda()` of a leaf that requires grad gives a non-leaf: not the same tensor on the device
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    scale = torch.ones(1, requires_grad=True).cuda()
                    return x.cuda() * scale
            """
        ),
        Valid(  # `torch.FloatTensor(3, 4)` is a size, not data; and outside the rollout
            """
            import torch
            for step in range(100):
                obs, reward, done, info = env.step(action)
                buffer = torch.FloatTensor(3, 4).to(device)
            stats = torch.FloatTensor(all_rewards).to(device)
            """
        ),
        Valid(  # filled element by element from Python numbers, then copied once: cheaper on the host
            """
            import torch
            class Pad(torch.nn.Module):
                def forward(self, x, lengths):
                    mask = torch.zeros(len(lengths), x.size(1))
                    for i, n in enumerate(lengths):
                        mask[i, :n] = 1.0
                    mask = mask.cuda()
                    return x * mask[..., None]
            """
        ),
        Valid(  # the eval-mode branch of a detector's forward: it never runs while the model trains
            """
            import torch
            class Detector(torch.nn.Module):
                def forward(self, images):
                    scores, boxes = self.head(self.backbone(images))
                    if self.training:
                        return self.loss(scores, boxes)
                    else:
                        kept = torch.zeros(0, 4)
                        kept = kept.cuda()
                        return torch.cat([kept, boxes[scores > 0.5]])

            class Segmenter(torch.nn.Module):
                def forward(self, images):
                    logits = self.net(images)
                    if self.training:
                        return logits
                    palette = torch.tensor([[0, 0, 0], [255, 0, 0]]).cuda()
                    return palette[logits.argmax(1)]
            """
        ),
        Valid(  # once, at set-up: not worth a finding
            """
            import torch
            class_weights = torch.tensor([1.0, 2.0]).cuda()
            """
        ),
    ]
    INVALID = [
        Invalid(  # an STFT window made on the CPU and copied in every step (a speech enhancement GAN)
            """
            import torch
            for noisy, clean in loader:
                noisy, clean = noisy.cuda(), clean.cuda()
                spec = torch.stft(noisy, 400, 100, window=torch.hamming_window(400).cuda(), return_complex=True)
                loss = criterion(model(spec), clean)
                loss.backward()
                opt.step()
            """,
            fixed="""
            import torch
            for noisy, clean in loader:
                noisy, clean = noisy.cuda(), clean.cuda()
                spec = torch.stft(noisy, 400, 100, window=torch.hamming_window(400, device="cuda"), return_complex=True)
                loss = criterion(model(spec), clean)
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # constant targets joined on the CPU from two factories every epoch, then copied
            """
            import torch
            for epoch in range(200):
                real = torch.ones(n_nodes, 1)
                fake = torch.zeros(n_nodes, 1)
                targets = torch.cat([real, fake], 0)
                targets = targets.cuda()
                loss = bce(critic(graph), targets)
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(  # the same host offsets copied to the GPU in every forward (pytorch-fm's FeaturesEmbedding)
            """
            import numpy as np
            import torch
            class FeaturesEmbedding(torch.nn.Module):
                def __init__(self, field_dims, dim):
                    super().__init__()
                    self.embedding = torch.nn.Embedding(sum(field_dims), dim)
                    self.offsets = np.array((0, *np.cumsum(field_dims)[:-1]), dtype=np.int64)

                def forward(self, x):
                    x = x + x.new_tensor(self.offsets).unsqueeze(0)
                    return self.embedding(x)

            model = FeaturesEmbedding(field_dims, 16).cuda()
            """,
        ),
        Invalid(  # h0 and c0 made one after the other: one finding that fixes both
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    h0 = torch.zeros(self.layers, x.size(0), self.hidden).to(x.device)
                    c0 = torch.zeros(self.layers, x.size(0), self.hidden).cuda()
                    return self.lstm(x, (h0, c0))
            """,
            fixed="""
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    h0 = torch.zeros(self.layers, x.size(0), self.hidden, device=x.device)
                    c0 = torch.zeros(self.layers, x.size(0), self.hidden, device="cuda")
                    return self.lstm(x, (h0, c0))
            """,
        ),
        Invalid(  # in the training loop; labels for a GAN
            """
            import torch
            device = torch.device("cuda")
            for images, _ in loader:
                real = torch.ones(images.size(0), 1).to(device, non_blocking=True)
                loss = criterion(disc(images.to(device)), real)
                loss.backward()
                opt.step()
            """,
            fixed="""
            import torch
            device = torch.device("cuda")
            for images, _ in loader:
                real = torch.ones(images.size(0), 1, device=device)
                loss = criterion(disc(images.to(device)), real)
                loss.backward()
                opt.step()
            """,
        ),
        Valid(  # data converted into a tensor has to travel anyway: a blocking copy converts on the CPU
                # whichever way it is written, so `as_tensor(..., device=)` would gain nothing
            """
            import numpy as np
            import torch
            device = torch.device("cuda")

            class ReplayBuffer:
                def sample(self, batch_size):
                    ind = np.random.randint(0, self.size, size=batch_size)
                    return (
                        torch.from_numpy(self.state[ind]).float().to(self.device),
                        torch.FloatTensor(self.reward[ind]).to(self.device),
                    )

            class Agent:
                def select_action(self, state):
                    state = torch.FloatTensor(state.reshape(1, -1)).to(device)
                    return self.actor(state)
            """
        ),
        Invalid(  # an offline dataset loaded whole into a numpy buffer, gathered and copied on every update
            """
            import numpy as np
            import torch

            class ReplayBuffer:
                def __init__(self, state_dim, size):
                    self.state = np.zeros((size, state_dim))
                    self.reward = np.zeros((size, 1))

                def add(self, state, reward):
                    self.state[self.ptr] = state
                    self.reward[self.ptr] = reward

                def load(self, dataset):
                    self.state = dataset["observations"]
                    self.reward = dataset["rewards"]

                def sample(self, batch_size):
                    ind = np.random.randint(0, len(self.state), size=batch_size)
                    return torch.FloatTensor(self.state[ind]).cuda(), torch.FloatTensor(self.reward[ind]).cuda()

            buffer = ReplayBuffer(17, 1000000)
            buffer.load(dataset)
            for step in range(1000000):
                agent.train(buffer.sample(256))
            """
        ),
        Valid(  # the same buffer filled row by row as an online agent acts: the rows reach the GPU either way
            """
            import numpy as np
            import torch

            class ReplayBuffer:
                def __init__(self, state_dim, size):
                    self.state = np.zeros((size, state_dim))

                def add(self, state):
                    self.state[self.ptr] = state

                def load(self, dataset):
                    self.state = dataset["observations"]

                def sample(self, batch_size):
                    ind = np.random.randint(0, len(self.state), size=batch_size)
                    return torch.FloatTensor(self.state[ind]).cuda()

            buffer = ReplayBuffer(17, 1000000)
            for step in range(1000000):
                state, reward, done, info = env.step(action)
                buffer.add(state)
                agent.train(buffer.sample(256))
            """
        ),
        Invalid(  # reshaped on the CPU first, then copied: the device goes to the factory
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    pos = torch.arange(x.size(1)).unsqueeze(0).expand(x.size(0), -1).to(device=x.device)
                    return self.embed(x) + self.pos(pos)
            model = Net().cuda()
            """,
            fixed="""
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    pos = torch.arange(x.size(1), device=x.device).unsqueeze(0).expand(x.size(0), -1)
                    return self.embed(x) + self.pos(pos)
            model = Net().cuda()
            """,
        ),
        Invalid(  # broadcast to the scores' shape on the CPU (`expand_as` reads only their shape), then copied
            """
            import torch
            class Attention(torch.nn.Module):
                def forward(self, scores, lengths):
                    keys = torch.arange(scores.size(-1)).unsqueeze(0).expand_as(scores).to(scores.device)
                    return scores.masked_fill(keys >= lengths[:, None], float("-inf"))
            model = Attention().cuda()
            """,
            fixed="""
            import torch
            class Attention(torch.nn.Module):
                def forward(self, scores, lengths):
                    keys = torch.arange(scores.size(-1), device=scores.device).unsqueeze(0).expand_as(scores)
                    return scores.masked_fill(keys >= lengths[:, None], float("-inf"))
            model = Attention().cuda()
            """,
        ),
        Invalid(  # a diffusion model's sinusoidal embedding, computed on the CPU in a helper its forward calls
            """
            import math
            import torch
            class TimeEmbedding(torch.nn.Module):
                @staticmethod
                def sinusoid(t, dim):
                    half = dim // 2
                    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half).to(device=t.device)
                    angles = t[:, None].float() * freqs[None]
                    return torch.cat([angles.cos(), angles.sin()], dim=-1)
                def other(self, t):
                    return torch.exp(torch.arange(4)).to(t.device)
                def forward(self, t):
                    return self.mlp(self.sinusoid(t, 256))
            embedder = TimeEmbedding().cuda()
            """,
        ),
        Invalid(  # a function of the file that a model's forward calls with the model (SimCSE's `cl_forward`)
            """
            import torch
            def contrastive_loss(cls, sim):
                labels = torch.arange(sim.size(0)).to(cls.device)
                return torch.nn.functional.cross_entropy(sim, labels)
            class Encoder(torch.nn.Module):
                def forward(self, x):
                    return contrastive_loss(self, self.sim(x))
            encoder = Encoder().cuda()
            """,
            fixed="""
            import torch
            def contrastive_loss(cls, sim):
                labels = torch.arange(sim.size(0), device=cls.device)
                return torch.nn.functional.cross_entropy(sim, labels)
            class Encoder(torch.nn.Module):
                def forward(self, x):
                    return contrastive_loss(self, self.sim(x))
            encoder = Encoder().cuda()
            """,
        ),
        Invalid(  # a causal mask built on the CPU on every forward, turned into bytes there, then copied
            """
            import torch
            class Decoder(torch.nn.Module):
                def causal(self, tokens):
                    n = tokens.shape[1]
                    return torch.tril(torch.ones(n, n)).type(torch.ByteTensor).to(self.device)
                def forward(self, tokens):
                    return self.blocks(tokens, self.causal(tokens))
            decoder = Decoder().cuda()
            """,
        ),
        Invalid(  # a distributional DQN's offsets, copied like another tensor (`.to(actions)` takes its dtype too)
            """
            import torch
            class Agent:
                def learn(self, memory):
                    states, actions, returns = memory.sample(self.batch_size)
                    offset = torch.linspace(0, (self.batch_size - 1) * self.atoms, self.batch_size).unsqueeze(1)
                    offset = offset.expand(self.batch_size, self.atoms).to(actions)
                    offset = torch.linspace(0, (self.batch_size - 1) * self.atoms, self.batch_size).to(actions)
                    loss = self.criterion(self.online_net(states), offset)
                    loss.backward()
                    self.optimiser.step()
            agent = Agent(device=torch.device("cuda"))
            for step in range(100_000):
                agent.learn(memory)
            """,
        ),
        Invalid(  # a detection loss builds its target buffers on the CPU, lets a helper fill them, then copies them
            """
            import torch
            class BoxLoss(torch.nn.Module):
                def forward(self, preds, targets):
                    boxes, scores, anchors = preds
                    n = boxes.size(0)
                    box_t = torch.zeros(n, anchors.size(0), 4)
                    label_t = torch.LongTensor(n, anchors.size(0))
                    for i in range(n):
                        assign(targets[i], anchors, box_t, label_t, i)
                    box_t = box_t.cuda()
                    label_t = label_t.to(boxes.device)
                    return self.smooth_l1(boxes, box_t) + self.ce(scores, label_t)
            """,
            count=2,
        ),
        Invalid(  # made on the CPU (filled or scaled there first), copied, then written on the GPU: a
                  # mask or target as large as an activation travels over every step, per layer
            """
            import torch
            class PaddedConvs(torch.nn.Module):
                def forward(self, x, lengths):
                    for conv in self.convs:
                        x = conv(x)
                        pad = torch.BoolTensor(x.size()).fill_(0)
                        if x.is_cuda:
                            pad = pad.cuda()
                        for i, n in enumerate(lengths.tolist()):
                            pad[i].narrow(2, n, x.size(2) - n).fill_(1)
                        x = x.masked_fill(pad, 0)
                    return x

            class IgnoreLoss(torch.nn.Module):
                def forward(self, scores, overlaps):
                    labels = torch.ones(scores.shape) * -1
                    labels = labels.cuda()
                    labels[overlaps < 0.4] = 0
                    labels[overlaps >= 0.5] = 1
                    return self.bce(scores[labels >= 0], labels[labels >= 0])
            """,
            count=2,
        ),
        Invalid(  # one column filled with a number before the copy (a GNN layer's self-loop edge features):
                  # one fill, which runs on the GPU as well, not a write element by element
            """
            import torch
            class GINConv(torch.nn.Module):
                def forward(self, x, edge_index, edge_attr):
                    self_loop_attr = torch.zeros(x.size(0), 2)
                    self_loop_attr[:, 0] = 4
                    self_loop_attr = self_loop_attr.to(edge_attr.device)
                    return self.propagate(edge_index, x=x, edge_attr=torch.cat((edge_attr, self_loop_attr), 0))

            model = GINConv().cuda()
            """,
        ),
        Invalid(  # numbers written in the code, made into a tensor and copied on every call: no fix,
                  # `torch.Tensor` takes the default dtype
            """
            import torch
            class BoxCoder(torch.nn.Module):
                def forward(self, deltas):
                    return deltas * torch.Tensor([[0.1, 0.1, 0.2, 0.2]]).cuda()
            """,
        ),
        Invalid(  # numbers written in the code, made into a tensor on every call: make them once (no fix:
                  # `torch.tensor(..., device=...)` builds them on the host and copies them too)
            """
            import torch
            class Loss(torch.nn.Module):
                def forward(self, logits, target):
                    weights = torch.tensor([1.0, 2.0, 0.5]).to(logits.device)
                    return torch.nn.functional.cross_entropy(logits, target, weight=weights)
            model = Net().cuda()
            """,
        ),
        Valid(  # a list made into a tensor and moved: `device=` would build it on the host and copy it too
            """
            import torch
            class IntConditioner(torch.nn.Module):
                def forward(self, ints, device=None):
                    ints = torch.tensor(ints, dtype=torch.long).to(device)
                    return self.embedder(ints.clamp(0, 9))
            model = IntConditioner().cuda()
            """
        ),
        Valid(  # host data made into a tensor, then copied: it has to travel anyway (see above)
            """
            import torch
            class Agent:
                def learn(self, batch):
                    rewards = torch.FloatTensor(batch.rewards)
                    rewards = rewards.cuda()
                    loss = self.critic_loss(batch, rewards)
                    loss.backward()
                    self.optimizer.step()
            """
        ),
        Invalid(  # random numbers differ between CPU and CUDA generators: no fix
            """
            import torch
            device = torch.device("cuda")
            for images, _ in loader:
                z = torch.randn(images.size(0), 64).to(device)
                loss = disc(gen(z)).mean()
                loss.backward()
                opt.step()
            """,
        ),
        Valid(  # host data the forward changes, or a buffer made once: nothing copied again each step
            """
            import numpy as np
            import torch
            class FeaturesEmbedding(torch.nn.Module):
                def __init__(self, field_dims, dim):
                    super().__init__()
                    self.embedding = torch.nn.Embedding(sum(field_dims), dim)
                    self.register_buffer("offsets", torch.as_tensor(np.cumsum(field_dims)), persistent=False)
                    self.scale = np.ones(dim)

                def forward(self, x):
                    self.scale = self.scale * 0.5
                    return self.embedding(x + self.offsets) * x.new_tensor(self.scale)

            model = FeaturesEmbedding(field_dims, 16).cuda()
            """,
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        self._sampled: dict[cst.CSTNode, list[tuple[cst.Call, str, HostBuffer]]] = {}
        for site in ctx.method_calls("to"):
            self._check(site, "to")
        for site in ctx.method_calls("cuda"):
            self._check(site, "cuda")
        for site in ctx.method_calls("new_tensor"):  # `x.new_tensor(self.offsets)`: made on x's device from host data
            if site.node.args and site.node.args[0].keyword is None and self._runs_every_step(site):
                self._constant_copied(site, site.node.args[0].value)
        for site in ctx.calls_to(*_BUILDERS):  # `torch.tensor(self.offsets, device=x.device)`
            on_device = any(arg.keyword is not None and arg.keyword.value == "device" for arg in site.node.args)
            if site.node.args and on_device and self._runs_every_step(site):
                self._constant_copied(site, site.node.args[0].value)
        for function, copies in self._sampled.items():
            self._report_host_buffer(function, copies)
        self._fold_adjacent()

    def _fold_adjacent(self) -> None:
        """Tensors made and moved by statements right after one another (`mask = torch.ones(n).to(d)`,
        then `bias = torch.zeros(n).to(d)`) are one finding, at the first, that fixes them all."""
        kept: list[Finding] = []
        last: tuple[Finding, list[cst.BaseStatement], int] | None = None
        for finding in self.findings:
            site = self.ctx.site_of(finding.node) if isinstance(finding.node, cst.Call) else None
            block = enclosing_block(self.ctx, site.statement) if site is not None and site.statement is not None else None
            index = next((i for i, statement in enumerate(block or ()) if statement is site.statement), None)  # type: ignore[union-attr]
            if last is not None and block is last[1] and index == last[2] + 1 and (finding.fix is None) == (last[0].fix is None) \
                    and not has_noqa(site.statement) and not has_noqa(block[last[2]]):  # type: ignore[index, union-attr]
                first = last[0]
                if first.fix is not None and finding.fix is not None:
                    first.fix = changed(first.fix, ops=(*first.fix.ops, *finding.fix.ops))
                first.message += f" (and `{_made(finding)}` in the next statement)"
                last = (first, block, index)
                continue
            kept.append(finding)
            last = (finding, block, index) if block is not None and index is not None else None
        self.findings = kept

    def _constant_copied(self, site: CallSite, data: cst.BaseExpression) -> bool:
        """`x.new_tensor(self.offsets)` (or `torch.from_numpy(self.offsets).to(device)`) on every
        step, where `self.offsets` is host data the module's `__init__` set once (``host_constant``):
        the same numbers copied to the GPU again each step. Reported; True when it was."""
        if host_constant(self.ctx, data, site.stack) is None:
            return False
        name = dotted_name(data)
        self.report(site.node, f"`{name}`, host data the module's `__init__` sets once, is copied to the GPU on every "
                    "step", no_fix_reason=f"make it a tensor once, in `__init__`, as a buffer (`self.register_buffer("
                    f"\"{name[5:]}\", torch.as_tensor(...), persistent=False)`) that moves with the module, and use "
                    "it as it is")
        return True

    def _sampled_on_host(self, site: CallSite, data: cst.BaseExpression) -> None:
        """`torch.FloatTensor(self.state[ind]).to(device)` in the `sample` of a replay buffer that
        keeps numpy arrays, loaded once (``filled_once``): noted for one finding per method."""
        ctx = self.ctx
        owner = ctx.class_of(site.stack)
        array = dotted_name(data.value) if isinstance(data, cst.Subscript) else None
        if owner is None or array is None or not array.startswith("self.") or not is_buffer_sampler(site.stack):
            return
        buffer = host_buffer(ctx, owner.name.value)
        if buffer is not None and array[5:] in buffer.arrays and filled_once(ctx, buffer):
            self._sampled.setdefault(ctx.function_of(site.stack), []).append((site.node, array, buffer))

    def _report_host_buffer(self, function: cst.CSTNode, copies: list[tuple[cst.Call, str, HostBuffer]]) -> None:
        move, array, buffer = copies[0]
        more = f" and {len(copies) - 1} more" if len(copies) > 1 else ""
        method = function.name.value if isinstance(function, cst.FunctionDef) else "sample"
        loaders = ", ".join(f"`{name}`" for name in sorted(buffer.loaders - buffer.writers))
        self.report(move, f"`{buffer.name}.{method}` gathers every batch from numpy arrays on the host "
                    f"(`{array}[...]`{more}) and copies it to the GPU",
                    no_fix_reason=f"the buffer is loaded whole ({loaders}) and never written row by row while it "
                    "trains: keep its arrays on the GPU as tensors, made once, and draw the indices there "
                    "(`torch.randint(..., device=...)`)")

    def _check(self, site: CallSite, method: str) -> None:
        ctx = self.ctx
        move = site.node
        made = move.func.value if isinstance(move.func, cst.Attribute) else None
        if isinstance(made, cst.Name) and self._runs_every_step(site):
            self._check_variable(site, made, method)
            return
        if not isinstance(made, cst.Call) or not self._runs_every_step(site):
            return
        built = without_layout_calls(made)
        if isinstance(built, cst.Call) and ctx.qualname(built.func) in _BUILDERS:
            self._check_built(site, built, move, method)
            return
        data = _converted_data(ctx, made)
        if data is not None:
            if not self._constant_copied(site, data):
                self._sampled_on_host(site, data)
            return  # data the step needs on the GPU: it travels either way (see the docs), unless a buffer holds it
        factory = without_layout_calls(made)  # `torch.linspace(...).unsqueeze(1).expand(b, n)`
        if not isinstance(factory, cst.Call):
            return
        qualified = ctx.qualname(factory.func)
        if qualified in _LEGACY_TYPES and self._target_device(move, method) is not None:
            dtype = _LEGACY_TYPES[qualified]
            self.report(move, f"`{qualified}(...)` is made on the CPU and then copied to the GPU",
                        no_fix_reason=f"make it with `torch.tensor(..., dtype={dtype}, device=...)` (or once, as a "
                        "buffer of the module): `torch.Tensor` takes the default dtype, which the script may change")
            return
        if qualified not in _FACTORIES and qualified not in _RANDOM:
            self._check_computed(move, made, method)
            return
        # `device=` already chosen; `requires_grad=True` then `.cuda()` gives a non-leaf copy, which
        # creating it on the device would turn into a leaf that collects gradients.
        if any(arg.keyword is not None and arg.keyword.value in _KEEP_AS_IS for arg in factory.args):
            return
        name = qualified.rsplit(".", 1)[-1]
        message = f"`torch.{name}(...)` is made on the CPU and then copied to the GPU"
        device = self._target_device(move, method)
        if device is None:
            like = self._like_tensor(move)
            if like is not None:
                self.report(move, message, no_fix_reason=f"`.to({like})` also takes that tensor's dtype: make it with "
                            f"`device={like}.device` and the dtype it needs")
            return
        if qualified in _RANDOM:
            self.report(move, message, no_fix_reason="random numbers from the CUDA generator differ from the CPU's")
            return
        indent = ctx.module.default_indent
        made_there = append_args(factory, keyword_arg("device", device), indent=indent)
        self.report(move, message, fix_ops=[replace(move, made.deep_replace(factory, made_there))])

    def _check_built(self, site: CallSite, built: cst.Call, move: cst.Call, method: str) -> None:
        """`torch.tensor(data).to(device)` on every step. `torch.tensor(..., device=...)` builds the
        tensor in host memory and copies it too, so `device=` saves nothing: host data (`ints`, a
        list the step made) has to travel anyway (reported only when it is a module's constant,
        ``_constant_copied``); numbers written in the code are the same on every step, made once
        they are not copied again."""
        data = _built_from(built)
        if data is None or self._constant_copied(site, data):
            return
        if not _written_out(data):
            self._sampled_on_host(site, data)  # (a replay buffer's arrays, loaded once: reported per method)
            return
        if self._target_device(move, method) is None:
            return
        self.report(move, "numbers written in the code are made into a tensor on the host and copied to the GPU on "
                    "every step", no_fix_reason="`device=` would still build it on the host and copy it: make it once, "
                    "as a buffer of the module (`self.register_buffer(..., persistent=False)`) or before the loop")

    def _check_variable(self, site: CallSite, name: cst.Name, method: str) -> None:
        """`conf_t = torch.LongTensor(n, m)`, a few statements of use, then `conf_t = conf_t.cuda()`:
        made on the CPU every step and copied over. Not when the statements between fill it
        element by element (`buf[i] = ...`): writing single elements is cheaper on the host."""
        ctx = self.ctx
        function = ctx.function_of(site.stack)
        if site.statement is None or self._target_device(site.node, method) is None:
            return
        before = [a for a in ctx.assignments_in(function, name.value) if a.statement is not None
                  and not a.unpacked and not a.augmented and comes_before(ctx, a.statement, site.statement)]
        created = _made_from(before[-1].value) if before else None
        if not isinstance(created, cst.Call) or _converts_data(ctx, created):
            return
        made_at = before[-1].statement
        qualified = joined = ctx.qualname(created.func) or ""
        if joined in _JOINS:  # `lbl = torch.cat((ones, zeros), 1)` of tensors the step made just above
            qualified = self._joined_factory(created, function, made_at) or ""
        elif not self._from_factory(created):
            return
        if not qualified:
            return
        if any(ctx.function_of(a.stack) is function and a.statement is not None and comes_before(ctx, made_at, a.statement)
               and comes_before(ctx, a.statement, site.statement) and not _one_fill(a.value, a.stack, site.stack)
               for a in ctx.item_assignments.get(name.value, ())):
            return  # written element by element before the copy (after it, the writes run on the GPU)
        legacy = _LEGACY_TYPES.get(qualified)
        how = f"`torch.empty(..., dtype={legacy}, device=...)`" if legacy else f"`{qualified}(..., device=...)`"
        made_by = f"`{joined}(...)` of tensors from `{qualified}(...)`" if joined in _JOINS else f"`{qualified}(...)`"
        self.report(site.node, f"`{name.value}` is made on the CPU by {made_by} on every step, then copied to the GPU",
                    no_fix_reason=f"make it on the device where it is created ({how}) and drop the copy; the code "
                    "in between uses it, so it is left to you")

    def _from_factory(self, created: cst.Call) -> bool:
        """Made by a factory on the CPU: no `device=` (nor `requires_grad`, `out`) chosen."""
        return (self.ctx.qualname(created.func) or "") in _FACTORIES | _RANDOM | _LEGACY_TYPES.keys() \
            and not any(arg.keyword is not None and arg.keyword.value in _KEEP_AS_IS for arg in created.args)

    def _joined_factory(self, join: cst.Call, function: cst.CSTNode | None, at: cst.BaseStatement | None) -> str | None:
        """`torch.cat((lbl_1, lbl_2), 1)` where each part was made by a factory on the CPU earlier
        in the same function (`lbl_1 = torch.ones(n, m)`): the first part's factory, else None."""
        parts = join.args[0].value if join.args and join.args[0].keyword is None and not join.args[0].star else None
        if not isinstance(parts, (cst.Tuple, cst.List)) or not parts.elements or at is None:
            return None
        factories = []
        for element in parts.elements:
            if not isinstance(element.value, cst.Name):
                return None
            made = [a for a in self.ctx.assignments_in(function, element.value.value) if a.statement is not None
                    and not a.unpacked and not a.augmented and comes_before(self.ctx, a.statement, at)]
            created = _made_from(made[-1].value) if made else None
            if not isinstance(created, cst.Call) or _converts_data(self.ctx, created) or not self._from_factory(created):
                return None
            factories.append(self.ctx.qualname(created.func))
        return factories[0]

    def _check_computed(self, move: cst.Call, made: cst.Call, method: str) -> None:
        """`torch.exp(-math.log(p) * torch.arange(half) / half).to(device=t.device)`: torch math on
        a tensor made on the CPU, all of it done there, then copied."""
        core = without_layout_calls(made)
        while isinstance(core, cst.Call) and isinstance(core.func, cst.Attribute) and core.func.attr.value == "type" \
                and len(core.args) == 1 and "cuda" not in (self.ctx.qualname(core.args[0].value) or "cuda"):
            core = without_layout_calls(core.func.value)  # `.type(torch.ByteTensor)`: a CPU dtype change
        if not isinstance(core, cst.Call) or not (self.ctx.qualname(core.func) or "").startswith("torch.") \
                or self._target_device(move, method) is None:
            return
        for node in walk_expression(made):
            if isinstance(node, cst.Call) and node is not made and self.ctx.qualname(node.func) in _FACTORIES | _RANDOM \
                    and not any(arg.keyword is not None and arg.keyword.value in _KEEP_AS_IS for arg in node.args):
                name = self.ctx.qualname(node.func).rsplit(".", 1)[-1]  # type: ignore[union-attr]
                self.report(move, f"`torch.{name}(...)` is made and computed on the CPU, then copied to the GPU",
                            no_fix_reason=f"make it with `torch.{name}(..., device=...)` and drop the `.{method}()`: the math "
                            "then runs on the GPU (its results may differ in the last bit)")
                return

    def _like_tensor(self, move: cst.Call) -> str | None:
        """`.to(actions)`: the one argument names a tensor whose device (and dtype) the copy takes."""
        args = move.args
        if len(args) != 1 or args[0].keyword is not None or args[0].star or is_dtype(self.ctx, args[0].value):
            return None
        name = dotted_name(args[0].value)
        if name is None or "dtype" in name.lower() or _DEVICE_NAME.search(name.rsplit(".", 1)[-1]):
            return None
        return name

    def _target_device(self, move: cst.Call, method: str) -> cst.BaseExpression | None:
        """What `device=` should be, when the call only moves to a device (else None)."""
        positional = [arg for arg in move.args if arg.keyword is None and not arg.star]
        keywords = {arg.keyword.value for arg in move.args if arg.keyword is not None}
        if any(arg.star for arg in move.args) or keywords - {"non_blocking", "device"}:
            return None
        if "device" in keywords:
            return None if positional else next(a.value for a in move.args if a.keyword and a.keyword.value == "device")
        if method == "cuda":
            return cst.parse_expression(string_literal(self.ctx, "cuda")) if not positional else positional[0].value
        if len(positional) != 1:
            return None
        value = positional[0].value
        if is_dtype(self.ctx, value):
            return None
        if isinstance(value, cst.SimpleString) or (
            isinstance(value, cst.Call) and self.ctx.qualname(value.func) == "torch.device"
        ):
            return value
        name = dotted_name(value)
        return value if name and _DEVICE_NAME.search(name.rsplit(".", 1)[-1]) else None

    def _runs_every_step(self, site: CallSite) -> bool:
        """In the training loop (or a function it calls), in a function that takes a step itself
        (an agent's `learn()`), in a module's `forward` (or a method it calls), or once per
        environment step or update of an RL script (acting, a replay buffer's `sample`). Not in a
        module's eval-mode branch (`if not self.training:`): that never runs while it trains; nor
        in code that no run takes (`if self.individual:`, an option off by default that no launch
        command of the project passes)."""
        if in_inference_branch(site.stack) or communication_helper(self.ctx, site.stack):
            return False
        function = self.ctx.function_of(site.stack)
        every_step = self.ctx.in_training_loop(site.stack) or in_rollout(self.ctx, site.stack) or (
            isinstance(function, cst.FunctionDef) and (function.name.value == "forward" or function in self.ctx.step_functions
                                                       or self._called_in_forward(function, site)))
        return every_step and not in_no_run(self.ctx, site.statement, site.stack)

    def _called_in_forward(self, function: cst.FunctionDef, site: CallSite) -> bool:
        """A method of a module that its `forward` calls (`self.timestep_embedding(t, dim)`), or a
        function of the file that a `forward` calls (SimCSE's `cl_forward(self, ...)`), outside its
        eval-mode branch."""
        owner = self.ctx.class_of(site.stack)
        wanted = f"self.{function.name.value}" if owner is not None else function.name.value
        return any(
            call.func == wanted and self.ctx.class_of(call.stack) is (owner or self.ctx.class_of(call.stack))
            and isinstance(caller := self.ctx.function_of(call.stack), cst.FunctionDef) and caller.name.value == "forward"
            and not in_inference_branch(call.stack)  # Autoformer's `time_delay_agg_inference`: eval mode only
            for call in self.ctx.calls
        )
