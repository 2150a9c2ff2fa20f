"""The semantic model answers PyTorch questions for any rule: tensors and host values, Python
numbers, hand-written attention and what surrounds it."""

from __future__ import annotations

import re
import textwrap

import libcst as cst
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speedfix.model.amp import accelerate_picks_precision, mixed_precision_by_default
from speedfix.model.arguments import find_argument
from speedfix.model.attention import attention_of, has_fast_path, is_default_scale, softmax_input
from speedfix.model.autograd import only_detached, outputs_leave_autograd
from speedfix.model.context import FileContext
from speedfix.model.devices import cpu_by_default, uses_cuda
from speedfix.model.flow import off_by_default
from speedfix.model.frames import class_of_method, in_inference_branch
from speedfix.model.frameworks import trainer_fits
from speedfix.model.launch import _PLACEHOLDER, _held_command, _unknown, _words
from speedfix.model.loaded_config import section_keys
from speedfix.model.networks import optimized_module, optimizer_factories
from speedfix.model.scale import named_for_evaluation, trains_narrow_mlps_only
from speedfix.model.tensors import has_sync_before, is_host_value, is_python_number, returns_tensor, tensors
from speedfix.model.unused import _DYNAMIC, _count, _finds_its_functions, _has_word
from speedfix.model.versions import TorchVersion
from speedfix.syntax.nodes import code_of, walk_expression
from speedfix.syntax.walk import walk_batched


def context(code: str) -> FileContext:
    module = cst.parse_module(textwrap.dedent(code))
    ctx = FileContext(module, "t.py", TorchVersion.parse("2.4"))
    walk_batched(module, [ctx])
    return ctx


def expression(ctx: FileContext, code: str) -> tuple[cst.BaseExpression, tuple]:
    """The first expression of the file written as ``code``, with the stack it is read at."""
    for site in ctx.calls:
        for node in walk_expression(site.node):
            if isinstance(node, cst.BaseExpression) and ctx.module.code_for_node(node) == code:
                return node, site.stack
    raise AssertionError(f"{code!r} is not an argument of a call")


TRAINING = """
    import torch
    def train(model, loader, opt):
        for x, y in loader:
            loss = model(x.cuda()).sum()
            lossf = loss.item()
            loss.backward()
            scaled = loss * 2
            opt.step()
            print(scaled, lossf, loss.shape, x)
"""


def test_tensors_of_a_training_step():
    ctx = context(TRAINING)
    found = tensors(ctx)
    scaled, stack = expression(ctx, "scaled")
    assert found.is_tensor(scaled, stack)  # made from the tensor that receives backward()
    assert not found.is_tensor(expression(ctx, "lossf")[0], stack)  # a Python number
    assert not found.is_tensor(expression(ctx, "loss.shape")[0], stack)  # a host attribute
    assert not found.is_tensor(expression(ctx, "x")[0], stack)  # a batch still on the host
    assert tensors(ctx) is found  # computed once per file


def test_backward_to_look_at_gradients_is_no_training_step():
    ctx = context("""
        import torch
        def receptive_field(img, out):
            out[0, :, 5, 5].sum().backward(retain_graph=True)
            field = img.grad.abs()
            img.grad.fill_(0)
            return field.cpu()
        for layer in range(4):
            features = conv(features)
            receptive_field(image, features)
        for x in batches:  # a hand-written SGD step reads the gradients to update
            loss = (w * x).sum()
            loss.backward()
            with torch.no_grad():
                w -= 0.1 * w.grad
        for x in batches:  # nothing read: a step whose update speedfix cannot see
            model(x).sum().backward()
    """)
    layers, sgd, unseen = (info.node for info in ctx.loops.values())
    assert layers not in ctx.step_loops
    assert sgd in ctx.step_loops and unseen in ctx.step_loops


