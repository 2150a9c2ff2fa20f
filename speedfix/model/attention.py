"""Attention written by hand, read back from its output.

``softmax(q @ k.transpose(-2, -1) * scale [+ mask | .masked_fill(...)]) [dropout] @ v``, in one
expression or spread over the statements of one block on the same variables, as in nanoGPT's
and minGPT's ``CausalSelfAttention``::

    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    att = self.attn_dropout(att)
    y = att @ v

``read_attention`` starts at the output (``att @ v``) and follows each variable to the plain
assignment that made it, earlier in the same block. What it recognises but cannot prove to be
exactly ``F.scaled_dot_product_attention`` (a step under an ``if``, a dtype cast, a mask that is
not provably causal, two masks) is kept as a *problem*: the rule reports it without a fix.

Around an attention, the model also answers what decides whether SDPA computes the same: is
there a fused path beside it already (``has_fast_path``), may its keys come from a key/value
cache (``may_cache_keys``), are its weights used elsewhere (``weights_used_elsewhere``), does a
name it reads change between its statements (``moved_names_rebound``), which
``register_buffer`` call holds its causal mask (``causal_mask_buffer``), and is its scale
SDPA's default 1/sqrt(head_dim) (``is_default_scale``). And of a model asked for its attention
weights (``output_attentions=True``): does anything read them (``attentions_unused``)?
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.arguments import find_argument
from speedfix.model.context import FileContext
from speedfix.model.flow import off_by_default
from speedfix.model.frames import Stack, class_of_method
from speedfix.model.index import CallSite
from speedfix.syntax.blocks import statement_owner
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import (bound_names, code_of, integer_value, number_value, target_names, walk_expression,
                                   walk_in_order)

SOFTMAX = ("torch.nn.functional.softmax", "torch.softmax")
SOFTMAX_MODULES = ("torch.nn.Softmax", "torch.nn.modules.activation.Softmax")
# qualified name -> (the probability's keyword, the training switch's keyword, default probability)
DROPOUT_FUNCTIONS = {
    "torch.nn.functional.dropout": ("p", "training", "0.5"),
    "torch.dropout": ("p", "train", None),
}
DROPOUT_MODULES = ("torch.nn.Dropout", "torch.nn.modules.dropout.Dropout")
MATMUL = ("torch.matmul", "torch.bmm")
EINSUM = "torch.einsum"
BMM = "torch.bmm"  # batched 3-D products: `(1, 2)` are its last two dimensions
# A function or class that calls one of these already has a fast path: its hand-written attention
# is the fallback (nanoGPT's `if self.flash: ... else: ...`, timm's `fused_attn`).
FAST_ATTENTION = ("scaled_dot_product_attention", "flash_attn_func", "flash_attn_qkvpacked_func",
                  "flash_attn_varlen_func", "memory_efficient_attention")
# Hugging Face models choose their attention function at run time (`config._attn_implementation`:
# "eager", "sdpa", "flash_attention_2"); their eager one exists to return the weights.
DISPATCH_ATTRIBUTE = "_attn_implementation"
_CONCATENATE = ("torch.cat", "torch.concat", "torch.concatenate")
# What a causal mask buffer may be wrapped in where it is built or read (`mask.view(1, 1, n, n)`).
_MASK_WRAPPERS = ("view", "reshape", "unsqueeze", "bool", "float", "byte", "int", "long", "to", "type", "contiguous")
_CASTS = ("float", "half", "bfloat16", "double", "type", "type_as", "to")

# Why a recognised attention gets no fix (the first one found is the finding's reason).
CONDITIONAL = "a step of the attention runs under a condition"
CAST = "the scores or weights are cast to another dtype"
UNKNOWN_MASK = "the mask is not provably causal (only a `torch.tril` buffer sliced `[:T, :T]` is)"
TWO_MASKS = "it applies two masks (SDPA takes one)"
SCALE_AFTER_MASK = "the scale is applied after the mask"
TWO_SCALES = "the scores are scaled twice"
UNKNOWN_DROPOUT = "the dropout's probability is not known (an `nn.Dropout` module or `F.dropout`)"
SOFTMAX_ARGS = "the softmax takes extra arguments"
KEYS_LAID_OUT = "the keys are already laid out `(batch, dim, tokens)` (SDPA takes them `(batch, tokens, dim)`)"
READ_BETWEEN = "another statement reads the scores or weights between the attention's steps"
VALUES_FIRST = ("the values come first and the weights transposed (`bmm(v, attn.permute(0, 2, 1))`, channels-first "
                "output): SDPA takes `v.transpose(1, 2)` and its output needs transposing back")
EINSUM_LAYOUT = "it is written with `einsum`, whose layouts the fix does not rewrite (SDPA takes `(..., tokens, dim)`)"
# In-place steps of the chain on the scores, read as `scores = scores.<method>(...)`.
_IN_PLACE = ("masked_fill_",)


@dataclass(frozen=True)
class Factor:
    """``scores * value`` (``divide``: ``scores / value``). A variable set once earlier in the
    block (``scale = 1.0 / math.sqrt(k.size(-1))``) also gives that statement and its value."""

    value: cst.BaseExpression
    divide: bool
    definition: cst.SimpleStatementLine | None = None
    resolved: cst.BaseExpression | None = None

    @property
    def meaning(self) -> cst.BaseExpression:
        return self.resolved if self.resolved is not None else self.value


@dataclass(frozen=True)
class CausalFill:
    """``scores.masked_fill(self.<buffer>[..., :T, :T] == 0, float("-inf"))``."""

    buffer: str  # the attribute: `bias`
    node: cst.Call


@dataclass(frozen=True)
class AdditiveMask:
    value: cst.BaseExpression


@dataclass(frozen=True)
class Dropout:
    module: str | None = None  # `self.attn_drop`, an nn.Dropout
    p: cst.BaseExpression | None = None  # functional dropout: its probability ...
    training: cst.BaseExpression | None = None  # ... and its `training` argument (None: always)


Mask = CausalFill | AdditiveMask


@dataclass
class Attention:
    output: cst.BaseExpression  # `att @ v` / `torch.matmul(att, v)`: what SDPA replaces
    softmax: cst.Call
    query: cst.BaseExpression | None = None
    key: cst.BaseExpression | None = None
    value: cst.BaseExpression | None = None
    factors: list[Factor] = field(default_factory=list)
    masks: list[Mask] = field(default_factory=list)
    dropout: Dropout | None = None
    steps: list[cst.SimpleStatementLine] = field(default_factory=list)  # chain statements before the output's
    first: int = 0  # index in the block of the first statement the chain reads
    chain_names: list[cst.Name] = field(default_factory=list)  # every mention of the chain's variables
    moved: list[cst.BaseExpression] = field(default_factory=list)  # code the fix moves to the output
    problems: list[str] = field(default_factory=list)
    batched: bool = False  # the raw scores are a `torch.bmm`: 3-D, their last dimension is 2

    def problem(self, reason: str) -> None:
        if reason not in self.problems:
            self.problems.append(reason)


def softmax_input(ctx: FileContext, call: cst.Call, cls: cst.ClassDef | None
                  ) -> tuple[cst.BaseExpression, bool] | None:
    """(input, whether it takes more arguments) of a softmax over the last dimension:
    `F.softmax(x, dim=-1)`, `x.softmax(-1)`, or `self.softmax(x)` with `self.softmax =
    nn.Softmax(dim=-1)` in the class ``cls``; also over dimension 2, the last of 3-D scores,
    which attention accepts only for scores a `torch.bmm` makes (``softmax_over_two``)."""
    parts = _softmax_parts(ctx, call, cls)
    if parts is None:
        return None
    data, rest = parts
    dim = argument(rest, "dim", 0)
    if not (_is_minus_one(dim) or _int(dim) == 2):
        return None
    return data, len(rest) > 1


def softmax_over_two(ctx: FileContext, call: cst.Call, cls: cst.ClassDef | None) -> bool:
    """Is ``call`` a softmax over dimension 2 (the last only of 3-D input)?"""
    parts = _softmax_parts(ctx, call, cls)
    return parts is not None and _int(argument(parts[1], "dim", 0)) == 2


def _softmax_parts(ctx: FileContext, call: cst.Call, cls: cst.ClassDef | None
                   ) -> tuple[cst.BaseExpression, Sequence[cst.Arg]] | None:
    """(input, the arguments that hold `dim`) of a softmax call or an `nn.Softmax` module's call."""
    func = call.func
    built = module_built_by(ctx, cls, dotted_name(func) or "")  # `self.softmax(x)` is a module, not a method
    if ctx.qualname(func) in SOFTMAX:
        data, rest = (call.args[0].value if call.args and not call.args[0].keyword else None), call.args[1:]
    elif isinstance(func, cst.Attribute) and func.attr.value == "softmax" and not ctx.qualname(func) and built is None:
        data, rest = func.value, call.args
    else:
        if built is None or ctx.qualname(built.func) not in SOFTMAX_MODULES:
            return None
        if len(call.args) != 1 or call.args[0].keyword:
            return None
        data, rest = call.args[0].value, built.args
    return (data, rest) if data is not None and rest else None


