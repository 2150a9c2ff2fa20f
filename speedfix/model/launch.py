"""How a project runs a script: the command lines of its launch scripts and READMEs.

`deepspeed train.py --deepspeed ds_config.json`, `accelerate launch --config_file fsdp.yaml
train.py --bf16 True`, `torchrun --nproc_per_node=4 train.py --tf32 True`: the settings of a
framework script are often given there, not in the script. The launch files of a project are:

- shell scripts (`.sh`, `.bash`, `.slurm`) in the script's folder and its subfolders (three
  levels: DeepSpeed-Chat keeps them in `training_scripts/opt/single_gpu/`), and in the folders
  above it up to the project's top, with their `scripts/` subfolders;
- the fenced code blocks of the README files of those folders and of the project's other
  folders (three levels below its top: `recipes/<model>/README.md`), of the Markdown files of
  its `docs/` folders, and the script's own module docstring (TRL documents its example runs
  there).

A command runs *this* script when a word of it names the script's path relative to the launch
file, the project's top or the script's folder (`python -m pkg.train` counts too); a module with
no `if __name__ == "__main__":` block is run by the commands of the scanned scripts that import
it, in turn (a helper that parses their command line). What follows
the script's path are its options; what comes before, the launcher's (`accelerate launch
--mixed_precision bf16`). A shell variable the launch file sets once, at its top level, to a
plain word (`batch=1`, then `--batch_size ${batch}`) is read as that word; other values with shell
variables (`$DS_CONFIG` from the caller) are unknown. A script that reads its options from a
file (`HfArgumentParser.parse_yaml_file(sys.argv[-1])`) takes the top-level values of the YAML or
JSON file its command names (`deepspeed train.py config/args.yaml`) as that command's options.
Nothing is run: the files are read as text (``ProjectFiles``).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import Callable, Mapping, Sequence
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.config_tree import load_mapping
from speedfix.model.console_scripts import console_scripts
from speedfix.model.context import FileContext
from speedfix.model.project_files import Location, ProjectFiles, kept_for_scan
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import is_main_guard

SHELL_SUFFIXES = (".sh", ".bash", ".slurm")
_SCRIPT_FOLDERS = ("scripts", "script", "bin", "run_scripts", "launch", "launchers")
_DEPTH = 3  # subfolders of the script's own folder searched for shell scripts (and of the top for READMEs)
_DOC_FOLDERS = ("docs", "doc", "documentation")
_TEST_FOLDERS = ("tests", "test")
_MAX_FOLDERS = 100  # folders of the project looked into for its READMEs at most
_MAX_FILES = 200  # launch files read per script at most
_FENCE = re.compile(r"^\s*(```|~~~)")
_SEPARATORS = frozenset({"&&", "||", ";", "|", "&", ">", ">>", "&>", "<", "2>", "(", ")"})
UNKNOWN_VALUE = object()  # an option's value that cannot be known (a shell variable)
# A README's `<your_path>`, `<job name>`: an unknown value, not a redirection (`< in.txt`, `2>&1`)
_PLACEHOLDER = re.compile(r"<([^<>\s]+|[A-Za-z_][\w.,/:=-]*(?: [\w.,/:=-]+)+)>")
_PLAIN_LINE = re.compile(r"[^'\"\\#();<>|&\r\n]*")
_BLANKS = re.compile(r"[ \t]+")
_COMMAND_WORD = re.compile(r"[\w./$~{}=:,+@%-]+$")  # what a command line starts with (not `│`, `├──`, `|`)
# A command whose options are left out and said to be elsewhere: `# arguments (same as above)`, `# 参数同上`,
# `...`.
_ELIDED = re.compile(r"#.*(?:\b(?:same as|as above|see above)\b|同上|如上)|(?:^|\s)(?:\.\.\.|…)(?:\s|$)", re.IGNORECASE)


class State(Enum):
    MISSING = "missing"  # no launch command sets it (or the project shows none)
    KNOWN = "known"  # every launch command sets it, to the same value
    MIXED = "mixed"  # some set it (or set it differently), some do not


@dataclass(frozen=True)
class Launch:
    """One command line that runs the script."""

    file: Path
    line: int
    launcher: str  # "python", "torchrun", "deepspeed", "accelerate", ...
    launcher_options: dict[str, object]
    options: dict[str, object]  # the script's own, `--bf16 True` -> {"bf16": "True"}
    where: dict[str, Location] = field(default_factory=dict)  # the line of each option
    positional: tuple[str, ...] = ()  # the words after the script before its first option
    direct: bool = True  # runs the script itself, not a file beside it that imports it (``_wrappers``)
    words: tuple[str, ...] = ()  # every word after the script, up to the end of the command (hydra's `-cp conf x=1`)

    @property
    def at(self) -> Location:
        """The command's first line, for a value it sets that no option's line shows."""
        return Location(self.file, self.line, 1, self.line, 1)


@dataclass(frozen=True)
class LaunchValue:
    state: State
    value: object = None  # a string, True for a bare flag, or UNKNOWN_VALUE
    where: Location | None = None

    @property
    def known(self) -> bool:
        return self.state is State.KNOWN and self.value is not UNKNOWN_VALUE


MISSING = LaunchValue(State.MISSING)
_LAUNCHES: WeakKeyDictionary[FileContext, list[Launch]] = WeakKeyDictionary()


def launches(ctx: FileContext) -> list[Launch]:
    """The project's command lines that run this script (computed once per file)."""
    found = _LAUNCHES.get(ctx)
    if found is None:
        found = _LAUNCHES[ctx] = _find(ctx) if ctx.project is not None else []
    return found


