from __future__ import annotations

from collections import Counter

import libcst as cst

from speedfix.engine.findings import AddImport, Applicability, FixOp, LossCheck, RemoveImportIfUnused, Severity, Transform
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.fixes.codegen import append_args, keyword_arg, reference
from speedfix.fixes.removal import blank_lines_of_removed, call_removal, removal_ops
from speedfix.model.arguments import find_argument, literal_bool
from speedfix.model.attention import (DISPATCH_ATTRIBUTE, TWO_MASKS, UNKNOWN_MASK, AdditiveMask, Attention, CausalFill,
                                      attention_of, causal_mask_buffer, checks_against_reference, fast_path_gate,
                                      has_fast_path, is_default_scale, matmul_operands, may_cache_keys, mentions,
                                      moved_names_rebound, softmax_input, unwrap_mask, weights_multiplied_again,
                                      weights_used_elsewhere)
from speedfix.model.frames import Stack, class_of_method
from speedfix.model.index import CallSite
from speedfix.model.tensors import is_python_number
from speedfix.model.versions import v
from speedfix.syntax.nodes import code_of, walk_expression

SDPA = "torch.nn.functional.scaled_dot_product_attention"
KEY_CACHE = "the keys may be longer than the queries (a key/value cache), where `is_causal=True` masks differently"
WEIGHTS_USED = "the attention weights are also used elsewhere (returned or stored), and SDPA does not return them"
REBOUND = "a name the attention reads changes between its statements"
SCALE_TENSOR = "the scale may be a tensor, and SDPA's `scale=` takes a number"
SCALE_NEEDS = "a scale other than 1/sqrt(head_dim) needs `scale=`, which is torch 2.1 or newer"


