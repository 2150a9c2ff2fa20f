from __future__ import annotations

import re

import libcst as cst

from speedfix.engine.findings import Applicability, LossCheck, Severity, replace
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import same_quotes, value_replaced
from speedfix.model.arguments import string_value
from speedfix.model.attention import attentions_unused
from speedfix.model.frameworks import SET_ELSEWHERE
from speedfix.model.index import CallSite
from speedfix.syntax.nodes import walk_expression

_KEYWORD = "attn_implementation"
_ATTRIBUTES = ("attn_implementation", "_attn_implementation")
_LOADERS = ("from_pretrained", "from_config")
# Gemma 2/3 cap their attention logits, which SDPA cannot do: transformers asks for eager there.
_NEEDS_EAGER = re.compile(r"gemma", re.IGNORECASE)
_FLASH_CLAIM = re.compile(r"flash[\s_-]*(attention|attn)", re.IGNORECASE)
_MESSAGE_CALLS = frozenset({"print", "info", "warning", "warn", "debug", "log", "write"})


class HfEagerAttention(Rule):
    """
    ## What it does
    Finds Hugging Face models that run their attention in plain PyTorch ops:
    `from_pretrained(..., attn_implementation="eager")` (also `from_config`, a model config, or
    `config._attn_implementation = "eager"`), and scripts that announce FlashAttention while nothing
    in them selects an attention implementation (a "FlashAttention enabled" message after importing
    the model's attention class enables nothing).

    ## Why is this bad?
    "eager" computes `softmax(QK^T)V` with separate matmul, softmax and dropout kernels and
    stores the full attention matrix for the backward pass. `"sdpa"` calls
    `torch.nn.functional.scaled_dot_product_attention`, which dispatches to fused
    FlashAttention/memory-efficient kernels: less memory traffic, no seq x seq matrix, and longer
    sequences fit. transformers already uses SDPA by default where a model supports it, so a
    message claiming FlashAttention without `attn_implementation` describes that default, not
    FlashAttention-2. `"flash_attention_2"` can be faster still, especially for padded batches of
    variable-length text, but needs the `flash-attn` package, fp16/bf16 weights and an Ampere or
    newer GPU.

    Also finds `output_attentions=True` passed to a model on every step (in the training loop or a
    module's `forward`) whose attention weights are never used: SDPA cannot return them, so
    transformers falls back to eager attention in every layer for that call.

    Not reported: Gemma models (transformers recommends eager for their logit soft-capping) and
    scripts that use the attention weights they ask for with `output_attentions=True`, which SDPA
    does not return.

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="eager")
    ```

    ## Use instead
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="sdpa")
    ```

    ## Fix safety
    Unsafe: the fused kernels round differently, so results differ in the last bits; a model
    class without SDPA support raises `ValueError` when asked for it; attention weights are no
    longer available. The misleading message is reported without a fix: whether FlashAttention-2
    fits depends on the GPU, the dtype and the installed packages.

    ## Impact
    High: eager attention computes and stores the full score matrix. Nothing moves it.

    ## Measured effect
    Hugging Face's GPU training guide lists SDPA and FlashAttention among the changes that improve
    training speed and memory; the PyTorch 2.0 release measured fused SDPA kernels against the eager
    attention of its models.
    Sources: https://huggingface.co/docs/transformers/perf_train_gpu_one,
    https://pytorch.org/blog/accelerated-pytorch-2/
    """

    impact = "high"
    code = "SF903"
    name = "hf-eager-attention"
    summary = ('Hugging Face model run with eager attention (`attn_implementation="eager"`, unused '
               '`output_attentions=True`), or a FlashAttention claim that enables nothing')
    severity = Severity.WARNING
    requires = (b"eager", b"lash", b"output_attentions")
    fix_applicability = Applicability.UNSAFE
    loss_check = LossCheck.NUMERICS
    fix_title = 'Use PyTorch\'s fused attention (`attn_implementation="sdpa"`)'
    effect = "Fused attention kernels instead of matmul-softmax-matmul: less time and memory per step."

    VALID = [
        Valid(  # a warning that FlashAttention is missing claims nothing (nanoGPT)
            """
            import torch.nn.functional as F
            from transformers import GPT2LMHeadModel
            if not hasattr(F, "scaled_dot_product_attention"):
                print("WARNING: using slow attention. Flash Attention requires PyTorch >= 2.0")
            model = GPT2LMHeadModel.from_pretrained("gpt2")
            """
        ),
        Valid(
            """
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("gpt2", attn_implementation="sdpa")
            print("FlashAttention enabled")
            """
        ),
        Valid(  # chosen in the keyword arguments handed to from_pretrained (peft's sft utils)
            """
            import torch
            from transformers import AutoModelForCausalLM
            model_kwargs = {"dtype": torch.bfloat16}
            if use_flash_attn:
                print("Using flash attention")
                model_kwargs["attn_implementation"] = "flash_attention_2"
            model = AutoModelForCausalLM.from_pretrained(name, **model_kwargs)
            """
        ),
        Valid(  # Gemma: eager is transformers' own advice for training
            """
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("google/gemma-2-9b", attn_implementation="eager")
            """
        ),
        Valid(  # attention weights are needed
            """
            from transformers import AutoModel
            model = AutoModel.from_pretrained("bert-base-uncased", attn_implementation="eager")
            out = model(**batch, output_attentions=True)
            """
        ),
        Valid(  # the weights asked for every step feed an attention-distillation loss: eager is the price
            """
            import torch
            import transformers

            class Student(torch.nn.Module):
                def forward(self, ids):
                    out = self.encoder(ids, output_attentions=True)
                    return self.head(out.last_hidden_state[:, 0]), out.attentions
            """
        ),
        Valid(  # "eager" of something else
            """
            import torch
            run(mode="eager")
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            from transformers import AutoModelForCausalLM, Qwen2Config

            model = AutoModelForCausalLM.from_pretrained(name, attn_implementation='eager')
            config = Qwen2Config(hidden_size=64, attn_implementation="eager")
            config._attn_implementation = "eager"
            """,
            fixed="""
            from transformers import AutoModelForCausalLM, Qwen2Config

            model = AutoModelForCausalLM.from_pretrained(name, attn_implementation='sdpa')
            config = Qwen2Config(hidden_size=64, attn_implementation="sdpa")
            config._attn_implementation = "sdpa"
            """,
            count=3,
        ),
        Invalid(  # a classifier asks for the weights on every step, keeps the last layer's, and never reads them
            """
            import torch
            import transformers

            class Classifier(torch.nn.Module):
                def __init__(self, encoder, classes):
                    super().__init__()
                    self.encoder = encoder
                    self.head = torch.nn.Linear(encoder.config.hidden_size, classes)

                def forward(self, ids):
                    out = self.encoder(ids, output_attentions=True)
                    last = out.attentions[-1]
                    return self.head(out.last_hidden_state[:, 0])

            model = Classifier(transformers.AutoModel.from_pretrained("bert-base-uncased"), 2).cuda()
            """,
        ),
        Invalid(  # brief 003: importing the attention class "enables" FlashAttention
            """
            from transformers import Qwen2Config, Qwen2ForCausalLM

            model = Qwen2ForCausalLM(Qwen2Config())
            try:
                from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention
                print("FlashAttention enabled")
            except ImportError:
                print("FlashAttention not available, using standard attention")
            """,
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        if not any(target.startswith("transformers") for target in ctx.imports.bindings.values()):
            return
        unused = self._unused_attention_requests()
        if unused is None:
            return  # the weights are read: eager attention is the price
        for site in unused:
            self.report(site.node, "`output_attentions=True` makes transformers run eager attention (no SDPA or "
                        "FlashAttention) in every layer on every step, and the weights it returns are never used",
                        no_fix_reason="drop `output_attentions=True` (and the unused reads of `.attentions`)")
        for site in ctx.calls:
            self._check_call(site)
        for name, assignments in ctx.assignments.items():
            if name.rsplit(".", 1)[-1] in _ATTRIBUTES:
                for assignment in assignments:
                    value = assignment.value
                    if isinstance(value, cst.SimpleString) and value.evaluated_value == "eager":
                        self.report(value, f'`{name} = "eager"` runs attention as separate matmul and softmax kernels',
                                    fix_ops=[replace(value, same_quotes(value, "sdpa"))])
        self._check_claims()

    def _check_call(self, site: CallSite) -> None:
        for arg in site.node.args:
            if arg.keyword is None or arg.keyword.value != _KEYWORD:
                continue
            if string_value(self.ctx, arg.value, site.stack) != "eager" or self._gemma(site):
                return
            fix = None
            if isinstance(arg.value, cst.SimpleString):
                sdpa = same_quotes(arg.value, "sdpa")
                fix = [value_replaced(site.node, arg, sdpa)]
            self.report(arg, '`attn_implementation="eager"` runs attention as separate matmul and softmax kernels',
                        fix_ops=fix, no_fix_reason=SET_ELSEWHERE)

    def _gemma(self, site: CallSite) -> bool:
        texts = [str(node.evaluated_value) for node in walk_expression(site.node) if isinstance(node, cst.SimpleString)]
        return any(_NEEDS_EAGER.search(text) for text in [*texts, self.ctx.call_qualname(site) or ""])

    def _builds_model(self, site: CallSite) -> bool:
        """`AutoModelForCausalLM.from_pretrained(...)`, `.from_config(...)`, `Qwen2ForCausalLM(config)`."""
        func = site.node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _LOADERS:
            return True
        leaf = (self.ctx.call_qualname(site) or "").rpartition(".")
        return leaf[0].startswith("transformers") and ("For" in leaf[2] or leaf[2].endswith("Model"))

    def _unused_attention_requests(self) -> list[CallSite] | None:
        """The calls asking for attention weights (`output_attentions=True`) that run on every
        step and whose weights nothing reads; None when some call's weights are used."""
        ctx = self.ctx
        unused: list[CallSite] = []
        for site in ctx.calls:
            if not any(arg.keyword is not None and arg.keyword.value == "output_attentions"
                       and isinstance(arg.value, cst.Name) and arg.value.value == "True" for arg in site.node.args):
                continue
            if not attentions_unused(ctx, site):
                return None
            function = ctx.function_of(site.stack)
            if ctx.in_training_loop(site.stack) or (isinstance(function, cst.FunctionDef) and function.name.value == "forward"):
                unused.append(site)
        return unused

    def _check_claims(self) -> None:
        """A message that says FlashAttention is on, in a script that never chooses one."""
        ctx = self.ctx
        if not any(self._builds_model(site) for site in ctx.calls):
            return
        chooses = any(_chooses_attention(site) for site in ctx.calls) or any(
            name.rsplit(".", 1)[-1] in _ATTRIBUTES for name in ctx.assignments
        ) or self._names_the_key()
        if chooses:
            return
        for site in ctx.calls:
            if _message_call(site) and _claims_flash(site.node):
                self.report(
                    site.node,
                    "this message says FlashAttention is on, but nothing sets `attn_implementation`: "
                    "the model runs transformers' default attention",
                    severity=Severity.INFO,
                    no_fix_reason='choose it in `from_pretrained(..., attn_implementation=...)`: "sdpa" anywhere, '
                    '"flash_attention_2" with the flash-attn package, fp16/bf16 and an Ampere or newer GPU',
                )
                return  # one is enough: the other messages say the same


    def _names_the_key(self) -> bool:
        """`model_kwargs["attn_implementation"] = ...`, `{"attn_implementation": ...}`: chosen in a
        dict that reaches `from_pretrained(**model_kwargs)`."""
        return any(
            isinstance(node, cst.SimpleString) and node.evaluated_value in _ATTRIBUTES
            for assignments in (*self.ctx.item_assignments.values(), *self.ctx.assignments.values())
            for assignment in assignments
            for node in walk_expression(assignment.statement or assignment.value)
        )


def _chooses_attention(site: CallSite) -> bool:
    return any(arg.keyword is not None and arg.keyword.value == _KEYWORD for arg in site.node.args)


def _message_call(site: CallSite) -> bool:
    func = site.node.func
    name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else ""
    return name in _MESSAGE_CALLS


# Words that make a message about FlashAttention say it is on, and words that say it is not
# ("WARNING: using slow attention. Flash Attention requires PyTorch >= 2.0", nanoGPT).
_ON = re.compile(r"enabl|\bon\b|activ|\busing\b|\buse[sd]?\b|启用|开启|已", re.IGNORECASE)
_OFF = re.compile(r"\bnot\b|\bno\b|instead|unavailable|disabl|requires?\b|\bslow|warn|fall ?back|without|未|不", re.IGNORECASE)


def _claims_flash(call: cst.Call) -> bool:
    """The message names FlashAttention, says it is on, and does not say it is missing."""
    texts = [node.value for node in walk_expression(call) if isinstance(node, (cst.SimpleString, cst.FormattedStringText))]
    text = " ".join(texts)
    return bool(_FLASH_CLAIM.search(text) and _ON.search(text) and not _OFF.search(text))