def module_built_by(ctx: FileContext, cls: cst.ClassDef | None, name: str) -> cst.Call | None:
    """The call that built `self.<attr>` (``name``), assigned exactly once in class ``cls``."""
    if cls is None or not name.startswith("self.") or name.count(".") != 1:
        return None
    found = [a for a in ctx.assignments.get(name, []) if any(f.node is cls for f in a.stack)]
    value = found[0].value if len(found) == 1 else None
    return value if isinstance(value, cst.Call) else None


def matmul_operands(ctx: FileContext, node: cst.CSTNode) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """``(a, b)`` for ``a @ b``, ``torch.matmul(a, b)`` and a two-operand ``torch.einsum`` that
    contracts one dimension (``einsum("b i d, b j d -> b i j", q, k)``)."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
        return node.left, node.right
    if isinstance(node, cst.Call) and ctx.qualname(node.func) in MATMUL:
        args = _positional(node, 2)
        if args is not None:
            return args[0], args[1]
    found = einsum_of(ctx, node)
    return (found[3], found[4]) if found is not None else None


def einsum_of(ctx: FileContext, node: cst.CSTNode
              ) -> tuple[str, str, str, cst.BaseExpression, cst.BaseExpression] | None:
    """(subscripts of a, of b, of the result, a, b) of ``torch.einsum("<a>,<b>-><result>", a, b)``
    that sums over exactly one dimension the two share (`...` reads as one batch subscript)."""
    if not isinstance(node, cst.Call) or ctx.qualname(node.func) != EINSUM:
        return None
    args = _positional(node, 3)
    if args is None or not isinstance(args[0], cst.SimpleString):
        return None
    spec = str(args[0].evaluated_value).replace(" ", "").replace("...", "*")
    inputs, arrow, result = spec.partition("->")
    parts = inputs.split(",")
    if not arrow or len(parts) != 2 or not all(parts) or not result:
        return None
    left, right = parts
    if any(len(set(subscripts)) != len(subscripts) for subscripts in (left, right, result)):
        return None  # a diagonal or a trace
    if len((set(left) & set(right)) - set(result)) != 1 or not set(result) <= set(left) | set(right):
        return None
    return left, right, result, args[1], args[2]


def _einsum_scores(left: str, right: str, result: str) -> bool:
    """Do the subscripts give scores `(..., queries, keys)`: the result ends with a dimension of
    the queries only and one of the keys only, and every other one is a batch dimension of both?"""
    if len(result) < 2:
        return False
    *batch, query, key = result
    return query in left and query not in right and key in right and key not in left and all(
        index in left and index in right for index in batch)


def _einsum_output(left: str, right: str, result: str) -> bool:
    """Do the subscripts weigh values by weights `(..., queries, keys)`: the sum runs over the
    weights' last dimension (the one the softmax normalised), and their queries stay?"""
    return len(left) >= 2 and (set(left) & set(right)) - set(result) == {left[-1]} and left[-2] in result