def self_test_block(ctx: FileContext) -> cst.If | None:
    """The `if __name__ == "__main__":` block of a library module: a file that a scanned script
    with a training loop imports (``Links.trained_by``), or that a script imports beside the
    library holding its training loop (``Links.beside_trainer``), and that no launch command of
    the project runs. The block runs only when someone runs the module on its own: a self-test or
    a demo (awd-lstm's `splitcross.py` training a toy loss, a data set's loader smoke test,
    vall-e's model files training on a toy batch), not the training the scan is about."""
    block = next((statement for statement in ctx.module.body
                  if isinstance(statement, cst.If) and is_main_guard(statement.test)), None)
    if block is None or trained_with(ctx) is None or any(launch.direct for launch in launches(ctx)):
        return None  # (the launch files are read only for a file with such a block)
    return block


def trained_with(ctx: FileContext) -> str | None:
    """The file (as shown) whose training loop a run builds this file's code for:
    ``Links.trained_by``, else ``Links.beside_trainer``."""
    return ctx.links.trained_by or ctx.links.beside_trainer


_OFF = frozenset({"False", "None", "0", "''", '""'})


def classes_off_the_run(ctx: FileContext) -> dict[str, str]:
    """The classes of this file (at its top level) that other files build only under an option
    the runs leave off (`if args.gail: discr = gail.Discriminator(...)` with `--gail` a
    `store_true` flag no launch command or README of the project passes; `elif args.policy ==
    "DDPG":` where the default and every command give `TD3`), each with why: no run builds
    them, so no run trains with them. None built here."""
    links = ctx.links
    if not links.built_under or not links.option_holders:
        return {}
    defaults = dict(links.options)
    built_here = {dotted_name(site.node.func) for site in ctx.calls}
    found: dict[str, str] = {}
    for statement in ctx.module.body:
        if not isinstance(statement, cst.ClassDef) or statement.name.value in built_here:
            continue
        name = statement.name.value
        sets = [gates for built, gates in links.built_under if built == name]
        flags = [next((gate for gate in sorted(gates, key=lambda gate: gate.startswith("!"))  # `args.policy=DDPG` first
                       if _off_in_every_run(ctx, gate, links.option_holders, defaults)), None) for gates in sets]
        if sets and all(flags):
            shown = str(flags[0])
            option, _, value = shown.lstrip("!").split(".", 1)[1].partition("=")
            if value and shown[0] == "!":
                found[name] = f"built only where `--{option}` is not `{value}`, which every run gives it"
            elif value:
                found[name] = (f"built only where `--{option}` is `{value}`, which no launch command or README of the "
                               "project gives and which is not its default")
            else:
                found[name] = (f"built only with `--{option}`, an option off by default that no launch command or "
                               "README of the project passes")
    return found


def _off_in_every_run(ctx: FileContext, gate: str, holders: tuple[str, ...], defaults: dict[str, str]) -> bool:
    """Does every run leave the gate of a construction off: a flag (`args.gail`) that is off by
    default and that no launch command or README passes, or an option's value (`args.policy=DDPG`)
    that neither its default nor any launch command gives (TD3's `--policy`, "TD3" in every run)?"""
    head, dot, option = gate.lstrip("!").partition(".")
    if not dot or head not in holders:
        return False
    option, equals, value = option.partition("=")
    if "." in option:
        return False
    if not equals:
        return not gate.startswith("!") and defaults.get(option) in _OFF and not option_passed(ctx, option)
    runs = _values_run(ctx, option, defaults)
    if runs is None:
        return False
    return runs == {value} if gate.startswith("!") else value not in runs


def _values_run(ctx: FileContext, option: str, defaults: Mapping[str, str]) -> set[str] | None:
    """The values the runs give the string option `--option`: each launch command's, and its
    default where a command leaves it out or the project shows none; None when one is unknown
    (a command's value, or a default that is no string literal)."""
    values = option_values(ctx, option)
    if values is None:
        return None
    if values and "" not in values:
        return values
    default = defaults.get(option, "")
    if not (len(default) > 1 and default[0] == default[-1] and default[0] in "'\""):
        return None  # no string default: which value runs is unknown
    return (values - {""}) | {default[1:-1]}


