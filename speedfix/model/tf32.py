"""Would TF32 speed up a script's own training loop?

TF32 runs fp32 matrix multiplications on the tensor cores of Ampere and newer GPUs. It matters
for a loop that trains in fp32 (no autocast, no 16-bit model by default), whose network
multiplies matrices (a conv-only network gets TF32 from cuDNN already), on a project that does
not ask only for older GPUs (V100s have no TF32).
"""

from __future__ import annotations

import libcst as cst

from speedfix.model.amp import accelerate_picks_precision, mixed_precision_by_default
from speedfix.model.context import FileContext
from speedfix.model.hardware import pre_ampere_only
from speedfix.model.index import CallSite
from speedfix.model.networks import training_multiplies_matrices
from speedfix.model.rl import trains_between_env_steps
from speedfix.model.scale import trains_narrow_mlps_only
from speedfix.project.steps import LIGHTNING_CALLBACK, LIGHTNING_MODULE


def loop_gains_from_tf32(ctx: FileContext) -> bool:
    """Does the file's training loop run fp32 matmuls where TF32 would help (whatever the script
    chooses for the matmul precision: ``patterns.matmul_precision_chosen`` says that)? Not in an
    MLP too narrow for tensor cores to matter (``scale.trains_narrow_mlps_only``), nor where the
    Accelerate launch picks the precision (with bf16 or fp16 no fp32 matmul is left), nor in an
    RL update run between an environment's steps (``rl.trains_between_env_steps``)."""
    return bool(training_steps(ctx)) and not mixed_precision_by_default(ctx) and training_multiplies_matrices(ctx) \
        and not pre_ampere_only(ctx) and not trains_narrow_mlps_only(ctx) and not accelerate_picks_precision(ctx) \
        and not trains_between_env_steps(ctx)


def training_steps(ctx: FileContext) -> list[cst.CSTNode]:
    """Where the file trains, in source order: its step loops, else the methods that take a whole
    step that another file's loop calls (Graph-WaveNet's `trainer.train(input, real)` in engine.py,
    its epoch loop in train.py)."""
    loops = [loop for loop in ctx.loops if loop in ctx.step_loops and not _in_lightning_class(ctx, loop)]
    if loops:
        return loops
    return [info.node for infos in ctx.functions.values() for info in infos
            if info.node in ctx.step_functions and info.node in ctx.hot_functions
            and not (info.class_name and ctx.is_subclass_of(info.class_name, *LIGHTNING_MODULE, *LIGHTNING_CALLBACK))
            and _whole_step(ctx, info.node)]  # (a Lightning step's TF32 is SF901's, at its Trainer)


def _in_lightning_class(ctx: FileContext, loop: cst.CSTNode) -> bool:
    """A loop in a method of a LightningModule (a GAN's two discriminator steps in its
    `training_step`): its Trainer runs it, and SF901 advises TF32 there."""
    owner = ctx.class_of(ctx.loops[loop].stack)
    return owner is not None and ctx.is_subclass_of(owner.name.value, *LIGHTNING_MODULE, *LIGHTNING_CALLBACK)


def _whole_step(ctx: FileContext, function: cst.CSTNode) -> bool:
    """Does the function run a backward pass of a loss it computes and step an optimizer (not
    an optimizer wrapper's `step()`, an engine wrapper's `backward(loss)`, nor an autograd
    Function's `backward`)?"""
    if not isinstance(function, cst.FunctionDef):
        return False
    params = {param.name.value for param in (*function.params.params, *function.params.kwonly_params)}

    def of_its_own(site: CallSite) -> bool:  # `loss.backward()`, `engine.backward(loss)`: a loss not handed in
        assert isinstance(site.node.func, cst.Attribute)
        loss = site.node.args[0].value if site.node.args else site.node.func.value
        return not (isinstance(loss, cst.Name) and loss.value in params)

    backward = any(ctx.function_of(site.stack) is function and of_its_own(site) for site in ctx.method_calls("backward"))
    return backward and any(ctx.function_of(site.stack) is function for site in ctx.method_calls("step"))
