"""Would TF32 speed up a script's own training loop?

TF32 runs fp32 matrix multiplications on the tensor cores of Ampere and newer GPUs. It matters
for a loop that trains in fp32 (no autocast, no 16-bit model by default), whose network
multiplies matrices (a conv-only network gets TF32 from cuDNN already), on a project that does
not ask only for older GPUs (V100s have no TF32).
"""

from __future__ import annotations

from speedfix.model.amp import accelerate_picks_precision, mixed_precision_by_default
from speedfix.model.context import FileContext
from speedfix.model.hardware import pre_ampere_only
from speedfix.model.networks import training_multiplies_matrices
from speedfix.model.rl import trains_between_env_steps
from speedfix.model.scale import trains_narrow_mlps_only


def loop_gains_from_tf32(ctx: FileContext) -> bool:
    """Does the file's training loop run fp32 matmuls where TF32 would help (whatever the script
    chooses for the matmul precision: ``patterns.matmul_precision_chosen`` says that)? Not in an
    MLP too narrow for tensor cores to matter (``scale.trains_narrow_mlps_only``), nor where the
    Accelerate launch picks the precision (with bf16 or fp16 no fp32 matmul is left), nor in an
    RL update run between an environment's steps (``rl.trains_between_env_steps``)."""
    return bool(ctx.step_loops) and not mixed_precision_by_default(ctx) and training_multiplies_matrices(ctx) \
        and not pre_ampere_only(ctx) and not trains_narrow_mlps_only(ctx) and not accelerate_picks_precision(ctx) \
        and not trains_between_env_steps(ctx)