def test_one_pass_of_a_loop_and_eval_mode_are_not_every_step():
    ctx = context("""
        import torch
        def evaluate(net, loader):
            return sum(net(x.cuda()).sum() for x in loader)
        class Net(torch.nn.Module):
            def forward(self, x):
                if self.training:
                    return self.head(x)
                else:
                    return self.head(x).softmax(-1)
            def predict(self, x):
                if self.training:
                    return self.head(x)
                return self.head(x).softmax(-1)
        net = Net()
        for i, x in enumerate(train_loader):
            net(x.cuda()).sum().backward()
            opt.step()
            for j, part in enumerate(x.split(4)):
                if j == 0:
                    first(part)
            if i == len(train_loader) - 1:
                evaluate(net, val_loader)
            if x == 0:  # the batch, not the counter: any step
                check(x)
    """)
    stacks: dict = {}
    for site in ctx.calls:
        stacks.setdefault(site.func, site.stack)  # the first call of each name
    assert ctx.is_hot(stacks["first"])  # once per pass of a loop inside the step: every step
    assert ctx.is_hot(stacks["check"])
    assert not ctx.is_hot(stacks["evaluate"]) and not ctx.in_training_loop(stacks["evaluate"])  # once per epoch
    assert not ctx.is_hot(stacks["x.cuda"])  # in evaluate(), which only the last pass runs
    heads = [site.stack for site in ctx.calls if site.func == "self.head"]
    assert ctx.is_hot(heads[0]) and not ctx.is_hot(heads[1])  # the eval-mode branch of forward
    assert not in_inference_branch(heads[2]) and in_inference_branch(heads[3])  # after `if self.training: return`


def test_host_values_and_syncs():
    assert returns_tensor("torch.zeros") and returns_tensor("torch.nn.functional.softmax")
    assert not returns_tensor("torch.device") and not returns_tensor("torch.is_tensor")
    assert is_host_value(cst.parse_expression("loss.item() * n"))
    assert not is_host_value(cst.parse_expression("loss * n"))
    assert has_sync_before(cst.parse_expression("x.cpu().numpy().tolist()").func.value)  # type: ignore[attr-defined]
    assert not has_sync_before(cst.parse_expression("x.sum()"))


ATTENTION = """
    import math
    import torch
    import torch.nn.functional as F
    class Attention(torch.nn.Module):
        def __init__(self, scale):
            self.scale = scale
        def forward(self, q, k, v):
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = F.softmax(att, dim=-1)
            return att @ v
        def scaled(self, q, k, v):
            return F.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1) @ v
    def fused(q, k, v):
        if torch.cuda.is_available():
            return F.scaled_dot_product_attention(q, k, v)
        return F.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
"""


def test_attention_and_what_surrounds_it():
    ctx = context(ATTENTION)
    softmaxes = [site for site in ctx.calls if softmax_input(ctx, site.node, class_of_method(site.stack))]
    assert len(softmaxes) == 3
    forward, scaled, fused = softmaxes
    attention, _, _ = attention_of(ctx, forward)  # type: ignore[misc]
    assert is_default_scale(ctx, attention, attention.factors[0])  # 1/sqrt(head_dim)
    other, _, _ = attention_of(ctx, scaled)  # type: ignore[misc]
    assert not is_default_scale(ctx, other, other.factors[0])
    # `self.scale` is an `__init__` parameter: a number the model is configured with, no tensor
    assert is_python_number(ctx, other.factors[0].meaning, scaled.stack)
    assert not has_fast_path(ctx, forward.stack) and has_fast_path(ctx, fused.stack)


def test_outputs_used_only_detached_or_as_host_values():
    """A GAN's generator run again for the discriminator step leaves autograd as a detached
    tensor that stays on the device; a sample saved to disk leaves as a host value."""
    ctx = context("""
        import torch
        for noise, real in loader:
            fake = generator(noise)
            fake = fake.detach()
            loss = critic(fake).mean()
            shown = generator(noise).cpu().numpy()
    """)
    fake, shown = (site for site in ctx.calls if ctx.module.code_for_node(site.node) == "generator(noise)")
    assert outputs_leave_autograd(ctx, fake) and only_detached(ctx, fake)
    assert outputs_leave_autograd(ctx, shown) and not only_detached(ctx, shown)


def test_a_device_that_defaults_to_the_cpu():
    """A `--device` option defaulting to "cpu" is where the default run trains; a device chosen
    at run time, or a host copy `.to("cpu")`, says nothing of the kind."""
    option = context("""
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--device", default="cpu")
        args = parser.parse_args()
        model = Net().to(args.device)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
    """)
    assert cpu_by_default(option) and not uses_cuda(option)
    chosen = context("""
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = Net().to(device)
        preds = model(x.to(device)).argmax(1).to("cpu")
    """)
    assert not cpu_by_default(chosen) and uses_cuda(chosen)


def test_membership_tests_with_the_defaults():
    from speedfix.model.flow import off_by_default

    ctx = context("""
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--bits", type=int, default=16)
        parser.add_argument("--dtype", default="fp32")
        args = parser.parse_args()
        if args.bits in [4, 8]:
            quantize(model)
        if args.dtype not in ("fp16", "bf16"):
            keep_fp32(model)
        if args.bits in (4, other):
            unknown(model)
    """)
    gated = {site.func: off_by_default(ctx, site.statement, site.stack) for site in ctx.calls}
    assert gated["quantize"] == "args.bits in [4, 8]"  # 16 is neither: off by default
    assert gated["keep_fp32"] is None and gated["unknown"] is None  # taken; cannot be known