def picked_by_no_run(ctx: FileContext) -> str | None:
    """Is this file reached only through entries of option-indexed dicts (``Links.picked_by``:
    LTSF-Linear's `model_dict[self.args.model]` holding `Autoformer`, whose layers only it imports)
    that no run picks: every launch command of the project that sets the option (or, where none
    does, its default) gives another key? Those entries and the runs' choices, for a note."""
    keys: dict[str, set[str]] = {}
    for option, key, _ in ctx.links.picked_by:
        keys.setdefault(option, set()).add(key)
    said: list[str] = []
    for option, picked in sorted(keys.items()):
        values = _values_run(ctx, option, dict(ctx.links.options))
        if values is None:
            return None  # a command's value, or the default, unknown: which entry runs is unknown
        if values & picked or any(not values <= set(every) for name, _, every in ctx.links.picked_by if name == option):
            return None  # a run picks it, or a value no dict holds: not the reading of the code it seems
        entries = " and ".join(f"`{key}`" for key in sorted(picked))
        chosen = " or ".join(f"`{value}`" for value in sorted(values))
        said.append(f"the {entries} entr{'ies' if len(picked) > 1 else 'y'} of a dict indexed by `--{option}`, "
                    f"which the runs set to {chosen}")
    return "; ".join(said)


def launch_files_capped(ctx: FileContext) -> bool:
    """Does the project hold more launch files than are read (``_MAX_FILES``)? Then a command
    that is not seen may run any code."""
    return ctx.project is not None and len(launch_files(ctx.project)) >= _MAX_FILES


def option_values(ctx: FileContext, option: str) -> set[str] | None:
    """The values the project's launch scripts and README commands (any command that runs a
    Python file) give `--option`, "" for a command that leaves it out (the script's default
    runs); None when one of them cannot be known (a shell variable set elsewhere, a bare flag),
    or when the project has more launch files than are read."""
    project = ctx.project
    if project is None:
        return None
    files = launch_files(project)
    if len(files) >= _MAX_FILES:
        return None  # a command among the files not read may set it
    values: set[str] = set()
    for path in files:
        text = project.text(path)
        if text is None or ".py" not in text:
            continue
        for logical_lines in kept_for_scan(("launch lines", path), lambda: _file_lines(path, text)):
            for _, logical, _ in logical_lines:
                if ".py" not in logical:
                    continue
                for command in _segments(kept_for_scan(("words", logical), lambda: _words(logical))):
                    if not any(word.endswith(".py") for word in command):
                        continue
                    value = _options(command).get(option, "")
                    if not isinstance(value, str):
                        return None
                    values.add(value)
    return values


def _segments(words: list[str]) -> list[list[str]]:
    """The commands of one line (`cd .. && python main.py --model x`: `cd ..`, then the rest)."""
    commands: list[list[str]] = [[]]
    for word in words:
        if word in _SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    return [command for command in commands if command]


def option_passed(ctx: FileContext, option: str) -> bool:
    """Does a launch script or README of the project pass the option `--option` (`--gail`, not
    `--gail-experts-dir`; `-` and `_` alike)? True where the project cannot be read."""
    pattern = re.compile(r"--%s(?![\w-])" % re.escape(option).replace("_", "[-_]"))
    project = ctx.project
    if project is None:
        return True
    files = launch_files(project)
    return len(files) >= _MAX_FILES or any(_passes(pattern, project.text(path) or "") for path in files)


# A line of argparse's `--help` listing pasted into a README: `  --cuda      run on CUDA (default: False)`.
_HELP_LINE = re.compile(r"\s*-[^\s\[]*(?: [A-Z_]+)?(?:, -[^\s\[]*(?: [A-Z_]+)?)*\s{2,}\S")


def _passes(pattern: re.Pattern[str], text: str) -> bool:
    """Does ``text`` pass the option ``pattern`` matches: not in argparse's usage (`[--cuda]`) or
    help listing that a README shows, which name the options and pass none."""
    for match in pattern.finditer(text):
        start = match.start()
        if text[start - 1:start] == "[":
            continue
        line_start = text.rfind("\n", 0, start) + 1
        if text[line_start:start].strip() == "" and _HELP_LINE.match(text, line_start):
            continue
        return True
    return False


def option(ctx: FileContext, *names: str, launcher: bool = False,
           files: Sequence[Mapping[str, tuple[object, Location]] | None] = ()) -> LaunchValue:
    """What the launch commands say about an option (any of ``names``, without dashes): KNOWN
    when every command sets it to one value, MISSING when none does, MIXED otherwise.
    ``launcher``: an option of the launcher (`accelerate launch --mixed_precision`). ``files``:
    per command (in ``launches`` order), the values of the config file it names (TRL's
    `--config recipe.yaml`; None: a file that cannot be read, whose values are unknown), for
    the options the command line itself leaves out."""
    values = per_command(ctx, *names, launcher=launcher, files=files)
    if not values:
        return MISSING
    if all(value is None for value in values):
        return MISSING
    if any(value is None for value in values) or len({repr(v[0]) for v in values if v is not None}) > 1:
        return LaunchValue(State.MIXED)
    value, where = values[0]  # type: ignore[misc]
    return LaunchValue(State.KNOWN, value, where)