def read_attention(ctx: FileContext, block: Sequence[cst.BaseStatement], index: int,
                   output: cst.BaseExpression, stack: Stack) -> Attention | None:
    """The attention whose output is ``output``, an expression in ``block[index]`` (a block at
    ``stack``); None when ``output`` is not ``softmax(q @ kᵀ ...) @ v``."""
    operands = matmul_operands(ctx, output)
    if operands is None:
        return None
    weights, value = operands
    found = Attention(output=output, softmax=cst.Call(func=cst.Name("softmax")), value=value, first=index)
    einsum = einsum_of(ctx, output)
    if einsum is not None:
        if not _einsum_output(*einsum[:3]):
            return None
        found.problem(EINSUM_LAYOUT)
    softmax = _Reader(ctx, block, class_of_method(stack), found)._weights(weights, index)
    if softmax is None and einsum is None:
        # `bmm(v, attn.permute(0, 2, 1))`: the output transposed, `(batch, channels, tokens)`, as
        # self-attention over a feature map's pixels writes it (SAGAN, DANet's position attention)
        bmm = isinstance(output, cst.Call) and ctx.qualname(output.func) == BMM
        flipped, at = untransposed(ctx, value, batched=bmm), index
        if flipped is None and isinstance(value, cst.Name):  # `w_ = w_.permute(0, 2, 1)` a line before
            flipped, at = _transposed_earlier(ctx, block, value.value, index, bmm)
        if flipped is not None:
            found = Attention(output=output, softmax=found.softmax, value=weights, first=at)
            found.problem(VALUES_FIRST)
            softmax = _Reader(ctx, block, class_of_method(stack), found)._weights(flipped, at)
    if softmax is None:
        return None
    found.softmax = softmax
    return found


def _transposed_earlier(ctx: FileContext, block: Sequence[cst.BaseStatement], name: str, index: int,
                        bmm: bool) -> tuple[cst.BaseExpression | None, int]:
    """(what ``name`` transposes, where) when the statement before ``block[index]`` that last
    mentions ``name`` assigns it a transpose (`w_ = w_.permute(0, 2, 1)`); (None, ``index``)."""
    for earlier in range(index - 1, -1, -1):
        statement = block[earlier]
        if not mentions(statement, name):
            continue
        value = _assigned_value(statement, name)
        flipped = untransposed(ctx, value, batched=bmm) if value is not None else None
        return (flipped, earlier) if flipped is not None else (None, index)
    return None, index