def test_trainer_fits_are_the_trainers_not_an_encoders():
    ctx = context("""
        import lightning as L
        encoders = {"id": LabelEncoder().fit(frame.id)}
        runner = L.Trainer(max_epochs=3)
        runner.fit(model, loader)
        """)
    assert [ctx.module.code_for_node(site.node) for site in trainer_fits(ctx)] == ["runner.fit(model, loader)"]


def test_section_keys_follow_a_section_through_names_and_rewrappings():
    ctx = context("""
        import argparse
        from omegaconf import OmegaConf
        config = OmegaConf.merge(*[OmegaConf.load(f) for f in files])
        section = config.pop("lightning", OmegaConf.create()).get("trainer", {})
        options = argparse.Namespace(**section)
        options = vars(options)
        Trainer(**options, **config["other"], **settings)
        """)
    call = next(site for site in ctx.calls if ctx.module.code_for_node(site.node.func) == "Trainer")
    assert [section_keys(ctx, arg.value, call.stack) for arg in call.node.args] == \
        [("lightning", "trainer"), ("other",), None]


def test_an_optimizer_factory_handed_parameter_groups_is_not_handed_the_model():
    ctx = context("""
        import torch
        def main(args, net):
            param_groups = get_decay_groups(net)
            optimizer = get_optimizer(param_groups, args)
            scheduler_optimizer = build_optimizer(args, net)
    """)
    assert [model for model, _ in optimizer_factories(ctx)] == ["net"]


def test_a_param_group_helper_of_an_imported_module_is_handed_the_model():
    # DINO's `utils.get_params_groups(student)`, MAE's `lrd.param_groups_lrd(model_without_ddp, ...)`:
    # the module is no model; the model is the helper's argument (`model.get_1x_lr_params()` is the model's)
    ctx = context("""
        import torch
        import utils
        import util.lr_decay as lrd
        def main(student, model, net):
            params_groups = utils.get_params_groups(student)
            first = torch.optim.AdamW(params_groups)
            model_without_ddp = model
            second = torch.optim.AdamW(lrd.param_groups_lrd(model_without_ddp, 0.05), lr=1e-3)
            third = torch.optim.SGD(net.get_1x_lr_params(), lr=0.1)
    """)
    optimizers = [site for site in ctx.calls if (site.func or "").startswith("torch.optim.")]
    assert [optimized_module(ctx, site) for site in optimizers] == ["student", "model", "net"]


def test_a_call_that_wraps_an_optimizer_is_no_optimizer_factory():
    # Fabric's `setup_optimizers(optimizer)` starts with "set" but wraps the optimizer it is given
    ctx = context("""
        import torch
        def main(fabric, model, args):
            model = fabric.setup(model)
            optimizer = torch.optim.AdamW(model.parameters(), fused=True)
            optimizer = fabric.setup_optimizers(optimizer)
            optimizer = create_optimizer_v2(model, opt="sgd")
            optimizer = set_optimizer(args, model)
    """)
    assert [model for model, _ in optimizer_factories(ctx)] == ["model", "model"]


def test_a_lightning_modules_saved_options_keep_their_command_line_defaults():
    # flan-alpaca: the module keeps the parsed options (`save_hyperparameters(hparams)`), so
    # `self.hparams.use_gradient_checkpointing` is the store_true option, off by default
    ctx = context("""
        import argparse
        import pytorch_lightning as pl

        def init_args():
            parser = argparse.ArgumentParser()
            parser.add_argument("--use_gradient_checkpointing", action="store_true")
            parser.add_argument("--use_lora", action="store_true", default=True)
            return parser.parse_args()

        class LightningModel(pl.LightningModule):
            def __init__(self, hparams):
                super().__init__()
                self.save_hyperparameters(hparams)
                if self.hparams.use_gradient_checkpointing:
                    self.model.gradient_checkpointing_enable()
                if self.hparams.use_lora:
                    self.model = get_peft_model(self.model)

        model = LightningModel(init_args())
    """)
    calls = {site.func: site for site in ctx.calls}
    enable, lora = calls["self.model.gradient_checkpointing_enable"], calls["get_peft_model"]
    assert off_by_default(ctx, enable.statement, enable.stack) == "self.hparams.use_gradient_checkpointing"
    assert off_by_default(ctx, lora.statement, lora.stack) is None


