"""What a scan says about a project that pins an old torch: the rules its pin switched off.

A project whose requirements pin `torch==0.4.1` is judged against 0.4.1 (``project_target``),
so the rules whose advice needs a newer torch (autocast 1.10, torch.compile 2.0, fused
optimizers 2.4) do not run there. The scan says so once per pin, at the requirement file, with
the rules left out and how to see their advice."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from speedfix.engine.results import Note
from speedfix.model.project_files import ProjectFiles, display_path
from speedfix.model.versions import TorchPin, TorchVersion, project_target, torch_pin
from speedfix.workspace.config import Settings

if TYPE_CHECKING:
    from speedfix.engine.rule import Rule


def pinned_torch_notes(paths: Iterable[Path], settings: Settings) -> list[Note]:
    """One note per torch pin that moved the target below the one the scan would use (the
    installed torch), naming the rules it switched off; none with an explicit torch version."""
    if settings.torch_version:
        return []
    current = settings.target
    seen_folders: set[Path] = set()
    left_out: dict[tuple[Path, TorchVersion], tuple[TorchPin, set[type[Rule]]]] = {}
    for path in paths:
        if path.parent in seen_folders:
            continue
        seen_folders.add(path.parent)
        project = ProjectFiles.for_script(path, (settings.root, Path.cwd()))
        pin = torch_pin(project)
        if pin is None:
            continue
        target = project_target(project, current)
        if not target < current:
            continue
        rules = {rule for rule in settings.rules_for(path)
                 if rule.applies_to(current) and not rule.applies_to(target) and not rule.advises_upgrade(target)}
        if rules:
            left_out.setdefault((pin.path, target), (pin, set()))[1].update(rules)
    return [Note(display_path(pin.path), _message(pin, target, rules, current))
            for (_, target), (pin, rules) in left_out.items()]


def _message(pin: TorchPin, target: TorchVersion, rules: set[type[Rule]], current: TorchVersion) -> str:
    by_version: dict[TorchVersion, list[str]] = {}
    for rule in sorted(rules, key=lambda r: r.code):
        by_version.setdefault(rule.min_torch, []).append(f"{rule.code} {rule.name}")
    groups = "; ".join(f"torch {version}+: {', '.join(names)}" for version, names in sorted(by_version.items()))
    count = f"{len(rules)} rules that need" if len(rules) != 1 else "1 rule that needs"
    return (f"the project pins {pin.shown} here, so the scan targets torch {target} and {count} a newer "
            f"torch did not run ({groups}); pass `--torch-version {current}` to see the advice for a newer torch")