class _Reader:
    """Reads the attention back from its output into ``found``."""

    def __init__(self, ctx: FileContext, block: Sequence[cst.BaseStatement], cls: cst.ClassDef | None,
                 found: Attention) -> None:
        self.ctx = ctx
        self.block = block
        self.cls = cls  # the class whose method holds the block
        self.found = found

    def _weights(self, expr: cst.BaseExpression, at: int) -> cst.Call | None:
        """softmax(scores) [dropout] [cast]: the softmax call, or None."""
        expr, at = self._peel(expr, at)
        attention = self.found
        if isinstance(expr, cst.Call):
            dropped = self._dropout(expr)
            if dropped is not None:
                if attention.dropout is not None:
                    return None
                attention.dropout, inner = dropped
                return self._weights(inner, at)
            scores = self._softmax_input(expr)
            if scores is not None and self._scores(scores, at):
                # over dimension 2: the last only of a `bmm`'s 3-D scores
                return expr if attention.batched or not softmax_over_two(self.ctx, expr, self.cls) else None
        return None

    def _softmax_input(self, call: cst.Call) -> cst.BaseExpression | None:
        found = softmax_input(self.ctx, call, self.cls)
        if found is None:
            return None
        data, extra = found
        if extra:
            self.found.problem(SOFTMAX_ARGS)
        return data

    def _dropout(self, call: cst.Call) -> tuple[Dropout, cst.BaseExpression] | None:
        """`self.attn_drop(x)` (an nn.Dropout, or a module named like one) or `F.dropout(x, p, training)`."""
        attention = self.found
        if not call.args or call.args[0].keyword or call.args[0].star:
            return None
        data, rest = call.args[0].value, call.args[1:]
        signature = DROPOUT_FUNCTIONS.get(self.ctx.qualname(call.func) or "")
        if signature is not None:
            p_name, training_name, p_default = signature
            p = argument(rest, p_name, 0) or (cst.Float(p_default) if p_default else None)
            if p is None:
                return None
            training = argument(rest, training_name, 1)
            attention.moved.extend(node for node in (p, training) if node is not None)
            return Dropout(p=p, training=training), data
        name = dotted_name(call.func)
        if name is None or "drop" not in name.rsplit(".", 1)[-1].lower() or rest:
            return None
        built = module_built_by(self.ctx, self.cls, name)
        if built is None or self.ctx.qualname(built.func) not in DROPOUT_MODULES:
            attention.problem(UNKNOWN_DROPOUT)
        return Dropout(module=name), data

    # ------------------------------------------------------------------ scores
    def _scores(self, expr: cst.BaseExpression, at: int) -> bool:
        """q @ kᵀ, scaled and masked in any order; True when it is one."""
        expr, at = self._peel(expr, at)
        attention = self.found
        raw = self._raw_scores(expr, at)
        if raw is not None:
            attention.query, attention.key = raw
            attention.moved.extend(raw)
            attention.first = min(attention.first, at)
            return True
        if isinstance(expr, cst.Call):
            filled = self._masked_fill(expr)
            if filled is not None:
                return self._scores(filled, at)
            where = self._where(expr)
            if where is not None:
                attention.problem(UNKNOWN_MASK)
                return self._scores(where, at)
            return False
        if not isinstance(expr, cst.BinaryOperation):
            return False
        if isinstance(expr.operator, cst.Add):
            for scores, mask in ((expr.left, expr.right), (expr.right, expr.left)):
                inner = self._scores_apart(scores, at)
                if inner is not None:
                    self._absorb(inner)
                    attention.masks.append(AdditiveMask(mask))
                    attention.moved.append(mask)
                    return True
            return False
        if isinstance(expr.operator, (cst.Multiply, cst.Divide)):
            divide = isinstance(expr.operator, cst.Divide)
            pairs = [(expr.left, expr.right)] if divide else [(expr.left, expr.right), (expr.right, expr.left)]
            for scores, value in pairs:
                inner = self._scores_apart(scores, at)
                if inner is not None:
                    if inner.masks:
                        attention.problem(SCALE_AFTER_MASK)
                    self._absorb(inner)
                    attention.factors.append(self._factor(value, divide, at))
                    attention.moved.append(value)
                    return True
        return False

    def _scores_apart(self, expr: cst.BaseExpression, at: int) -> Attention | None:
        """``expr`` read as scores into a record of its own (None: it is not): which operand of
        `+` or `*` is the scores decides which one is the mask or the scale. Each operand is read
        once, so nested sums cost linear time."""
        apart = Attention(output=self.found.output, softmax=self.found.softmax, first=self.found.first)
        return apart if _Reader(self.ctx, self.block, self.cls, apart)._scores(expr, at) else None

    def _absorb(self, apart: Attention) -> None:
        found = self.found
        found.query, found.key = apart.query, apart.key
        found.factors.extend(apart.factors)
        found.masks.extend(apart.masks)
        found.steps.extend(apart.steps)
        found.chain_names.extend(apart.chain_names)
        found.moved.extend(apart.moved)
        found.first = min(found.first, apart.first)
        found.batched = apart.batched
        for reason in apart.problems:
            found.problem(reason)

    def _factor(self, value: cst.BaseExpression, divide: bool, at: int) -> Factor:
        if isinstance(value, cst.Name):
            for index in range(at - 1, -1, -1):
                statement = self.block[index]
                if mentions(statement, value.value):
                    resolved = _assigned_value(statement, value.value)
                    if resolved is not None and isinstance(statement, cst.SimpleStatementLine):
                        return Factor(value, divide, statement, resolved)
                    break
        return Factor(value, divide)

    def _raw_scores(self, expr: cst.BaseExpression, at: int) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
        """`q @ k.transpose(-2, -1)`: (q, k), also with the transpose in a variable of its own
        (`k_t = k.transpose(2, 3)`). A `torch.bmm(q, k)` whose second operand is no visible
        transpose is still attention: its keys were laid out transposed beforehand
        (`k.view(B, C, H * W)` of a conv feature map), which SDPA takes as `k.transpose(1, 2)`.
        An `einsum` of scores is attention whatever its layout (reported without a fix)."""
        operands = matmul_operands(self.ctx, expr)
        if operands is None:
            return None
        einsum = einsum_of(self.ctx, expr)
        if einsum is not None:
            if not _einsum_scores(*einsum[:3]):
                return None
            self.found.problem(EINSUM_LAYOUT)
            return operands
        bmm = isinstance(expr, cst.Call) and self.ctx.qualname(expr.func) == BMM
        self.found.batched = bmm
        key = untransposed(self.ctx, operands[1], batched=bmm)
        if key is None and isinstance(operands[1], cst.Name):
            key = self._transposed_before(operands[1].value, at, bmm)
        if key is None and bmm:
            self.found.problem(KEYS_LAID_OUT)
            key = operands[1]
        return (operands[0], key) if key is not None else None

    def _transposed_before(self, name: str, at: int, bmm: bool) -> cst.BaseExpression | None:
        """``k`` for keys transposed into a variable of their own earlier in the block (`k_t =
        k.transpose(2, 3)`); the statement goes with the attention when nothing else reads it."""
        key, where = _transposed_earlier(self.ctx, self.block, name, at, bmm)
        statement = self.block[where]
        if key is None or not isinstance(statement, cst.SimpleStatementLine):
            return None
        self.found.first = min(self.found.first, where)
        if sum(mentions(other, name) for other in self.block) == 2:  # set here, read by the scores only
            self.found.steps.append(statement)
        return key

    def _masked_fill(self, call: cst.Call) -> cst.BaseExpression | None:
        """`scores.masked_fill(cond, value)`: the scores; records the mask."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in ("masked_fill", "masked_fill_")):
            return None
        args = _positional(call, 2)
        if args is None:
            return None
        attention = self.found
        buffer = _causal_condition(args[0])
        if buffer is None or not is_minus_inf(self.ctx, args[1]):
            buffer = ""
            attention.problem(UNKNOWN_MASK)
        attention.masks.append(CausalFill(buffer, call))
        return func.value

    def _where(self, call: cst.Call) -> cst.BaseExpression | None:
        """`torch.where(mask, scores, fill)`: the scores (a mask the rule cannot prove causal)."""
        if self.ctx.qualname(call.func) != "torch.where":
            return None
        args = _positional(call, 3)
        return args[1] if args is not None else None

    # ------------------------------------------------------------------ variables
    def _peel(self, expr: cst.BaseExpression, at: int) -> tuple[cst.BaseExpression, int]:
        """Follow variables and see through dtype casts (`.float()`, `.type_as(q)`: a problem)."""
        expr, at = self._resolve(expr, at)
        inner = _cast_operand(expr) if isinstance(expr, cst.Call) else None
        while inner is not None:
            self.found.problem(CAST)
            expr, at = self._resolve(inner, at)
            inner = _cast_operand(expr) if isinstance(expr, cst.Call) else None
        return expr, at

    def _resolve(self, expr: cst.BaseExpression, at: int) -> tuple[cst.BaseExpression, int]:
        """Follow a variable to the value it was last given by a plain assignment earlier in the
        block (``att += mask`` reads as ``att + mask``); anything else stays as it is."""
        attention = self.found
        while isinstance(expr, cst.Name):
            found = self._definition(expr.value, at)
            if found is None:
                return expr, at
            attention.chain_names.append(expr)
            expr, at = found
        return expr, at

    def _definition(self, name: str, before: int) -> tuple[cst.BaseExpression, int] | None:
        attention = self.found
        for index in range(before - 1, -1, -1):
            statement = self.block[index]
            if not mentions(statement, name):
                continue
            if isinstance(statement, cst.BaseCompoundStatement):
                attention.problem(CONDITIONAL)  # `if mask is not None: att = att + mask`
                continue
            value = _assigned_value(statement, name)
            if value is None and (_only_checks(statement, name) or _reads_shape_only(statement, name)):
                # `assert w.shape == ...`, a mask built to the scores' shape (`torch.arange(n).expand_as(w)`):
                # still the attention, but the fix would remove what the statement reads
                attention.problem(READ_BETWEEN)
                continue
            if value is None:
                return None  # unpacked, annotated, only read: not a step of the chain
            assert isinstance(statement, cst.SimpleStatementLine)
            attention.steps.append(statement)
            attention.chain_names.append(_target(statement))
            attention.first = min(attention.first, index)
            return value, index
        return None


def _assigned_value(statement: cst.BaseStatement, name: str) -> cst.BaseExpression | None:
    """`name = value` -> value; `name += x` -> `name + x` (likewise `*=` and `/=`); an in-place
    `name.masked_fill_(cond, x)` -> that call (read as `name.masked_fill(cond, x)`)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if _in_place_target(small) == name:
        assert isinstance(small, cst.Expr)
        return small.value
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target = small.targets[0].target
        if isinstance(target, cst.Name) and target.value == name:
            return small.value
    if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name) and small.target.value == name:
        operators = {cst.AddAssign: cst.Add, cst.MultiplyAssign: cst.Multiply, cst.DivideAssign: cst.Divide}
        operator = operators.get(type(small.operator))
        if operator is not None:
            return cst.BinaryOperation(left=small.target, operator=operator(), right=small.value)
    return None