def test_an_absl_flag_off_by_default_keeps_its_branch_off_the_default_run():
    # conditional-flow-matching: `flags.DEFINE_bool("parallel", False, ...)`, then `if FLAGS.parallel:`
    ctx = context("""
        import torch
        from absl import flags

        FLAGS = flags.FLAGS
        flags.DEFINE_bool("parallel", False, help="multi gpu training")
        flags.DEFINE_integer("num_workers", 4, help="workers")

        def train(argv):
            if FLAGS.parallel:
                net_model = torch.nn.DataParallel(net_model)
            if FLAGS.num_workers:
                loader = make_loader(FLAGS.num_workers)
    """)
    calls = {site.func: site for site in ctx.calls}
    parallel, loader = calls["torch.nn.DataParallel"], calls["make_loader"]
    assert off_by_default(ctx, parallel.statement, parallel.stack) == "FLAGS.parallel"
    assert off_by_default(ctx, loader.statement, loader.stack) is None


def test_an_options_name_and_help_do_not_make_the_default_run_half_precision():
    # Transformer-XL: `--fp16` (store_true, help "pseudo-fp16 mode"), `if args.fp16: model = model.half()`
    code = """
        import argparse
        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument('--fp16', action='store_true', help='Run in pseudo-fp16 mode (fp16 storage fp32 math).')
        parser.add_argument('--static-loss-scale', type=float, default=1,
                            help='Static loss scale, positive power of 2 values can '
                            'improve fp16 convergence.')
        parser.add_argument('--precision', default=PRECISION)
        args = parser.parse_args()
        model = Net().cuda()
        if args.fp16:
            model = model.half()
    """
    assert not mixed_precision_by_default(context(code.replace("PRECISION", "'fp32'")))
    # a 16-bit default of an option is a setting of the default run (the scan cannot tell what reads it)
    assert mixed_precision_by_default(context(code.replace("PRECISION", "'bf16'")))


def test_keywords_of_a_conditional_dict_of_keywords():
    # chronos: `TrainingArguments(..., **({"warmup_steps": n} if new else {"warmup_ratio": r}), tf32=tf32)`
    ctx = context("""
        from transformers import TrainingArguments
        args = TrainingArguments(output_dir="out", **({"warmup_steps": 10} if NEW else {"warmup_ratio": 0.1}), tf32=True)
    """)
    (site,) = [site for site in ctx.calls if site.func == "TrainingArguments"]
    assert find_argument(ctx, site, "bf16").missing  # neither branch sets it: the default
    assert find_argument(ctx, site, "warmup_steps").unknown  # one branch does
    assert code_of(find_argument(ctx, site, "tf32").node) == "True"


def test_a_narrow_mlp_is_told_from_wider_or_other_networks():
    code = """
        import torch
        import torch.nn as nn

        class Actor(nn.Module):
            def __init__(self, state_dim, action_dim, hidden=WIDTH):
                super().__init__()
                self.l1 = nn.Linear(state_dim, hidden)
                self.l2 = nn.Linear(hidden, hidden)
                self.norm = nn.LayerNorm(hidden)
                self.l3 = nn.Linear(hidden, action_dim)
                EXTRA

            def forward(self, state):
                return self.l3(self.norm(torch.relu(self.l2(torch.relu(self.l1(state))))))

        actor = Actor(17, 6).cuda()
        critic = nn.Sequential(nn.Linear(23, 64), nn.ReLU(), nn.Linear(64, 1)).cuda()
        opt = torch.optim.Adam(actor.parameters())
        critic_opt = torch.optim.Adam(critic.parameters())
    """
    def narrow(width: str, extra: str = "pass") -> bool:
        return trains_narrow_mlps_only(context(code.replace("WIDTH", width).replace("EXTRA", extra)))

    assert narrow("256")  # TD3's actor and a small critic
    assert not narrow("512")  # wide enough for tensor cores to pay
    assert not narrow("256", "self.conv = nn.Conv2d(3, 16, 3)")  # not an MLP
    assert not narrow("256", "self.w = torch.mm(torch.eye(4), torch.eye(4))")  # a matmul written out
    assert not narrow("256", "self.w = torch.eye(4) @ torch.eye(4)")