class ManualAttention(Rule):
    """
    ## What it does
    Finds attention written by hand: `softmax(q @ k.transpose(-2, -1) * scale [+ mask]) [dropout]
    @ v`, in one expression or over several statements on the same variable, as in nanoGPT's and
    minGPT's `CausalSelfAttention` (`att = (q @ k.transpose(-2, -1)) * (1.0 /
    math.sqrt(k.size(-1)))`, `att = att.masked_fill(self.bias[:, :, :T, :T] == 0,
    float("-inf"))`, `att = F.softmax(att, dim=-1)`, `att = self.attn_dropout(att)`, `y = att @
    v`). `torch.matmul`, `k.mT`, keys transposed into a variable of their own, `/ math.sqrt(d)`,
    `att.softmax(dim=-1)`, an `nn.Softmax(dim=-1)` module, a mask filled in place
    (`att.masked_fill_(...)`) and `F.dropout` count too, and so does a two-operand `torch.einsum`
    whose first product sums over the head dimension into `(..., queries, keys)` and whose second
    sums the values over the keys (`einsum("b i d, b j d -> b i j", q, k)`, then `einsum("b i j,
    b j d -> b i d", attn, v)`), as diffusion U-Nets write it; and so does `torch.bmm`: `softmax(bmm(q, k)) @ v` is
    attention whatever the layout of `k` (self-attention over a feature map's pixels reshapes the
    keys to `(B, C, H*W)` beforehand; SDPA takes them as `k.transpose(1, 2)`), also with the output
    kept channels-first, `bmm(v, attn.permute(0, 2, 1))` (SAGAN's self-attention layer; also with
    the weights transposed a statement before, and a softmax over `dim=2`, the last dimension of
    `bmm`'s 3-D scores, as the attention blocks of diffusion U-Nets write it). An added bias
    (a relative position table, as in windowed attention) is an additive mask, which SDPA's
    `attn_mask` takes; a softmax in a branch of an `if` whose result is multiplied into the
    values after it is read along that branch (one finding per attention). Attention in a function or class that also calls
    `F.scaled_dot_product_attention` (or FlashAttention, xFormers) is a fallback and is left
    alone, as are Hugging Face models, which pick their attention at run time
    (`attn_implementation`), and attention in a function that compares results (`assert
    torch.allclose(kernel(q, k, v), expected)`: a kernel's test, whose hand-written attention is
    the reference).

    ## Why is this bad?
    The hand-written version materialises the `T x T` score matrix and reads and writes it
    several times (scale, mask, softmax, dropout), in memory that grows with the square of the
    sequence length, and keeps it for the backward pass. `F.scaled_dot_product_attention` (torch
    2.0) runs the whole computation as one fused kernel (FlashAttention or memory-efficient
    attention on GPUs, a fused kernel on CPUs) that never stores the matrix. `torch.compile`
    rewrites some of these patterns into it by itself, those its pattern list knows; a model
    that is not compiled gets none of it.

    ## Example
    ```python
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    att = self.attn_dropout(att)
    y = att @ v
    ```

    ## Use instead
    ```python
    y = F.scaled_dot_product_attention(
        q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0, is_causal=True,
    )
    ```

    ## Fix safety
    Unsafe: a different kernel rounds differently, and attention dropout draws its random mask
    inside the kernel, so the loss moves within seed-to-seed noise. The fix is made only when the
    result is provably the same computation: no mask, an additive mask (`+ mask`, passed as
    `attn_mask=`), or a causal one (a `torch.tril(torch.ones(...))` buffer registered in the
    class, sliced `[..., :T, :T]`, compared `== 0` and filled with `-inf`: `is_causal=True`); the
    dropout an `nn.Dropout` module of the class (`dropout_p=self.<module>.p if self.training else
    0.0`, so a `p` changed later still counts) or `F.dropout`. A scale that is not
    `1/sqrt(head_dim)` (`k.size(-1)`, `q.shape[-1]`) is passed as `scale=` (torch 2.1; a query
    scaled beforehand gets `scale=1.0`). Everything else is reported without a fix: attention
    written with `torch.einsum` (its subscripts may put the tokens anywhere, `"bct,bcs->bts"`
    keeps the channels first, and SDPA wants `(..., tokens, dim)`), the weights
    also returned or stored (for visualisation), keys laid out transposed beforehand, values
    multiplied first with the weights transposed (a channels-first output), an `assert`
    or `print` that reads the scores between the steps, a mask that is not provably causal, steps under
    an `if`, dtype casts around the softmax, two masks, and a causal mask where the keys may
    outnumber the queries (a key/value cache: with one new token `[:T, :T]` masks nothing, while
    `is_causal=True` would hide all but the first key). Weights that also go into another
    product (relative-position attention, VITS's and Music Transformer's: the probabilities, or
    what is made of them, multiplied with relative value embeddings and added to the output) are
    part of what the layer computes and SDPA cannot give them: not reported.

    The causal mask buffer stays: buffers are persistent by default, so it is in every saved
    `state_dict`, and without it `load_state_dict` of an existing checkpoint fails on an
    unexpected key (strict loading is the default). It costs `T x T` memory per layer and no
    time; delete it by hand if no old checkpoint needs loading. A buffer registered with
    `persistent=False` is not in checkpoints and is removed when nothing else reads it. The
    `nn.Softmax`/`nn.Dropout` modules stay too (no parameters; the dropout's `p` is read).

    ## Impact
    High: attention is a large share of a transformer's time and memory. Nothing moves it.

    ## Measured effect
    FlashAttention's paper: GPT-2 training 3x faster at sequence length 1K, BERT-large 15% end to
    end. On one H100 (torch 2.11), the forward and backward pass of the bundled GPT fixture's
    causal attention (12 heads of 64, batch 32) took 1.44 ms written by hand and 0.49 ms with
    SDPA at T=256 in fp16 (3x, 616 against 353 MiB), and 3.5 against 0.56 ms at T=1024, batch 8
    (6x, 1.6 GiB against 357 MiB); on a CPU core, 1.3-2x. What a whole training step gains
    depends on the share of attention in it, which grows with the sequence length: measure it
    with `speedfix bench`.
    Sources: https://arxiv.org/abs/2205.14135,
    https://pytorch.org/tutorials/intermediate/scaled_dot_product_attention_tutorial.html,
    https://github.com/pytorch/pytorch/blob/main/torch/_inductor/fx_passes/fuse_attention.py
    """

    impact = "high"
    code = "SF503"
    name = "manual-attention"
    summary = "Attention written by hand (`softmax(q @ k.T) @ v`) instead of `F.scaled_dot_product_attention`"
    severity = Severity.WARNING
    requires = (b"softmax", b"Softmax")
    fix_applicability = Applicability.UNSAFE
    # SDPA's kernel rounds differently and draws the dropout mask itself: judged by the seed band.
    loss_check = LossCheck.RNG
    fix_title = "Use `F.scaled_dot_product_attention`"
    min_torch = v("2.0")
    effect = "One fused kernel, no T x T matrix: attention 3-6x faster on an H100; GPT-2 3x (FlashAttention)."

    VALID = [
        Valid(  # relative-position attention (VITS): the probabilities also weigh relative value embeddings
            """
            import torch
            from torch import nn

            class RelativeAttention(nn.Module):
                def forward(self, q, k, v):
                    scores = torch.bmm(q, k.transpose(1, 2)) * self.scale
                    probs = nn.functional.softmax(scores, dim=-1)
                    out = torch.bmm(probs, v)
                    relative = self.to_relative(probs)
                    out += torch.matmul(relative, self.rel_v)
                    return out
            """
        ),
        Valid(  # so-vits-svc (VITS): the probabilities go to a helper that multiplies them with relative values
            """
            import math
            import torch
            from torch import nn
            from torch.nn import functional as F

            class MultiHeadAttention(nn.Module):
                def attention(self, query, key, value):
                    scores = torch.matmul(query / math.sqrt(self.k_channels), key.transpose(-2, -1))
                    p_attn = self.drop(F.softmax(scores, dim=-1))
                    output = torch.matmul(p_attn, value)
                    if self.window_size is not None:
                        relative_weights = self._absolute_position_to_relative_position(p_attn)
                        output = output + self._matmul_with_relative_values(relative_weights, self.emb_rel_v)
                    return output

                def _matmul_with_relative_values(self, x, y):
                    return torch.matmul(x, y.unsqueeze(0))
            """
        ),
        Valid(  # a softmax over dim 2 of 4-D scores normalises over the queries: no attention SDPA computes
            """
            import torch

            def pool(q, k, v):
                weights = torch.softmax(q @ k.transpose(-2, -1), dim=2)
                return weights @ v
            """
        ),
        Valid(  # a kernel's test: attention written by hand is the reference it checks the kernel against
            """
            import torch

            def test_attention_kernel(q, k, v, kernel):
                scores = torch.softmax(q @ k.transpose(-2, -1) * q.size(-1) ** -0.5, dim=-1)
                expected = scores @ v
                assert torch.allclose(kernel(q, k, v), expected, atol=1e-2)
            """
        ),
        Valid(  # nanoGPT: the manual branch is the fallback for torch < 2.0
            """
            import math
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class CausalSelfAttention(nn.Module):
                def forward(self, q, k, v, T):
                    if self.flash:
                        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    else:
                        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                        att = F.softmax(att, dim=-1)
                        y = att @ v
                    return y
            """
        ),
        Valid(  # a softmax whose result is not multiplied into values
            """
            import torch.nn.functional as F
            def forward(self, x):
                probs = F.softmax(self.head(x) @ self.w.transpose(-2, -1), dim=-1)
                return probs.argmax(-1)
            """
        ),
        Valid(  # softmax over another dimension
            """
            import torch
            def pool(q, k, v):
                return torch.softmax(q @ k.transpose(-2, -1), dim=1) @ v
            """
        ),
        Valid(  # Hugging Face: the eager function is one of the implementations picked at run time
            """
            import torch
            from torch import nn

            def eager_attention_forward(module, query, key, value, attention_mask, **kwargs):
                attn_weights = torch.matmul(query, key.transpose(-1, -2)) * module.scaling
                attn_weights = nn.functional.softmax(attn_weights, dim=-1)
                return torch.matmul(attn_weights, value), attn_weights

            class Attention(nn.Module):
                def forward(self, q, k, v, mask):
                    attention_interface = eager_attention_forward
                    if self.config._attn_implementation != "eager":
                        attention_interface = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
                    return attention_interface(self, q, k, v, mask)
            """
        ),
        Valid(  # the einsum sums over the queries, not over the keys the softmax normalised
            """
            import torch

            def mix(q, k, v):
                w = torch.softmax(torch.einsum("b i d, b j d -> b i j", q, k), dim=-1)
                return torch.einsum("b i j, b i d -> b j d", w, v)
            """
        ),
        Valid(  # SDPA came with torch 2.0
            """
            import torch.nn.functional as F
            def attend(q, k, v):
                return F.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
            """,
            torch="1.13",
        ),
    ]
    INVALID = [
        Invalid(  # a mask made to the scores' shape between the steps: found; the fix would remove what it reads
            """
            import math
            import torch
            import torch.nn.functional as F

            class Attention(torch.nn.Module):
                def forward(self, q, k, v, lengths):
                    w = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.size(-1))
                    keys = torch.arange(w.size(-1), device=w.device).expand_as(w)
                    w = w.masked_fill(keys >= lengths[:, None, None], float("-inf"))
                    return torch.bmm(F.softmax(w, dim=-1), v)

            model = Attention().cuda()
            """
        ),
        Invalid(  # attention over a feature map's pixels, output kept channels-first: `bmm(v, weights.permute(0, 2, 1))`
            """
            import torch
            import torch.nn as nn

            class PixelAttention(nn.Module):
                def __init__(self, channels):
                    super().__init__()
                    self.q = nn.Conv2d(channels, channels // 8, 1)
                    self.k = nn.Conv2d(channels, channels // 8, 1)
                    self.v = nn.Conv2d(channels, channels, 1)
                    self.weigh = nn.Softmax(dim=-1)

                def forward(self, x):
                    b, c, h, w = x.shape
                    query = self.q(x).flatten(2).permute(0, 2, 1)
                    key = self.k(x).flatten(2)
                    weights = self.weigh(torch.bmm(query, key))
                    mixed = torch.bmm(self.v(x).flatten(2), weights.permute(0, 2, 1))
                    return x + mixed.view(b, c, h, w)
            """,
        ),
        Invalid(  # a U-Net's attention block: softmax over dim 2 of `bmm`'s scores, weights transposed a line before
            """
            import torch
            import torch.nn as nn

            class SpatialSelfAttention(nn.Module):
                def __init__(self, channels):
                    super().__init__()
                    self.to_q = nn.Conv2d(channels, channels, 1)
                    self.to_k = nn.Conv2d(channels, channels, 1)
                    self.to_v = nn.Conv2d(channels, channels, 1)

                def forward(self, x):
                    b, c, h, w = x.shape
                    q = self.to_q(x).reshape(b, c, h * w).permute(0, 2, 1)
                    k = self.to_k(x).reshape(b, c, h * w)
                    scores = torch.bmm(q, k) * c ** -0.5
                    scores = torch.softmax(scores, dim=2)
                    v = self.to_v(x).reshape(b, c, h * w)
                    scores = scores.permute(0, 2, 1)
                    out = torch.bmm(v, scores)
                    return x + out.reshape(b, c, h, w)
            """,
        ),
        Invalid(  # the fused path only behind a flag that is off by default (llm.c's `--flash 0`)
            """
            import argparse
            import math
            import torch
            import torch.nn.functional as F

            FLASH = 0

            class CausalSelfAttention(torch.nn.Module):
                def __init__(self, block_size):
                    super().__init__()
                    self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

                def forward(self, q, k, v):
                    T = q.size(2)
                    if FLASH:
                        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    else:
                        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                        att = F.softmax(att, dim=-1)
                        y = att @ v
                    return y

            if __name__ == "__main__":
                parser = argparse.ArgumentParser()
                parser.add_argument("--flash", type=int, default=0)
                args = parser.parse_args()
                FLASH = args.flash
            """,
            fixed="""
            import argparse
            import torch
            import torch.nn.functional as F

            FLASH = 0

            class CausalSelfAttention(torch.nn.Module):
                def __init__(self, block_size):
                    super().__init__()
                    self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

                def forward(self, q, k, v):
                    T = q.size(2)
                    if FLASH:
                        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    else:
                        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    return y

            if __name__ == "__main__":
                parser = argparse.ArgumentParser()
                parser.add_argument("--flash", type=int, default=0)
                args = parser.parse_args()
                FLASH = args.flash
            """,
        ),
        Invalid(  # minGPT: causal tril buffer, nn.Dropout, 1/sqrt(head_dim); the buffer stays, `math` goes
            """
            import math
            import torch
            import torch.nn as nn
            from torch.nn import functional as F

            class CausalSelfAttention(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.attn_dropout = nn.Dropout(config.attn_pdrop)
                    self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                                                 .view(1, 1, config.block_size, config.block_size))

                def forward(self, q, k, v):
                    B, nh, T, hs = q.size()
                    # causal self-attention
                    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                    att = att.masked_fill(self.bias[:,:,:T,:T] == 0, float('-inf'))
                    att = F.softmax(att, dim=-1)
                    att = self.attn_dropout(att)
                    y = att @ v  # (B, nh, T, hs)
                    return y
            """,
            fixed="""
            import torch
            import torch.nn as nn
            from torch.nn import functional as F

            class CausalSelfAttention(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.attn_dropout = nn.Dropout(config.attn_pdrop)
                    self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                                                 .view(1, 1, config.block_size, config.block_size))

                def forward(self, q, k, v):
                    B, nh, T, hs = q.size()
                    # causal self-attention
                    y = F.scaled_dot_product_attention(
                        q,
                        k,
                        v,
                        dropout_p=self.attn_dropout.p if self.training else 0.0,
                        is_causal=True,
                    )  # (B, nh, T, hs)
                    return y
            """,
        ),
        Invalid(  # a scale kept in a local, a non-persistent buffer: both go, and `import math`
            """
            import math
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Attention(nn.Module):
                def __init__(self, n):
                    super().__init__()
                    mask = torch.tril(torch.ones(n, n))
                    self.register_buffer("mask", mask.view(1, 1, n, n), persistent=False)

                def forward(self, q, k, v, T):
                    scale = 1.0 / math.sqrt(k.size(-1))
                    att = (q @ k.transpose(-2, -1)) * scale
                    att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
                    att = F.softmax(att, dim=-1)
                    return att @ v
            """,
            fixed="""
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Attention(nn.Module):
                def __init__(self, n):
                    super().__init__()

                def forward(self, q, k, v, T):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            """,
        ),
        Invalid(  # one expression, an additive mask, a scale of its own, F.dropout, `F` imported
            """
            import torch

            def attend(q, k, v, mask, training):
                w = torch.nn.functional.dropout(torch.softmax(q @ k.mT / 8 + mask, dim=-1), p=0.1, training=training)
                return torch.matmul(w, v)
            """,
            fixed="""
            import torch
            import torch.nn.functional as F

            def attend(q, k, v, mask, training):
                return F.scaled_dot_product_attention(
                    q,
                    k,
                    v,
                    attn_mask=mask,
                    dropout_p=0.1 if training else 0.0,
                    scale=1 / 8,
                )
            """,
        ),
        Invalid(  # timm style: no mask, q scaled beforehand, the output reshaped in place
            """
            import torch.nn as nn
            import torch.nn.functional as F

            class Attention(nn.Module):
                def __init__(self, dim, attn_drop=0.0):
                    super().__init__()
                    self.scale = (dim // 8) ** -0.5
                    self.attn_drop = nn.Dropout(attn_drop)

                def forward(self, q, k, v, B, N, C):
                    attn = (q @ k.transpose(-2, -1)) * self.scale
                    attn = attn.softmax(dim=-1)
                    attn = self.attn_drop(attn)
                    return (attn @ v).transpose(1, 2).reshape(B, N, C)
            """,
            fixed="""
            import torch.nn as nn
            import torch.nn.functional as F

            class Attention(nn.Module):
                def __init__(self, dim, attn_drop=0.0):
                    super().__init__()
                    self.scale = (dim // 8) ** -0.5
                    self.attn_drop = nn.Dropout(attn_drop)

                def forward(self, q, k, v, B, N, C):
                    return F.scaled_dot_product_attention(
                        q,
                        k,
                        v,
                        dropout_p=self.attn_drop.p if self.training else 0.0,
                        scale=self.scale,
                    ).transpose(1, 2).reshape(B, N, C)
            """,
        ),
        Invalid(  # self-attention over the pixels of a feature map: `torch.bmm` with keys made `(B, C, HW)` by a reshape
            """
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class PixelAttention(nn.Module):
                def forward(self, feats):
                    n, c, h, w = feats.shape
                    queries = self.to_q(feats).flatten(2).transpose(1, 2)
                    keys = self.to_k(feats).flatten(2)
                    values = self.to_v(feats).flatten(2).transpose(1, 2)
                    logits = torch.bmm(queries, keys) / c ** 0.5
                    assert logits.shape[-1] == h * w
                    probs = F.softmax(logits, dim=-1)
                    mixed = torch.bmm(probs, values)
                    return mixed.transpose(1, 2).reshape(n, c, h, w)
            """,
        ),
        Invalid(  # windowed attention: a learned position bias added to the scores (SDPA's `attn_mask` carries it), the
            # softmax an `nn.Softmax` module named `softmax`, called in both branches of an `if`: one finding
            """
            import torch
            import torch.nn as nn

            class LocalWindowAttention(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.softmax = nn.Softmax(dim=-1)
                    self.attn_drop = nn.Dropout(0.0)

                def forward(self, q, k, v, pos_bias, shift_mask=None):
                    scores = q @ k.transpose(-2, -1)
                    scores = scores + pos_bias
                    if shift_mask is not None:
                        scores = self.softmax(scores + shift_mask)
                    else:
                        scores = self.softmax(scores)
                    scores = self.attn_drop(scores)
                    return scores @ v
            """,
        ),
        Invalid(  # vit-pytorch: an `nn.Softmax` module, `torch.matmul`, a scale from __init__
            """
            import torch
            from torch import nn

            class Attention(nn.Module):
                def __init__(self, dim_head=64, dropout=0.0):
                    super().__init__()
                    self.scale = dim_head ** -0.5
                    self.attend = nn.Softmax(dim=-1)
                    self.dropout = nn.Dropout(dropout)

                def forward(self, q, k, v):
                    dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale

                    attn = self.attend(dots)
                    attn = self.dropout(attn)

                    return torch.matmul(attn, v)
            """,
            fixed="""
            import torch
            from torch import nn
            import torch.nn.functional as F

            class Attention(nn.Module):
                def __init__(self, dim_head=64, dropout=0.0):
                    super().__init__()
                    self.scale = dim_head ** -0.5
                    self.attend = nn.Softmax(dim=-1)
                    self.dropout = nn.Dropout(dropout)

                def forward(self, q, k, v):
                    return F.scaled_dot_product_attention(
                        q,
                        k,
                        v,
                        dropout_p=self.dropout.p if self.training else 0.0,
                        scale=self.scale,
                    )
            """,
        ),
        Invalid(  # a buffer that `generate()` reads too stays, persistent or not
            """
            import math
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Attention(nn.Module):
                def __init__(self, n):
                    super().__init__()
                    self.register_buffer("causal", torch.tril(torch.ones(n, n, dtype=torch.bool)), persistent=False)

                def forward(self, q, k, v, T):
                    att = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
                    att = att.masked_fill(self.causal[:T, :T] == 0, -math.inf)
                    return att.softmax(dim=-1) @ v

                def generate(self, n):
                    return self.causal[:n, :n]
            """,
            fixed="""
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Attention(nn.Module):
                def __init__(self, n):
                    super().__init__()
                    self.register_buffer("causal", torch.tril(torch.ones(n, n, dtype=torch.bool)), persistent=False)

                def forward(self, q, k, v, T):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                def generate(self, n):
                    return self.causal[:n, :n]
            """,
        ),
        Invalid(  # `scale=` needs torch 2.1: reported, no fix
            """
            import torch.nn.functional as F

            def attend(q, k, v):
                return F.softmax(q @ k.transpose(-2, -1) / 8.0, dim=-1) @ v
            """,
            torch="2.0",
        ),
        Invalid(  # EdgeNeXt: a learned temperature is a tensor, and `scale=` takes a number
            """
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class XCA(nn.Module):
                def __init__(self, num_heads):
                    super().__init__()
                    self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))

                def forward(self, q, k, v):
                    attn = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)) * self.temperature
                    return attn.softmax(dim=-1) @ v
            """
        ),
        Invalid(  # keys from a cache can outnumber the queries: `is_causal=True` would mask differently
            """
            import math
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Attention(nn.Module):
                def __init__(self, n):
                    super().__init__()
                    self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))

                def forward(self, q, k, v, T, layer_past=None):
                    if layer_past is not None:
                        k = torch.cat((layer_past[0], k), dim=-2)
                        v = torch.cat((layer_past[1], v), dim=-2)
                    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                    att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                    return F.softmax(att, dim=-1) @ v
            """
        ),
        Invalid(  # the weights are returned for visualisation: reported, no fix
            """
            import torch.nn.functional as F

            def attend(q, k, v):
                att = F.softmax(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5, dim=-1)
                return att @ v, att
            """
        ),
        Invalid(  # a padding mask is not provably causal: reported, no fix
            """
            import math
            import torch.nn.functional as F

            def attend(q, k, v, pad):
                scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
                scores = scores.masked_fill(pad == 0, float("-inf"))
                return F.softmax(scores, dim=-1) @ v
            """
        ),
        Invalid(  # keys transposed into a variable of their own: it goes with the attention
            """
            import math
            import torch.nn.functional as F

            def attend(q, k, v):
                keys_t = k.transpose(-2, -1)
                weights = F.softmax(q @ keys_t / math.sqrt(q.size(-1)), dim=-1)
                return weights @ v
            """,
            fixed="""
            import torch.nn.functional as F

            def attend(q, k, v):
                return F.scaled_dot_product_attention(q, k, v)
            """,
        ),
        Invalid(  # a causal mask filled in place: the same computation, fixed
            """
            import math
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Attn(nn.Module):
                def __init__(self, n):
                    super().__init__()
                    self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))

                def forward(self, q, k, v):
                    T = q.size(2)
                    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                    att.masked_fill_(self.bias[:, :, :T, :T] == 0, float("-inf"))
                    return F.softmax(att, dim=-1) @ v
            """,
            fixed="""
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Attn(nn.Module):
                def __init__(self, n):
                    super().__init__()
                    self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))

                def forward(self, q, k, v):
                    T = q.size(2)
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            """,
        ),
        Invalid(  # a mask filled in place, the scale after it: reported, no fix
            """
            import torch
            import torch.nn as nn

            class Heads(nn.Module):
                def __init__(self, n, p):
                    super().__init__()
                    self.drop = nn.Dropout(p)
                    self.register_buffer("upper", torch.triu(torch.ones(n, n), diagonal=1))

                def forward(self, q, k, v):
                    t = q.shape[2]
                    scores = q @ k.transpose(2, 3)
                    scores.masked_fill_(self.upper.bool()[:t, :t], -torch.inf)
                    weights = self.drop(torch.softmax(scores / k.shape[-1] ** 0.5, dim=-1))
                    return weights @ v
            """
        ),
        Invalid(  # einsum attention (diffusion U-Nets, cross-attention): reported, no fix for its layouts
            """
            import torch
            from torch import einsum

            class CrossAttn(torch.nn.Module):
                def forward(self, q, k, v):
                    sim = einsum("b i d, b j d -> b i j", q, k) * self.scale
                    return einsum("b i j, b j d -> b i d", sim.softmax(dim=-1), v)
            """
        ),
        Invalid(  # einsum over channels-first tensors, a float32 softmax: reported, no fix
            """
            import torch as th

            def qkv_attention(q, k, v, scale):
                weight = th.einsum("bct,bcs->bts", q * scale, k * scale)
                weight = th.softmax(weight.float(), dim=-1).type(weight.dtype)
                return th.einsum("bts,bcs->bct", weight, v)
            """
        ),
        Invalid(  # Llama style: the mask under an `if`, casts around the softmax: reported, no fix
            """
            import math
            import torch
            import torch.nn.functional as F

            def attend(xq, keys, values, mask, head_dim):
                scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(head_dim)
                if mask is not None:
                    scores = scores + mask
                scores = F.softmax(scores.float(), dim=-1).type_as(xq)
                return torch.matmul(scores, values)
            """
        ),
    ]

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self._attributes: Counter[str] = Counter()  # `<anything>.<attr>` reads, by attribute name

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._attributes[node.attr.value] += 1

    def finish(self) -> None:
        if self._attributes[DISPATCH_ATTRIBUTE]:
            return
        sites = [site for site in self.ctx.calls if softmax_input(self.ctx, site.node, class_of_method(site.stack))]
        outputs: set[int] = set()  # one finding per attention, whichever branch's softmax leads to it
        for site in sites:
            found = attention_of(self.ctx, site)
            if found is not None and not has_fast_path(self.ctx, site.stack) and id(found[0].output) not in outputs \
                    and not checks_against_reference(self.ctx, site.stack) \
                    and not weights_multiplied_again(found[0], self.ctx.function_of(site.stack) or self.ctx.module):
                outputs.add(id(found[0].output))
                self._report(site, found)

    # ------------------------------------------------------------------ reporting
    def _report(self, site: CallSite, found: tuple[Attention, list[cst.BaseStatement], int]) -> None:
        attention, block, index = found
        message = ("attention written by hand: `F.scaled_dot_product_attention` computes it in one fused "
                   "kernel without storing the T x T score matrix")
        gate = fast_path_gate(self.ctx, site.stack)
        if gate is not None:
            message += f"; the fused path runs only when `{gate}`, which is off by default"
        plan = _Fix(self, attention, block, index, site.stack)
        reason = plan.refusal()
        if reason is not None:
            self.report(site.node, message, no_fix_reason=reason)
            return
        self.report(site.node, message, fix_ops=plan.ops())


