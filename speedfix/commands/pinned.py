"""What a scan says about a project that pins an old torch: the rules its pin switched off.

A project whose requirements pin `torch==0.4.1` is judged against 0.4.1 (``project_target``),
so the rules whose advice needs a newer torch (autocast 1.10, torch.compile 2.0, fused
optimizers 2.4) do not run there. The scan says so once per pin, at the requirement file, with
the rules left out and how to see their advice."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

from speedfix.engine.catalog import catalog, rule_torch_range
from speedfix.engine.results import Note
from speedfix.model.project_files import ProjectFiles, display_path
from speedfix.model.versions import TorchPin, TorchRange, TorchVersion, project_target, torch_pin
from speedfix.workspace.config import Settings


def pinned_torch_notes(paths: Iterable[Path], settings: Settings, inputs: dict[str, str] | None = None) -> list[Note]:
    """One note per torch pin that moved the target below the one the scan would use (the
    installed torch), naming the rules it switched off; none with an explicit torch version.
    The rules' torch ranges come from the catalog: a scan of cached files imports no rule.
    ``inputs`` receives the project files looked at, with their digests (for the scan cache)."""
    if settings.torch_version:
        return []
    current = settings.target
    left_out: dict[tuple[Path, TorchVersion], tuple[TorchPin, dict[str, TorchRange]]] = {}
    for path, project in _one_per_folder(paths, settings):
        pin = torch_pin(project)
        target = project_target(project, current) if pin is not None else current
        if inputs is not None:
            inputs.update(project.inputs)
        if pin is None:
            continue
        if not target < current:
            continue
        ranges = _torch_ranges(settings, path)
        rules = {code: span for code, span in ranges.items()
                 if span.applies_to(current) and not span.applies_to(target) and not span.advises_upgrade(target)}
        if rules:
            left_out.setdefault((pin.path, target), (pin, {}))[1].update(rules)
    return [Note(display_path(pin.path), _message(pin, target, rules, current))
            for (_, target), (pin, rules) in left_out.items()]


def _torch_ranges(settings: Settings, path: Path) -> dict[str, TorchRange]:
    """Code -> torch range of each rule enabled for ``path``; the rule classes only for codes the
    catalog's summaries do not know yet."""
    ranges = {code: rule_torch_range(code) for code in settings.codes_for(path)}
    if None in ranges.values():
        ranges.update({rule.code: rule.torch_range() for rule in settings.rules_for(path)})
    return {code: span for code, span in ranges.items() if span is not None}


def _message(pin: TorchPin, target: TorchVersion, rules: dict[str, TorchRange], current: TorchVersion) -> str:
    by_version: dict[TorchVersion, list[str]] = {}
    names = catalog()
    for code, span in sorted(rules.items()):
        by_version.setdefault(span.min_torch, []).append(f"{code} {names.get(code, '')}".rstrip())
    groups = "; ".join(f"torch {version}+: {', '.join(codes)}" for version, codes in sorted(by_version.items()))
    count = f"{len(rules)} rules that need" if len(rules) != 1 else "1 rule that needs"
    return (f"the project pins {pin.shown} here, so the scan targets torch {target} and {count} a newer "
            f"torch did not run ({groups}); pass `--torch-version {current}` to see the advice for a newer torch")


def read_torch_pins(paths: Iterable[Path], settings: Settings) -> None:
    """Read the torch pins of the scripts' projects once, for what follows in the scan to reuse
    (within ``listings_kept``): the analysis of each file and ``pinned_torch_notes``."""
    if not settings.torch_version:
        for _, project in _one_per_folder(paths, settings):
            torch_pin(project)


def _one_per_folder(paths: Iterable[Path], settings: Settings) -> Iterator[tuple[Path, ProjectFiles]]:
    """A script of each folder, with how its project's files are read."""
    seen: set[Path] = set()
    for path in paths:
        if path.parent not in seen:
            seen.add(path.parent)
            yield path, ProjectFiles.for_script(path, (settings.root, Path.cwd()))