def test_an_accelerate_launch_picks_the_precision_where_the_code_does_not():
    # F5-TTS: `Accelerator(..., **accelerate_kwargs)`, run by `accelerate launch --mixed_precision=fp16`
    code = """
        from accelerate import Accelerator
        accelerator = Accelerator(gradient_accumulation_steps=1, ARGS)
    """
    assert accelerate_picks_precision(context(code.replace("ARGS", "**accelerate_kwargs")))
    assert accelerate_picks_precision(context(code.replace(", ARGS", "")))
    assert not accelerate_picks_precision(context(code.replace("ARGS", 'mixed_precision="no"')))
    assert not accelerate_picks_precision(context(code.replace("ARGS", 'mixed_precision="bf16"')))


@pytest.mark.parametrize("name, evaluation", [
    ("cv_loader", True), ("self.cv_data", True), ("val_dl", True), ("test_loader", True),
    ("tr_loader", False), ("cv_train_loader", False), ("cv2_loader", False), ("loader", False),
])
def test_loader_names_that_say_evaluation(name, evaluation):
    assert named_for_evaluation(name) is evaluation


@pytest.mark.parametrize("gpus, on_gpu", [
    ("torch.cuda.device_count()", True),
    ("n_gpus", True),  # bound to the machine's count above
    ("1", True), ("-1", True), ("[0]", True), ('"0,1"', True),
    ("0", False), ("None", False), ("[]", False), ("args.gpus", False),  # 1.x trains on the CPU by default
])
def test_a_lightning_1x_trainer_takes_gpus_from_its_gpus_setting(gpus, on_gpu):
    """`pl.Trainer(gpus=..., accelerator="ddp" if n > 1 else None)`: Lightning 1.x's backend in
    `accelerator` says nothing of the device; `gpus` does."""
    from speedfix.model.frameworks import LIGHTNING_TRAINER, lightning_on_gpu
    ctx = context(f"""\
        import torch
        import pytorch_lightning as pl
        n_gpus = torch.cuda.device_count()
        trainer = pl.Trainer(gpus={gpus}, accelerator="ddp" if n_gpus > 1 else None)
        """)
    site = ctx.calls_to(*LIGHTNING_TRAINER)[0]
    assert lightning_on_gpu(ctx, site) is on_gpu



_TEXT_PIECES = ["eval(", ".eval(", "model.eval()", "sys.modules[__name__]", "_sys.modules [ __name__", "Fire(",
                "fire.Fire (", "globals()", "vars( )", "vars(x)", "__all__", "exec (", "CLI(", "getmembers(", "evaluate(",
                "my_eval(", "train", "train_", "_train", "trains", "é", "\n", " ", ".", "(", "'", "\\n"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(_TEXT_PIECES), max_size=12).map("".join))
def test_the_fast_text_searches_find_what_the_regular_expressions_find(text):
    """`unused`'s word counts and its search for a file that finds its own functions answer as
    `\\bname\\b` and the full pattern do."""
    assert _finds_its_functions(text) == bool(_DYNAMIC.search(text))
    for name in ("train", "eval", "modules", "é"):
        found = len(re.findall(rf"\b{re.escape(name)}\b", text))
        assert _count(name, text) == found and _has_word(name, text) is (found > 0)


_SHELL_PIECES = ["datasets=", "(", ")", "$train_set", " ", "x=", "'", '"', "python", "train.py", "--fp16", "=", "\\",
                 "`", "$(", "which", "a", "#", "&&", ";", "|", "<", ">", "{", "}", "${x}", "VAR=\"a b\"", "\t", "é"]


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(_SHELL_PIECES), max_size=14).map("".join))
def test_any_shell_line_splits_into_words_without_raising(line):
    """A launch file's line, whatever it holds (wavenet_vocoder's bash array `datasets=($a $b)`
    left `datasets=` as a word with an empty value), gives words or none: never an exception that
    would cost the training script its analysis."""
    words = _held_command(_words(line))
    assert all(isinstance(word, str) for word in words)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(_SHELL_PIECES), max_size=14).map("".join))
def test_a_shell_line_splits_as_a_posix_shell_lexer_splits_it(line):
    """Lines without quotes, escapes, comments or operators take a shortcut; the words are the
    ones shlex gives (what every line got before the shortcut)."""
    import shlex

    plain = _PLACEHOLDER.sub(_unknown, line.lstrip("$ ").strip())  # a README's `<placeholder>`
    lexer = shlex.shlex(plain, posix=True, punctuation_chars=True)
    lexer.commenters, lexer.whitespace_split = "#", True
    try:
        expected = list(lexer)
    except ValueError:  # an unclosed quote: split at blanks
        expected = plain.split()
    assert _words(line) == expected