def per_command(ctx: FileContext, *names: str, launcher: bool = False,
                files: Sequence[Mapping[str, tuple[object, Location]] | None] = ()) -> list[tuple[object, Location | None] | None]:
    """What each launch command (in ``launches`` order) says about an option, as ``option``
    reads it: (its value, its line), or None for a command that leaves it out. Where the
    commands disagree (`--fp16` in one launch script, nothing in another), each run's value."""
    values: list[tuple[object, Location | None] | None] = []
    for index, launch in enumerate(launches(ctx)):
        options = launch.launcher_options if launcher else launch.options
        name = next((n for n in names if n in options), None)
        from_file = files[index] if index < len(files) else {}
        in_file = next((n for n in names if n in from_file), None) if from_file is not None else None
        if name is not None:
            values.append((options[name], launch.where.get(name)))
        elif from_file is None:
            values.append((UNKNOWN_VALUE, None))
        else:
            values.append(from_file[in_file] if in_file is not None else None)
    return values


def comment_above(ctx: FileContext, command: Launch) -> str:
    """The comment lines right above a command in its launch file, lower-cased ("# use --fp16
    instead of --bf16 due to autogptq"): what the author says about that run."""
    text = ctx.project.text(command.file) if ctx.project is not None else None
    lines = (text or "").splitlines()[:max(command.line - 1, 0)]
    said: list[str] = []
    for line in reversed(lines):
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        said.append(stripped.lstrip("#").strip().lower())
    return " ".join(reversed(said))


def truth(value: object) -> bool | None:
    """`--bf16`, `--bf16 True`, `--bf16=false`: the boolean a Hugging Face/argparse flag takes."""
    if value is True:
        return True
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in ("true", "1", "yes", "y", "t"):
            return True
        if lowered in ("false", "0", "no", "n", "f"):
            return False
    return None


# ---------------------------------------------------------------------- finding the commands
def _find(ctx: FileContext) -> list[Launch]:
    project = ctx.project
    assert project is not None
    found: list[Launch] = []
    installed = console_scripts(project)
    runners = (project.script, *_wrappers(project), *_importing_scripts(ctx, installed))
    commands = {name: path for name, path in installed.items() if path in runners}
    names = frozenset(_runner_names(runners) | set(commands))
    named = _any_of(names)
    for path in launch_files(project):
        text = project.text(path)
        if text is None or not named(text):
            continue  # no command there can run the script
        try:
            # the lines that name the script, once per scan for the scripts of the same names
            lines = kept_for_scan(("lines naming", path, names), lambda: [
                line for block in kept_for_scan(("launch lines", path), lambda: _file_lines(path, text))
                for line in block if named(line[1])])
            found.extend(_commands(project, path, lines, runners, commands))
        except (ValueError, IndexError, KeyError) as exc:  # a line this reader cannot follow costs that
            # file's commands, not the script's analysis
            project.note(path, f"its commands were not read ({type(exc).__name__}: {exc})")
    docstring = _module_docstring(ctx)
    if docstring is not None:
        first, lines = docstring
        found.extend(_commands(project, project.script, [line for line in _logical_lines(first, lines) if named(line[1])],
                               runners, commands))
    if any((site.func or "").endswith(_ARGUMENT_FILE_READERS) for site in ctx.calls):
        found = [_with_argument_file(project, command) for command in found]
    return found


# `HfArgumentParser.parse_yaml_file(sys.argv[-1])`: the script's options come from the file a command names
_ARGUMENT_FILE_READERS = (".parse_yaml_file", ".parse_json_file")


def _with_argument_file(project: ProjectFiles, command: Launch) -> Launch:
    """The command with the top-level values of the YAML or JSON file it hands the script
    (`deepspeed src/train_lomo.py config/args_lomo.yaml`) as its options (options written on the
    command line win). They are located at the command: a relative path among them (`deepspeed:
    config/ds.json`) is relative to where the command runs, not to the file."""
    for word in reversed(command.positional):
        path = _nearest(project, command.file, word) if word.endswith((".yaml", ".yml", ".json")) else None
        tree = load_mapping(project, path) if path is not None else None
        if tree is None:
            continue
        options, where = dict(command.options), dict(command.where)
        for key, node in tree.value.items():
            if isinstance(key, str) and not isinstance(node.value, (dict, list)) and key not in options:
                options[key] = node.value if isinstance(node.value, str) else str(node.value)
                where[key] = command.at
        return replace(command, options=options, where=where)
    return command


def launch_files(project: ProjectFiles) -> list[Path]:
    """The files whose commands may run the script (besides its own docstring): the shell
    scripts and Markdown files this module's docstring names, found once per folder."""
    return project.recorded(("launch files", project.folder), lambda: _launch_files(project))


