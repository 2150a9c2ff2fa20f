"""Impact estimates that several rules share: an evaluation-only loader, a small or a large model,
what TF32 is worth for the networks trained."""

from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Finding, Impact, Severity
from speedfix.engine.impact import Estimate
from speedfix.model.context import FileContext
from speedfix.model.index import CallSite
from speedfix.model.arguments import find_argument
from speedfix.model.model_size import trains_adapters
from speedfix.model.rl import generation_in_step, trains_between_env_steps
from speedfix.model.loader_classes import dataloader_calls
from speedfix.model.scale import (LARGE_MODEL_PARAMETERS, NARROW_WIDTH, SMALL_MODEL_PARAMETERS, Role,
                                   largest_trained_model, trains_narrow_mlps_only,
                                   loader_role, per_file, trains_hub_model)
from speedfix.model.workload import Family, graph_library, small_option_width, small_stated_width, trained_family

__all__ = ["Estimate", "Finding", "Impact", "Severity", "by_message", "compile_gain", "evaluation_loader", "large_model",
           "small_model",
           "spread_out", "tf32_gain", "trains_adapters", "trains_hub_model",
           "unpinned_training_loaders"]  # what a rule's impact_here needs


def evaluation_loader(ctx: FileContext, finding: Finding) -> Estimate | None:
    """Low for a finding on a DataLoader that only evaluation or testing reads; a benchmark of
    the script (which measures the training loop) does not decide it."""
    site = next((site for site in dataloader_calls(ctx) if site.node is finding.node), None)
    if site is not None and loader_role(ctx, site) is Role.EVALUATION:
        return Estimate(Impact.LOW, "a loader that only evaluation or testing reads", measurable=False)
    return None


@per_file
def unpinned_training_loaders(ctx: FileContext) -> bool:
    """Does the file build DataLoaders, none of those that may feed training pinned
    (`pin_memory` not set, or False)? A file that builds none is handed unpinned ones when the
    file that imports it builds its loaders so (``Links.unpinned_loaders``)."""
    built = dataloader_calls(ctx)
    if not built:
        return ctx.links.unpinned_loaders is not None
    loaders = [site for site in built if loader_role(ctx, site) is not Role.EVALUATION]
    return bool(loaders) and all(_unpinned(ctx, site) for site in loaders)


def _unpinned(ctx: FileContext, site: CallSite) -> bool:
    pin = find_argument(ctx, site, "pin_memory", 7)
    return pin.missing or (isinstance(pin.node, cst.Name) and pin.node.value == "False")


def small_model(ctx: FileContext, impact: Impact) -> Estimate | None:
    """``impact`` when every model the script trains is small, counted from the layers it writes,
    or, where they cannot be counted, by the widths its options give them (``small_option_width``)."""
    count = largest_trained_model(ctx)
    if count is None and trains_narrow_mlps_only(ctx):  # an input width the environment decides
        return Estimate(impact, f"small models (MLPs no wider than {NARROW_WIDTH})")
    width = small_option_width(ctx) if count is None else None
    if width is not None:
        return Estimate(impact, f"a small model by its options (widths up to {width})")
    if count is None or count >= SMALL_MODEL_PARAMETERS:
        return None
    return Estimate(impact, f"a small model (about {_millions(count)} parameters)")


def large_model(ctx: FileContext, impact: Impact) -> Estimate | None:
    """``impact`` when the largest model the script trains has a billion parameters or more (its
    checkpoint or config says so, or its layers count to it): steps of a second or more."""
    count = largest_trained_model(ctx)
    if count is None or count < LARGE_MODEL_PARAMETERS:
        return None
    return Estimate(impact, f"a large model (about {_millions(count)} parameters): long steps")


def compile_gain(ctx: FileContext) -> Estimate | None:
    """What `torch.compile` is worth for the models the script trains, wherever compile is
    advised (SF501 and the framework rules' compile notes): low for a model of a billion
    parameters or more, or for steps that generate their samples first (``generation_in_step``),
    medium for a small one (its compile time is a large share of a short run), for RL updates
    between environment steps or for a graph network (``graph_library``); None: the rule's usual
    impact."""
    large = large_model(ctx, Impact.LOW)
    if large is not None:
        return Estimate(Impact.LOW, f"{large.reason}, most of it in large matmuls that compile leaves to the same "
                                    "kernels; a fine-tune's batches of varying length recompile")
    generation = generation_in_step(ctx)
    if generation is not None:
        return Estimate(Impact.LOW, f"each step generates its samples first (`{generation}`): decoding token by token "
                                    "at lengths that change every step takes most of it and keeps recompiling")
    small = small_model(ctx, Impact.MEDIUM)
    if small is None and trains_between_env_steps(ctx):
        return Estimate(Impact.MEDIUM, "reinforcement learning: its updates alternate with environment steps and "
                                       "acting, which the compile leaves as they are")
    graphs = graph_library(ctx) if small is None else None
    if graphs is not None:
        return Estimate(Impact.MEDIUM, f"a graph network ({graphs}): batches of graphs whose node and edge counts "
                                       "change every step recompile or run with dynamic shapes, and the message "
                                       "passing's scatter kernels gain little")
    return small


def _millions(count: int) -> str:
    if count >= 1_000_000_000:
        return f"{count / 1e9:.1f}B"
    return f"{count / 1e6:.1f}M" if count >= 100_000 else f"{count:,}"


_CUDNN_TF32 = "cuDNN already runs its convolutions in TF32"


def tf32_gain(ctx: FileContext) -> Estimate | None:
    """What TF32 matmuls are worth for the networks the script trains in fp32, wherever the TF32
    advice is given (SF201, and the TF32 part of the Lightning and Hugging Face rules): low for a
    conv net (cuDNN already runs convolutions in TF32, only the classifier head gains), medium
    for a small model or one whose family nothing shows, high when matmuls do the work (None:
    the rule's usual high, for matmuls counted from the layers)."""
    family = trained_family(ctx)
    if family is not None and family[0] is Family.CONV:
        said = "a conv net" if family[1] is None else f"a conv net by its name ({family[1]})"
        return Estimate(Impact.LOW, f"{said}: {_CUDNN_TF32}")
    small = small_model(ctx, Impact.MEDIUM)
    if small is not None:
        return small
    if family is None:
        return Estimate(Impact.MEDIUM, "a model whose layers the scan does not see: TF32 speeds up its matmuls, "
                                       "not its convolutions")
    if family[1] is None:
        return None
    width = small_stated_width(ctx)
    if width is not None:
        return Estimate(Impact.MEDIUM, f"a small transformer (width {width})")
    return Estimate(Impact.HIGH, f"{family[1]} trained in fp32: its matmuls do the work")


def by_message(finding: Finding, table: tuple[tuple[str, Impact, str], ...]) -> Estimate | None:
    """For a rule that reports several settings: the impact of the first entry whose words the
    finding's message holds (the rule's usual impact when none does)."""
    for words, impact, reason in table:
        if words in finding.message:
            return Estimate(impact, reason)
    return None


def spread_out(finding: Finding) -> Estimate | None:
    """Medium for a costly call that runs every N steps rather than on every one (reported as
    info), low for one that runs only while an option is on."""
    if finding.severity is not Severity.INFO:
        return None
    if finding.no_fix_reason and "only runs while" in finding.no_fix_reason:
        return Estimate(Impact.LOW, "it runs only while an option is on")
    return Estimate(Impact.MEDIUM, "it runs every few steps, not on every one")