# Calls that take only the shape (and dtype, device) of the tensor they are given, not its values.
_SHAPE_OF_ARGUMENT = frozenset({"expand_as", "view_as", "reshape_as"})
_LIKE = frozenset({"ones_like", "zeros_like", "empty_like", "full_like", "rand_like", "randn_like"})
_SHAPE_OF_RECEIVER = frozenset({"size", "dim"})
_METADATA = frozenset({"shape", "device", "dtype", "ndim"})


def _reads_shape_only(statement: cst.BaseStatement, name: str) -> bool:
    """`other = <expression>` that reads ``name`` only for its shape (or dtype, device):
    `x.expand_as(name)`, `torch.ones_like(name)`, `name.size(-1)`, `name.shape` (a mask made to
    the scores' shape)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if not isinstance(small, cst.Assign) or any(name in target_names(t.target) for t in small.targets):
        return False
    return _shape_reads(small.value, name)


def _shape_reads(node: cst.CSTNode, name: str) -> bool:
    """Whether every read of ``name`` in ``node`` is of its shape only."""
    if isinstance(node, cst.Name):
        return node.value != name
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == name:
        return node.attr.value in _METADATA
    if isinstance(node, cst.Call):
        func = node.func
        method = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
        if method in _SHAPE_OF_RECEIVER and isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) \
                and func.value.value == name:
            return all(_shape_reads(arg.value, name) for arg in node.args)
        given = node.args[0].value if node.args else None
        if (method in _SHAPE_OF_ARGUMENT or method in _LIKE) and isinstance(given, cst.Name) and given.value == name:
            rest = [arg.value for arg in node.args[1:]]
            receiver = [func.value] if method in _SHAPE_OF_ARGUMENT and isinstance(func, cst.Attribute) else []
            return all(_shape_reads(part, name) for part in (*receiver, *rest))
    return all(_shape_reads(child, name) for child in node.children)


def _only_checks(statement: cst.BaseStatement, name: str) -> bool:
    """An `assert` or `print(...)` line that reads ``name`` and binds nothing."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if isinstance(small, cst.Assert):
        return True
    return (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
            and isinstance(small.value.func, cst.Name) and small.value.func.value == "print")


def mentions(node: cst.CSTNode, name: str) -> int:
    """How often the name ``name`` occurs in ``node`` (read or written)."""
    return sum(isinstance(n, cst.Name) and n.value == name for n in walk_expression(node))


def _in_place_target(small: cst.BaseSmallStatement) -> str | None:
    """``x`` for a statement `x.masked_fill_(...)`."""
    call = small.value if isinstance(small, cst.Expr) else None
    func = call.func if isinstance(call, cst.Call) else None
    if isinstance(func, cst.Attribute) and func.attr.value in _IN_PLACE and isinstance(func.value, cst.Name):
        return func.value.value
    return None


def _target(statement: cst.SimpleStatementLine) -> cst.Name:
    small = statement.body[0]
    if _in_place_target(small) is not None:
        return small.value.func.value  # type: ignore[attr-defined,union-attr]
    target = small.targets[0].target if isinstance(small, cst.Assign) else small.target  # type: ignore[union-attr]
    assert isinstance(target, cst.Name)
    return target


# ---------------------------------------------------------------------- small shapes
def untransposed(ctx: FileContext, expr: cst.BaseExpression, batched: bool = False) -> cst.BaseExpression | None:
    """``k`` for ``k.transpose(-2, -1)``, ``k.transpose(2, 3)`` (4-D), ``k.mT``,
    ``k.permute(0, 1, 3, 2)`` and ``torch.transpose(k, -2, -1)``; with ``batched`` (an operand of
    `torch.bmm`, 3-D) also ``k.transpose(1, 2)`` and ``k.permute(0, 2, 1)``."""
    last_two = _LAST_TWO + _LAST_TWO_3D if batched else _LAST_TWO
    if isinstance(expr, cst.Attribute) and expr.attr.value == "mT":
        return expr.value
    if not isinstance(expr, cst.Call):
        return None
    if ctx.qualname(expr.func) == "torch.transpose":
        args = _positional(expr, 3)
        return args[0] if args is not None and _ints(args[1:]) in last_two else None
    func = expr.func
    if not isinstance(func, cst.Attribute) or ctx.qualname(func):
        return None
    positional = all(not arg.keyword and not arg.star for arg in expr.args)
    dims = _ints([arg.value for arg in expr.args]) if positional else None
    if func.attr.value == "transpose" and dims in last_two:
        return func.value
    if func.attr.value == "permute" and (dims == (0, 1, 3, 2) or (batched and dims == (0, 2, 1))):
        return func.value
    return None


_LAST_TWO = ((-2, -1), (-1, -2), (2, 3), (3, 2))
_LAST_TWO_3D = ((1, 2), (2, 1))


def _ints(nodes: Sequence[cst.BaseExpression]) -> tuple[int, ...] | None:
    values: list[int] = []
    for node in nodes:
        value = _int(node)
        if value is None:
            return None
        values.append(value)
    return tuple(values)


def _int(node: cst.BaseExpression | None) -> int | None:
    if isinstance(node, cst.Integer):
        return integer_value(node)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = _int(node.expression)
        return -inner if inner is not None and isinstance(node.expression, cst.Integer) else None
    return None


def _is_minus_one(node: cst.BaseExpression | None) -> bool:
    return _int(node) == -1


