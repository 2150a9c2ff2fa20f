from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import Severity
from speedfix.engine.rule import Invalid, Rule, Valid
from speedfix.engine.wording import name_all
from speedfix.model.context import FileContext
from speedfix.model.index import CallSite
from speedfix.model.flow import assigned_name, enclosing_statements, in_no_run
from speedfix.model.frames import class_of, function_of
from speedfix.model.networks import DATA_PARALLEL, data_parallel_calls
from speedfix.model.scale import evaluation_script
from speedfix.syntax.comments import has_noqa
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import code_of, walk_expression



class DataParallel(Rule):
    """
    ## What it does
    Finds `torch.nn.DataParallel` (or a project class derived from it, such as Transformer-XL's
    `BalancedDataParallel`), once per choice (one model wrapped in either branch of an `if` is
    one finding, and so are the networks one function wraps: stargan-v2's `build_model()` wraps
    five; a line with `# noqa` stays apart), and not where it runs only with more GPUs than the
    script's default (`if num_gpus > 1:` with `--ngpu` defaulting to 1) unless a launch command of
    the project passes the option that turns it on (`--multi_gpu` in a run script), nor in a function of a training script
    that only evaluates or samples (it trains nothing, is not called from the training loop and
    keeps the wrapper to itself), nor where it only mirrors a wrapper its caller chose (`if
    isinstance(model, nn.DataParallel): copy = nn.DataParallel(copy)` in an EMA helper): the
    advice belongs where the model is first wrapped. Nor in a script that trains nothing and
    evaluates (`model.eval()`, `torch.no_grad()`: a test, demo or evaluation script) and that no
    training script of the scan imports.

    ## Why is this bad?
    `DataParallel` runs one Python process that replicates the model onto every GPU on every
    forward pass, scatters the batch and gathers the outputs on GPU 0, all under one GIL: GPU 0
    becomes a bottleneck and scaling stops early. PyTorch recommends `DistributedDataParallel`
    (one process per GPU, gradients all-reduced while the backward pass runs) "even if there is
    only a single node".

    ## Example
    ```python
    model = nn.DataParallel(model).cuda()
    ```

    ## Use instead
    ```python
    # launched with: torchrun --nproc-per-node=NUM_GPUS train.py
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DistributedDataParallel(model.cuda(local_rank), device_ids=[local_rank])
    sampler = DistributedSampler(train_set)  # and DataLoader(..., sampler=sampler)
    ```

    ## Fix safety
    No automatic fix: moving to DDP changes how the script is launched (`torchrun`), needs a
    process group, a `DistributedSampler`, and rank-0-only logging and checkpointing.

    ## Impact
    High: a script wraps its model in DataParallel to train on several GPUs, and there it is
    much slower than DistributedDataParallel: one process feeds every GPU, GPU 0 gathers the
    outputs, and the model is copied again on every forward (fairseq: no speedup at all with
    DataParallel, 5.5-6x on 8 GPUs with one process per GPU). On one GPU it costs little, and
    where the wrapper runs only with more GPUs than the script's default it is not reported at
    all. Nothing moves it.

    ## Measured effect
    fairseq saw no speedup with DataParallel and about 5.5-6x on 8 GPUs with one process per
    GPU; on consumer GPUs without peer-to-peer links DataParallel has been measured faster in some
    setups (pytorch#65936), so benchmark both.
    Sources: https://github.com/facebookresearch/fairseq/issues/34,
    https://pytorch.org/docs/stable/notes/cuda.html#use-nn-parallel-distributeddataparallel-instead-of-multiprocessing-or-nn-dataparallel
    """

    impact = "high"
    code = "SF801"
    name = "data-parallel"
    summary = "`nn.DataParallel` instead of DistributedDataParallel"
    severity = Severity.WARNING
    requires = (b"DataParallel",)
    gpu_only = True
    effect = "One process per GPU: about 5.5-6x on 8 GPUs in fairseq, where DataParallel gave none."

    VALID = [
        Valid(  # an evaluation script: it trains nothing
            """
            import torch
            model = torch.nn.DataParallel(build_model()).cuda()
            model.load_state_dict(torch.load(args.checkpoint))
            model.eval()
            with torch.no_grad():
                for images, _ in test_loader:
                    save(model(images.cuda()))
            """
        ),
        Valid(  # a helper copies a model and wraps the copy only if the original was wrapped
            """
            import copy
            import torch.nn as nn

            def averaged_copy(model, shadow):
                if isinstance(model, nn.DataParallel):
                    twin = copy.deepcopy(model.module).cuda()
                    twin = nn.DataParallel(twin)
                else:
                    twin = copy.deepcopy(model).cuda()
                twin.load_state_dict(shadow)
                return twin
            """
        ),
        Valid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model.cuda(rank), device_ids=[rank])
            """
        ),
        Valid(  # only with more GPUs than the default of one
            """
            import argparse
            import torch.nn as nn
            parser = argparse.ArgumentParser()
            parser.add_argument("--ngpu", type=int, default=1)
            opt = parser.parse_args()
            num_gpus = int(opt.ngpu)
            netG, netD = Generator().cuda(), Discriminator().cuda()
            if num_gpus > 1:
                netG = nn.DataParallel(netG)
                netD = nn.DataParallel(netD)
            """
        ),
        Valid(  # wrapped only to sample from a checkpoint; the training loop elsewhere never sees it
            """
            import torch

            def train(model, loader, opt):
                for x, y in loader:
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
                    opt.step()

            def sample(model):
                model.load_state_dict(torch.load("ckpt.pt"))
                runner = torch.nn.DataParallel(model.cuda())
                with torch.no_grad():
                    print(runner(torch.randn(64, 8).cuda()).mean())
            """
        ),
        Valid(  # a runner's sampling mode: its own model, wrapped for inference beside the `train()` it skips
            """
            import torch

            class Runner:
                def train(self, loader):
                    model = Net().cuda()
                    opt = torch.optim.SGD(model.parameters(), lr=0.1)
                    for x, y in loader:
                        opt.zero_grad()
                        torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
                        opt.step()

                def sample(self):
                    model = Net().cuda()
                    model.load_state_dict(torch.load("ckpt.pt"))
                    model = torch.nn.DataParallel(model)
                    model.eval()
                    self.save_images(model)

                def save_images(self, model):
                    with torch.no_grad():
                        print(model(torch.randn(64, 8).cuda()).mean())
            """
        ),
    ]
    INVALID = [
        Invalid(  # a method that keeps the wrapper on the object for the training loop of another method
            """
            import torch

            class Runner:
                def setup(self):
                    model = torch.nn.DataParallel(Net().cuda())
                    self.model = model

                def train(self, loader, opt):
                    for x, y in loader:
                        opt.zero_grad()
                        torch.nn.functional.mse_loss(self.model(x.cuda()), y.cuda()).backward()
                        opt.step()
            """
        ),
        Invalid(  # a helper that hands the wrapped model back to the training loop
            """
            import torch

            def wrap(model):
                wrapped = torch.nn.DataParallel(model.cuda())
                return wrapped

            def train(model, loader, opt):
                for x, y in loader:
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
                    opt.step()

            train(wrap(net), loader, opt)
            """
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            if torch.cuda.device_count() > 1:
                model = nn.DataParallel(model)
            model = model.cuda()
            """
        ),
        Invalid(  # a subclass of DataParallel (Transformer-XL's BalancedDataParallel) is one too
            """
            import torch
            from torch.nn.parallel import DataParallel

            class BalancedDataParallel(DataParallel):
                def __init__(self, gpu0_bsz, *args, **kwargs):
                    self.gpu0_bsz = gpu0_bsz
                    super().__init__(*args, **kwargs)

            para_model = BalancedDataParallel(4, model.cuda(), dim=1)
            """
        ),
        Invalid(  # the networks one function builds, each wrapped: one choice, one finding naming the others
            """
            import torch.nn as nn

            def build_model(args):
                generator = nn.DataParallel(Generator(args.img_size))
                mapping_network = nn.DataParallel(MappingNetwork(args.latent_dim))
                discriminator = nn.DataParallel(Discriminator(args.img_size))
                return generator.cuda(), mapping_network.cuda(), discriminator.cuda()
            """
        ),
        Invalid(  # one model wrapped one way or the other (pytorch/examples ImageNet): one finding
            """
            import torch
            if args.arch.startswith("alexnet") or args.arch.startswith("vgg"):
                model.features = torch.nn.DataParallel(model.features)
                model.cuda()
            else:
                model = torch.nn.DataParallel(model).cuda()
            """
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        reported: list[cst.CSTNode] = []  # the `if` chains holding a reported wrapper
        by_function: dict[int, list[CallSite]] = {}  # the wrappers one function (or the module) makes
        if evaluation_script(ctx) and ctx.links.trained_by is None:
            return  # a test, demo or evaluation script: the advice is for training
        for site in data_parallel_calls(ctx):
            if in_no_run(ctx, site.statement, site.stack):
                continue  # `if num_gpus > 1:` with one GPU by default, unless a run script passes more
            if _evaluation_only(ctx, site):
                continue  # a model wrapped for sampling or testing, in a script that trains elsewhere
            if _mirrors_wrapper(ctx, site):
                continue  # made only when the model it copies is wrapped already
            chain = _if_chain(ctx, site.statement)
            if chain is not None and any(chain is seen for seen in reported):
                continue  # another branch of the same choice (one model, wrapped one way or another)
            if chain is not None:
                reported.append(chain)
            # a statement with `# noqa` stays apart, so that the comment suppresses its wrapper alone
            key = id(site.statement) if has_noqa(site.statement) else id(function_of(site.stack))
            by_function.setdefault(key, []).append(site)
        for sites in by_function.values():
            message = "`DataParallel` drives every GPU from one process; use DistributedDataParallel with torchrun"
            if len(sites) > 1:  # stargan-v2's `build_model()` wraps each of its five networks
                others = name_all([f"`{_wrapped(site)}`" for site in sites[1:]])
                message += f" (the same choice wraps {others} too)"
            self.report(sites[0].node, message, no_fix_reason="moving to DDP changes how the script is launched")


def _wrapped(site: CallSite) -> str:
    """What a wrapper is known by: the name it is bound to, else the wrapped expression."""
    name = assigned_name(site)
    if name is not None:
        return name
    return code_of(site.node.args[0].value) if site.node.args else code_of(site.node)


def _mirrors_wrapper(ctx: FileContext, site: CallSite) -> bool:
    """Is the wrapper made in the body of `if isinstance(x, nn.DataParallel):`, keeping a choice
    made elsewhere?"""
    if site.statement is None:
        return False
    for outer in enclosing_statements(ctx, site.statement)[1:]:
        if isinstance(outer, cst.If) and _tests_data_parallel(ctx, outer.test) \
                and any(node is site.statement for node in walk_expression(outer.body)):
            return True
    return False


def _tests_data_parallel(ctx: FileContext, test: cst.BaseExpression) -> bool:
    """`isinstance(model, nn.DataParallel)`, also and-ed with other tests."""
    return any(isinstance(node, cst.Call) and dotted_name(node.func) == "isinstance" and len(node.args) == 2
               and ctx.qualname(node.args[1].value) in DATA_PARALLEL for node in walk_expression(test))


def _if_chain(ctx: FileContext, statement: cst.BaseStatement | None) -> cst.CSTNode | None:
    """The outermost `if` of the `if`/`elif`/`else` chain that ``statement`` sits in a branch of."""
    found = None
    for outer in enclosing_statements(ctx, statement)[1:] if statement is not None else ():
        if not isinstance(outer, cst.If):
            break
        found = outer
    return found


def _evaluation_only(ctx: FileContext, site: CallSite) -> bool:
    """Is the wrapper made in a function (or a method: a runner's `sample()` beside its `train()`)
    of a script that trains elsewhere, a function that trains nothing (no training loop of its own, none run through its calls, not
    called from one) and keeps the wrapper to itself (a local name, nothing returned)? Such a
    function evaluates or samples (`def eval(): sampler = DataParallel(sampler)`)."""
    function = function_of(site.stack)
    name = assigned_name(site)
    if not ctx.step_loops or not isinstance(function, cst.FunctionDef) or name is None or "." in name:
        return False
    if class_of(site.stack) is not None and (function.name.value in _RUN_BY_THE_MODEL or function in ctx.hot_functions):
        return False  # a method the object's construction or its forward pass runs, or a step another file runs
    if any(isinstance(node, (cst.Return, cst.Global, cst.Nonlocal)) and getattr(node, "value", True) is not None
           for node in walk_expression(function.body)):
        return False  # the wrapper may leave the function
    if _stored_on_an_object(function, name):
        return False  # `self.model = model`: the method hands the wrapper to the object's other methods
    if _trains(ctx, function) or any(ctx.in_training_loop(caller.stack) for caller in ctx.local_callers(function)):
        return False
    for call in ctx.calls:
        if any(frame.node is function for frame in call.stack):
            callee = ctx.project_callee(call)
            if (callee is not None and (callee.trains or callee.steps)) or any(
                    info.node in ctx.step_functions or _trains(ctx, info.node) for info in ctx.local_callees(call)):
                return False
    return True


_RUN_BY_THE_MODEL = ("__init__", "forward", "__call__")


def _stored_on_an_object(function: cst.FunctionDef, name: str) -> bool:
    """Does ``function`` assign something that reads ``name`` to an attribute or an item?"""
    for node in walk_expression(function.body):
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)) and node.value is not None:
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            if any(isinstance(t, (cst.Attribute, cst.Subscript)) for t in targets) and any(
                    isinstance(n, cst.Name) and n.value == name for n in walk_expression(node.value)):
                return True
    return False


def _trains(ctx: FileContext, function: cst.CSTNode) -> bool:
    """Does ``function`` hold a training loop?"""
    return any(info.node in ctx.step_loops and any(frame.node is function for frame in info.stack)
               for info in ctx.loops.values())
