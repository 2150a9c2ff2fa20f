"""Run-time findings: what the measured script configured, judged with the rules' codes.

The child records the facts (``facts.py``, in the result's ``runtime``); this module decides, in
one place, which of them are slow, and says so as the rule of that pattern would: its code, name,
severity and impact come from the rule class, the finding points at the line of user code that
made the object (``data.py:7``), and a rule that only applies on a GPU (``Rule.gpu_only``) is
only reported from a run on one. A scan of the same file that reports the same code at that line
makes the two one finding, confirmed at run time (``confirm``).

What a scan cannot see and the run can: values that come from a JSON or YAML file, the command
line, the environment or a computation; settings a framework applies (a Trainer's loaders and
precision); flags set in another module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from speedfix.engine.impact import Measurements, verdict
from speedfix.model.torch_api import FUSABLE_OPTIMIZERS, TENSOR_DATASET
from speedfix.model.versions import DEFAULT_TARGET, TorchVersion

from .results import LoaderFacts, RunResult, RuntimeFacts, RuntimeFinding

Check = Callable[[RunResult, RuntimeFacts], Iterator[tuple[str, str, str | None, int | None]]]


def _pct(value: float | None) -> str:
    return "" if value is None else f"; {value:.0%} of the step time went to waiting for data"


def _short(type_name: str) -> str:
    return type_name.rsplit(".", 1)[-1]


def _made(loader: LoaderFacts, root: str | None) -> str:
    where = f"made at {loader.where(root)}"
    return where + (f" (by {loader.via})" if loader.via else "")


def _loaders(run: RunResult, facts: RuntimeFacts) -> Iterator[tuple[str, str, str | None, int | None]]:
    loader = facts.training_loader()
    if loader is None or loader.num_workers is None:
        return
    root = str(Path(run.script).parent)
    made = _made(loader, root)
    if loader.num_workers == 0 and loader.dataset not in TENSOR_DATASET:  # in memory: workers only add copies
        yield ("SF101", f"the training DataLoader {made} runs with 0 workers: every batch is loaded in the training "
               f"process between two steps{_pct(run.data.data_wait_fraction)}", loader.file, loader.line)
    if not loader.pin_memory and run.device.type == "cuda":
        yield ("SF102", f"the training DataLoader {made} does not pin memory: each batch is copied to the GPU "
               "from pageable memory, through a staging copy", loader.file, loader.line)
    if loader.num_workers and not loader.persistent_workers and loader.epochs > 1:
        yield ("SF103", f"the training DataLoader {made} starts its {loader.num_workers} worker(s) again at each of "
               f"its {loader.epochs} epochs (persistent_workers=False)", loader.file, loader.line)


def _optimizers(run: RunResult, facts: RuntimeFacts) -> Iterator[tuple[str, str, str | None, int | None]]:
    root = str(Path(run.script).parent)
    for opt in facts.optimizers:
        if (opt.type in FUSABLE_OPTIMIZERS and opt.param_device == "cuda" and not opt.fused and opt.foreach is None
                and not opt.differentiable):
            yield ("SF401", f"the {_short(opt.type)} made at {opt.where(root)} runs unfused at run time (fused="
                   f"{opt.fused}, foreach={opt.foreach}): several kernels per step where `fused=True` runs one",
                   opt.file, opt.line)


class _Framework(NamedTuple):
    """A framework that trains the model, as its advice is reported. The scan reports TF32 and
    compile advice under the framework's rule where that rule speaks of it (SF901's TF32 and
    `trainer.fit` notes, SF902's `tf32`/`torch_compile`, SF905's `engine.compile()`), so a run's
    finding carries the same code and confirms it."""

    name: str  # in facts.frameworks
    code: str  # its precision advice
    who: str
    tf32: str  # the code of its TF32 advice
    compile: str  # the code of its compile advice
    how: str  # how to compile under it


_FRAMEWORKS = (  # in the order they are looked for
    _Framework("lightning", "SF901", "Lightning's Trainer", "SF901", "SF901", "compile it before `trainer.fit`"),
    _Framework("transformers", "SF902", "Hugging Face's Trainer", "SF902", "SF902",
               "`TrainingArguments(torch_compile=True)`"),
    _Framework("deepspeed", "SF905", "DeepSpeed", "SF201", "SF905", "`engine.compile()` after `deepspeed.initialize`"),
    _Framework("accelerate", "SF904", "Accelerate", "SF201", "SF501",
               "`Accelerator(dynamo_backend=\"inductor\")` or `torch.compile`"),
)


def _owner(facts: RuntimeFacts) -> _Framework | None:
    """The framework that trains the model (the first of ``_FRAMEWORKS`` the run saw)."""
    return next((owner for owner in _FRAMEWORKS if owner.name in facts.frameworks), None)


def _lower_precision(name: str, values: dict) -> bool:
    """Whether the framework trains in bf16/fp16."""
    if name == "lightning":
        return any(word in str(values.get("precision") or "") for word in ("16", "bf16", "mixed"))
    if name == "transformers":
        return bool(values.get("bf16") or values.get("fp16"))
    if name == "deepspeed":
        return bool(values.get("bfloat16_enabled") or values.get("fp16_enabled"))
    return str(values.get("mixed_precision") or "no") not in ("no", "None")


def _precision(run: RunResult, facts: RuntimeFacts) -> Iterator[tuple[str, str, str | None, int | None]]:
    if run.device.type != "cuda" or run.device.param_dtype != "float32":
        return
    autocast = facts.autocast
    owner = _owner(facts)
    flags = facts.flags
    capability = flags.gpu_capability if flags else None
    # autocast unknown (a compiled model's training calls are not seen): unknown means silence
    no_tf32 = bool(flags and flags.float32_matmul_precision == "highest" and autocast is not None
                   and not autocast.enabled and (capability is None or capability[0] >= 8))
    tf32_words = "fp32 matmuls run without TF32 at run time (float32_matmul_precision is 'highest')"
    if owner is not None:
        if not _lower_precision(owner.name, facts.frameworks[owner.name]):
            fp32 = f"{owner.who} trains in full fp32 precision at run time: no bf16/fp16 mixed precision"
            if no_tf32 and owner.name == "transformers":  # one finding, as SF902 reports it from the scan
                yield owner.code, f"{fp32}, and {tf32_words}", run.script, None
                return
            yield owner.code, fp32, run.script, None
    elif autocast is not None and not autocast.enabled:
        yield ("SF202", "the training forward runs in fp32 without autocast at run time: bf16 autocast runs its "
               "matmuls and convolutions on the tensor cores", run.script, None)
    if no_tf32:
        yield owner.tf32 if owner else "SF201", tf32_words, run.script, None


def _model(run: RunResult, facts: RuntimeFacts) -> Iterator[tuple[str, str, str | None, int | None]]:
    model, flags = facts.model, facts.flags
    if model is None:
        return
    hf_compiles = bool(facts.frameworks.get("transformers", {}).get("torch_compile"))
    if run.device.type == "cuda" and not model.compiled and not facts.compiled and not hf_compiles:
        owner = _owner(facts)
        yield (owner.compile if owner else "SF501",
               f"the {_short(model.inner_type or model.type)} model runs eagerly at run time: nothing was compiled"
               + (f" ({owner.how})" if owner else ""), run.script, None)
    if run.device.type == "cuda" and model.conv and flags and flags.cudnn_benchmark is False:
        yield ("SF601", "a convolutional model trains with torch.backends.cudnn.benchmark off at run time",
               run.script, None)
    if model.wrapper == "DataParallel":
        yield ("SF801", "the model runs under nn.DataParallel at run time (one process drives every GPU)",
               run.script, None)
    if model.ddp and model.ddp.get("find_unused_parameters"):
        yield ("SF803", "DistributedDataParallel runs with find_unused_parameters=True at run time: it walks "
               "the autograd graph after every forward", run.script, None)


def _flags(run: RunResult, facts: RuntimeFacts) -> Iterator[tuple[str, str, str | None, int | None]]:
    flags = facts.flags
    if flags is None:
        return
    if flags.anomaly_detection:
        yield ("SF603", "autograd anomaly detection is on at run time: every backward op checks for NaN",
               run.script, None)
    if flags.deterministic_algorithms or flags.cudnn_deterministic:
        yield ("SF602", "deterministic algorithms are on at run time (torch.use_deterministic_algorithms or "
               "cudnn.deterministic): slower kernels are chosen", run.script, None)


CHECKS: tuple[Check, ...] = (_loaders, _optimizers, _precision, _model, _flags)


def _rule(code: str):
    from speedfix.engine.registry import rule_by_code  # imports the rules: only once there are facts

    return rule_by_code(code)


def _value(attr: object) -> str | None:
    return None if attr is None else str(getattr(attr, "value", attr))


def figures(run: RunResult, source: str) -> Measurements:
    """What a run measured that decides a finding's impact (the data wait, the median step),
    each figure kept only when it is a number in its range."""
    step = run.timing.step_time_s.median if run.timing.step_time_s is not None else None
    return Measurements(source, device=run.device.type, data_wait=_share(run.data.data_wait_fraction),
                        step_time_s=_positive(step))


def _share(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1 else None


def _positive(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _impact(rule: type, measured: Measurements) -> str | None:
    """The rule's usual impact, or what this run measured where it decides (a data wait of 58%
    puts a loader finding first)."""
    measure = getattr(rule, "measure", None)
    decided = verdict(measure, measured) if measure is not None else None
    return _value(decided[0]) if decided is not None else _value(getattr(rule, "impact", None))


def judge(run: RunResult) -> list[RuntimeFinding]:
    """The run-time findings of one run, each once, on the device it ran on."""
    facts = run.runtime
    if facts is None or not run.reported:
        return []
    device = run.device.type
    measured = figures(run, "this run")
    found: dict[tuple[str, str | None, int | None, str], RuntimeFinding] = {}  # one framework code may say several things
    for check in CHECKS:
        for code, message, file, line in check(run, facts):
            rule = _rule(code)
            if rule is None or (rule.gpu_only and device != "cuda"):
                continue  # the advice does not apply on this device
            found.setdefault((code, file, line, message), RuntimeFinding(
                code=code, name=rule.name, message=message, severity=_value(rule.severity) or "warning",
                impact=_impact(rule, measured), file=file, line=line, device=device))
    return list(found.values())


def confirm(findings: Iterable[RuntimeFinding], static: Iterable[tuple[str, str, int, int]]) -> list[RuntimeFinding]:
    """Mark each run-time finding that a scan reports too: the same code in the same file, at the
    same line (a static finding spans ``line`` to ``end_line``; a run-time finding without a line
    matches any line of the file). ``static``: (code, absolute path, line, end_line)."""
    known = list(static)
    out = []
    for finding in findings:
        same = any(code == finding.code and _same_file(path, finding.file)
                   and (finding.line is None or start <= finding.line <= end) for code, path, start, end in known)
        out.append(replace(finding, static=same))
    return out


def _same_file(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return a == b


def scan_findings(paths: Iterable[str], codes: Iterable[str], torch_version: str | None) -> list[tuple[str, str, int, int]]:
    """What a scan of each file (on its own) reports for ``codes``: (code, path, line, end_line)."""
    from speedfix.engine.analysis import analyze  # libcst: only when there is something to compare
    from speedfix.syntax.source import read_source

    wanted = set(codes)
    rules = [rule for code in sorted(wanted) if (rule := _rule(code)) is not None]
    try:
        version = TorchVersion.parse(torch_version or DEFAULT_TARGET)  # local tags (+cu130) are ignored
    except ValueError:
        version = TorchVersion.parse(DEFAULT_TARGET)
    out = []
    for path in dict.fromkeys(paths):
        try:
            analysis = analyze(read_source(Path(path)), path, rules, version)
        except Exception:  # a file that cannot be read or parsed: nothing to compare with
            continue
        out.extend((f.code, path, f.line, f.end_line) for f in analysis.findings if f.code in wanted)
    return out


def with_findings(run: RunResult, *, scan: bool = True) -> RunResult:
    """The run with its run-time findings (``runtime.findings``), compared with a scan of their files."""
    findings = judge(run)
    if not findings:
        return run
    if scan:
        files = [f.file for f in findings if f.file and Path(f.file).is_file()]
        findings = confirm(findings, scan_findings(files, {f.code for f in findings}, run.env.torch))
    return replace(run, runtime=replace(run.runtime, findings=findings))


def first_runtime(runs: Iterable[RunResult], *, findings: bool = False) -> RuntimeFacts | None:
    """What the first measured run of a variant configured (with its run-time findings, unscanned)."""
    run = next((r for r in runs if r.measured and r.runtime is not None), None)
    if run is None:
        return None
    return (with_findings(run, scan=False) if findings else run).runtime