def is_minus_inf(ctx: FileContext, node: cst.BaseExpression) -> bool:
    """``float("-inf")``, ``-float("inf")``, ``-math.inf``, ``-torch.inf``."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "float":
        args = _positional(node, 1)
        return args is not None and isinstance(args[0], cst.SimpleString) and args[0].evaluated_value == "-inf"
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = node.expression
        if ctx.qualname(inner) in ("math.inf", "torch.inf", "numpy.inf"):
            return True
        if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Name) and inner.func.value == "float":
            args = _positional(inner, 1)
            return args is not None and isinstance(args[0], cst.SimpleString) and args[0].evaluated_value == "inf"
    return False


def _causal_condition(cond: cst.BaseExpression) -> str | None:
    """``self.<buffer>[:, :, :T, :T] == 0`` -> the buffer's attribute name."""
    if not (isinstance(cond, cst.Comparison) and len(cond.comparisons) == 1):
        return None
    target = cond.comparisons[0]
    if not isinstance(target.operator, cst.Equal) or _int(target.comparator) != 0:
        return None
    subscript = cond.left
    if not isinstance(subscript, cst.Subscript):
        return None
    name = dotted_name(subscript.value)
    if name is None or not name.startswith("self.") or name.count(".") != 1:
        return None
    slices = [element.slice for element in subscript.slice]
    if len(slices) < 2 or not all(isinstance(s, cst.Slice) and s.step is None and s.lower is None for s in slices):
        return None
    *leading, rows, columns = slices
    if any(s.upper is not None for s in leading):  # type: ignore[union-attr]
        return None
    upper = rows.upper  # type: ignore[union-attr]
    if upper is None or columns.upper is None or not upper.deep_equals(columns.upper):  # type: ignore[union-attr]
        return None
    return name.split(".", 1)[1]


def _cast_operand(call: cst.Call) -> cst.BaseExpression | None:
    """``x`` for ``x.float()``, ``x.type_as(q)``, ``x.to(v.dtype)``..."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _CASTS:
        if func.attr.value in ("float", "half", "bfloat16", "double") and call.args:
            return None
        return func.value
    return None


def _positional(call: cst.Call, count: int) -> list[cst.BaseExpression] | None:
    """The call's arguments when it has exactly ``count``, all positional."""
    if len(call.args) != count or any(arg.keyword or arg.star for arg in call.args):
        return None
    return [arg.value for arg in call.args]


def argument(args: Sequence[cst.Arg], keyword: str, position: int) -> cst.BaseExpression | None:
    """The value of ``keyword``, else of the ``position``-th positional argument, in ``args``."""
    for arg in args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    positional = [arg for arg in args if arg.keyword is None and not arg.star]
    return positional[position].value if position < len(positional) else None


# ---------------------------------------------------------------- around the attention
def attention_of(ctx: FileContext, site: CallSite) -> tuple[Attention, list[cst.BaseStatement], int] | None:
    """The attention a softmax call is part of, with its block and the output's index there.
    A softmax in a branch (`if mask is not None: ... else: attn = self.softmax(attn)`) whose
    output is after the `if` is read on the branch's path: the branch's statements in place of
    the `if` (a conditional step: reported without a fix)."""
    owner = statement_owner(ctx, site.statement) if site.statement is not None else None
    if owner is None:
        return None
    block = owner[1]
    start = next(i for i, statement in enumerate(block) if statement is site.statement)
    found = _attention_in(ctx, site, block, start)
    if found is not None:
        return found
    path = _branch_path(ctx, owner[0], block, site)
    if path is None:
        return None
    found = _attention_in(ctx, site, *path)
    if found is not None:
        found[0].problem(CONDITIONAL)
    return found


def _attention_in(ctx: FileContext, site: CallSite, block: list[cst.BaseStatement], start: int
                  ) -> tuple[Attention, list[cst.BaseStatement], int] | None:
    for index in range(start, len(block)):
        if not isinstance(block[index], cst.SimpleStatementLine):
            continue
        for node in walk_expression(block[index]):
            if matmul_operands(ctx, node) is None:
                continue
            found = read_attention(ctx, block, index, node, site.stack)  # type: ignore[arg-type]
            if found is not None and found.softmax is site.node:
                return found, block, index
    return None


def _branch_path(ctx: FileContext, owner: cst.CSTNode, branch: list[cst.BaseStatement], site: CallSite
                 ) -> tuple[list[cst.BaseStatement], int] | None:
    """The statements run on the way through the `if` branch ``branch`` (``owner``: the `If`,
    or its `Else`) out into the block around the `if`, and the index of the softmax's
    statement there."""
    statement = owner
    if isinstance(owner, cst.Else):
        function = ctx.function_of(site.stack)
        statement = next((node for node in walk_expression(function) if isinstance(node, cst.If)
                          and node.orelse is owner), None) if function is not None else None
    if not isinstance(statement, cst.If):
        return None
    outer = statement_owner(ctx, statement)
    if outer is None:
        return None  # an `elif`: its `if` is not a statement of a block
    block = outer[1]
    at = next(i for i, node in enumerate(block) if node is statement)
    start = at + next(i for i, node in enumerate(branch) if node is site.statement)
    return [*block[:at], *branch, *block[at + 1:]], start


_FAST_PATHS: WeakKeyDictionary[FileContext, set[cst.CSTNode]] = WeakKeyDictionary()


def fast_path_gate(ctx: FileContext, stack: Stack) -> str | None:
    """The test that keeps a fused attention of the function or class around ``stack`` off by
    default (llm.c's `if FLASH:` with `--flash 0`), or None."""
    scopes = {ctx.function_of(stack), class_of_method(stack)} - {None}
    for site in ctx.calls:
        if (dotted_name(site.node.func) or "").rsplit(".", 1)[-1] in FAST_ATTENTION and any(
                frame.node in scopes for frame in site.stack):
            gate = off_by_default(ctx, site.statement, site.stack)
            if gate is not None:
                return gate
    return None


def has_fast_path(ctx: FileContext, stack: Stack) -> bool:
    """Does the function or class around ``stack`` also call a fused attention (the code at
    ``stack`` is then its fallback)?"""
    found = _FAST_PATHS.get(ctx)
    if found is None:
        found = _FAST_PATHS[ctx] = {  # every frame around a call of a fused attention run by default
            frame.node
            for site in ctx.calls
            if (dotted_name(site.node.func) or "").rsplit(".", 1)[-1] in FAST_ATTENTION
            and off_by_default(ctx, site.statement, site.stack) is None  # not llm.c's `if FLASH:` (0)
            for frame in site.stack
        }
    scopes = {ctx.function_of(stack), class_of_method(stack)} - {None}
    return any(node in scopes for node in found)