class _Fix:
    """What the fix needs to know about one attention, and the operations that make it."""

    def __init__(self, rule: ManualAttention, attention: Attention, block: list[cst.BaseStatement], index: int,
                 stack: Stack) -> None:
        self.rule = rule
        self.ctx = rule.ctx
        self.attention = attention
        self.block = block
        self.index = index
        self.stack = stack
        self.scope: cst.CSTNode = self.ctx.function_of(stack) or self.ctx.module
        self.buffer: CallSite | None = None  # the causal mask's register_buffer call

    # ------------------------------------------------------------------ may it be fixed?
    def refusal(self) -> str | None:
        attention = self.attention
        if attention.problems:
            return attention.problems[0]
        if len(attention.masks) > 1:
            return TWO_MASKS
        mask = attention.masks[0] if attention.masks else None
        if isinstance(mask, CausalFill):
            self.buffer = causal_mask_buffer(self.ctx, mask.buffer, self.stack)
            if self.buffer is None:
                return UNKNOWN_MASK
            if may_cache_keys(self.ctx, attention, self.scope):
                return KEY_CACHE
        if weights_used_elsewhere(attention, self.scope):
            return WEIGHTS_USED
        if moved_names_rebound(attention, self.block, self.index):
            return REBOUND
        scale = self._scale()
        if scale is not None and self.ctx.torch_version < v("2.1"):
            return SCALE_NEEDS
        factor = self.attention.factors[0] if self.attention.factors else None
        if scale is not None and factor is not None and not is_python_number(self.ctx, factor.meaning, self.stack):
            return SCALE_TENSOR
        return None

    # ------------------------------------------------------------------ the new call
    def _scale(self) -> str | None:
        """The `scale=` value, or None for SDPA's default 1/sqrt(head_dim)."""
        factors = self.attention.factors
        if not factors:
            return "1.0"
        factor = factors[0]
        if is_default_scale(self.ctx, self.attention, factor):
            return None
        value = factor.value.with_changes(lpar=[], rpar=[])
        if not factor.divide:
            return code_of(value)
        atomic = isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float))
        return f"1 / {code_of(value) if atomic else '(' + code_of(value) + ')'}"

    def _dropout(self) -> str | None:
        dropout = self.attention.dropout
        if dropout is None:
            return None
        if dropout.module is not None:
            return f"{dropout.module}.p if self.training else 0.0"
        assert dropout.p is not None
        p = code_of(dropout.p)
        if isinstance(dropout.p, cst.IfExp):
            p = f"({p})"
        if dropout.training is None or (isinstance(dropout.training, cst.Name) and dropout.training.value == "True"):
            return p
        if isinstance(dropout.training, cst.Name) and dropout.training.value == "False":
            return None
        return f"{p} if {code_of(dropout.training)} else 0.0"

    def _keywords(self) -> list[cst.Arg]:
        mask = self.attention.masks[0] if self.attention.masks else None
        pairs = [
            ("attn_mask", code_of(mask.value) if isinstance(mask, AdditiveMask) else None),
            ("dropout_p", self._dropout()),
            ("is_causal", "True" if isinstance(mask, CausalFill) else None),
            ("scale", self._scale()),
        ]
        return [keyword_arg(name, value) for name, value in pairs if value is not None]

    # ------------------------------------------------------------------ operations
    def ops(self) -> list[FixOp]:
        ops: list[FixOp] = []
        function = _sdpa_name(self.ctx, ops, self.stack)
        attention = self.attention
        assert attention.query is not None and attention.key is not None
        query, key, keywords = attention.query, attention.key, self._keywords()
        indent = self.ctx.module.default_indent

        def rewrite(updated: cst.CSTNode) -> cst.CSTNode:
            operands = matmul_operands(self.ctx, updated)
            value = operands[1] if operands is not None else attention.value
            call = cst.parse_expression(f"{function}()")
            assert isinstance(call, cst.Call)
            # all arguments appended to an empty call: wrapped one per line when it grows too long
            return append_args(call, cst.Arg(query), cst.Arg(key), cst.Arg(value), *keywords,  # type: ignore[arg-type]
                               indent=indent)

        ops.append(Transform(attention.output, rewrite))
        removed = [*attention.steps, *self._dead_scale()]
        for statement in removed:
            ops.extend(removal_ops(self.ctx, statement) or ())
        ops.extend(blank_lines_of_removed(self.block, removed))
        ops.extend(self._dead_buffer())
        if self.ctx.imports.bindings.get("math") == "math" and any(
            self.ctx.qualname(node) == "math.sqrt" for statement in removed for node in walk_expression(statement)
        ):
            ops.append(RemoveImportIfUnused("math"))  # removed only if nothing else uses it
        return ops

    def _dead_scale(self) -> list[cst.SimpleStatementLine]:
        """`scale = 1.0 / math.sqrt(k.size(-1))`, read only by the attention, goes with it."""
        factor = self.attention.factors[0] if self.attention.factors else None
        if factor is None or factor.definition is None or not is_default_scale(self.ctx, self.attention, factor):
            return []
        assert isinstance(factor.value, cst.Name)
        return [factor.definition] if mentions(self.scope, factor.value.value) == 2 else []

    def _dead_buffer(self) -> list[FixOp]:
        """A non-persistent mask buffer that nothing else reads goes too (a persistent one is
        in checkpoints: removing it would break loading them)."""
        site = self.buffer
        if site is None:
            return []
        persistent = find_argument(self.ctx, site, "persistent", 2).node
        if literal_bool(self.ctx, persistent, site.stack) is not False:
            return []
        mask = self.attention.masks[0]
        assert isinstance(mask, CausalFill)
        if self.rule._attributes[mask.buffer] != 1:  # our `self.<buffer>[...]` is its only read
            return []
        ops = list(call_removal(self.ctx, site) or ())
        tensor = find_argument(self.ctx, site, "tensor", 1).node
        tensor = unwrap_mask(tensor) if tensor is not None else None  # `mask.view(1, 1, n, n)`: `mask`
        builder = self.ctx.function_of(site.stack)
        if ops and isinstance(tensor, cst.Name) and builder is not None and mentions(builder, tensor.value) == 2:
            assignment = self.ctx.assignments_in_scope(tensor.value, site.stack)
            if len(assignment) == 1 and assignment[0].statement is not None:
                ops.extend(removal_ops(self.ctx, assignment[0].statement) or ())
        return ops


def _sdpa_name(ctx, ops: list[FixOp], stack: Stack) -> str:  # type: ignore[no-untyped-def]
    """`F.scaled_dot_product_attention` through the file's own alias of torch.nn.functional, or
    with `import torch.nn.functional as F` added where `F` is free; else as codegen spells it."""
    local = ctx.local_name_for(SDPA, stack)
    if local is not None and local.count(".") == 1:
        return local
    if "F" not in ctx.imports.bindings and ctx.free_for_import("F", stack):
        ops.append(AddImport("torch.nn.functional", asname="F"))
        return "F.scaled_dot_product_attention"
    return reference(ctx, SDPA, ops, stack)