def has_docstring(ctx: FileContext) -> bool:
    """Does the script have a module docstring (whose commands may run it)?"""
    return _module_docstring(ctx) is not None


def _wrappers(project: ProjectFiles) -> list[Path]:
    """Scripts beside this one that import it and are run in its place: FastChat's
    `train_mem.py` patches attention, then `from fastchat.train.train import train` and calls it."""
    script = project.script
    modules = {script.stem}
    top = project.top()
    if top in script.parents:
        modules.add(".".join(script.relative_to(top).with_suffix("").parts))
    entry = _entry_calls(project.quiet_text(script) or "")  # (the analysis of the script says why it cannot be read)
    found = []
    for path in project.listing(script.parent, (".py",))[:_MAX_FILES]:
        text = project.text(path) or ""
        if path == script or "__main__" not in text:
            continue
        for match in _IMPORT_LINE.finditer(text):
            module = match.group(1) or match.group(3)
            if module not in modules and not (match.group(3) and any(module.startswith(f"{m}.") for m in modules)):
                continue
            # `from train import train`: the script's entry point; a module that takes only its
            # argument classes or data helpers (FastChat's `train_lora.py`) runs its own
            imported = set(re.findall(r"\w+", match.group(2))) if match.group(1) is not None else None
            if imported is None or not entry or imported & entry:
                found.append(path)
                break
    return found


# A line that imports a module: `from <module> import <names>` (1, 2) or `import <module>` (3)
_IMPORT_LINE = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+(\([^)]*\)|[^\n]*)|import\s+([\w.]+))", re.MULTILINE)


def _importing_scripts(ctx: FileContext, installed: dict[str, Path]) -> list[Path]:
    """For a module with no `if __name__ == "__main__":` block, the scanned scripts that import
    it, in turn (``Links.entry_importers``): the commands that run them run its code
    (ChatGLM-Efficient-Tuning's `src/utils/common.py`, whose `prepare_args()` parses the
    arguments of `train_sft.py`'s command line, through the package's `__init__.py`); and the
    modules importing it that a console script of the project runs (``installed``:
    stylegan2-deepspeed's `cli.py`, whose `main()` builds the trainer of `trainer.py`)."""
    project = ctx.project
    if project is None or not (ctx.links.entry_importers or installed) or any(
            isinstance(statement, cst.If) and is_main_guard(statement.test) for statement in ctx.module.body):
        return []
    found = []
    entries = set(installed.values())
    for shown in (*ctx.links.entry_importers, *ctx.links.importers):
        path = Path(shown)
        if project.script.is_absolute() and not path.is_absolute():
            path = Path(os.path.normpath(Path.cwd() / path))
        if (shown in ctx.links.entry_importers or path in entries) and path not in found:
            found.append(path)
    return found


_MAIN_GUARD = re.compile(r"""^if\s+__name__\s*==\s*["']__main__["']\s*:(.*)""", re.MULTILINE | re.DOTALL)


def _entry_calls(text: str) -> set[str]:
    """The functions the script's `if __name__ == "__main__":` block calls (empty: no such block)."""
    match = _MAIN_GUARD.search(text)
    return set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", match.group(1))) if match else set()


def _launch_files(project: ProjectFiles) -> list[Path]:
    files: list[Path] = []
    seen: set[Path] = set()

    def add(path: Path) -> None:
        if path not in seen and len(files) < _MAX_FILES:
            seen.add(path)
            files.append(path)

    def shell_scripts(folder: Path, depth: int) -> None:
        for path in project.listing(folder, SHELL_SUFFIXES):
            add(path)
        if depth <= 0:
            return
        for sub in project.subfolders(folder):
            shell_scripts(sub, depth - 1)

    for index, folder in enumerate(project.folders_up()):
        if index == 0:
            shell_scripts(folder, _DEPTH)
        else:
            for path in project.listing(folder, SHELL_SUFFIXES):
                add(path)
            subfolders = {sub.name for sub in project.subfolders(folder)}
            for name in _SCRIPT_FOLDERS:
                if name in subfolders:
                    shell_scripts(folder / name, _DEPTH - 1)
        for path in project.listing(folder, (".md", ".MD")):
            if path.name.lower().startswith("readme"):
                add(path)
    for path in project.recorded(("project docs", project.top()), lambda: _project_docs(project)):
        add(path)
    return files


def _project_docs(project: ProjectFiles) -> list[Path]:
    """The README files of the project's other folders (alignment-handbook's `recipes/<model>/
    README.md`), every Markdown file of its `docs/` folders, and the shell scripts of its other
    folders (FineGrainedRLHF's `tasks/qa_feedback/training/train_sft.sh` runs `./sft/run_sft.py`
    from the top): a few levels below the top, breadth first, ``_MAX_FOLDERS`` folders at most
    (the same for every script of the project)."""
    found: list[Path] = []
    todo = [(project.top(), _DEPTH)]
    for folder, depth in todo:
        for sub in project.subfolders(folder):
            if sub.name.startswith(".") or sub.name in _TEST_FOLDERS or len(todo) >= _MAX_FOLDERS:
                continue
            docs = sub.name.lower() in _DOC_FOLDERS
            for path in project.listing(sub, (".md", ".MD")):
                if docs or path.name.lower().startswith("readme"):
                    found.append(path)
            found.extend(project.listing(sub, SHELL_SUFFIXES))
            if depth > 1:
                todo.append((sub, depth - 1))
    return found