# Calls that compare two results: a function making them checks one implementation against another.
_RESULT_CHECKS = frozenset({
    "torch.allclose", "torch.testing.assert_close", "torch.testing.assert_allclose", "numpy.allclose",
    "numpy.testing.assert_allclose", "numpy.testing.assert_array_almost_equal",
})
_CHECKING: WeakKeyDictionary[FileContext, set[cst.CSTNode]] = WeakKeyDictionary()


def checks_against_reference(ctx: FileContext, stack: Stack) -> bool:
    """Does the function around ``stack`` compare results (`assert torch.allclose(kernel(q, k,
    v), expected)`, `ref.allclose(out)`)? A kernel's test computes attention by hand as the
    reference it checks the fast kernel against."""
    found = _CHECKING.get(ctx)
    if found is None:
        found = _CHECKING[ctx] = {
            ctx.function_of(site.stack) for site in ctx.calls
            if ctx.call_qualname(site) in _RESULT_CHECKS
            or (isinstance(site.node.func, cst.Attribute) and site.node.func.attr.value == "allclose")
        } - {None}
    return ctx.function_of(stack) in found


def may_cache_keys(ctx: FileContext, attention: Attention, scope: cst.CSTNode) -> bool:
    """Can the keys be longer than the queries (a key/value cache: `torch.cat` on the keys, a
    `past`/`cache` name in ``scope``)? `[:T, :T]` with one new token masks nothing, while
    `is_causal=True` aligns its mask to the top left and would hide all but the first key."""
    key = attention.key
    key_name = dotted_name(key) if key is not None else None
    for node in walk_expression(scope):
        if isinstance(node, cst.Name) and ("cache" in node.value.lower() or "past" in node.value.lower()):
            return True
        if isinstance(node, cst.Assign) and key_name in {n for t in node.targets for n in target_names(t.target)}:
            calls = (c for c in walk_expression(node.value) if isinstance(c, cst.Call))
            if any(ctx.qualname(c.func) in _CONCATENATE for c in calls):
                return True
    return False


def weights_used_elsewhere(attention: Attention, scope: cst.CSTNode) -> bool:
    """Are the attention's weights read in ``scope`` outside the chain (returned, stored)?"""
    chain = {id(name) for name in attention.chain_names}
    names = {name.value for name in attention.chain_names}
    return any(
        isinstance(node, cst.Name) and node.value in names and id(node) not in chain
        for node in walk_expression(scope)
    )


def weights_multiplied_again(attention: Attention, scope: cst.CSTNode) -> bool:
    """Do the attention's weights also go into another product, directly or through names bound
    from them (VITS's relative-position attention: `relative_weights =
    self._absolute_position_to_relative_position(attn_probs)`, then `torch.matmul(relative_weights,
    value_relative_embeddings)` added to the output, or a helper named for the product doing it:
    `self._matmul_with_relative_values(relative_weights, ...)`)? Then they are part of what the layer
    computes, which SDPA cannot give: no attention it replaces."""
    chain = {id(name) for name in attention.chain_names}
    tainted = {name.value for name in attention.chain_names}
    after: list[cst.CSTNode] = []  # the code after the softmax, in source order
    for node in walk_in_order(scope):
        if after or node is attention.softmax:
            after.append(node)
    for node in after:  # names bound from the weights later on (not the attention's output itself)
        if isinstance(node, cst.Assign) and _reads_outside(node.value, tainted, chain) \
                and not any(child is attention.output for child in walk_expression(node.value)):
            tainted |= {target.target.value for target in node.targets if isinstance(target.target, cst.Name)}
    for node in after:
        operands: list[cst.BaseExpression] = []
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
            operands = [node.left, node.right]
        elif isinstance(node, cst.Call) and _is_product((dotted_name(node.func) or "").rsplit(".", 1)[-1]):
            operands = [arg.value for arg in node.args]
        if node is not attention.output and any(_reads_outside(operand, tainted, chain) for operand in operands):
            return True
    return False


_PRODUCTS = frozenset({"matmul", "bmm", "einsum", "mm"})


def _is_product(name: str) -> bool:
    """A product: torch's, or a helper named for one (so-vits-svc's and Glow-TTS's
    `self._matmul_with_relative_values(relative_weights, embeddings)`)."""
    return name in _PRODUCTS or any(word in name for word in ("matmul", "bmm", "einsum"))


def _reads_outside(expr: cst.BaseExpression, names: set[str], chain: set[int]) -> bool:
    return any(isinstance(node, cst.Name) and node.value in names and id(node) not in chain for node in walk_expression(expr))


def moved_names_rebound(attention: Attention, block: list[cst.BaseStatement], index: int) -> bool:
    """Does a statement between the attention's first one and its output (``block[index]``)
    rebind something a rewrite would move to the output (q, k, the mask, the scale, the
    dropout's p)?"""
    skip = {id(statement) for statement in attention.steps}
    bound: set[str] = set()
    for statement in block[attention.first:index]:
        if id(statement) not in skip:
            bound |= bound_names(statement)
    read = {dotted_name(node) for expr in attention.moved for node in walk_expression(expr)} - {None}
    return any(name == b or name.startswith(b + ".") for name in read for b in bound)  # type: ignore[union-attr]


def causal_mask_buffer(ctx: FileContext, buffer: str, stack: Stack) -> CallSite | None:
    """The class's one `self.register_buffer("<buffer>", torch.tril(torch.ones(...))...)`, for a
    method at ``stack`` that reads `self.<buffer>`; None when the buffer is anything else or is
    assigned too."""
    cls = class_of_method(stack)
    assigned = ctx.assignments.get(f"self.{buffer}", [])
    if cls is None or any(any(f.node is cls for f in a.stack) for a in assigned):
        return None
    sites = [
        site for site in ctx.method_calls("register_buffer")
        if dotted_name(site.node.func) == "self.register_buffer" and any(f.node is cls for f in site.stack)
        and _string(find_argument(ctx, site, "name", 0).node) == buffer
    ]
    if len(sites) != 1:
        return None
    tensor = find_argument(ctx, sites[0], "tensor", 1).node
    return sites[0] if tensor is not None and _is_tril_of_ones(ctx, tensor, sites[0].stack) else None


def unwrap_mask(node: cst.BaseExpression) -> cst.BaseExpression:
    """``x`` for ``x.view(1, 1, n, n)``, ``x.bool()``, ``x[None, None]`` and the like."""
    while True:
        func = node.func if isinstance(node, cst.Call) else None
        if isinstance(func, cst.Attribute) and func.attr.value in _MASK_WRAPPERS:
            node = func.value
        elif isinstance(node, cst.Subscript) and all(
            isinstance(e.slice, cst.Index) and isinstance(e.slice.value, (cst.Name, cst.Ellipsis))
            and (not isinstance(e.slice.value, cst.Name) or e.slice.value.value == "None")
            for e in node.slice
        ):
            node = node.value
        else:
            return node


def _unwrap_assigned(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> cst.BaseExpression:
    """``unwrap_mask``, through a variable assigned once (`mask = torch.tril(...)`) too."""
    node = unwrap_mask(node)
    value = ctx.single_value(node.value, stack) if isinstance(node, cst.Name) else None
    return unwrap_mask(value) if value is not None else node


def _is_tril_of_ones(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> bool:
    node = _unwrap_assigned(ctx, node, stack)
    if isinstance(node, cst.Call) and ctx.qualname(node.func) == "torch.tril":
        args = node.args
        inner = args[0].value if args and not args[0].keyword else None
        diagonal = argument(args[1:], "diagonal", 0)
    elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "tril":
        inner, diagonal = node.func.value, argument(node.args, "diagonal", 0)
    else:
        return False
    if diagonal is not None and not (isinstance(diagonal, cst.Integer) and diagonal.value == "0"):
        return False
    inner = _unwrap_assigned(ctx, inner, stack) if inner is not None else None
    return isinstance(inner, cst.Call) and ctx.qualname(inner.func) == "torch.ones"


def _string(node: cst.BaseExpression | None) -> str | None:
    return str(node.evaluated_value) if isinstance(node, cst.SimpleString) else None


def is_default_scale(ctx: FileContext, attention: Attention, factor: Factor) -> bool:
    """Is ``factor`` SDPA's default scale, 1/sqrt(head_dim) (`/ math.sqrt(k.size(-1))`,
    `* k.size(-1) ** -0.5`, `* (1.0 / math.sqrt(q.shape[-1]))`)?"""
    meaning = factor.meaning
    if factor.divide:
        return _is_sqrt_head_dim(ctx, attention, meaning)
    if isinstance(meaning, cst.BinaryOperation) and isinstance(meaning.operator, cst.Divide):
        one = meaning.left
        return (isinstance(one, (cst.Integer, cst.Float)) and number_value(one) == 1.0
                and _is_sqrt_head_dim(ctx, attention, meaning.right))
    base = _is_power(meaning, -0.5)
    return base is not None and _is_head_dim(attention, base)


def _is_sqrt_head_dim(ctx: FileContext, attention: Attention, node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Call) and ctx.qualname(node.func) == "math.sqrt" and len(node.args) == 1:
        return _is_head_dim(attention, node.args[0].value)
    base = _is_power(node, 0.5)
    return base is not None and _is_head_dim(attention, base)


def _is_head_dim(attention: Attention, node: cst.BaseExpression | None) -> bool:
    """`k.size(-1)`, `q.shape[-1]`: the last dimension of the query or the key."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "size":
        tensor, ok = node.func.value, len(node.args) == 1 and code_of(node.args[0].value).strip() == "-1"
    elif (isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute)
          and node.value.attr.value == "shape"):
        tensor, ok = node.value.value, len(node.slice) == 1 and code_of(node.slice[0].slice).strip() == "-1"
    else:
        return False
    sides = (attention.query, attention.key)
    return ok and any(side is not None and tensor.deep_equals(side) for side in sides)


def _is_power(node: cst.BaseExpression, exponent: float) -> cst.BaseExpression | None:
    """``base`` for ``base ** exponent``."""
    if not (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power)):
        return None
    right = node.right
    sign = 1.0
    if isinstance(right, cst.UnaryOperation) and isinstance(right.operator, cst.Minus):
        sign, right = -1.0, right.expression
    if isinstance(right, (cst.Float, cst.Integer)) and sign * (number_value(right) or 0.0) == exponent:
        return node.left
    return None


# What a Hugging Face model output holds besides the attention weights.
_OTHER_OUTPUTS = frozenset({"last_hidden_state", "logits", "loss", "pooler_output", "hidden_states", "past_key_values"})


def attentions_unused(ctx: FileContext, site: CallSite) -> bool:
    """Are the attention weights a model call returns (`out = model(ids, output_attentions=True)`)
    read by nothing: `out` is only read for its other fields (`out.last_hidden_state`), and any
    `att = out.attentions[-1]` binds a name nobody reads? A result returned, passed on, indexed
    or unpacked may carry them anywhere, and one never read shows nothing: used."""
    statement = site.statement
    small = statement.body[0] if statement is not None and len(statement.body) == 1 else None
    if not isinstance(small, cst.Assign) or small.value is not site.node or len(small.targets) != 1 \
            or not isinstance(small.targets[0].target, cst.Name):
        return False
    name = small.targets[0].target.value
    function = ctx.function_of(site.stack)
    scope = function if function is not None else ctx.module
    reads = [node for node in walk_expression(scope) if isinstance(node, cst.Name) and node.value == name]
    fields = [node for node in walk_expression(scope)
              if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == name]
    if not fields or len(reads) != len(fields) + 1:  # each read but the assignment's target is a field read
        return False
    for field_read in fields:
        if field_read.attr.value == "attentions":
            if not _bound_unread(ctx, function, scope, field_read):
                return False
        elif field_read.attr.value not in _OTHER_OUTPUTS:
            return False
    return True


def _bound_unread(ctx: FileContext, function: cst.CSTNode | None, scope: cst.CSTNode, read: cst.Attribute) -> bool:
    """Is ``read`` (`out.attentions`) part of the value of an assignment to a name that nothing reads?"""
    for target, assignments in ctx.assignments_by_function.get(function, {}).items():
        if "." in target or not any(read in walk_expression(a.value) for a in assignments if not a.unpacked):
            continue
        return sum(1 for node in walk_expression(scope) if isinstance(node, cst.Name) and node.value == target) == 1
    return False