def _readme_blocks(text: str) -> list[tuple[int, list[str]]]:
    """The fenced code blocks of a Markdown file: (first line number, lines)."""
    blocks: list[tuple[int, list[str]]] = []
    current: list[str] | None = None
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            if current is None:
                current, start = [], number + 1
            else:
                blocks.append((start, current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _module_docstring(ctx: FileContext) -> tuple[int, list[str]] | None:
    body = ctx.module.body
    if not body or not isinstance(body[0], cst.SimpleStatementLine) or not body[0].body:
        return None
    expr = body[0].body[0]
    if not isinstance(expr, cst.Expr) or not isinstance(expr.value, (cst.SimpleString, cst.ConcatenatedString)):
        return None
    text = ctx.module.code_for_node(expr.value)
    first = len(ctx.module.code_for_node(cst.Module(body=[], header=ctx.module.header)).splitlines()) + 1
    return first, text.splitlines()


def _file_lines(path: Path, text: str) -> list[list[tuple[int, str, list[tuple[int, str]]]]]:
    """The logical lines of a launch file, per shell script or per code block of a README, with
    the shell variables the block sets once expanded (``_expanded``)."""
    readme = path.suffix.lower() == ".md"
    blocks = _readme_blocks(text) if readme else [(1, text.splitlines())]
    return [_expanded(_logical_lines(first, lines, readme=readme)) for first, lines in blocks]


_ASSIGNMENT = re.compile(r"(?:export[ \t]+)?([A-Za-z_]\w*)=(\S*)")
_REFERENCE = re.compile(r"\$(?:\{([A-Za-z_]\w*)\}|([A-Za-z_]\w*))")


def _expanded(lines: list[tuple[int, str, list[tuple[int, str]]]]) -> list[tuple[int, str, list[tuple[int, str]]]]:
    """`batch=1` ... `--per_device_train_batch_size ${batch}`: a variable the script sets once, at
    the top level (not indented: no loop or branch around it), to a plain word before the
    command is its value there, also a word made of such variables (`train_path=$path/run.py`).
    One set twice, to a value made of commands or of variables it does not know, or set by the
    caller (`${BATCH:-1}`, `$1`), stays unknown."""
    assigned: dict[str, tuple[int, str] | None] = {}

    def known_value(match: re.Match[str]) -> str:
        found = assigned.get(match.group(1) or match.group(2))
        return found[1] if found is not None else match.group(0)

    for start, logical, _physical in lines:
        match = _ASSIGNMENT.fullmatch(logical.strip()) if logical[:1] not in (" ", "\t") else None
        if match is not None:
            name, value = match.group(1), match.group(2)
            plain = value.strip("'\"") if value[:1] in "'\"" and value[-1:] == value[:1] and len(value) > 1 else value
            plain = _REFERENCE.sub(known_value, plain)  # `train_path=$path/run.py` after `path=./`
            known = not any(char in plain for char in "$`(){}'\"")
            assigned[name] = None if name in assigned or not known else (start, plain)
    if not any(assigned.values()):
        return lines

    def expand(start: int, logical: str) -> str:
        def value(match: re.Match[str]) -> str:
            found = assigned.get(match.group(1) or match.group(2))
            return found[1] if found is not None and found[0] < start else match.group(0)
        return _REFERENCE.sub(value, logical)

    return [(start, expand(start, logical) if "$" in logical else logical, physical)
            for start, logical, physical in lines]


def _commands(project: ProjectFiles, path: Path, logical_lines: list[tuple[int, str, list[tuple[int, str]]]],
              runners: tuple[Path, ...], installed: dict[str, Path]) -> list[Launch]:
    """The commands of ``logical_lines`` (of ``path``, those that name one of ``runners``) that
    run the script, or one of ``runners`` (a file beside it that imports it and runs its entry
    point), also through the console script of the project that runs it (``installed``:
    `stylegan2_deepspeed`, or `` `which stylegan2_deepspeed` `` after a launcher)."""
    found = []
    files = tuple(runner.name for runner in runners)
    for start, logical, physical in logical_lines:
        words = kept_for_scan(("held words", logical), lambda: _held_command(kept_for_scan(
            ("words", logical), lambda: _words(logical))))
        if words and not _COMMAND_WORD.match(words[0]):
            continue  # a README's folder tree (`│   ├── train.py   # Stage 2`), a table: no command
        if _ELIDED.search(logical):
            continue  # `accelerate launch train.py # arguments (same as above)`: its options are another command's
        for index, word in enumerate(words):
            module = words[index - 1] in _MODULE_FLAGS if index else False
            command = installed.get(word.strip("`$()")) if installed else None
            if command is None and not module and not word.endswith(files):
                continue  # (``_names_script`` asks it first)
            runner = command or next((runner for runner in runners if _names_script(project, path, word, module, runner)), None)
            if runner is not None and not _reads_the_file(words[:index]):
                after = words[index + 1:]
                if command is not None and after[:1] == [")"]:
                    after = after[1:]  # `$(which name)`: the script's options follow the substitution
                launch = _launch(path, start, physical, words[:index], after)
                if runner != project.script:
                    launch = replace(launch, direct=False)
                found.append(launch)
                break
    return found


@lru_cache(maxsize=256)
def _any_of(names: frozenset[str]) -> Callable[[str], re.Match[str] | None]:
    """A test of whether a text holds one of ``names`` where a word ends (one regular expression
    for all): what a command word that names the script ends with (`train.py`, `-m pkg.train`,
    its console script), not `training` or `train_loader`."""
    if not names:
        return lambda _: None
    return re.compile(f"(?:{'|'.join(map(re.escape, sorted(names, key=len, reverse=True)))})(?![\\w-])").search


# Commands that read, copy or check a script rather than run it (MoCo's README: `diff main_moco.py
# <(curl .../imagenet/main.py)`, to show its changes)
_NOT_RUNNERS = frozenset({
    "diff", "cat", "less", "more", "head", "tail", "vim", "vi", "nano", "emacs", "code", "open", "cp", "mv", "rm",
    "ls", "ln", "touch", "chmod", "git", "grep", "wc", "sed", "awk", "wget", "curl", "scp", "rsync", "tar", "zip",
    "unzip", "echo", "black", "isort", "flake8", "pylint", "mypy", "ruff", "pytest", "cd",
})


def _reads_the_file(before: list[str]) -> bool:
    """Does the command around the script's name (the words after the last `&&`, `;` or `|`)
    start with a program that reads the file instead of running it (`diff train.py ...`)?"""
    start = max((i + 1 for i, word in enumerate(before) if word in _SEPARATORS), default=0)
    program = next((word for word in before[start:] if not _HELD.fullmatch(word)), None)  # after `VAR=value`
    return program is not None and os.path.basename(program) in _NOT_RUNNERS


_HELD = re.compile(r"[A-Za-z_]\w*=(.*)", re.DOTALL)


def _held_command(words: list[str]) -> list[str]:
    """The command a variable holds (`PROGRAM="train.py --mixed_precision=fp16 ..."`, for an
    `accelerate launch $PROGRAM` the README leaves out, its closing quote too): its words. A
    plain setting (`CUDA_VISIBLE_DEVICES=0 python train.py`, `SCRIPT=train.py`) is no command."""
    match = _HELD.fullmatch(words[0]) if words else None
    if match is None:
        return words
    value = match.group(1)
    if any(char.isspace() for char in value):  # a quoted value with options in it
        return [*_words(value), *words[1:]]
    if value[:1] in ("'", '"') and not value.endswith(value[0]) and len(words) > 1:
        return [value[1:], *words[1:]]  # a quote that never closes: the rest of the line is the value
    return words


# `python -m pkg.train`, `deepspeed --module pkg.train`, `torchrun --module pkg.train`
_MODULE_FLAGS = ("-m", "--module")


def _runner_names(runners: tuple[Path, ...]) -> set[str]:
    """What a command that runs one of ``runners`` names: a file or module name, or the package
    whose `__main__.py` it is (`python -m pkg.ppo` runs `pkg/ppo/__main__.py`)."""
    return {name for runner in runners
            for name in (runner.name, runner.stem, *((runner.parent.name,) if runner.stem == "__main__" else ()))}


def _logical_lines(first: int, lines: list[str], *, readme: bool = False) -> list[tuple[int, str, list[tuple[int, str]]]]:
    """Lines joined at trailing backslashes: (first line number, text, its physical lines). In a
    README, an indented line that starts with an option also goes on the command above it: a
    command laid out for reading, with a backslash left out (`python main.py --base x.yaml`, then
    `    --gpus 0,` below it)."""
    result = []
    pending: list[tuple[int, str]] = []
    for number, line in enumerate(lines, first):
        stripped = line.rstrip()
        if stripped.lstrip().startswith("#") and not pending:
            continue
        if readme and not pending and result and stripped[:1] in (" ", "\t") and stripped.lstrip().startswith("-"):
            pending = list(result.pop()[2])
        if readme and (noted := _NOTED_CONTINUATION.search(stripped)):
            stripped = stripped[:noted.start() + 1]  # `--model_mode="wav2vec2" \ # or hubert`: a note, then more
        if stripped.endswith("\\"):
            pending.append((number, stripped[:-1]))
            continue
        pending.append((number, stripped))
        result.append((pending[0][0], " ".join(text for _, text in pending), pending))
        pending = []
    if pending:
        result.append((pending[0][0], " ".join(text for _, text in pending), pending))
    return result


# A README's continuation with a note after it (`--model_mode="wav2vec2" \ # or you can use hubert`):
# a shell would end the command there; the reader is meant to go on.
_NOTED_CONTINUATION = re.compile(r"\\[ \t]+#[^\n]*$")


def _unknown(placeholder: re.Match[str]) -> str:
    return "$" + placeholder.group(1).replace(" ", "_")  # one word, a variable's value


def _words(line: str) -> list[str]:
    line = _PLACEHOLDER.sub(_unknown, line.lstrip("$ ").strip())
    if _PLAIN_LINE.fullmatch(line):  # no quote, escape, comment or operator: shlex would split at blanks
        return _BLANKS.split(line) if line else []
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.commenters = "#"
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote
        return line.split()


def _names_script(project: ProjectFiles, launch_file: Path, word: str, module: bool, script: Path) -> bool:
    if module:
        if not re.fullmatch(r"[\w.]+", word):
            return False
        relative = Path(*word.split("."))
        wanted = relative / "__main__.py" if script.stem == "__main__" else relative.with_suffix(".py")
        return any(os.path.normpath(base / wanted) == str(script) for base in _bases(project, launch_file))
    if not word.endswith(script.name):
        return False
    if "$" in word:  # `"${dir_path}/pytorch/basics/x.py"`: the path after the variable
        tail = word.rsplit("}", 1)[-1] if "}" in word else re.sub(r"^\$\w+", "", word)
        parts = Path(tail.lstrip("/")).parts
        return len(parts) >= 2 and script.parts[-len(parts):] == parts
    if word.startswith("~") or os.path.isabs(word):
        return False
    nearest = _nearest(project, launch_file, word)
    if nearest is not None:  # another `run.py` nearer the launch file is the one it runs
        return str(nearest) == str(script)
    return any(os.path.normpath(base / word) == str(script) for base in _bases(project, launch_file))


def _nearest(project: ProjectFiles, launch_file: Path, word: str) -> Path | None:
    """The file ``word`` names from the launch file's folder or the nearest folder above it (up
    to the project's top) that has one: where a launch script is run from. Asked once per scan
    for all the scripts that read the launch file."""
    top = project.top()

    def find() -> Path | None:
        folders = [launch_file.parent]
        while folders[-1] != top and folders[-1].parent != folders[-1] and project.inside(folders[-1].parent):
            folders.append(folders[-1].parent)
        return project.find(word, tuple(folders))
    return project.recorded(("nearest", launch_file, word, top), find)


def _bases(project: ProjectFiles, launch_file: Path) -> tuple[Path, ...]:
    return (launch_file.parent, project.top(), project.folder)


def _launch(path: Path, start: int, physical: list[tuple[int, str]], before: list[str], after: list[str]) -> Launch:
    launcher_words = [w for w in before if "=" not in w or w.startswith("-")]  # not `CUDA_VISIBLE_DEVICES=0`
    launcher = "python"
    for word in launcher_words:
        name = os.path.basename(word)
        if name in ("torchrun", "deepspeed", "accelerate", "python", "python3", "srun", "mpirun", "lightning"):
            launcher = "python" if name.startswith("python") else name
            if launcher != "python":
                break
    if "torch.distributed.launch" in before or "torch.distributed.run" in before:
        launcher = "torchrun"
    options = _options(after)
    where = {name: _location(path, physical, name) for name in options}
    positional = []
    for word in after:
        if word.startswith("-") or word in _SEPARATORS:
            break
        positional.append(word)
    words = []
    for word in after:
        if word in _SEPARATORS:
            break
        words.append(word)
    return Launch(path, start, launcher, _options(before), options, where, tuple(positional), words=tuple(words))


def _options(words: list[str]) -> dict[str, object]:
    options: dict[str, object] = {}
    index = 0
    while index < len(words):
        word = words[index]
        if word in _SEPARATORS:
            break
        index += 1
        if not word.startswith("--") or len(word) == 2:
            continue
        name, equals, value = word[2:].partition("=")
        key = name.replace("-", "_")
        if equals:
            options.setdefault(key, _value(value))
        elif index < len(words) and not words[index].startswith("--") and words[index] not in _SEPARATORS:
            options.setdefault(key, _value(words[index]))
            index += 1
        else:
            options.setdefault(key, True)
    return options


def _value(word: str) -> object:
    return UNKNOWN_VALUE if "$" in word or "`" in word else word


def _location(path: Path, physical: list[tuple[int, str]], name: str) -> Location:
    pattern = re.compile(rf"--{re.escape(name).replace('_', '[-_]')}(?![\w-])")
    for number, text in physical:
        match = pattern.search(text)
        if match:
            return Location(path, number, match.start() + 1, number, len(text.rstrip()) + 1, text)
    number, text = physical[0]
    return Location(path, number, 1, number, len(text) + 1, text)
