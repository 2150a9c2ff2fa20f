"""Whole-project analysis: files of one scan that import each other are analysed together, and
each finding lands on the line where its fix belongs; training loops and CUDA evidence as
people write them; what could not be checked; the cache when an imported file changes."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from speedfix.model.context import FileContext
from speedfix.model.devices import uses_cuda
from speedfix.model.versions import TorchVersion
from speedfix.project import extract_facts, link
from speedfix.project.linker import LEFT_OUT
from speedfix.syntax.walk import walk_batched

# The layout of most research code: the device in config.py, the network in models.py, the loop
# in engine.py, and main.py building loaders, model and optimizer.
CONFIG = """\
DEVICE = "cuda"
BATCH_SIZE = 64
EPOCHS = 10
"""

MODELS = """\
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3)
        self.bn = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.bn(self.conv(x)).relu().mean((2, 3)))
"""

UTILS = """\
def log_loss_dict(losses):
    return {name: value.item() for name, value in losses.items()}
"""

ENGINE = """\
import torch
from tqdm import tqdm

from config import DEVICE
from utils import log_loss_dict


def train_one_epoch(model, loader, optimizer, criterion):
    model.train()
    for images, labels in tqdm(loader):
        images, labels = images.to(DEVICE), labels.to(DEVICE)
        loss = criterion(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        log_loss_dict({"loss": loss})
"""

MAIN = """\
import torch
from torch.utils.data import DataLoader

from config import BATCH_SIZE, DEVICE, EPOCHS
from engine import train_one_epoch
from models import Net


def main():
    dataset = torch.load("data.pt")
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True)
    model = Net().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    criterion = torch.nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        train_one_epoch(model, loader, optimizer, criterion)


if __name__ == "__main__":
    main()
"""

PROJECT = {"config.py": CONFIG, "models.py": MODELS, "utils.py": UTILS, "engine.py": ENGINE, "main.py": MAIN}
SELECT = "SF101,SF102,SF104,SF301,SF401,SF501,SF703"
FINDING = re.compile(r"^(?P<path>[^:\s]+):(?P<line>\d+):\d+: (?P<code>SF\d{3}) ", re.MULTILINE)


def line_of(code: str, snippet: str) -> int:
    return next(number for number, line in enumerate(code.splitlines(), 1) if snippet in line)


def findings(stdout: str) -> set[tuple[str, int, str]]:
    return {(Path(m["path"]).name, int(m["line"]), m["code"]) for m in FINDING.finditer(stdout)}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name, code in PROJECT.items():
        (tmp_path / name).write_text(code, encoding="utf-8")
    return tmp_path


def test_a_folder_is_analysed_as_one_project(run_cli, project):
    result = run_cli("scan", ".", "--select", SELECT, "--no-summary", cwd=project)
    loader, model, optimizer = (line_of(MAIN, s) for s in ("DataLoader(dataset", "Net().to", "AdamW("))
    upload, item = line_of(ENGINE, "images.to(DEVICE)"), line_of(UTILS, "value.item()")
    assert findings(result.stdout) == {
        # The loader is iterated in engine.py: its findings land on the DataLoader call in main.py.
        ("main.py", loader, "SF101"),
        ("main.py", loader, "SF102"),  # CUDA: DEVICE comes from config.py
        ("main.py", model, "SF501"),
        ("main.py", optimizer, "SF401"),
        ("engine.py", upload, "SF104"),  # both copies on that line
        ("utils.py", item, "SF301"),  # a helper that engine.py's loop calls on every step
        ("models.py", line_of(MODELS, "Conv2d"), "SF703"),
    }
    assert sum(1 for f in FINDING.finditer(result.stdout) if f["code"] == "SF104") == 1  # one transfer of x and y
    assert "note:" not in result.stdout


def test_a_file_scanned_alone_works_as_before_and_says_what_it_could_not_check(run_cli, project):
    alone = run_cli("scan", "main.py", "--select", SELECT, "--no-summary", cwd=project)
    # No CUDA evidence in the file itself: only the device-independent finding, as before.
    assert findings(alone.stdout) == {("main.py", line_of(MAIN, "DataLoader(dataset"), "SF101")}
    assert "main.py: note: no training loop in this file; it imports config.py, engine.py, models.py" in alone.stdout
    assert "scan the whole folder" in alone.stdout
    engine = run_cli("scan", "engine.py", "--select", SELECT, "--no-summary", cwd=project)
    assert engine.stdout == "" and engine.exit_code == 0  # DEVICE's value is not known: silence
    json_report = run_cli("scan", "main.py", "--select", SELECT, "--output-format", "json", cwd=project)
    assert json.loads(json_report.stdout)[0]["code"] == "SF101"  # standard output stays JSON
    assert "note: no training loop" in json_report.stderr


def test_the_note_is_not_given_when_the_loop_is_in_a_scanned_file(run_cli, project):
    result = run_cli("scan", "main.py", "engine.py", "config.py", "--select", SELECT, "--no-summary", cwd=project)
    assert "note:" not in result.stdout
    assert ("main.py", line_of(MAIN, "DataLoader(dataset"), "SF102") in findings(result.stdout)


def test_apply_fixes_the_file_where_the_fix_belongs(run_cli, project):
    result = run_cli("apply", ".", "--select", "SF104,SF401", "--unsafe-fixes", cwd=project)
    assert result.exit_code == 1, result
    assert "fused=True" in (project / "main.py").read_text()
    assert "images.to(DEVICE, non_blocking=True)" in (project / "engine.py").read_text()


def test_cache_follows_the_files_a_file_imports(run_cli, project, counted):
    first = run_cli("scan", ".", "--select", SELECT, "--no-summary", "--jobs", "1", cwd=project)
    assert ("engine.py", line_of(ENGINE, "images.to(DEVICE)"), "SF104") in findings(first.stdout)
    counted.clear()
    again = run_cli("scan", ".", "--select", SELECT, "--no-summary", "--jobs", "1", cwd=project)
    assert again.stdout == first.stdout and counted == []
    # config.py stops saying CUDA: the files that read DEVICE must be analysed again.
    (project / "config.py").write_text(CONFIG.replace('"cuda"', '"cpu"'), encoding="utf-8")
    counted.clear()
    cpu = run_cli("scan", ".", "--select", SELECT, "--no-summary", "--jobs", "1", cwd=project)
    assert {"config.py", "engine.py", "main.py"} <= set(counted)
    assert {code for _, _, code in findings(cpu.stdout)} == {"SF101", "SF703"}
    # a helper that is no longer called from the loop: utils.py is analysed again
    (project / "engine.py").write_text(ENGINE.replace('        log_loss_dict({"loss": loss})\n', ""), encoding="utf-8")
    counted.clear()
    run_cli("scan", ".", "--select", SELECT, "--no-summary", "--jobs", "1", cwd=project)
    assert "utils.py" in counted and "models.py" not in counted


# ------------------------------------------------------------------ trainer classes, packages
def test_trainer_class_receiving_loader_and_device(run_cli, tmp_path, write):
    write("pkg/__init__.py", "")
    write("pkg/trainer.py", """\
        class Trainer:
            def __init__(self, model, train_loader, optimizer, device):
                self.model = model
                self.train_loader = train_loader
                self.optimizer = optimizer
                self.device = device

            def fit(self, epochs):
                for _ in range(epochs):
                    for batch in self.train_loader:
                        x, y = batch
                        x, y = x.to(self.device), y.to(self.device)
                        loss = self.model(x, y)
                        loss.backward()
                        self.optimizer.step()
                        self.optimizer.zero_grad()
        """)
    write("train.py", """\
        import torch
        from torch.utils.data import DataLoader
        from pkg.trainer import Trainer

        def main():
            loader = DataLoader(make_dataset(), batch_size=32, num_workers=4)
            model = build()
            trainer = Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cuda"))
            trainer.fit(10)

        if __name__ == "__main__":
            main()
        """)
    result = run_cli("scan", ".", "--select", "SF102,SF104", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == {("train.py", 6, "SF102"), ("trainer.py", 12, "SF104")}


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_one_steps_syncs_in_helpers_of_other_files_are_one_finding(run_cli, tmp_path, write, jobs):
    """VITS: the step's syncs sit in helpers of three modules; the rule gives one finding per step."""
    write("losses.py", """\
        def feature_loss(fmap_r, fmap_g):
            losses = []
            for dr, dg in zip(fmap_r, fmap_g):
                losses.append((dr - dg).abs().mean().item())
            return sum(losses)
        """)
    write("mel.py", """\
        import torch

        def mel(y):
            if torch.min(y) < -1.0:
                print("min value is", torch.min(y))
            return y
        """)
    write("train.py", """\
import torch
from losses import feature_loss
from mel import mel

model = Net().cuda()
opt = torch.optim.AdamW(model.parameters())
for epoch in range(10):
    for x, y in loader:
        out = model(mel(x.cuda()))
        loss = (out - y.cuda()).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(feature_loss(out, y))
""")
    result = run_cli("scan", ".", "--select", "SF301", "--no-summary", "-j", jobs, "--no-cache", cwd=tmp_path)
    lines = [line for line in result.stdout.splitlines() if "SF301" in line]
    assert len(lines) == 1 and lines[0].startswith("losses.py:4:"), result.stdout  # no sync in train.py itself
    assert "; helpers of the same step in other files sync too, at `mel.py:4` (impact:" in lines[0], lines
    write("train.py", (tmp_path / "train.py").read_text() + "        print(loss.item())\n")
    result = run_cli("scan", ".", "--select", "SF301", "--no-summary", "-j", jobs, "--no-cache", cwd=tmp_path)
    lines = [line for line in result.stdout.splitlines() if "SF301" in line]
    assert len(lines) == 1 and lines[0].startswith("train.py:"), result.stdout  # the script's own finding keeps them
    assert "other files sync too, at `losses.py:4`, `mel.py:4`" in lines[0]


def test_a_helpers_sync_once_per_loop_element_raises_the_steps_one_finding(run_cli, tmp_path, write):
    """The model of another file syncs at every decoder step (a stop token read with `.item()`):
    folded into the script's own finding, whose impact becomes that helper's (high)."""
    write("model.py", """\
        import torch
        import torch.nn as nn

        class Decoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.cell = nn.LSTMCell(8, 8)
                self.stop = nn.Linear(8, 1)

            def forward(self, x, steps):
                h, c = torch.zeros_like(x), torch.zeros_like(x)
                outputs = []
                for t in range(steps):
                    h, c = self.cell(x, (h, c))
                    outputs.append(h)
                    if torch.sigmoid(self.stop(h)).max().item() > 0.5:
                        break
                return torch.stack(outputs).sum()
        """)
    write("train.py", """\
        import torch
        from model import Decoder

        model = Decoder().cuda()
        optimizer = torch.optim.Adam(model.parameters())
        for epoch in range(10):
            for x in loader:
                loss = model(x.cuda(), 100)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                print(loss.item())
        """)
    result = run_cli("scan", ".", "--select", "SF301", "--no-cache", "--output-format", "json", cwd=tmp_path)
    (finding,) = json.loads(result.stdout)
    assert (finding["path"], finding["line"]) == ("train.py", 12), finding
    assert "other files sync too, at `model.py:16`" in finding["message"]
    assert finding["impact"] == "high" and finding["impact_reason"].startswith("at `model.py:16`: "), finding


@pytest.mark.parametrize("grad_off", [True, False])
def test_an_evaluation_called_under_no_grad_from_another_file(run_cli, tmp_path, write, grad_off):
    """`validate()` in its own module, called by the training script inside `with torch.no_grad():`:
    autograd is already off for its loop (reported when the call runs with autograd on)."""
    write("evaluation.py", """\
        def validate(model, loader):
            model.eval()
            total = 0.0
            for x, y in loader:
                total += (model(x.cuda()) - y.cuda()).abs().mean().item()
            return total
        """)
    call = "with torch.no_grad():\n        validate(model, val_loader)" if grad_off else "validate(model, val_loader)"
    write("train.py", f"""\
import torch
from evaluation import validate

for epoch in range(10):
    for x, y in train_loader:
        loss = model(x.cuda()).sum()
        loss.backward()
        optimizer.step()
    {call}
""")
    result = run_cli("scan", ".", "--select", "SF702", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == (set() if grad_off else {("evaluation.py", 4, "SF702")})


def test_relative_imports_and_module_attributes(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "settings.py").write_text("import torch\nDEVICE = torch.device('cuda:0')\n")
    (tmp_path / "app" / "loop.py").write_text("from . import settings\n\ndef run(x):\n    return x.to(settings.DEVICE)\n")
    files = {path: extract_facts(path.read_bytes()) for path in (tmp_path / "app").glob("*.py")}
    links = link(files, [tmp_path], lambda path: path.name)
    loop = links[tmp_path / "app" / "loop.py"]
    assert loop.cuda == "`DEVICE` from settings.py is a CUDA device"
    assert loop.is_cuda_name(".settings.DEVICE")


@pytest.mark.parametrize("twin, linked", [(None, True), ("tools/solver.py", False), ("tools/solver/__init__.py", False)])
def test_a_module_that_one_folder_of_the_scan_alone_holds_is_linked_as_its_path_setup_makes_it(tmp_path, twin, linked):
    """`src/bin/train.py`'s `from solver import Solver`, with `src/solver/solver.py` put on the
    path by a shell script: linked when no other folder of the scan holds a `solver` module."""
    files = {
        tmp_path / "src" / "bin" / "train.py": "from solver import Solver\nimport solver.solver\n",
        tmp_path / "src" / "solver" / "solver.py": "class Solver:\n    def train(self):\n        pass\n",
    }
    if twin is not None:
        files[tmp_path / twin] = ""
    for path, code in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    facts = {path: extract_facts(code) for path, code in files.items()}
    train = link(facts, [tmp_path], lambda path: path.name)[tmp_path / "src" / "bin" / "train.py"]
    assert (train.function("solver.Solver.train") is not None) is linked
    assert "solver.solver" not in train.modules  # `solver/solver.py` is no package: `solver` is the module


def test_an_import_takes_the_first_folder_on_the_path_that_holds_its_top_name(tmp_path):
    """NGCF: `NGCF/main.py` runs `from NGCF import NGCF` from its folder, a package `NGCF/` too:
    Python finds `NGCF/NGCF.py` in the script's folder first, and the name is its class."""
    files = {
        tmp_path / "NGCF" / "__init__.py": "",
        tmp_path / "NGCF" / "NGCF.py": "class NGCF:\n    def train(self):\n        pass\n",
        tmp_path / "NGCF" / "main.py": "from NGCF import NGCF\n",
    }
    for path, code in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    facts = {path: extract_facts(code) for path, code in files.items()}
    main = link(facts, [tmp_path], lambda path: path.name)[tmp_path / "NGCF" / "main.py"]
    assert main.function("NGCF.NGCF.train") is not None and "NGCF.NGCF" not in main.modules


def test_functions_re_exported_by_a_package_are_linked(tmp_path):
    files = {
        tmp_path / "utils" / "__init__.py": "from .train_utils import train\nfrom .helpers import *\n",
        tmp_path / "utils" / "train_utils.py": (
            "def train(model, loader, opt):\n    for x in loader:\n        model(x).backward()\n        opt.step()\n"
        ),
        tmp_path / "utils" / "helpers.py": "def step(loss, opt):\n    loss.backward()\n    opt.step()\n",
        tmp_path / "run.py": "from utils import train\nfrom utils import *\n",
    }
    for path, code in files.items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(code)
    facts = {path: extract_facts(code) for path, code in files.items()}
    run = link(facts, [tmp_path], lambda path: path.name)[tmp_path / "run.py"]
    assert run.function("utils.train").iterated == ("loader",)
    assert run.function(run.star["step"]).steps  # through the package's own `import *`


@pytest.mark.parametrize("second, expected", [
    ('make(a, **{"num_workers": 2, "pin_memory": True})', (("make", "num_workers", "2"), ("make", "pin_memory", "True"))),
    ('make(a, **{"num_workers": 8, "pin_memory": True})', (("make", "num_workers", ""), ("make", "pin_memory", "True"))),
    ('make(a, **{"num_workers": 2})', (("make", "num_workers", "2"), ("make", "pin_memory", LEFT_OUT))),  # one call
    # leaves `pin_memory` out: the default holds there
    ("make(a, **options)", ()),  # keys that cannot be read
])
def test_kwargs_forwarded_by_every_caller_are_known_only_when_they_agree(tmp_path, second, expected):
    files = {
        tmp_path / "data.py": "def make(a, **kwargs):\n    return DataLoader(a, **kwargs)\n",
        tmp_path / "one.py": 'from data import make\n\ndef f(a):\n    kw = {"num_workers": 2, "pin_memory": True}\n'
                             "    return make(a, **kw)\n",
        tmp_path / "two.py": "from data import make\n\ndef g(a):\n    return " + second + "\n",
    }
    assert _linked(tmp_path, files)[tmp_path / "data.py"].kwargs == expected


def _linked(tmp_path, files):
    """The links of ``files`` (path -> code), written below ``tmp_path``."""
    for path, code in files.items():
        path.write_text(code)
    return link({path: extract_facts(code) for path, code in files.items()}, [tmp_path])


@pytest.mark.parametrize("second, expected", [
    ("make(b, workers=8)", (("make", "a", ""), ("make", "workers", "8"),)),  # every caller passes 8
    ("make(b, 8)", (("make", "a", ""), ("make", "workers", "8"),)),  # by position: the same parameter
    ("make(b, workers=4)", (("make", "a", ""), ("make", "workers", ""),)),  # the callers differ
    ("make(b)", (("make", "a", ""), ("make", "workers", ""),)),  # one call keeps the default
    ("make(*rest)", (("make", "*", ""),)),  # arguments that cannot be read
])
def test_arguments_other_files_pass_are_known_only_when_every_call_agrees(tmp_path, second, expected):
    files = {
        tmp_path / "data.py": "def make(a, workers=2):\n    return DataLoader(a, num_workers=workers)\n",
        tmp_path / "one.py": "from data import make\n\ndef f(args):\n    return make(args.root, workers=args.workers)\n\n"
                             "def options(parser):\n    parser.add_argument('--workers', type=int, default=8)\n",
        tmp_path / "two.py": "from data import make\n\ndef g(b):\n    return " + second + "\n",
    }
    assert _linked(tmp_path, files)[tmp_path / "data.py"].arguments == expected


@pytest.mark.parametrize("second, expected", [
    ("if __name__ == '__main__':\n    WORKERS = 8\n    make(b, WORKERS)\n", "8"),  # YOLOv7's `fp16 = False`
    ("WORKERS = 8\nmake(b, WORKERS)\n", "8"),
    ("WORKERS = 8\nif b:\n    WORKERS = 4\nmake(b, WORKERS)\n", ""),  # bound under an `if` too
    ("WORKERS = 8\nWORKERS = 4\nmake(b, WORKERS)\n", ""),  # bound twice
    ("WORKERS = 8\ndef g(WORKERS):\n    return make(b, WORKERS)\n", ""),  # a function's own name
])
def test_a_module_constant_another_file_passes_is_its_value(tmp_path, second, expected):
    files = {
        tmp_path / "data.py": "def make(a, workers=2):\n    return DataLoader(a, num_workers=workers)\n",
        tmp_path / "one.py": "from data import make\n\ndef f(b):\n    return make(b, 8)\n",
        tmp_path / "two.py": "from data import make\n\n" + second,
    }
    assert dict(((name, param), value) for name, param, value in _linked(tmp_path, files)[tmp_path / "data.py"]
                .arguments)[("make", "workers")] == expected


def test_a_network_built_of_another_files_sparse_layers_multiplies_sparse_matrices(tmp_path):
    files = {
        tmp_path / "layers.py": "import torch\nfrom torch import nn\n\nclass GraphConv(nn.Module):\n"
                                "    def forward(self, x, adj):\n        return torch.spmm(adj, x @ self.weight)\n",
        tmp_path / "models.py": "from torch import nn\nfrom layers import GraphConv\n\nclass GCN(nn.Module):\n"
                                "    def __init__(self):\n        super().__init__()\n        self.conv = GraphConv()\n\n"
                                "class MLP(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                                "        self.fc = nn.Linear(8, 8)\n",
        tmp_path / "train.py": "from models import GCN, MLP\n",
    }
    train = _linked(tmp_path, files)[tmp_path / "train.py"]
    assert train.function("models.GCN").sparse and not train.function("models.MLP").sparse


@pytest.mark.parametrize("code", [
    # torchvision's and pytorch-cifar100's VGG: a list of layers, returned as one Sequential
    "import torch.nn as nn\n\ndef make_layers(cfg):\n    layers = []\n    for v in cfg:\n"
    "        layers += [nn.Conv2d(3, v, 3), nn.ReLU(inplace=True)]\n    return nn.Sequential(*layers)\n",
    # PyTorch-YOLOv3: modules added to a ModuleList built from a parsed .cfg, returned in a tuple
    "from torch import nn\n\ndef make_layers(defs):\n    module_list = nn.ModuleList()\n    for d in defs:\n"
    "        modules = nn.Sequential()\n        modules.add_module('conv', nn.Conv2d(3, d, 3))\n"
    "        module_list.append(modules)\n    return {}, module_list\n",
])
def test_a_function_that_fills_and_returns_a_module_container_builds_its_layers(code):
    assert extract_facts(code).functions["make_layers"].conv_dims == (2,)
    plain = code.replace("nn.Sequential(*layers)", "layers").replace("return {}, module_list", "return {}, defs")
    assert extract_facts(plain).functions["make_layers"].conv_dims == ()  # returns no container it fills


def test_the_layers_of_a_star_imported_parts_module_reach_the_class_and_its_package(tmp_path):
    # Pytorch-UNet: `from .unet_parts import *` in unet_model.py, `from .unet_model import UNet` in the
    # package's __init__.py, `from unet import UNet` in train.py
    (tmp_path / "unet").mkdir()
    files = {
        tmp_path / "unet" / "__init__.py": "from .unet_model import UNet\n",
        tmp_path / "unet" / "unet_parts.py": "import torch.nn as nn\n\nclass DoubleConv(nn.Module):\n"
                                             "    def __init__(self, a, b):\n        super().__init__()\n"
                                             "        self.conv = nn.Sequential(nn.Conv2d(a, b, 3), nn.ReLU())\n",
        tmp_path / "unet" / "unet_model.py": "from .unet_parts import *\n\nclass UNet(nn.Module):\n"
                                             "    def __init__(self):\n        super().__init__()\n"
                                             "        self.inc = DoubleConv(3, 64)\n        self.act = len([])\n",
        tmp_path / "train.py": "from unet import UNet\n",
    }
    facts = extract_facts(files[tmp_path / "unet" / "unet_model.py"])
    assert facts.functions["UNet"].parts == ("*.DoubleConv",)  # not `len`, a builtin
    train = _linked(tmp_path, files)[tmp_path / "train.py"]
    assert train.function("unet.UNet").conv_dims == (2,)
    assert not train.function("unet.UNet").matmul  # every part read: convolutions only, TF32 changes nothing
    files[tmp_path / "unet" / "unet_parts.py"] += "        self.head = nn.Linear(b, 10)\n"
    train = _linked(tmp_path, files)[tmp_path / "train.py"]
    assert train.function("unet.UNet").matmul


def test_an_agents_update_called_between_rollouts_of_another_file_is_an_rl_update(run_cli, tmp_path, write):
    """pytorch-a2c-ppo-acktr: main.py steps the environments and calls `agent.update(rollouts)` of
    a class its package re-exports (`from .ppo import PPO` in algo/__init__.py); the GAIL
    discriminator trains in a loop inside that main loop. No precision or TF32 advice there."""
    write("rl/__init__.py", "")
    write("rl/algo/__init__.py", "from .ppo import PPO\nfrom .gail import Discriminator\n")
    update = """\
        import torch
        import torch.nn as nn

        class {name}:
            def __init__(self, actor_critic):
                self.actor_critic = actor_critic
                self.net = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1)).cuda()
                self.optimizer = torch.optim.Adam(self.net.parameters(), fused=True)

            def update(self, rollouts):
                for batch in rollouts.batches():
                    loss = self.net(batch).pow(2).mean()
                    self.optimizer.zero_grad()
                    loss.backward()
                    self.optimizer.step()
        """
    write("rl/algo/ppo.py", update.format(name="PPO"))
    write("rl/algo/gail.py", update.format(name="Discriminator"))
    main = """\
import torch
from rl import algo

agent = algo.PPO(policy)
discr = algo.Discriminator(policy)
for j in range(1000):
    for step in range(5):
        obs, reward, done, infos = envs.step(policy.act(obs))
        rollouts.insert(obs, reward)
    for _ in range(5):
        discr.update(rollouts)
    agent.update(rollouts)
"""
    write("main.py", main)
    scan = ["scan", ".", "--select", "SF201,SF202", "--no-summary", "--no-cache"]
    assert run_cli(*scan, cwd=tmp_path).stdout == ""
    write("main.py", main.replace("envs.step(", "envs.advance("))  # no environment: a plain training run
    assert {line.split(":")[0] for line in run_cli(*scan, cwd=tmp_path).stdout.splitlines()} == \
        {"rl/algo/ppo.py", "rl/algo/gail.py"}


def test_a_library_loader_function_named_for_evaluation_is_evaluations(run_cli, tmp_path, write):
    """pytorch-cifar100: utils.py's `get_test_dataloader()` feeds `eval_training()` under
    `@torch.no_grad()`; its sibling `get_training_dataloader()` feeds the training loop."""
    factory = """\
        def get_{kind}_dataloader(batch_size=16, num_workers=2):
            data = torchvision.datasets.CIFAR100(root="./data", train={train}, download=True)
            loader = DataLoader(data, shuffle=True, num_workers=num_workers, batch_size=batch_size)
            return loader
        """
    write("utils.py", "import torchvision\nfrom torch.utils.data import DataLoader\n\n\n"
          + textwrap.dedent(factory).format(kind="training", train=True) + "\n\n"
          + textwrap.dedent(factory).format(kind="test", train=False) + "\n\ndef get_network():\n    return Net().cuda()\n")
    write("train.py", """\
import torch
from utils import get_training_dataloader, get_test_dataloader

def train(epoch):
    for images, labels in training_loader:
        loss = net(images.cuda()).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

@torch.no_grad()
def evaluate():
    for images, labels in test_loader:
        print(net(images.cuda()).argmax(1).eq(labels.cuda()).sum())

if __name__ == "__main__":
    net = Net().cuda()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    training_loader = get_training_dataloader(num_workers=4)
    test_loader = get_test_dataloader(num_workers=4)
    for epoch in range(200):
        train(epoch)
        evaluate()
""")
    result = run_cli("scan", ".", "--select", "SF102", "--no-summary", "--no-cache", cwd=tmp_path)
    assert [line.split(" ")[0] for line in result.stdout.splitlines()] == ["utils.py:7:14:"], result.stdout


GAIL_MAIN = """\
import torch
from a2c import gail
from a2c.arguments import get_args

args = get_args()
model = Net().cuda()
optimizer = torch.optim.Adam(model.parameters(), fused=True)
if args.gail:
    discr = gail.Discriminator(64)
for x, y in loader:
    loss = model(x.cuda(non_blocking=True)).sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if args.gail:
        discr.update(x)
"""


@pytest.mark.parametrize("readme, left_out", [
    ("Train: `python main.py --lr 1e-3`\n", True),
    ("Imitation: `python main.py --gail --gail-experts-dir ./experts`\n", False),  # a documented run passes it
])
def test_a_class_built_only_under_an_option_that_is_off_by_default_is_left_out(run_cli, tmp_path, write, readme,
                                                                                left_out):
    """pytorch-a2c-ppo-acktr-gail: `if args.gail: discr = gail.Discriminator(...)` with `--gail` a
    `store_true` flag of another module's parser; the discriminator's own training is off the run's path."""
    write("a2c/__init__.py", "")
    write("a2c/arguments.py", """\
        import argparse

        def get_args():
            parser = argparse.ArgumentParser()
            parser.add_argument("--lr", type=float, default=7e-4)
            parser.add_argument("--gail", action="store_true", default=False)
            args = parser.parse_args()
            return args
        """)
    write("a2c/gail.py", """\
        import torch
        import torch.nn as nn

        class Discriminator(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.net = nn.Linear(width, 1).cuda()
                self.optimizer = torch.optim.Adam(self.net.parameters())

            def update(self, batch):
                for x in batch:
                    loss = self.net(x).sum()
                    self.optimizer.zero_grad()
                    loss.backward()
                    self.optimizer.step()
                    print(loss.item())
        """)
    write("main.py", GAIL_MAIN)
    write("README.md", readme)
    result = run_cli("scan", ".", "--select", "SF301,SF401", "--no-summary", "--no-cache", cwd=tmp_path)
    assert any(line.startswith("a2c/gail.py:") and "note:" not in line
               for line in result.stdout.splitlines()) is not left_out, result.stdout
    note = ("a2c/gail.py: note: 2 findings in `Discriminator` (built only with `--gail`, an option off by default "
            "that no launch command or README of the project passes) left out: no run builds them")
    assert (note in result.stdout) is left_out, result.stdout


@pytest.mark.parametrize("launch, left_out", [
    ('python main.py --policy "TD3" --env Hopper-v3\npython main.py --env Ant-v3\n', True),
    ('python main.py --policy DDPG --env Hopper-v3\n', False),  # a documented run picks it
])
def test_a_class_built_only_for_an_option_value_no_run_gives_is_left_out(run_cli, tmp_path, write, launch, left_out):
    """sfujim/TD3's `main.py`: `if args.policy == "TD3": ... elif args.policy == "DDPG": policy =
    DDPG.DDPG(**kwargs)` with `--policy` defaulting to "TD3", the value every command of its
    `run_experiments.sh` gives: `DDPG.py`'s agent trains in no run."""
    write("main.py", """\
        import argparse
        import DDPG
        import TD3
        parser = argparse.ArgumentParser()
        parser.add_argument("--policy", default="TD3")
        parser.add_argument("--env", default="HalfCheetah-v2")
        args = parser.parse_args()
        if args.policy == "TD3":
            policy = TD3.TD3(17, 6)
        elif args.policy == "DDPG":
            policy = DDPG.DDPG(17, 6)
        for t in range(1000000):
            policy.train(replay_buffer, 256)
        """)
    agent = AGENT_WITH_SYNC
    write("TD3.py", agent.format(name="TD3"))
    write("DDPG.py", agent.format(name="DDPG"))
    write("run_experiments.sh", launch)
    result = run_cli("scan", ".", "--select", "SF301", "--no-summary", "--no-cache", cwd=tmp_path)
    lines = result.stdout.splitlines()
    assert any(line.startswith("TD3.py:") for line in lines), result.stdout
    assert any(line.startswith("DDPG.py:") and "note:" not in line for line in lines) is not left_out, result.stdout
    note = ("DDPG.py: note: 1 finding in `DDPG` (built only where `--policy` is `DDPG`, which no launch command or "
            "README of the project gives and which is not its default) left out: no run builds them")
    assert (note in lines) is left_out, result.stdout


AGENT_WITH_SYNC = """\
        import torch

        class {name}:
            def __init__(self, state_dim, action_dim):
                self.actor = Actor(state_dim, action_dim).to("cuda")
                self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), fused=True)

            def train(self, replay_buffer, batch_size):
                state = replay_buffer.sample(batch_size)
                loss = -self.actor(state).mean()
                self.actor_optimizer.zero_grad()
                loss.backward()
                self.actor_optimizer.step()
                print(loss.item())
        """


def test_a_file_python_cannot_parse_may_build_the_class_another_file_builds_only_under_an_option(
        run_cli, tmp_path, write):
    """knowledge-distillation-pytorch: `count_model_size.py` builds `net.Net` only where `--model`
    is `cnn` (default `resnet18`), and `train.py`, old code Python no longer parses (`.cuda(
    async=True)`), builds it in its runs: its construction is unseen, so `Net` is not left out."""
    write("count_model_size.py", """\
        import argparse
        import model.net as net
        parser = argparse.ArgumentParser()
        parser.add_argument("--model", default="resnet18")
        args = parser.parse_args()
        if args.model == "cnn":
            model = net.Net()
        """)
    write("model/__init__.py", "")
    write("model/net.py", AGENT_WITH_SYNC.format(name="Net"))
    scan = ("scan", ".", "--select", "SF301", "--no-summary", "--no-cache")
    assert "left out: no run builds them" in run_cli(*scan, cwd=tmp_path).stdout
    write("train.py", "import model.net as net\nmodel = net.Net()\nx = batch.cuda(async=True)\n")
    result = run_cli(*scan, cwd=tmp_path).stdout
    assert "left out: no run builds them" not in result and "model/net.py:" in result, result


GNN_LAYERS = """\
import torch
import torch.nn as nn

class GINConv(nn.Module):
    def __init__(self, width):
        super(GINConv, self).__init__()
        self.mlp = nn.Linear(width, width)

    def forward(self, x, edge_attr):
        loops = torch.zeros(x.size(0), 2)
        loops = loops.to(edge_attr.device)
        return self.mlp(x) + torch.cat((edge_attr, loops)).sum()

class GCNConv(nn.Module):
    def __init__(self, width):
        super(GCNConv, self).__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x, edge_attr):
        loops = torch.zeros(x.size(0), 2)
        loops = loops.to(edge_attr.device)
        return self.lin(x) + torch.cat((edge_attr, loops)).sum()

class GNN(nn.Module):
    def __init__(self, num_layer, width, gnn_type="gin"):
        super().__init__()
        self.layers = nn.ModuleList()
        for _ in range(num_layer):
            if gnn_type == "gin":
                self.layers.append(GINConv(width))
            elif gnn_type == "gcn":
                self.layers.append(GCNConv(width))

    def forward(self, x, edge_attr):
        for layer in self.layers:
            x = layer(x, edge_attr)
        return x

class GNNGraphPred(nn.Module):
    def __init__(self, num_layer, width, gnn_type="gin"):
        super().__init__()
        self.gnn = GNN(num_layer, width, gnn_type=gnn_type)
{extra}"""

GNN_TRAIN = """\
import argparse
import torch
from model import GNN

parser = argparse.ArgumentParser()
parser.add_argument("--gnn_type", type=str, default={default!r})
args = parser.parse_args()
model = GNN(5, 300, gnn_type=args.gnn_type).cuda()
optimizer = torch.optim.Adam(model.parameters(), fused=True)
for x, edge_attr in loader:
    loss = model(x.cuda(non_blocking=True), edge_attr.cuda(non_blocking=True)).sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("default, readme, extra, reported", [
    ("gin", "", "", {11}),  # the default run builds GINConv only: GCNConv's finding is left out
    ("gcn", "", "", {11, 21}),  # GNNGraphPred passes its own default on: `gin` may run too
    ("gin", "`python train.py --gnn_type gcn`\n", "", {11, 21}),  # a documented run picks GCNConv
    ("gin", "", "LAYERS = {'gcn': GCNConv}\n", {11, 21}),  # named elsewhere: it may be built through the dict
    ("gin", "", "GNNGraphPred(5, 300, gnn_type='gcn')\n", {11, 21}),  # a construction of the wrapper picks it
    ("gcn", "", "GNNGraphPred(5, 300, gnn_type='gcn')\n", {21}),  # ... or passes the run's choice on
])
def test_a_layer_class_that_a_string_option_picks_for_no_run_is_left_out(run_cli, tmp_path, write, default, readme,
                                                                         extra, reported):
    """pretrain-gnns: `GNN.__init__` builds `GINConv` or `GCNConv` by its `gnn_type`, which the
    training script passes from `--gnn_type` (default `gin`) and a wrapper class passes on; the
    layer no run picks is not trained, so advice inside it is left out with a note."""
    write("model.py", GNN_LAYERS.format(extra=extra))
    write("train.py", GNN_TRAIN.format(default=default))
    write("README.md", readme)
    result = run_cli("scan", ".", "--select", "SF701", "--no-summary", "--no-cache", cwd=tmp_path)
    found = {int(line.split(":")[1]) for line in result.stdout.splitlines()
             if line.startswith("model.py:") and "SF701" in line}
    assert found == reported, result.stdout
    left_out = {11, 21} - reported
    assert ("note: 1 finding in `GCNConv` (built only where `gnn_type` is `'gcn'`; the runs give `'gin'`) left out: "
            "no run builds them" in result.stdout) is (left_out == {21}), result.stdout
    assert ("`GINConv` (built only where `gnn_type` is `'gin'`; the runs give `'gcn'`)" in result.stdout) is (
        left_out == {11}), result.stdout


UNET = """\
import torch
import torch.nn as nn

class QKVAttentionLegacy(nn.Module):
    def forward(self, q, k, v):
        weight = torch.softmax(torch.einsum("bct,bcs->bts", q, k), dim=-1)
        return torch.einsum("bts,bcs->bct", weight, v)

class AttentionBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.attention = QKVAttentionLegacy()

    def forward(self, x):
        return self.attention(x, x, x)

class SpatialTransformer(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.proj = nn.Linear(channels, channels)

class UNetModel(nn.Module):
    def __init__(self, channels, use_spatial_transformer=False):
        super().__init__()
        self.block = AttentionBlock(channels) if not use_spatial_transformer else SpatialTransformer(channels)

class EncoderUNetModel(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.block = AttentionBlock(channels)
"""


@pytest.mark.parametrize("configs, left_out", [
    ({"txt2img.yaml": "True"}, True),  # the run builds the spatial transformer
    ({"txt2img.yaml": "True", "lsun.yaml": "False"}, False),  # another run builds the attention block
    ({"txt2img.yaml": None}, False),  # the default: the attention block
])
def test_classes_a_run_config_leaves_unbuilt_are_left_out(run_cli, tmp_path, write, configs, left_out):
    """Latent diffusion's UNet builds `AttentionBlock` (and with it the hand-written
    `QKVAttentionLegacy`) only `if not use_spatial_transformer`, which the YAML config the runs
    build it from sets; `EncoderUNetModel`, which nothing builds, does not put it on the run."""
    write("ldm/openaimodel.py", UNET)
    write("main.py", "import torch\nfrom ldm.util import instantiate_from_config\n"
                     "model = instantiate_from_config(config.model).cuda()\n")
    for name, value in configs.items():
        option = "" if value is None else f"\n      use_spatial_transformer: {value}"
        write(f"configs/{name}", f"model:\n  target: ldm.openaimodel.UNetModel\n  params:\n      channels: 320{option}\n")
    result = run_cli("scan", ".", "--select", "SF503", "--no-summary", "--no-cache", "--torch-version", "2.4", cwd=tmp_path)
    note = ("ldm/openaimodel.py: note: 1 finding in `QKVAttentionLegacy` (built only in `AttentionBlock`, which no run "
            "builds) left out: no run builds them")
    assert (note in result.stdout) is left_out, result.stdout
    assert ("ldm/openaimodel.py:6:" in result.stdout) is not left_out, result.stdout


# ------------------------------------------------------------------ loops as people write them
def context(code: str, links=None) -> FileContext:
    module = cst.parse_module(textwrap.dedent(code))
    ctx = FileContext(module, "t.py", TorchVersion.parse("2.4"), links)
    walk_batched(module, [ctx])
    return ctx


@pytest.mark.parametrize(
    "loop",
    [
        "for x, y in tqdm(loader, desc='train'):",
        "for i, (x, y) in enumerate(tqdm(loader)):",
        "for x, y in metric_logger.log_every(data_loader, 10, header):",
        "for step, (x, y) in enumerate(metric_logger.log_every(data_loader, print_freq, header)):",
    ],
)
def test_wrapped_loader_loops_find_the_batch(loop):
    from speedfix.model.patterns import BatchNames

    ctx = context(f"""
        import torch
        from tqdm import tqdm
        def train(model, loader, data_loader, opt, device):
            {loop}
                x = x.to(device)
                loss = model(x, y)
                loss.backward()
                opt.step()
    """)
    assert len(ctx.step_loops) == 1
    site = next(s for s in ctx.method_calls("to"))
    assert BatchNames(ctx).is_batch(site.node.func.value, site.stack)


def test_iter_next_batches_and_parameter_loaders():
    from speedfix.model.patterns import BatchNames

    ctx = context("""
        def train(model, batches, opt, steps):
            it = iter(batches)
            for step in range(steps):
                x, y = next(it)
                x = x.cuda()
                loss = model(x, y)
                loss.backward()
                opt.step()

        def fit(model, data, opt):
            for inputs, targets in data:
                inputs = inputs.cuda()
                model(inputs, targets).backward()
                opt.step()
    """)
    batches = BatchNames(ctx)
    moved = [site for site in ctx.method_calls("cuda")]
    assert all(batches.is_batch(site.node.func.value, site.stack) for site in moved) and len(moved) == 2


@pytest.mark.parametrize(
    "step",
    [
        "loss_scaler(loss, optimizer, clip_grad=max_norm, parameters=model.parameters())",
        "accelerator.backward(loss)",
        "fabric.backward(loss)",
        "scaler.scale(loss).backward()",
        "self.loss_scaler(loss, self.optimizer)",
    ],
)
def test_step_markers(step):
    ctx = context(f"""
        def train(self, model, loader, optimizer, loss_scaler, accelerator, fabric, scaler, max_norm):
            for x, y in loader:
                loss = model(x, y)
                {step}
    """)
    assert len(ctx.step_loops) == 1


def test_a_scaler_that_is_not_a_loss_scaler_is_no_step():
    ctx = context("""
        def prepare(rows, scaler):
            for row in rows:
                scaler(row)
    """)
    assert not ctx.step_loops


def test_per_step_helpers_are_hot():
    ctx = context("""
        import torch
        class Accumulator:
            def __init__(self, n):
                self.data = [0.0] * n
            def add(self, *args):
                self.data = [a + float(b) for a, b in zip(self.data, args)]
            def reset(self):
                self.data = [0.0] * len(self.data)

        class MetricLogger:
            def update(self, **kwargs):
                for k, v in kwargs.items():
                    if isinstance(v, torch.Tensor):
                        v = v.item()

        def train(net, loader, opt):
            for epoch in range(3):
                metric = Accumulator(2)
                logger = MetricLogger()
                for x, y in loader:
                    loss = net(x, y)
                    loss.backward()
                    opt.step()
                    metric.add(loss, x.shape[0])
                    logger.update(loss=loss)
                metric.reset()
    """)
    hot = {info.name for infos in ctx.functions.values() for info in infos if info.node in ctx.hot_functions}
    assert hot == {"add", "update"}
    item = next(ctx.method_calls("item"))
    assert not ctx.is_hot(item.stack)  # `isinstance(v, torch.Tensor)`: the caller decides


# ------------------------------------------------------------------ CUDA evidence
@pytest.mark.parametrize(
    "code",
    [
        "x = batch.to(accelerator.device)",
        "Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor\nreal = imgs.type(Tensor)",
        "device = d2l.try_gpu()",
    ],
)
def test_cuda_evidence_in_the_file(code):
    assert uses_cuda(context("import torch\n" + code))


def test_cuda_evidence_from_other_files(tmp_path):
    files = {
        tmp_path / "config.py": 'DEVICE = "cuda" if torch.cuda.is_available() else "cpu"\nLR = 0.1\n',
        tmp_path / "train.py": "from config import DEVICE\nfrom trainer import Trainer\nTrainer(DEVICE).fit()\n",
        tmp_path / "trainer.py": "class Trainer:\n    def __init__(self, device):\n        self.device = device\n",
        tmp_path / "lr.py": "from config import LR\n",
        tmp_path / "cpu.py": "import torch\nfrom lr import x\n",
    }
    facts = {path: extract_facts(code) for path, code in files.items()}
    links = link(facts, [tmp_path], lambda path: path.name)
    assert links[tmp_path / "train.py"].cuda == "`DEVICE` from config.py is a CUDA device"
    assert links[tmp_path / "trainer.py"].cuda == "train.py, which imports it, runs on CUDA"  # `.to(self.device)`
    assert links[tmp_path / "lr.py"].cuda is None and links[tmp_path / "cpu.py"].cuda is None


def test_a_function_returning_a_cuda_device_is_cuda_evidence_for_its_importers(tmp_path):
    """`def get_device(): return torch.device("cuda" ...)` in utils.py: train.py, which imports it,
    runs on CUDA (the project facts had two `visit_Return`s and the second hid this one)."""
    files = {
        tmp_path / "utils.py": 'import torch\ndef get_device():\n    return torch.device("cuda" if torch.cuda.is_available() else "cpu")\n',
        tmp_path / "train.py": "from utils import get_device\ndevice = get_device()\n",
    }
    facts = {path: extract_facts(code) for path, code in files.items()}
    assert "get_device" in facts[tmp_path / "utils.py"].cuda_names
    links = link(facts, [tmp_path], lambda path: path.name)
    assert links[tmp_path / "train.py"].cuda is not None


def test_cuda_as_a_parameter_default_reaches_the_imported_model_file(tmp_path):
    """minDiffusion: `def train(n_epoch=100, device="cuda:1")` is the only CUDA in the script;
    the model file it imports builds tensors in `forward` and runs on that device."""
    files = {
        tmp_path / "train.py": 'from ddpm import DDPM\ndef train(epochs=10, device="cuda:1"):\n    DDPM().to(device)\n',
        tmp_path / "ddpm.py": "import torch\nclass DDPM(torch.nn.Module):\n    pass\n",
    }
    links = link({path: extract_facts(code) for path, code in files.items()}, [tmp_path], lambda path: path.name)
    assert links[tmp_path / "ddpm.py"].cuda == "train.py, which imports it, runs on CUDA"



@pytest.mark.parametrize("device, on_cuda", [("'cuda' if opt['gpu_ids'] is not None else 'cpu'", True), ("'cpu'", False)])
def test_a_base_class_of_another_file_that_copies_to_a_cuda_device_makes_its_subclass_cuda_code(tmp_path, device, on_cuda):
    """SR3: `class DDPM(BaseModel)` moves its network and batches with the inherited
    `set_device(x)` (`x.to(self.device)`), the device `cuda` when GPUs are configured."""
    files = {
        tmp_path / "base_model.py": f"import torch\nclass BaseModel:\n    def __init__(self, opt):\n"
                                    f"        self.device = torch.device({device})\n"
                                    "    def set_device(self, x):\n        return x.to(self.device)\n",
        tmp_path / "model.py": "from base_model import BaseModel\nclass DDPM(BaseModel):\n    def __init__(self, opt, net):\n"
                               "        super().__init__(opt)\n        self.net = self.set_device(net)\n",
    }
    links = link({path: extract_facts(code) for path, code in files.items()}, [tmp_path], lambda path: path.name)
    assert links[tmp_path / "model.py"].cuda == ("`BaseModel` from base_model.py copies to a CUDA device" if on_cuda else None)


def test_links_do_not_depend_on_the_order_files_are_found(tmp_path):
    """Two CUDA scripts import one model file: the reason it runs on CUDA, part of its cache key,
    must name the same importer however the files were listed."""
    files = {
        tmp_path / "main.py": 'from model import Net\nNet().to("cuda")\n',
        tmp_path / "generate.py": 'from model import Net\nNet().to("cuda")\n',
        tmp_path / "model.py": "import torch\nclass Net(torch.nn.Module):\n    pass\n",
    }
    facts = {path: extract_facts(code) for path, code in files.items()}
    forward = link(facts, [tmp_path], lambda path: path.name)
    backward = link(dict(reversed(facts.items())), [tmp_path], lambda path: path.name)
    assert forward[tmp_path / "model.py"].cuda == "generate.py, which imports it, runs on CUDA"
    assert {path: found.digest() for path, found in forward.items()} == {
        path: found.digest() for path, found in backward.items()
    }

# ------------------------------------------------------------------ notebooks
def test_time_cells_are_scanned_and_skipped_cells_are_named(run_cli, tmp_path):
    cells = [
        "import torch\nfrom torch.utils.data import DataLoader",
        "%%capture\n!pip install tqdm\nloader = DataLoader(ds, batch_size=64)",
        "%%bash\necho hello",
        "%%time\nfor x, y in loader:\n    x = x.cuda()\n    loss = model(x, y)\n    loss.backward()\n    opt.step()\n    print(loss.item())",
        "%%timeit -n 1\nmodel(x.cuda())",
    ]
    notebook = {
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                   "source": text} for i, text in enumerate(cells)],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    }
    path = tmp_path / "train.ipynb"
    path.write_text(json.dumps(notebook, indent=1), encoding="utf-8")
    result = run_cli("scan", path.name, "--select", "SF102,SF104,SF301", "--no-summary", cwd=tmp_path)
    assert "train.ipynb:cell 2:3:10: SF102" in result.stdout  # the body of a %%capture cell
    assert "train.ipynb:cell 4:3:9: SF104" in result.stdout  # the body of a %%time cell
    assert "train.ipynb:cell 4:7:11: SF301" in result.stdout
    assert "train.ipynb: note: cell 3 skipped: `%%bash` cell, not Python" in result.stdout
    fixed = run_cli("apply", path.name, "--select", "SF104", cwd=tmp_path)
    assert fixed.exit_code == 1, fixed
    sources = ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]]
    assert sources[3].startswith("%%time\nfor x, y in loader:\n    x = x.cuda(non_blocking=True)\n")
    assert sources[2] == cells[2]


# ------------------------------------------------------------------ files a script names
DS_SCRIPT = """\
import argparse
import deepspeed

parser = argparse.ArgumentParser()
parser.add_argument("--deepspeed_config", default="ds_config.json")
args = parser.parse_args()
engine, optimizer, _, _ = deepspeed.initialize(model=model, config=args.deepspeed_config)
"""


def test_a_deepspeed_json_beside_the_script_is_read_and_follows_the_cache(run_cli, tmp_path, counted):
    (tmp_path / "train.py").write_text(DS_SCRIPT)
    config = tmp_path / "ds_config.json"
    config.write_text('{"fp16": {"enabled": true}, "zero_optimization": {"stage": 0}}')
    first = run_cli("scan", "train.py", "--select", "SF905", "--no-summary", cwd=tmp_path)
    assert first.stdout.startswith('ds_config.json:1:2: SF905 "fp16" trains with dynamic loss scaling')  # its line
    counted.clear()
    assert run_cli("scan", "train.py", "--select", "SF905", "--no-summary", cwd=tmp_path).stdout == first.stdout
    assert counted == []  # from the cache
    config.write_text('{"bf16": {"enabled": true}, "zero_optimization": {"stage": 0}}')
    assert run_cli("scan", "train.py", "--select", "SF905", "--no-summary", cwd=tmp_path).stdout == ""
    config.write_text('{"bf16": {"enabled": true},')  # broken: named, and the other files still scanned
    (tmp_path / "other.py").write_text("import deepspeed\ndeepspeed.initialize(model=m, config={'wall_clock_breakdown': True})\n")
    broken = run_cli("scan", ".", "--select", "SF905", "--no-summary", cwd=tmp_path)
    assert "train.py:5:51: SF905 DeepSpeed config not checked: ds_config.json is not plain JSON" in broken.stdout
    assert "other.py:2:39: SF905" in broken.stdout


def test_a_conv_net_defined_in_a_models_package(run_cli, tmp_path, write):
    """pytorch-cifar's layout: `from models import *` re-exports a ResNet built from blocks."""
    write("models/__init__.py", "from .resnet import *\n")
    write("models/resnet.py", """\
        import torch.nn as nn

        def conv3x3(cin, cout):
            return nn.Conv2d(cin, cout, 3, padding=1, bias=False)

        class BasicBlock(nn.Module):
            def __init__(self, cin, cout):
                super().__init__()
                self.conv = conv3x3(cin, cout)

            def forward(self, x):
                return self.conv(x).relu()

        class ResNet(nn.Module):
            def __init__(self, block):
                super().__init__()
                self.layer = block(3, 8)
                self.fc = nn.Linear(8, 10)

            def forward(self, x):
                return self.fc(self.layer(x).mean((2, 3)))

        def ResNet18():
            return ResNet(BasicBlock)
        """)
    write("main.py", """\
        import torch
        from models import *

        device = "cuda"
        net = ResNet18()
        net = net.to(device)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        for inputs, targets in trainloader:
            inputs, targets = inputs.to(device), targets.to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(net(inputs), targets)
            loss.backward()
            optimizer.step()
        """)
    result = run_cli("scan", ".", "--select", "SF601,SF206", "--output-format", "json", cwd=tmp_path)
    found = {(f["path"], f["line"], f["code"]): f for f in json.loads(result.stdout)}
    assert set(found) == {("main.py", 5, "SF206"), ("main.py", 5, "SF601")}
    assert "defined in another file" in found["main.py", 5, "SF206"]["no_fix_reason"]
    alone = run_cli("scan", "main.py", "--select", "SF601,SF206", "--no-summary", cwd=tmp_path)
    assert "SF206" not in alone.stdout and "SF601" not in alone.stdout  # nothing says it is a conv net


_BY_NAME_MODEL = """\
    import torch
    import torch.nn as nn
    from utils import SetAbstraction

    class get_model(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.sa = SetAbstraction(k)

        def forward(self, x):
            return self.sa(x).mean((2, 3))

    class get_loss(nn.Module):
        def forward(self, pred, target):
            return nn.functional.cross_entropy(pred, target)
    """
_BY_NAME_UTILS = """\
    import torch
    import torch.nn as nn

    def sample(x):
        index = torch.arange(x.shape[0]).to(x.device)
        return x[index]

    class SetAbstraction(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.conv = nn.Conv2d(3, k, 1)

        def forward(self, x):
            return self.conv(sample(x))
    """
_BY_NAME_TRAIN = """\
    import argparse
    import importlib
    import os
    import sys
    import torch

    sys.path.append(os.path.join(os.path.dirname(__file__), "models"))

    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--model", default={default})
        args = parser.parse_args()
        MODEL = importlib.import_module({argument})
        classifier = MODEL.get_model(8).cuda()
        criterion = MODEL.get_loss()
        optimizer = torch.optim.SGD(classifier.parameters(), lr=0.1)
        for points, target in loader:
            points, target = points.cuda(), target.cuda()
            loss = criterion(classifier(points), target)
            loss.backward()
            optimizer.step()
    """


@pytest.mark.parametrize("default, argument, linked", [
    ('"pointnet_cls"', "args.model", True),  # the default names the module
    ('"pointnet_msg"', "args.model", True),  # no such module: the one that has what the script takes
    ('"pointnet_cls"', '"models." + args.model', True),  # `models/` as a namespace package
    ('"pointnet_cls"', 'f"{args.model}"', False),  # not a form read
    ("None", '"pointnet_cls"', True),  # written out
])
def test_a_model_module_imported_by_an_options_value_is_linked(run_cli, tmp_path, write, default, argument, linked):
    """PointNet++'s `MODEL = importlib.import_module(args.model)` with `models/` put on the path:
    the model module the default (or, failing it, the only module with `get_model` and
    `get_loss`) names is the one the script trains, so the conv net and the copies its helpers
    make on every step are found."""
    write("models/pointnet_cls.py", _BY_NAME_MODEL)
    write("models/utils.py", _BY_NAME_UTILS)
    write("train.py", _BY_NAME_TRAIN.format(default=default, argument=argument))
    result = run_cli("scan", ".", "--select", "SF601,SF701", "--output-format", "json", cwd=tmp_path)
    found = {(f["path"], f["line"], f["code"]) for f in json.loads(result.stdout)}
    assert found == ({("train.py", 14, "SF601"), ("models/utils.py", 5, "SF701")} if linked else set())


def test_a_module_imported_by_an_options_value_is_not_guessed_among_several(tmp_path):
    """Two modules with what the script takes, and a default that names neither: no link."""
    files = {
        tmp_path / "a.py": "def get_model():\n    pass\n",
        tmp_path / "b.py": "def get_model():\n    pass\n",
        tmp_path / "train.py": "import importlib\nimport argparse\np = argparse.ArgumentParser()\n"
                               "p.add_argument('--model', default='c')\nargs = p.parse_args()\n"
                               "M = importlib.import_module(args.model)\nnet = M.get_model()\n",
    }
    links = _linked(tmp_path, files)[tmp_path / "train.py"]
    assert not links.modules
    (tmp_path / "b.py").unlink()
    del files[tmp_path / "b.py"]
    assert set(_linked(tmp_path, files)[tmp_path / "train.py"].names.values()) == {str(tmp_path / "a.py")}


@pytest.mark.parametrize("layer, reported", [("nn.Linear(8, 8)", True), ("nn.Conv2d(3, 8, 3)", False)])
def test_a_network_handed_to_a_trainer_class_decides_tf32_and_its_modules_are_found_on_the_path(
        run_cli, tmp_path, write, layer, reported):
    """Speech-Transformer: `src/bin/train.py` imports `solver` from `src/solver/` (its `path.sh`
    puts that folder on `PYTHONPATH`) and hands `Solver(data, model, ...)` the network it built;
    the solver's loop trains `self.model`, a matmul network (TF32 helps) or a conv-only one (cuDNN
    convolutions use TF32 already)."""
    write("src/net/net.py", f"""\
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = {layer}

            def forward(self, x):
                return self.layer(x)
        """)
    write("src/solver/solver.py", """\
        class Solver:
            def __init__(self, data, model, optimizer):
                self.loader = data["tr_loader"]
                self.model = model
                self.optimizer = optimizer

            def train(self):
                for epoch in range(10):
                    for x, y in self.loader:
                        x = x.cuda(non_blocking=True)
                        loss = (self.model(x) - y.cuda(non_blocking=True)).pow(2).mean()
                        self.optimizer.zero_grad(set_to_none=True)
                        loss.backward()
                        self.optimizer.step()
        """)
    write("src/bin/train.py", """\
        import torch
        from net import Net
        from solver import Solver

        def main(loader):
            model = Net()
            model.cuda()
            optimizer = torch.optim.Adam(model.parameters(), fused=True)
            solver = Solver({"tr_loader": loader}, model, optimizer)
            solver.train()
        """)
    result = run_cli("scan", ".", "--select", "SF201", "--no-summary", "--no-cache", cwd=tmp_path)
    found = [line.split(" ", 2)[:2] for line in result.stdout.splitlines() if "SF201" in line]
    assert found == ([["src/solver/solver.py:9:13:", "SF201"]] if reported else []), result.stdout
    if reported:  # the script that runs the solver chooses the matmul precision, from its command line
        train = tmp_path / "src" / "bin" / "train.py"
        train.write_text(train.read_text().replace(
            "def main(loader):\n", "def main(loader, args):\n    if args.tf32:\n"
            "        torch.backends.cuda.matmul.allow_tf32 = True\n") + "\nif __name__ == '__main__':\n    main(None, None)\n")
        assert "SF201" not in run_cli("scan", ".", "--select", "SF201", "--no-summary", "--no-cache", cwd=tmp_path).stdout


@pytest.mark.parametrize("own, reported", [("LFR_m=1", True), ("num_workers=4", False)])
def test_a_dataloader_subclass_from_a_folder_on_the_path_is_a_dataloader(run_cli, tmp_path, write, own, reported):
    """Speech-Transformer's `AudioDataLoader(data.DataLoader)` in `src/data/data.py` (its `path.sh`
    puts `src/data/` on `PYTHONPATH`): `__init__(self, *args, LFR_m=1, **kwargs)` keeps a keyword of
    its own and hands the rest to DataLoader, so its calls are read as DataLoader's. A keyword of
    its own named like DataLoader's (`num_workers`) would not reach DataLoader: left alone."""
    write("src/data/data.py", f"""\
        import torch.utils.data as data

        class AudioDataLoader(data.DataLoader):
            def __init__(self, *args, {own}, **kwargs):
                super(AudioDataLoader, self).__init__(*args, **kwargs)
                self.collate_fn = None
        """)
    write("src/bin/train.py", """\
        import torch
        from data import AudioDataLoader

        def main(dataset, model, optimizer):
            loader = AudioDataLoader(dataset, batch_size=1, num_workers=4)
            for epoch in range(10):
                for x, y in loader:
                    x, y = x.cuda(), y.cuda()
                    loss = (model(x) - y).pow(2).mean()
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
        """)
    result = run_cli("scan", ".", "--select", "SF102", "--no-summary", "--no-cache", cwd=tmp_path)
    found = [line.split(" ", 2)[:2] for line in result.stdout.splitlines() if "SF102" in line]
    assert found == ([["src/bin/train.py:5:14:", "SF102"]] if reported else []), result.stdout


@pytest.mark.parametrize("strategy, reported", [("steps", [14]), ("epoch", [8]), (None, [14])])
def test_training_arguments_in_a_branch_no_run_takes_are_not_reported(run_cli, tmp_path, write, strategy, reported):
    """whisper-finetune: one `Seq2SeqTrainingArguments(...)` per `--train_strategy`; the README's
    command picks one (none: the default, `steps`), and only that one's settings are the run's."""
    write("train.py", """\
        import argparse
        from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

        parser = argparse.ArgumentParser()
        parser.add_argument("--train_strategy", type=str, default="steps")
        args = parser.parse_args()
        if args.train_strategy == "epoch":
            training_args = Seq2SeqTrainingArguments(
                output_dir="out",
                gradient_checkpointing=True,
                bf16=True,
            )
        elif args.train_strategy == "steps":
            training_args = Seq2SeqTrainingArguments(
                output_dir="out",
                gradient_checkpointing=True,
                bf16=True,
            )
        trainer = Seq2SeqTrainer(model=model, args=training_args, train_dataset=data)
        trainer.train()
        """)
    write("README.md", f"```bash\ntorchrun --nproc_per_node=4 train.py --train_strategy {strategy}\n```\n" if strategy else "")
    result = run_cli("scan", ".", "--select", "SF902", "--no-summary", "--no-cache", cwd=tmp_path)
    lines = [line for line in result.stdout.splitlines() if "gradient_checkpointing=True" in line]
    assert [int(line.split(":")[1]) - 2 for line in lines] == reported, result.stdout


def test_a_project_class_around_a_diffusers_unet_is_a_conv_net(run_cli, tmp_path, write):
    """tango: `models.AudioDiffusion` builds `UNet2DConditionModel.from_config(...)`; the training
    script in another file trains it with cuDNN's default algorithms."""
    write("models.py", """\
        import torch.nn as nn
        from diffusers import UNet2DConditionModel

        class AudioDiffusion(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.unet = UNet2DConditionModel.from_config(config)

            def forward(self, latents, t, text):
                return self.unet(latents, t, encoder_hidden_states=text).sample.pow(2).mean()
        """)
    write("train.py", """\
        import torch
        from models import AudioDiffusion

        model = AudioDiffusion(config).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, fused=True)
        for latents, t, text in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(latents.cuda(non_blocking=True), t, text)
            loss.backward()
            optimizer.step()
        """)
    result = run_cli("scan", ".", "--select", "SF601", "--no-summary", cwd=tmp_path)
    assert [line.split(" ", 2)[:2] for line in result.stdout.splitlines()] == [["train.py:4:9:", "SF601"]], result.stdout


def test_torch_that_a_star_import_brings_is_torch(run_cli, tmp_path, write):
    """A script with no `import torch` of its own that takes `torch` from `from nets.segnet import *`:
    its `torch.nn.DataParallel` and its `torch.no_grad()` are torch's."""
    write("nets/__init__.py", "")
    write("nets/segnet.py", """\
        import torch
        import torch.nn as nn

        class SegNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 21, 3, padding=1)

            def forward(self, x):
                return self.conv(x)
        """)
    write("train.py", """\
        from nets.segnet import *

        model = torch.nn.DataParallel(SegNet()).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for image, mask in train_loader:
            loss = criterion(model(image.cuda(non_blocking=True)), mask.cuda(non_blocking=True))
            loss.backward()
            optimizer.step()
        for image, mask in val_loader:
            with torch.no_grad():
                out = model(image.cuda(non_blocking=True))
        """)
    result = run_cli("scan", ".", "--select", "SF801,SF702", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == {("train.py", 3, "SF801")}


def test_a_setter_method_of_another_files_model_runs_no_network(run_cli, tmp_path, write):
    """Transformer-XL's `evaluate()`: `model.reset_length(...)` (mem_transformer.py: three
    attribute assignments) before and after a forward under `torch.no_grad()`. A method that
    calls nothing runs no network, so it records no autograd graph, nor does one that only keeps
    the books (Real-Time-Voice-Cloning's `get_step()`: a buffer's `.item()`; `save()`: `torch.save`
    of state dicts); `model.sample(x)`, which runs the network, still does, and so does
    `model.logits(h)`, which computes with the weights through a torch function."""
    write("mem_transformer.py", """\
        import torch

        class MemTransformerLM(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(8, 8)
                self.tgt_len = 128

            def reset_length(self, tgt_len, ext_len, mem_len):
                self.tgt_len = tgt_len
                self.ext_len = ext_len

            def sample(self, x):
                return self.net(x)

            def logits(self, h):
                return torch.nn.functional.linear(h, self.net.weight)

            def get_step(self):
                return self.step.data.item()

            def save(self, path, optimizer):
                torch.save({"model": self.state_dict(), "optimizer": optimizer.state_dict()}, path)

            def forward(self, x):
                return self.net(x)
        """)
    write("train.py", """\
        import torch
        from mem_transformer import MemTransformerLM

        model = MemTransformerLM().cuda()
        optimizer = torch.optim.Adam(model.parameters(), fused=True)

        def evaluate(eval_iter):
            model.eval()
            model.reset_length(64, 0, 128)
            with torch.no_grad():
                for data in eval_iter:
                    total = model(data.cuda(non_blocking=True)).sum().item()
            print(model.sample(data).mean().item(), model.logits(data).mean().item())
            print(model.get_step())
            model.save("last.pt", optimizer)
            model.reset_length(128, 0, 128)
            model.train()

        for epoch in range(10):
            for data in train_iter:
                model(data.cuda(non_blocking=True)).sum().backward()
                optimizer.step()
            evaluate(val_iter)
        """)
    result = run_cli("scan", ".", "--select", "SF702", "--no-summary", "--output-format", "json", cwd=tmp_path)
    found = [(f["path"], f["line"], f["message"].split(" run")[0]) for f in json.loads(result.stdout)]
    assert found == [("train.py", 13, "`model.sample(...)` and `model.logits(...)`")]


@pytest.mark.parametrize("launched", [True, False])
def test_a_data_parallel_subclass_that_a_run_script_turns_on(run_cli, tmp_path, write, launched):
    """Transformer-XL: `if args.multi_gpu:` (store_true) wraps the model in `BalancedDataParallel`,
    a subclass of `DataParallel` in utils/data_parallel.py; run_wt103_base.sh passes `--multi_gpu`
    (inside an `if [[ $1 == 'train' ]]` block). Without the run script the default run is one GPU."""
    write("utils/data_parallel.py", """\
        from torch.nn.parallel import DataParallel

        class BalancedDataParallel(DataParallel):
            def __init__(self, gpu0_bsz, *args, **kwargs):
                self.gpu0_bsz = gpu0_bsz
                super().__init__(*args, **kwargs)
        """)
    write("train.py", """\
        import argparse
        import torch
        from utils.data_parallel import BalancedDataParallel

        parser = argparse.ArgumentParser()
        parser.add_argument("--multi_gpu", action="store_true")
        args = parser.parse_args()
        model = Net().cuda()
        if args.multi_gpu:
            para_model = BalancedDataParallel(4, model, dim=1)
        else:
            para_model = model
        """)
    if launched:
        write("run_wt103_base.sh", """\
            #!/bin/bash
            if [[ $1 == 'train' ]]; then
                python train.py \\
                    --multi_gpu \\
                    ${@:2}
            fi
            """)
    result = run_cli("scan", ".", "--select", "SF801", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == ({("train.py", 10, "SF801")} if launched else set())


def test_a_logger_of_another_file_called_from_a_module_level_loop_runs_every_step(run_cli, tmp_path, write):
    """`logger = Logger()` at module level, `logger.log(losses, images)` in the loop: the log
    method and the helper it calls run every step, so the host copy there is a per-step sync."""
    write("report.py", """\
        import numpy as np

        def as_image(t):
            return np.clip(t[0].cpu().numpy(), 0, 1)

        class Logger:
            def log(self, losses, images):
                for name, image in images.items():
                    self.show(name, as_image(image))
        """)
    write("train", """\
        import torch
        from report import Logger

        net = Net().cuda()
        opt = torch.optim.Adam(net.parameters(), fused=True)
        logger = Logger()
        for x, y in loader:
            out = net(x.cuda(non_blocking=True))
            loss = (out - y.cuda(non_blocking=True)).abs().mean()
            loss.backward()
            opt.step()
            logger.log({"loss": loss}, images={"out": out})
        """)
    result = run_cli("scan", "train", "report.py", "--select", "SF301", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == {("report.py", 4, "SF301")}


def test_a_zoo_backbone_chosen_by_name_from_a_models_module_is_a_conv_net(run_cli, tmp_path, write):
    """`getattr(models, args.arch)(...)` with `arg = parser.add_argument` and `--arch` defaulting
    to "resnet34", where models.py has `resnet34 = partial(Classifier, backbone=M.resnet34)`:
    the default run trains a torchvision ResNet."""
    write("pkg/__init__.py", "")
    write("pkg/models.py", """\
        from functools import partial
        import torch.nn as nn
        import torchvision.models as M

        class Classifier(nn.Module):
            def __init__(self, classes, backbone=M.resnet18):
                super().__init__()
                self.net = backbone()
                self.net.fc = nn.Linear(self.net.fc.in_features, classes)

            def forward(self, x):
                return self.net(x)

        resnet34 = partial(Classifier, backbone=M.resnet34)
        resnet50 = partial(Classifier, backbone=M.resnet50)
        """)
    write("pkg/main.py", """\
        import argparse
        import torch
        from . import models

        def main():
            parser = argparse.ArgumentParser()
            arg = parser.add_argument
            arg("--arch", default="resnet34")
            args = parser.parse_args()
            model = getattr(models, args.arch)(classes=10).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                torch.nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True)).backward()
                opt.step()
        """)
    result = run_cli("scan", "pkg", "--select", "SF601", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == {("main.py", 10, "SF601")}


def _loader_handed_on(write, *, reshuffle: bool) -> None:
    """melgan's layout: `data/loaders.py` builds the loader from a YAML config object, `run.py`
    hands it to `engine/fit.py`'s `fit()`, whose epoch loop iterates it through `tqdm`."""
    write("configs/base.yaml", """\
        data:
          root: /data
        ---
        train:
          num_workers: 16
          batch_size: 8
        """)
    write("data/__init__.py", "")
    write("data/loaders.py", """\
        from torch.utils.data import DataLoader

        def make_loader(hp, dataset):
            return DataLoader(dataset, batch_size=hp.train.batch_size, shuffle=True,
                              num_workers=hp.train.num_workers, pin_memory=True)
        """)
    write("engine/__init__.py", "")
    write("engine/fit.py", f"""\
        import itertools
        import tqdm

        def fit(model, opt, trainloader):
            for epoch in itertools.count():
                {"trainloader.dataset.reshuffle()" if reshuffle else "pass"}
                bar = tqdm.tqdm(trainloader)
                for x, y in bar:
                    loss = model(x.cuda(non_blocking=True), y.cuda(non_blocking=True))
                    loss.backward()
                    opt.step()
        """)
    write("run.py", """\
        import torch
        from data.loaders import make_loader
        from engine.fit import fit
        from hparams import load_hparams

        if __name__ == "__main__":
            hp = load_hparams()
            trainloader = make_loader(hp, build_dataset(hp))
            model = build_model(hp).cuda()
            fit(model, torch.optim.Adam(model.parameters(), fused=True), trainloader)
        """)


@pytest.mark.parametrize("reshuffle", [False, True])
def test_a_loader_from_a_config_object_handed_to_another_files_epoch_loop(run_cli, tmp_path, write, reshuffle):
    """The workers come from the project's run config (`hp.train.num_workers`: 16, from a YAML of
    two `---` documents); the loader is restarted every epoch of `fit()`. When `fit()` changes the
    dataset between epochs, persistent workers would not see it: reported without a fix."""
    _loader_handed_on(write, reshuffle=reshuffle)
    result = run_cli("scan", ".", "--select", "SF101,SF103", "--output-format", "json", cwd=tmp_path)
    found = [(f["path"], f["line"], f["code"], f["message"], f["fix"] is not None) for f in json.loads(result.stdout)]
    assert found == [("data/loaders.py", 4, "SF103", "`DataLoader` starts its 16 worker processes again every epoch",
                      not reshuffle)]


def test_a_factorys_worker_count_is_what_its_callers_pass(run_cli, tmp_path, write):
    """A loader factory's `num_workers=2` default is not the run's count when the script that
    calls it passes `--num_workers` (default 8): no SF101 "only 2 workers". The loaders go to a
    class whose `train()` iterates them in an epoch loop: SF103 for the 8 workers restarted."""
    write("loaders.py", """\
        from torch.utils.data import DataLoader

        def build_loader(root, batch_size, num_workers=2):
            loader = DataLoader(FolderSet(root), batch_size=batch_size, shuffle=True, num_workers=num_workers,
                                pin_memory=True)
            return loader
        """)
    write("trainer.py", """\
        import torch

        class Trainer:
            def __init__(self, config, train_loader):
                self.train_loader = train_loader
                self.model = Net().cuda()
                self.opt = torch.optim.Adam(self.model.parameters(), fused=True)

            def train(self):
                for epoch in range(100):
                    for x, y in self.train_loader:
                        loss = self.model(x.cuda(non_blocking=True), y.cuda(non_blocking=True))
                        loss.backward()
                        self.opt.step()
        """)
    write("main.py", """\
        import argparse
        from loaders import build_loader
        from trainer import Trainer

        def main(config):
            loader = build_loader(config.train_path, config.batch_size, num_workers=config.num_workers)
            Trainer(config, loader).train()

        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--train_path", default="data/train")
            parser.add_argument("--batch_size", type=int, default=1)
            parser.add_argument("--num_workers", type=int, default=8)
            main(parser.parse_args())
        """)
    result = run_cli("scan", ".", "--select", "SF101,SF103", "--output-format", "json", cwd=tmp_path)
    found = [(f["path"], f["line"], f["code"], f["message"]) for f in json.loads(result.stdout)]
    assert found == [("loaders.py", 4, "SF103", "`DataLoader` starts its `num_workers` worker processes again every epoch")]


@pytest.mark.parametrize("setting, entry, reported", [
    ("cudnn.benchmark = True", True, False),  # the launching script chose for the whole process
    ("if config.fast:\n                cudnn.benchmark = True", True, True),  # only behind an option
    ("cudnn.benchmark = True", False, True),  # a function of a module that is no script (a test's helper)
])
def test_a_cudnn_choice_of_the_script_that_runs_the_trainer_counts(run_cli, tmp_path, write, setting, entry, reported):
    write("trainer.py", """\
        import torch
        import torch.nn as nn

        class Trainer:
            def __init__(self, loader):
                self.loader = loader
                self.net = nn.Sequential(nn.Conv2d(3, 64, 3), nn.ReLU(), nn.Conv2d(64, 1, 3)).cuda()
                self.opt = torch.optim.Adam(self.net.parameters(), fused=True)

            def train(self):
                for epoch in range(10):
                    for x, y in self.loader:
                        loss = (self.net(x.cuda()) - y.cuda()).abs().mean()
                        loss.backward()
                        self.opt.step()
        """)
    write("main.py", f"""\
        from torch.backends import cudnn
        from trainer import Trainer

        def main(config, loader):
            {setting}
            Trainer(loader).train()
        """ + ("\n        if __name__ == '__main__':\n            main(parse_options(), make_loader())\n" if entry else ""))
    result = run_cli("scan", ".", "--select", "SF601", "--output-format", "json", cwd=tmp_path)
    found = [(f["path"], f["code"]) for f in json.loads(result.stdout)]
    assert found == ([("trainer.py", "SF601")] if reported else [])


@pytest.mark.parametrize("flag, built, expected", [
    ('action="store_true"', "fp16=args.fp16", ["SF202"]),  # off by default: the default run trains in fp32
    ('action="store_false"', "fp16=args.fp16", ["SF207"]),  # on by default: fp16 with a scaler
    ('action="store_true"', "**extra", ["SF207"]),  # whatever `extra` holds: unknown, may be on
])
def test_an_autocast_enabled_by_a_keyword_the_learner_gets_through_kwargs(run_cli, tmp_path, write, flag, built, expected):
    """DiffWave's layout: `main(parser.parse_args())` hands the options to `main(args)`, which
    builds the learner with `fp16=args.fp16`; the learner keeps `autocast(enabled=kwargs.get("fp16",
    False))` and trains `with self.autocast:`."""
    write("learner.py", f"""\
        import torch
        import torch.nn as nn

        class Learner:
            def __init__(self, model, optimizer, **kwargs):
                self.model = model
                self.optimizer = optimizer
                self.autocast = torch.cuda.amp.autocast(enabled=kwargs.get("fp16", False))
                self.scaler = torch.cuda.amp.GradScaler(enabled=kwargs.get("fp16", False))

            def train(self, loader):
                for audio in loader:
                    with self.autocast:
                        loss = (self.model(audio.cuda()) - audio.cuda()).abs().mean()
                    self.scaler.scale(loss).backward()
                    self.scaler.step(self.optimizer)
                    self.scaler.update()

        def train(args, loader):
            model = nn.Sequential(nn.Conv1d(1, 64, 3, padding=1), nn.ReLU(), nn.Conv1d(64, 1, 3, padding=1)).cuda()
            opt = torch.optim.Adam(model.parameters(), fused=True)
            extra = {{}}
            Learner(model, opt, {built}).train(loader)
        """)
    write("main.py", f"""\
        from argparse import ArgumentParser
        from learner import train

        def main(args):
            train(args, None)

        if __name__ == "__main__":
            parser = ArgumentParser()
            parser.add_argument("--fp16", {flag})
            main(parser.parse_args())
        """)
    result = run_cli("scan", ".", "--select", "SF202,SF207", "--output-format", "json", cwd=tmp_path)
    found = [(f["path"], f["line"], f["code"]) for f in json.loads(result.stdout)]
    assert found == [("learner.py", 8, code) for code in expected]


@pytest.mark.parametrize("keeps, expected", [
    ("self.fp16 = kwargs.get('fp16')", ["SF202"]),  # the class keeps it: its code shows what it does
    ("self.inner = External(**kwargs)", []),  # passed on to code the file does not show: may be 16-bit
])
def test_an_fp16_keyword_to_the_files_own_class_is_read_in_its_code(run_cli, tmp_path, write, keeps, expected):
    write("train.py", f"""\
        import torch
        import torch.nn as nn
        from elsewhere import External, options

        class Learner:
            def __init__(self, model, **kwargs):
                self.model = model
                {keeps}
                self.autocast = torch.autocast("cuda", enabled=False)

            def train(self, loader, opt):
                for x in loader:
                    with self.autocast:
                        loss = self.model(x.cuda()).abs().mean()
                    loss.backward()
                    opt.step()

        model = nn.Sequential(nn.Conv1d(1, 64, 3), nn.ReLU(), nn.Conv1d(64, 1, 3)).cuda()
        Learner(model, fp16=options.fp16).train([], torch.optim.Adam(model.parameters(), fused=True))
        """)
    result = run_cli("scan", "train.py", "--select", "SF202", "--output-format", "json", cwd=tmp_path)
    assert [f["code"] for f in json.loads(result.stdout)] == expected


def test_a_device_a_helper_of_another_file_returns_through_a_local_name_is_cuda(run_cli, tmp_path, write):
    """pytorchic-bert: `utils.get_device()` binds `device = torch.device("cuda" if ...)` and
    returns it; the script hands it to the trainer of a third file, which moves batches there."""
    write("utils.py", """\
        import torch

        def get_device():
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            print(device)
            return device
        """)
    write("train.py", """\
        class Trainer:
            def __init__(self, model, loader, optimizer, device):
                self.model, self.loader, self.optimizer, self.device = model, loader, optimizer, device

            def train(self):
                model = self.model.to(self.device)
                for batch in self.loader:
                    batch = [t.to(self.device) for t in batch]
                    self.optimizer.zero_grad(set_to_none=True)
                    loss = model(*batch).mean()
                    loss.backward()
                    self.optimizer.step()
        """)
    write("classify.py", """\
        import torch
        import train
        from utils import get_device

        model = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.GELU(), torch.nn.Linear(3072, 768))
        loader = torch.utils.data.DataLoader(dataset, batch_size=32, num_workers=4, pin_memory=True)
        optimizer = torch.optim.AdamW(model.parameters(), fused=True)
        train.Trainer(model, loader, optimizer, get_device()).train()
        """)
    result = run_cli("scan", ".", "--select", "SF202", "--output-format", "json", cwd=tmp_path)
    assert [(f["path"], f["code"]) for f in json.loads(result.stdout)] == [("train.py", "SF202")]


def test_loader_options_forwarded_through_kwargs_to_another_files_factory(run_cli, tmp_path, write):
    """deeplab's layout: a trainer class passes `**kwargs` of a dict literal (workers from an
    argparse default, pinned memory) to `make_loaders(args, **kwargs)` of data.py, keeps the
    loaders as `self.` attributes, and `main()` calls its epoch method in a loop. The workers
    are known (4: no SF101), pinned (no SF102), restarted every epoch (SF103, without a fix: the
    count is an option of the caller)."""
    write("data.py", """\
        from torch.utils.data import DataLoader

        def make_loaders(args, **kwargs):
            train = DataLoader(TrainSet(args), batch_size=8, shuffle=True, **kwargs)
            val = DataLoader(ValSet(args), batch_size=8, **kwargs)
            return train, val
        """)
    write("train.py", """\
        import argparse
        import torch
        from tqdm import tqdm
        from data import make_loaders

        class Runner:
            def __init__(self, args):
                kwargs = {"num_workers": args.workers, "pin_memory": True}
                self.train_loader, self.val_loader = make_loaders(args, **kwargs)
                self.model = Net().cuda()
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def run_epoch(self):
                bar = tqdm(self.train_loader)
                for x, y in bar:
                    loss = self.model(x.cuda(non_blocking=True), y.cuda(non_blocking=True))
                    loss.backward()
                    self.opt.step()

        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--workers", type=int, default=4)
            runner = Runner(parser.parse_args())
            for epoch in range(50):
                runner.run_epoch()

        if __name__ == "__main__":
            main()
        """)
    result = run_cli("scan", ".", "--select", "SF101,SF102,SF103", "--output-format", "json", cwd=tmp_path)
    found = [(f["path"], f["line"], f["code"], f["message"], f["fix"]) for f in json.loads(result.stdout)]
    message = "`DataLoader` starts its 4 worker processes again every epoch"
    assert found == [("data.py", 4, "SF103", message, None), ("data.py", 5, "SF103", message, None)]


def test_a_loader_kept_by_a_trainer_class_of_another_file_and_run_every_epoch(run_cli, tmp_path, write):
    """BERT-pytorch's layout: `Pretrainer(model, train_loader=loader)` keeps the loader, its
    `train(epoch)` hands it to `self.run(epoch, self.train_loader)`, whose loop steps; `main.py`
    calls `trainer.train(epoch)` in an epoch loop: the workers start again every epoch."""
    write("trainer.py", """\
        import torch
        import tqdm

        class Pretrainer:
            def __init__(self, model, train_loader):
                self.model = model.cuda()
                self.train_loader = train_loader
                self.opt = torch.optim.Adam(self.model.parameters(), fused=True)

            def train(self, epoch):
                self.run(epoch, self.train_loader)

            def run(self, epoch, data_loader, train=True):
                bar = tqdm.tqdm(enumerate(data_loader))
                for i, batch in bar:
                    loss = self.model(batch.cuda(non_blocking=True))
                    if train:
                        loss.backward()
                        self.opt.step()
        """)
    write("main.py", """\
        from torch.utils.data import DataLoader
        from trainer import Pretrainer

        def main(args):
            loader = DataLoader(load_corpus(args), batch_size=64, num_workers=5, pin_memory=True)
            trainer = Pretrainer(build_model(args), train_loader=loader)
            for epoch in range(args.epochs):
                trainer.train(epoch)
        """)
    result = run_cli("scan", ".", "--select", "SF103", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == {("main.py", 5, "SF103")}


def test_a_loader_cycled_by_a_generator_of_another_file(run_cli, tmp_path, write):
    """`datalooper = infiniteloop(dataloader)` with `def infiniteloop(loader): while True: for x, y
    in iter(loader): yield x` in utils.py (flow-matching and GAN training scripts): the loop steps
    on `next(datalooper)`, and every pass over the loader starts its workers again. A generator
    that iterates its loader once (`first_batches`) restarts nothing."""
    write("utils.py", """\
        def infiniteloop(dataloader):
            while True:
                for x, y in iter(dataloader):
                    yield x

        def first_batches(dataloader):
            for x, y in dataloader:
                yield x
        """)
    write("train.py", """\
        import torch
        from utils import first_batches, infiniteloop

        def main():
            loader = torch.utils.data.DataLoader(dataset(), batch_size=128, num_workers=4, pin_memory=True)
            once = torch.utils.data.DataLoader(dataset(), batch_size=128, num_workers=4, pin_memory=True)
            datalooper, warm = infiniteloop(loader), first_batches(once)
            model = torch.nn.Linear(8, 1).cuda()
            opt = torch.optim.Adam(model.parameters(), fused=True)
            for step in range(400_000):
                opt.zero_grad()
                model(next(datalooper).cuda(non_blocking=True)).mean().backward()
                opt.step()
        """)
    result = run_cli("scan", ".", "--select", "SF103", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == {("train.py", 5, "SF103")}


def test_only_the_training_loader_of_a_returned_pair_restarts_every_epoch(run_cli, tmp_path, write):
    """WaveRNN-style `train_set, test_set = get_datasets(...)` from utils/dataset.py, then an
    epoch loop over `train_set` only: the test loader's single worker is left alone."""
    write("utils/dataset.py", """\
        from torch.utils.data import DataLoader

        def get_datasets(path, batch_size):
            train_set = DataLoader(make(path), batch_size=batch_size, num_workers=2, shuffle=True, pin_memory=True)
            test_set = DataLoader(make(path), batch_size=1, num_workers=1, pin_memory=True)
            return train_set, test_set
        """)
    write("train.py", """\
        import torch
        from utils.dataset import get_datasets

        def main():
            train_set, test_set = get_datasets("data", 32)
            model = torch.nn.Linear(8, 1).cuda()
            opt = torch.optim.Adam(model.parameters(), fused=True)
            for epoch in range(100):
                for x, y in train_set:
                    model(x.cuda(non_blocking=True)).mean().backward()
                    opt.step()
        """)
    result = run_cli("scan", ".", "--select", "SF103", "--output-format", "json", cwd=tmp_path)
    found = [(f["path"], f["line"], f["message"]) for f in json.loads(result.stdout)]
    assert found == [("utils/dataset.py", 4, "`DataLoader` starts its 2 worker processes again every epoch")]


def test_an_evaluation_loader_iterated_every_epoch_in_another_file(run_cli, tmp_path, write):
    """DeiT: `evaluate(data_loader_val, model, device)` from engine.py runs every epoch, and
    `train_one_epoch` trains on the other loader. Persistent workers are advised for the
    training loader only: restarting the validation loader's workers holds up no training step."""
    write("engine.py", """\
        import torch

        def train_one_epoch(model, data_loader, optimizer):
            for x, y in data_loader:
                model(x.cuda(non_blocking=True)).sum().backward()
                optimizer.step()

        @torch.no_grad()
        def evaluate(data_loader, model):
            for x, y in data_loader:
                model(x.cuda(non_blocking=True))
        """)
    write("main.py", """\
        import torch
        from engine import evaluate, train_one_epoch

        train = torch.utils.data.DataLoader(ds, num_workers=8, pin_memory=True)
        val = torch.utils.data.DataLoader(ds_val, num_workers=8)
        for epoch in range(300):
            train_one_epoch(model, train, optimizer)
            evaluate(val, model)
        """)
    result = run_cli("scan", ".", "--select", "SF102,SF103", "--no-summary", cwd=tmp_path)
    assert result.stdout.splitlines() == [
        "main.py:4:9: SF103 [*] `DataLoader` starts its 8 worker processes again every epoch (impact: low)"]


def test_a_loader_returned_by_a_factory_of_another_file(run_cli, tmp_path, write):
    """pytorch-tutorial's `get_loader()` in data_loader.py: the loader is built there, the loop
    that iterates it every epoch and copies its batches is in train.py. The loader returned
    beside it, which no training loop iterates, is the validation loader: nothing to pin
    (RepDistiller's `get_cifar100_dataloaders`)."""
    write("data.py", """\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def get_loaders(batch_size):
            train = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=batch_size, num_workers=4)
            val = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=batch_size)
            return train, val
        """)
    write("train.py", """\
        import torch
        from data import get_loaders

        def main():
            train_loader, val_loader = get_loaders(32)
            for epoch in range(10):
                for (x,) in train_loader:
                    x = x.view(-1, 8).to("cuda")
                    model(x).sum().backward()
                    optimizer.step()

        main()
        """)
    result = run_cli("scan", ".", "--select", "SF102,SF103,SF104", "--no-summary", cwd=tmp_path)
    assert result.stdout.splitlines() == [
        "data.py:5:13: SF102 [*] `DataLoader` without `pin_memory=True`: batches are copied to the GPU from pageable memory"
        " (impact: medium)",
        "train.py:8:17: SF104 [*] `.to()` of a batch in the training loop blocks the CPU until the copy is done "
        "(pin the DataLoader's memory too, SF102) (impact: medium)",
        "data.py:5:13: SF103 [*] `DataLoader` starts its 4 worker processes again every epoch (impact: low)",
    ]


def test_a_loader_made_at_module_level_and_iterated_by_a_training_function(run_cli, tmp_path, write):
    """locuslab/TCN's `train_loader, test_loader = data_generator(root, batch_size)` at module
    level, iterated by `def train(ep):`: the loader of `utils.py` feeds training (its file never
    names CUDA itself); the test loader beside it does not."""
    write("utils.py", """\
        import torch
        from torchvision import datasets

        def data_generator(root, batch_size):
            train_set = datasets.MNIST(root=root, train=True, download=True)
            test_set = datasets.MNIST(root=root, train=False, download=True)
            train_loader = torch.utils.data.DataLoader(train_set, batch_size=batch_size)
            test_loader = torch.utils.data.DataLoader(test_set, batch_size=batch_size)
            return train_loader, test_loader
        """)
    write("train.py", """\
        import torch
        from utils import data_generator

        train_loader, test_loader = data_generator("./data", 64)

        def train(ep):
            for data, target in train_loader:
                data, target = data.cuda(non_blocking=True), target.cuda(non_blocking=True)
                loss = model(data).sum()
                loss.backward()
                optimizer.step()

        for epoch in range(10):
            train(epoch)
        """)
    result = run_cli("scan", ".", "--select", "SF102", "--no-summary", cwd=tmp_path)
    assert result.stdout.splitlines() == [
        "utils.py:7:20: SF102 [*] `DataLoader` without `pin_memory=True`: batches are copied to the GPU from pageable memory"
        " (impact: medium)"], result.stdout


def test_a_collate_fn_of_another_file_that_builds_its_batches_on_the_gpu(run_cli, tmp_path, write):
    """ChatGLM-finetune-LoRA: `import dataset.GLM`, then `DataLoader(..., collate_fn=dataset.GLM.
    collate_fn)`, whose batches are made with `device=device`: CUDA tensors cannot be pinned (the
    DataLoader would raise), so no SF102."""
    write("dataset/__init__.py", "")
    write("dataset/GLM.py", """\
        import torch
        device = "cuda"

        def collate_fn(batch):
            ids = torch.tensor([item["ids"] for item in batch], device=device)
            return {"input_ids": ids, "labels": ids.clone()}
        """)
    write("train.py", """\
        import torch
        from torch.utils.data import DataLoader
        import dataset.GLM

        loader = DataLoader(pairs, batch_size=4, collate_fn=dataset.GLM.collate_fn)
        model = Net().cuda()
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
        """)
    assert run_cli("scan", ".", "--select", "SF102", "--no-summary", cwd=tmp_path).stdout == ""


@pytest.mark.parametrize("moves", [True, False])
def test_a_loader_factory_handed_datasets_that_move_their_samples_to_the_gpu(run_cli, tmp_path, write, moves):
    """fastcomposer: `get_data_loader(dataset, batch_size)` in data.py, handed by train.py a
    `FastComposerDataset(..., device=accelerator.device)` whose `__getitem__` moves each sample
    to `self.device`: its samples are CUDA tensors, which worker processes cannot make and the
    loader cannot pin. A Dataset that leaves them on the host gets both findings."""
    write("data.py", f"""\
        import torch

        class ImageDataset(torch.utils.data.Dataset):
            def __init__(self, images, device=None):
                self.images, self.device = images, device

            def __getitem__(self, index):
                image = torch.as_tensor(self.images[index])
                {"return image.to(self.device)" if moves else "return image"}

            def __len__(self):
                return len(self.images)

        def get_data_loader(dataset, batch_size, shuffle=True):
            return torch.utils.data.DataLoader(dataset, shuffle=shuffle, batch_size=batch_size, num_workers=0)
        """)
    write("train.py", """\
        import torch
        from data import ImageDataset, get_data_loader

        dataset = ImageDataset(images, device="cuda")
        loader = get_data_loader(dataset, 32)
        model = Net().cuda()
        for batch in loader:
            loss = model(batch.to("cuda", non_blocking=True)).sum()
            loss.backward()
            optimizer.step()
        """)
    found = run_cli("scan", ".", "--select", "SF101,SF102", "--no-summary", cwd=tmp_path).stdout.splitlines()
    assert [line.split(": ")[1].split(" ")[0] for line in found] == ([] if moves else ["SF101", "SF102"]), found


def test_the_loader_a_factory_builds_when_its_training_flag_is_off_feeds_evaluation(run_cli, tmp_path, write):
    """voicefilter's `create_dataloader(hp, args, train)`: the `if train:` branch builds the
    training loader, the `else:` branch the test loader, which only evaluation reads: nothing to
    pin there."""
    write("data.py", """\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def create_dataloader(batch_size, train):
            if train:
                return DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=batch_size, num_workers=4,
                                  persistent_workers=True)
            else:
                return DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=1, num_workers=0)
        """)
    write("train.py", """\
        import torch
        from data import create_dataloader

        def main():
            trainloader = create_dataloader(32, train=True)
            testloader = create_dataloader(32, train=False)
            for epoch in range(10):
                for (x,) in trainloader:
                    model(x.to("cuda", non_blocking=True)).sum().backward()
                    optimizer.step()
                with torch.no_grad():
                    for (x,) in testloader:
                        model(x.to("cuda", non_blocking=True))

        main()
        """)
    result = run_cli("scan", ".", "--select", "SF101,SF102,SF103", "--no-summary", cwd=tmp_path)
    assert result.stdout.splitlines() == [
        "data.py:6:16: SF102 [*] `DataLoader` without `pin_memory=True`: batches are copied to the GPU from pageable memory"
        " (impact: medium)",
    ], result.stdout


@pytest.mark.parametrize("test, reported", [
    ('if phase == "train":\n        ...\n    elif phase == "val":', False),  # SR3's create_dataloader
    ('if phase in ("val", "test"):', False),
    ('if phase != "train":', False),
    ('if phase == "train":\n        ...\n    else:', False),
    ('if phase == "train":', True),  # the training loader
])
def test_the_loader_a_factory_builds_for_an_evaluation_phase_feeds_evaluation(run_cli, tmp_path, write, test, reported):
    write("data.py", f"""\
import torch

def create_dataloader(dataset, phase):
    {test}
        return torch.utils.data.DataLoader(dataset, batch_size=1, shuffle=False, num_workers=1)
""")
    write("train.py", """\
import torch
from data import create_dataloader

def main(model, optimizer, datasets):
    for phase, dataset in datasets.items():  # (SR3: the phases of the run config)
        loader = create_dataloader(dataset, phase)
    for epoch in range(10):
        for (x,) in loader:
            model(x.cuda()).sum().backward()
            optimizer.step()

main(None, None, {})
""")
    result = run_cli("scan", ".", "--select", "SF101", "--no-summary", cwd=tmp_path)
    assert ("SF101" in result.stdout) is reported, result.stdout


_TRAIN_LOOP = """\
    def train_loop(model, optimizer, train_set, epochs):
        for epoch in range(epochs):
            for i, (x, y) in enumerate(train_set, 1):
                loss = model(x.cuda(non_blocking=True), y.cuda(non_blocking=True))
                loss.backward()
                optimizer.step()
    """


@pytest.mark.parametrize("loop_file", ["train.py", "engine.py"])
def test_a_factorys_loader_handed_to_an_epoch_loop(run_cli, tmp_path, write, loop_file):
    """WaveRNN's `train_set, test_set = get_vocoder_datasets(...)` handed to `voc_train_loop()`,
    which iterates it every epoch: SF103 for the training loader only, whether the loop is in
    the script itself or in a third file (the tuple's other element is never iterated)."""
    write("data.py", """\
        from torch.utils.data import DataLoader

        def get_loaders(dataset, batch_size):
            train_loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=4, pin_memory=True)
            test_loader = DataLoader(dataset, batch_size=1, num_workers=2, pin_memory=True)
            return train_loader, test_loader
        """)
    if loop_file == "engine.py":
        write("engine.py", _TRAIN_LOOP)
    head = "from engine import train_loop\n" if loop_file == "engine.py" else textwrap.dedent(_TRAIN_LOOP)
    write("train.py", head + textwrap.dedent("""\
        import torch
        from data import get_loaders

        if __name__ == "__main__":
            model = Net().cuda()
            optimizer = torch.optim.Adam(model.parameters(), fused=True)
            train_set, test_set = get_loaders(FolderSet("data"), 32)
            train_loop(model, optimizer, train_set, 100)
        """))
    result = run_cli("scan", ".", "--select", "SF103", "--no-summary", cwd=tmp_path)
    assert result.stdout.splitlines() == [
        "data.py:4:20: SF103 [*] `DataLoader` starts its 4 worker processes again every epoch (impact: low)"]


@pytest.mark.parametrize("launched", [False, True])
def test_a_library_modules_self_test_is_left_out(run_cli, tmp_path, write, launched):
    """awd-lstm's splitcross.py: main.py trains with its loss; its `__main__` block trains a toy
    loss as a self-test. Its findings are left out (with a note) unless a launch command of the
    project runs the module on its own. A test that trains with main.py does not make main.py's
    own `__main__` block a self-test."""
    write("splitcross.py", """\
        import torch

        class SplitLoss(torch.nn.Module):
            def forward(self, hiddens, targets):
                return torch.nn.functional.cross_entropy(hiddens, targets)

        if __name__ == "__main__":
            embed = torch.nn.Embedding(100, 10).cuda()
            optimizer = torch.optim.SGD(embed.parameters(), lr=1)
            for _ in range(10):
                loss = SplitLoss()(embed(torch.randint(0, 100, (50,), device="cuda")), torch.zeros(50).long().cuda())
                print("loss", loss.item())
                loss.backward()
                optimizer.step()
        """)
    write("main.py", """\
        import torch
        from splitcross import SplitLoss

        def make_model():
            return torch.nn.LSTM(400, 1150).cuda()

        if __name__ == "__main__":
            model = make_model()
            optimizer = torch.optim.SGD(model.parameters(), lr=30, foreach=True)
            for x, y in batches():
                out, _ = model(x)
                loss = SplitLoss()(out, y)
                loss.backward()
                optimizer.step()
                print(loss.item())
        """)
    write("tests/test_model.py", """\
        import torch
        import main

        def test_the_model_trains():
            model = main.make_model()
            for _ in range(2):
                model(torch.randn(2, 4, 400))[0].sum().backward()
        """)
    if launched:
        write("README.md", "```bash\npython splitcross.py\n```\n")
    result = run_cli("scan", ".", "--select", "SF301", "--no-summary", cwd=tmp_path)
    own = "main.py:15:15: SF301 `loss.item()` in the training loop makes the CPU wait for the GPU every step (impact: medium)"
    if launched:
        assert result.stdout.splitlines() == [
            own,
            "splitcross.py:12:23: SF301 `loss.item()` in the training loop makes the CPU wait for the GPU every step "
            "(impact: medium)"]
    else:
        assert result.stdout.splitlines() == [
            own,
            'splitcross.py: note: 1 finding in the `if __name__ == "__main__":` block left out: main.py trains with '
            "this module and no launch command runs it on its own (a self-test)"]


def test_a_model_files_demo_function_that_only_its_self_test_calls_is_left_out(run_cli, tmp_path, write):
    """vall-e: train.py reaches the engines' training loop (a library without a `__main__`
    block) and, beside it, ar.py, whose `__main__` block calls `example_usage()`, a toy training
    run of the model. The block and the function only it calls are a self-test; a helper the
    block calls that train.py imports too is not."""
    write("engines.py", """\
        import torch

        def train(model, loader):
            optimizer = torch.optim.AdamW(model.parameters(), fused=True)
            for x in loader:
                model(x.cuda(non_blocking=True)).sum().backward()
                optimizer.step()
        """)
    write("ar.py", """\
        import torch

        class AR(torch.nn.Module):
            def forward(self, x):
                return x

        def make_batch():
            return torch.randn(4, 8)

        def example_usage():
            model = AR().cuda()
            optimizer = torch.optim.Adam(model.parameters(), fused=True)
            for _ in range(100):
                loss = model(make_batch().cuda(non_blocking=True)).sum()
                print(loss.item())
                loss.backward()
                optimizer.step()

        if __name__ == "__main__":
            example_usage()
            print(make_batch().sum().item())
        """)
    write("train.py", """\
        import engines
        from ar import AR, make_batch

        if __name__ == "__main__":
            engines.train(AR().cuda(), [make_batch()])
        """)
    result = run_cli("scan", ".", "--select", "SF301", "--no-summary", cwd=tmp_path)
    assert result.stdout.splitlines() == [
        'ar.py: note: 1 finding in `example_usage()`, which only the `if __name__ == "__main__":` block calls, left '
        "out: engines.py trains with this module and no launch command runs it on its own (a self-test)"]


@pytest.mark.parametrize("use", ["", "from layers.utils import train\n", "from layers import utils\nutils.train\n",
                                 "from layers.utils import (\n    get_filter,\n    train,\n)\n",
                                 "from layers.utils import *\n", "explore.ipynb",
                                 "import layers.utils as layer_utils\nlayer_utils.train(m, l, o)\n",
                                 "from layers import utils as lu\nlu.train\n"])
def test_a_library_modules_function_that_nothing_calls_is_left_out(run_cli, tmp_path, write, use):
    """FEDformer: layers/utils.py, imported for `get_filter`, keeps a `train()` helper that
    nothing calls or imports (the experiments train in exp/exp_main.py, `model.train()` and
    `flag='train'` there are other names): its findings are left out with a note. Imported by
    name, through the module (also under an alias: Wave-U-Net's `import model.utils as
    model_utils`) or by a star, or called by a notebook (a cell's source is one JSON string:
    `train(` after its `\\n` is still a use of `train`), it keeps them."""
    if use == "explore.ipynb":
        write(use, json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                                          "source": "import torch\ntrain(model, loader, optimizer)"}],
                               "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        use = "\n"
    write("layers/utils.py", """\
        def get_filter(k):
            return k

        def train(model, loader, optimizer):
            model.train()
            for data, target in loader:
                loss = (model(data.cuda()) - target.cuda()).pow(2).mean()
                loss.backward()
                optimizer.step()
                print(loss.item())
        """)
    write("layers/wavelet.py", "from layers.utils import get_filter\n\nK = get_filter(3)\n")
    write("exp/exp_main.py", f"""\
        import torch
        import layers.wavelet
        {use.replace(chr(10), chr(10) + "        ")}
        def run(model, loader, optimizer):
            model.train()
            for x, y in loader(flag='train'):
                loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
                loss.backward()
                optimizer.step()
        """)
    result = run_cli("scan", ".", "--select", "SF301", "--no-summary", cwd=tmp_path)
    finding = "layers/utils.py:10:15: SF301 `loss.item()` in the training loop makes the CPU wait for the GPU every step"
    if use:
        assert [line for line in result.stdout.splitlines() if line.startswith("layers/")] == [
            finding + " (impact: medium)"]
    else:
        assert result.stdout.splitlines() == [
            "layers/utils.py: note: 1 finding in `train()` left out: nothing in the project calls or names it"]


@pytest.mark.parametrize("built", ["DataModule", "{'argoverse': DataModule}[args.dataset]"])
def test_a_data_module_built_from_every_option_takes_the_options_worker_count(run_cli, tmp_path, write, built):
    """QCNet: the data module is picked from a dict by `--dataset` and built with `**vars(args)`,
    so `--num_workers` (default 8) reaches its `num_workers: int = 0`: no SF101."""
    write("dm/__init__.py", "from dm.data import DataModule\n")
    write("dm/data.py", """\
        import pytorch_lightning as pl
        from torch.utils.data import DataLoader

        class DataModule(pl.LightningDataModule):
            def __init__(self, root, num_workers: int = 0, **kwargs):
                super().__init__()
                self.root = root
                self.num_workers = num_workers

            def train_dataloader(self):
                return DataLoader(self.root, batch_size=32, num_workers=self.num_workers)
        """)
    write("train.py", f"""\
        from argparse import ArgumentParser
        import pytorch_lightning as pl
        from dm import DataModule

        if __name__ == "__main__":
            parser = ArgumentParser()
            parser.add_argument('--dataset', type=str, default='argoverse')
            parser.add_argument('--num_workers', type=int, default=8)
            args = parser.parse_args()
            datamodule = {built}(**vars(args))
            pl.Trainer(precision="bf16-mixed").fit(Net(), datamodule)
        """)
    assert run_cli("scan", ".", "--select", "SF101", "--no-summary", cwd=tmp_path).stdout == ""


@pytest.mark.parametrize("launch, reported", [(None, False), ("python train.py --local_rank 0\n", True)])
def test_an_option_of_a_parser_another_file_builds_keeps_its_default(run_cli, tmp_path, write, launch, reported):
    """BERT-NER: `args = get_argparse().parse_args()`, the parser built in tools/args.py with
    `--local_rank` defaulting to -1 (a negative literal): `if args.local_rank != -1:` wraps the
    model in DDP in no run, unless a launch command passes the option."""
    write("tools/args.py", """\
        import argparse

        def get_argparse():
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=-1)
            return parser
        """)
    write("train.py", """\
        import torch
        from tools.args import get_argparse

        def main():
            args = get_argparse().parse_args()
            model = Net().cuda()
            if args.local_rank != -1:
                model = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
            optimizer = torch.optim.AdamW(model.parameters(), fused=True)
            for x in loader:
                model(x.cuda(non_blocking=True)).sum().backward()
                optimizer.step()

        if __name__ == "__main__":
            main()
        """)
    if launch is not None:
        write("run.sh", launch)
    found = run_cli("scan", ".", "--select", "SF803", "--no-summary", cwd=tmp_path).stdout
    assert ("train.py:8:17: SF803" in found) is reported


@pytest.mark.parametrize("default, reported", [("True", True), ("False", False)])
def test_a_field_of_a_dataclass_another_file_defines_keeps_its_default(run_cli, tmp_path, write, default, reported):
    """ChatLM: `def sft_train(config: SFTconfig)` with `SFTconfig` a dataclass of config.py whose
    `fp16: bool = True`: `TrainingArguments(fp16=config.fp16)` trains in fp16 where bf16 fits."""
    write("config.py", f"""\
        from dataclasses import dataclass

        @dataclass
        class SFTconfig:
            batch_size: int = 8
            fp16: bool = {default}
        """)
    write("sft_train.py", """\
        from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments
        from config import SFTconfig

        def sft_train(config: SFTconfig) -> None:
            args = Seq2SeqTrainingArguments(output_dir="out", fp16=config.fp16, bf16=False)
            Seq2SeqTrainer(model=model, args=args, train_dataset=dataset).train()

        if __name__ == "__main__":
            sft_train(SFTconfig())
        """)
    found = run_cli("scan", ".", "--select", "SF902", "--no-summary", cwd=tmp_path).stdout
    assert ("`fp16=True` scales the loss" in found) is reported, found


def test_a_factorys_loader_through_a_method_that_returns_it_unchanged(run_cli, tmp_path, write):
    """Time-Series-Library: `data_provider()` of data_factory.py builds the loader, the
    experiment's `_get_data()` returns its `(data_set, data_loader)` unchanged, and `train()`
    iterates the second element every epoch: the loader's findings go to the factory."""
    write("data_provider/data_factory.py", """\
        from torch.utils.data import DataLoader

        def data_provider(args, flag):
            data_set = SeriesSet(args.root_path, flag=flag)
            data_loader = DataLoader(data_set, batch_size=32, shuffle=True, num_workers=args.num_workers)
            return data_set, data_loader
        """)
    write("exp/forecast.py", """\
        import torch
        from data_provider.data_factory import data_provider

        class Forecast:
            def __init__(self, args):
                self.args = args
                self.model = Net().cuda()

            def _get_data(self, flag):
                data_set, data_loader = data_provider(self.args, flag)
                return data_set, data_loader

            def train(self):
                train_data, train_loader = self._get_data(flag="train")
                optimizer = torch.optim.Adam(self.model.parameters(), fused=True)
                for epoch in range(self.args.train_epochs):
                    for x, y in train_loader:
                        self.model(x.cuda(non_blocking=True), y.cuda(non_blocking=True)).backward()
                        optimizer.step()
        """)
    write("run.py", """\
        import argparse
        from exp.forecast import Forecast

        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--num_workers", type=int, default=10)
            parser.add_argument("--train_epochs", type=int, default=10)
            args = parser.parse_args()
            Forecast(args).train()
        """)
    result = run_cli("scan", ".", "--select", "SF102,SF103", "--no-summary", cwd=tmp_path)
    assert [line.split(": ", 2)[1].split()[0] for line in result.stdout.splitlines()] == ["SF102", "SF103"]
    assert all(line.startswith("data_provider/data_factory.py:5:19:") for line in result.stdout.splitlines())


@pytest.mark.parametrize("switches", [True, False])
def test_ddp_accumulation_through_a_helper_that_enters_no_sync(run_cli, tmp_path, write, switches):
    """NVlabs' `with misc.ddp_sync(ddp, sync):` (EDM, StyleGAN): the helper of another file
    enters `module.no_sync()` on the micro-steps that do not sync, so SF802 stays quiet; a
    helper that does not is no excuse."""
    body = "with module.no_sync(): yield" if switches else "yield"
    write("torch_utils/misc.py", f"""\
        import contextlib
        import torch

        @contextlib.contextmanager
        def ddp_sync(module, sync):
            if sync or not isinstance(module, torch.nn.parallel.DistributedDataParallel):
                yield
            else:
                {body}
        """)
    write("train.py", """\
        import torch
        from torch_utils import misc

        def main(net, batches, rounds=4):
            ddp = torch.nn.parallel.DistributedDataParallel(net.cuda(), device_ids=[0])
            optimizer = torch.optim.Adam(ddp.parameters(), fused=True)
            while True:
                optimizer.zero_grad(set_to_none=True)
                for round_idx in range(rounds):
                    with misc.ddp_sync(ddp, round_idx == rounds - 1):
                        images, labels = next(batches)
                        ddp(images.cuda(non_blocking=True)).sum().backward()
                optimizer.step()
        """)
    result = run_cli("scan", ".", "--select", "SF802", "--no-summary", cwd=tmp_path)
    assert ("SF802" in result.stdout) is not switches


@pytest.mark.parametrize("caller_no_grad", [True, False])
def test_acting_under_no_grad_in_a_caller_that_cannot_name_the_agents_class(run_cli, tmp_path, write, caller_no_grad):
    """DrQ-v2: the workspace builds its agent from the config (`hydra.utils.instantiate`) and
    calls `self.agent.act(obs)` under `torch.no_grad()`; the agent's file cannot see that, but
    an `act` called under no_grad by another scanned file counts for its `act` methods."""
    write("agent.py", """\
        import torch
        import utils

        class Actor(torch.nn.Module):
            def forward(self, obs):
                return torch.tanh(self.net(obs))

        class Agent:
            def __init__(self):
                self.actor = Actor().to("cuda")

            def act(self, obs):
                obs = torch.as_tensor(obs, device="cuda")
                action = self.actor(obs)
                return action.cpu().numpy()
        """)
    write("utils.py", "import torch\n\ndef set_seed(seed):\n    torch.manual_seed(seed)\n")
    guard = "torch.no_grad()" if caller_no_grad else "utils.timer()"
    write("train.py", f"""\
        import hydra
        import torch
        import utils

        class Workspace:
            def __init__(self, cfg):
                self.agent = hydra.utils.instantiate(cfg.agent)

            def train(self, env):
                obs = env.reset()
                for step in range(1000000):
                    with {guard}:
                        action = self.agent.act(obs)
                    obs = env.step(action)
        """)
    result = run_cli("scan", ".", "--select", "SF702", "--no-summary", cwd=tmp_path)
    assert ("SF702" in result.stdout) is not caller_no_grad


def test_a_sync_in_a_submodules_forward_of_another_file_runs_every_step(run_cli, tmp_path, write):
    """FastSpeech2's length regulator: `predicted[i].item()` per phoneme in a module of
    model/modules.py, which the model of model/net.py calls from its `forward` (`self.lr(x, d)`
    with `self.lr = LengthRegulator()`); train.py calls the model every step."""
    write("model/__init__.py", "")
    write("model/modules.py", """\
        import torch
        import torch.nn as nn

        class LengthRegulator(nn.Module):
            def expand(self, batch, predicted):
                out = []
                for i, vec in enumerate(batch):
                    out.append(vec.expand(max(int(predicted[i].item()), 0), -1))
                return torch.cat(out, 0)

            def forward(self, x, duration):
                return torch.stack([self.expand(b, d) for b, d in zip(x, duration)])
        """)
    write("model/net.py", """\
        import torch.nn as nn
        from .modules import LengthRegulator

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.lr = LengthRegulator()
                self.proj = nn.Linear(256, 80)

            def forward(self, x, d):
                return self.proj(self.lr(x, d))
        """)
    write("train.py", """\
        import torch
        from model.net import Net

        def main(loader):
            model = Net().cuda()
            opt = torch.optim.Adam(model.parameters(), fused=True)
            for x, d, y in loader:
                loss = (model(x.cuda(non_blocking=True), d.cuda(non_blocking=True)) - y.cuda(non_blocking=True)).pow(2).mean()
                loss.backward()
                opt.step()
        """)
    result = run_cli("scan", ".", "--select", "SF301", "--no-summary", cwd=tmp_path)
    assert result.stdout.startswith("model/modules.py:8:43: SF301 `predicted[i].item()` in the training loop")


def test_an_lstm_in_another_file_keeps_the_autocast_fix_away(run_cli, tmp_path, write):
    """pytorch-tutorial's image captioning: DecoderRNN (an nn.LSTM) lives in model.py; autocast
    would run its cuDNN LSTM in fp16, so SF202 reports without a fix."""
    write("model.py", """\
        import torch.nn as nn

        class DecoderRNN(nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = nn.LSTM(256, 512, batch_first=True)
        """)
    write("train.py", """\
        import torch
        from model import DecoderRNN

        decoder = DecoderRNN().cuda()
        for x, y in loader:
            loss = criterion(decoder(x.cuda()), y.cuda())
            loss.backward()
            optimizer.step()
        """)
    result = run_cli("scan", ".", "--select", "SF202", "--output-format", "json", cwd=tmp_path)
    (finding,) = json.loads(result.stdout)
    assert finding["path"] == "train.py" and finding["fix"] is None
    assert "cuDNN LSTM" in finding["no_fix_reason"]


def test_a_conv_net_trained_by_an_engine_of_another_file(run_cli, tmp_path, write):
    """DeiT/ConvNeXt layout: main.py builds a timm ResNet and calls engine.train_one_epoch every
    epoch; cuDNN autotuning and channels-last are set up in main.py, where the model is."""
    write("engine.py", """\
        import torch

        def train_one_epoch(model, loader, optimizer):
            for x, y in loader:
                model(x.cuda(non_blocking=True)).sum().backward()
                optimizer.step()
        """)
    write("main.py", """\
        import timm
        import torch
        from engine import train_one_epoch

        def main():
            model = timm.create_model("resnet50").cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(10):
                train_one_epoch(model, loader, optimizer)

        main()
        """)
    result = run_cli("scan", ".", "--select", "SF206,SF601", "--no-summary", cwd=tmp_path)
    # cuDNN autotuning (medium) before channels-last without mixed precision (low)
    assert [line.split(" ", 2)[:2] for line in result.stdout.splitlines()] == [["main.py:6:13:", "SF601"], ["main.py:6:13:", "SF206"]]


def test_a_device_a_chain_of_star_imports_brings_makes_the_loop_a_cuda_loop(run_cli, tmp_path, write):
    """`device` set to CUDA in conf.py reaches train.py through `from data import *` (data.py:
    `from conf import *`), and the batches come from an iterator of another library: the loop
    trains on CUDA, even when data.py, which only passes names on, is not among the scanned files."""
    write("conf.py", """\
        import torch

        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        batch_size = 64
        """)
    write("data.py", """\
        from conf import *
        from util.loader import make_iterators

        train_iter = make_iterators(batch_size=batch_size, device=device)
        """)
    write("train.py", """\
        from torch import nn
        from torch.optim import Adam

        from data import *

        model = nn.Transformer(d_model=64, nhead=4).to(device)
        optimizer = Adam(model.parameters(), lr=1e-4)


        def train(model, iterator, optimizer):
            for i, batch in enumerate(iterator):
                optimizer.zero_grad()
                loss = model(batch.src, batch.trg).sum()
                loss.backward()
                optimizer.step()


        for epoch in range(10):
            train(model, train_iter, optimizer)
        """)
    result = run_cli("scan", "train.py", "conf.py", "--select", "SF202,SF401", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == {("train.py", 14, "SF202"), ("train.py", 7, "SF401")}
    assert "data.py" not in result.stdout  # read for its names only, never reported on


def test_a_settings_object_another_file_makes_gives_its_class_defaults(run_cli, tmp_path, write):
    """`from utils.config import opt`, where utils/config.py makes `opt = Config()` from a class
    whose body says `num_workers = 4`: the loader starts 4 workers every epoch (utils/config.py
    is not scanned; a field it sets again at module level is unknown)."""
    write("utils/__init__.py", "")
    write("utils/config.py", """\
        class Config:
            num_workers = 4
            test_workers = 2
            epochs = 10

        opt = Config()
        opt.test_workers = 0
        """)
    write("train.py", """\
        import torch
        from utils.config import opt

        loader = torch.utils.data.DataLoader(data, batch_size=8, pin_memory=True, num_workers=opt.num_workers)
        test_loader = torch.utils.data.DataLoader(test, batch_size=8, pin_memory=True, num_workers=opt.test_workers)
        model = Net().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(opt.epochs):
            for x, y in loader:
                loss = model(x.cuda(non_blocking=True)).sum()
                loss.backward()
                optimizer.step()
            for x, y in test_loader:
                print(model(x.cuda(non_blocking=True)))
        """)
    result = run_cli("scan", "train.py", "--select", "SF103", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == {("train.py", 4, "SF103")}
    assert "starts its 4 worker processes" in result.stdout


def test_a_trainer_class_whose_train_step_another_file_calls_every_step(run_cli, tmp_path, write):
    """`trainer = Trainer(net).cuda()` in train.py and `trainer.train_step(img, label)` in its
    loop over the loader: train_step (zero_grad, forward, backward, step), which no code of its
    own file calls, is one training step; its fp32 forward, the helper loss it runs and the
    batch copies of the loop are per-step code."""
    write("trainer.py", """\
        import torch as t
        from torch import nn


        def masked_loss(pred, target):
            weight = t.zeros(target.shape).cuda()
            weight[target > 0] = 1
            return ((pred - target) ** 2 * weight).sum()


        class Trainer(nn.Module):
            def __init__(self, net):
                super().__init__()
                self.net = net
                self.optimizer = t.optim.SGD(net.parameters(), lr=0.01)

            def forward(self, img, label):
                return masked_loss(self.net(img), label)

            def train_step(self, img, label):
                self.optimizer.zero_grad()
                loss = self.forward(img, label)
                loss.backward()
                self.optimizer.step()
                return loss
        """)
    write("train.py", """\
        from torch.utils.data import DataLoader
        from trainer import Trainer
        from nets import Net

        loader = DataLoader(data, batch_size=4, num_workers=4, persistent_workers=True, pin_memory=True)
        trainer = Trainer(Net()).cuda()
        for epoch in range(10):
            for img, label in loader:
                img, label = img.cuda().float(), label.cuda()
                trainer.train_step(img, label)
        """)
    result = run_cli("scan", "train.py", "trainer.py", "--select", "SF202,SF701,SF104", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == {("trainer.py", 23, "SF202"), ("trainer.py", 6, "SF701"), ("train.py", 9, "SF104")}


def test_an_object_a_modules_forward_builds_from_a_sibling_package_runs_every_step(run_cli, tmp_path, write):
    """`models/attention.py` imports `utils.masks` (a package beside its own folder) and builds a
    `BandMask` in `forward`, through a method of its own: the mask's constructor runs on every
    step, so its `torch.ones(...).to(device)` is made on the CPU and copied each time. A plain
    function of that file the forward calls (`log_shape`) stays as it was: not per-step code."""
    write("utils/masks.py", """\
        import torch


        class BandMask:
            def __init__(self, length, device="cpu"):
                self.mask = torch.ones(length, length, dtype=torch.bool).to(device).triu(1)


        def log_shape(x, device="cpu"):
            return torch.zeros(1).to(device)
        """)
    write("models/attention.py", """\
        from torch import nn
        from utils.masks import BandMask, log_shape


        class Attention(nn.Module):
            def _mask(self, x):
                return BandMask(x.shape[1], device=x.device).mask

            def forward(self, x):
                log_shape(x, x.device)
                return x.masked_fill(self._mask(x), 0.0)
        """)
    write("train.py", """\
        import torch
        from models.attention import Attention

        model = Attention().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in batches:
            model(x.cuda(non_blocking=True)).sum().backward()
            optimizer.step()
        """)
    result = run_cli("scan", "train.py", "models/attention.py", "utils/masks.py", "--select", "SF701", "--no-summary",
                     cwd=tmp_path)
    assert findings(result.stdout) == {("masks.py", 6, "SF701")}


def test_a_loader_made_by_one_of_several_factories_of_another_file(run_cli, tmp_path, write):
    """`loader = data.make_small(...)` or `loader = data.make_large(...)` by an option, then
    iterated every epoch: each factory's DataLoader (4 workers by its parameter's default, which
    no caller passes) restarts its workers every epoch."""
    write("data.py", """\
        from torch.utils.data import DataLoader


        def make_small(name, batch_size, num_workers=4):
            return DataLoader(small_set(name), batch_size=batch_size, num_workers=num_workers, pin_memory=True)


        def make_large(name, batch_size, num_workers=4):
            return DataLoader(large_set(name), batch_size=batch_size, num_workers=num_workers, pin_memory=True)
        """)
    write("train.py", """\
        import argparse
        import torch
        import data

        parser = argparse.ArgumentParser()
        parser.add_argument("--size", default="small")
        args = parser.parse_args()
        if args.size == "small":
            loader = data.make_small("mnist", 64)
        else:
            loader = data.make_large("celeba", 64)
        model = Net().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(25):
            for x in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                optimizer.step()
        """)
    result = run_cli("scan", "train.py", "data.py", "--select", "SF103", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == {("data.py", 5, "SF103"), ("data.py", 9, "SF103")}
    assert "starts its `num_workers` worker processes" in result.stdout  # the callers could pass another count


def test_a_dataloader_subclass_of_another_file_is_read_like_a_dataloader(run_cli, write, tmp_path):
    """`class WaveLoader(DataLoader)` forwarding `*args, **kwargs`: its calls take DataLoader's keywords."""
    write("loading.py", """\
        from torch.utils.data import DataLoader

        class WaveLoader(DataLoader):
            def __init__(self, *args, **kwargs):
                super(WaveLoader, self).__init__(*args, **kwargs)
                self.collate_fn = pad

        class BucketLoader(DataLoader):
            def __init__(self, dataset, workers):
                super().__init__(dataset, num_workers=workers)
        """)
    write("train.py", """\
        import torch
        from loading import BucketLoader, WaveLoader

        model = Net().cuda()
        waves = WaveLoader(clips, batch_size=8, num_workers=4)
        buckets = BucketLoader(clips, 4)
        for epoch in range(10):
            for x, y in waves:
                model(x.cuda()).sum().backward()
            for x, y in buckets:
                model(x.cuda()).sum().backward()
        """)
    result = run_cli("scan", "train.py", "loading.py", "--select", "SF102,SF103", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == {("train.py", 5, "SF102"), ("train.py", 5, "SF103")}


def test_a_function_handed_to_another_files_step_runs_every_step(run_cli, write, tmp_path):
    """Megatron's layout: the script hands its `forward_step` to a library file's `train_step`,
    whose training loop calls it every step; an `evaluate` that calls what it is given outside
    any training loop makes nothing hot."""
    write("trainlib.py", "def train_step(batch, model, optimizer, forward_step_func):\n"
                         "    for micro in batch.split(4):\n"
                         "        loss = forward_step_func(micro, model)\n"
                         "        loss.backward()\n"
                         "        optimizer.step()\n"
                         "    return loss\n\n\n"
                         "def evaluate(batch, model, step_func):\n"
                         "    return step_func(batch, model)\n")
    write("pretrain.py", "import torch\nfrom trainlib import evaluate, train_step\n\n\n"
                         "def forward_step(batch, model):\n"
                         "    mask = batch['mask'].cuda()\n"
                         "    loss = (model(batch['x'].cuda()) * mask).sum()\n"
                         "    if mask.sum().item() > 0:\n"
                         "        loss = loss / mask.sum()\n"
                         "    return loss\n\n\n"
                         "def eval_step(batch, model):\n"
                         "    return model(batch['x'].cuda()).float().mean().item()\n\n\n"
                         "def train(model, optimizer, loader):\n"
                         "    for batch in loader:\n"
                         "        train_step(batch, model, optimizer, forward_step_func=forward_step)\n"
                         "        evaluate(batch, model, eval_step)\n")
    result = run_cli("scan", ".", "--select", "SF301", "--no-summary", cwd=tmp_path).stdout
    assert result.startswith("pretrain.py:8:8: SF301 `mask.sum().item()` in the training loop")
    assert "pretrain.py:14" not in result  # `evaluate` calls its function once, outside a training loop


BUFFER = """\
    import numpy as np
    import torch


    class ReplayBuffer:
        def __init__(self, state_dim, max_size=int(1e6)):
            self.state = np.zeros((max_size, state_dim))
            self.reward = np.zeros((max_size, 1))
            self.device = torch.device("cuda")

        def add(self, state, reward):
            self.state[self.ptr] = state
            self.reward[self.ptr] = reward

        def load_dataset(self, dataset):
            self.state = dataset["observations"]
            self.reward = dataset["rewards"]

        def sample(self, batch_size):
            ind = np.random.randint(0, len(self.state), size=batch_size)
            return torch.FloatTensor(self.state[ind]).to(self.device), torch.FloatTensor(self.reward[ind]).to(self.device)
    """


@pytest.mark.parametrize("online", [False, True])
def test_a_buffer_another_file_loads_once_is_sampled_on_the_host_every_update(run_cli, tmp_path, write, online):
    """`main.py` builds `utils.ReplayBuffer`, loads an offline dataset into it and trains from
    it: the buffer's `sample` gathers numpy rows and copies them on every update (one finding,
    no fix). When `main.py` also adds rows as it acts, the buffer is an online one: nothing."""
    write("utils.py", BUFFER)
    write("main.py", f"""\
        import utils

        buffer = utils.ReplayBuffer(17)
        buffer.load_dataset(dataset)
        for t in range(1000000):
            {"buffer.add(*env.step(action)[:2])" if online else "pass"}
            agent.train(buffer.sample(256))
        """)
    result = run_cli("scan", ".", "--select", "SF701", "--output-format", "json", cwd=tmp_path)
    found = [(f["path"], f["line"], f["fix"]) for f in json.loads(result.stdout)]
    assert found == ([] if online else [("utils.py", 21, None)])


def test_the_modules_a_lightning_module_imports_run_on_the_gpu_it_trains_on(run_cli, tmp_path, write):
    """Lightning trains a LightningModule on a GPU when there is one: the optimizer factory its
    `configure_optimizers` imports builds a GPU optimizer, though its own file never names CUDA."""
    write("optim.py", """\
        import torch

        def build_optimizer(model, lr):
            return torch.optim.AdamW(model.parameters(), lr=lr)
        """)
    write("module.py", """\
        import lightning as L
        from optim import build_optimizer

        class LitModel(L.LightningModule):
            def configure_optimizers(self):
                return build_optimizer(self, 1e-3)
        """)
    result = run_cli("scan", "optim.py", "module.py", "--select", "SF401", "--no-summary", cwd=tmp_path)
    assert result.stdout.startswith("optim.py:4:12: SF401"), result.stdout
    assert "SF401" not in run_cli("scan", "optim.py", "--select", "SF401", "--no-summary", cwd=tmp_path).stdout


def test_the_model_a_factory_returns_with_its_optimizer_runs_its_forward_every_step(run_cli, tmp_path, write):
    """FastSpeech2's layout: `train.py` gets `model, optimizer = get_model(...)` from
    `utils/model.py`, which builds `model.Net(...).to(device)` (a `model` package beside `utils`,
    though the factory's own module is named `model` too) and wraps it in DataParallel. The
    loop's `model(x)` runs `Net.forward`, its regulator's `forward`, and the helpers that calls,
    three levels down, where a per-element `.item()` waits for the GPU."""
    write("model/__init__.py", "from .net import Net\n")
    write("model/net.py", """\
        import torch
        from torch import nn

        class Regulator(nn.Module):
            def expand(self, batch, predicted):
                out = []
                for i, vec in enumerate(batch):
                    out.append(vec.expand(max(int(predicted[i].item()), 0), -1))
                return torch.cat(out, 0)

            def regulate(self, x, duration):
                return [self.expand(b, d) for b, d in zip(x, duration)]

            def forward(self, x, duration):
                return self.regulate(x, duration)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.regulator = Regulator()

            def forward(self, x, duration):
                return self.regulator(x, duration)
        """)
    write("utils/__init__.py", "")
    write("utils/model.py", """\
        import torch
        from model import Net

        def get_model(device):
            model = Net().to(device)
            optimizer = torch.optim.Adam(model.parameters(), fused=True)
            return model, optimizer
        """)
    write("train.py", """\
        import torch
        from utils.model import get_model

        device = torch.device("cuda")
        model, optimizer = get_model(device)
        model = torch.nn.DataParallel(model)
        for x, duration in loader:
            loss = model(x.to(device, non_blocking=True), duration.to(device, non_blocking=True)).sum()
            loss.backward()
            optimizer.step()
        """)
    result = run_cli("scan", ".", "--select", "SF301", "--no-summary", cwd=tmp_path)
    assert result.stdout.startswith("model/net.py:8:43: SF301 `predicted[i].item()`"), result.stdout


@pytest.mark.parametrize("factory", ["staticmethod", "classmethod", "other class"])
def test_the_model_a_static_factory_of_its_class_builds_runs_its_forward_every_step(run_cli, tmp_path, write, factory):
    """fastcomposer: `model = FastComposerModel.from_pretrained(args)`, a static method that
    returns `FastComposerModel(...)` (or a classmethod returning `cls(...)`): the loop's
    `model(batch)` runs its `forward`, whose helper calls `gc.collect()` every step. A factory
    that returns another class's object says nothing of this one's `forward`."""
    made = {"staticmethod": "Composer(Unet())", "classmethod": "cls(Unet())", "other class": "Unet()"}[factory]
    write("composer.py", f"""\
        import gc
        import torch
        from torch import nn

        class Unet(nn.Module):
            def forward(self, x):
                return x

        class Composer(nn.Module):
            def __init__(self, unet):
                super().__init__()
                self.unet = unet

            @{"classmethod" if factory == "classmethod" else "staticmethod"}
            def from_pretrained({"cls, " if factory == "classmethod" else ""}path):
                return {made}

            def _clear(self):
                gc.collect()

            def forward(self, x):
                loss = self.unet(x).sum()
                self._clear()
                return loss
        """)
    write("train.py", """\
        import torch
        from composer import Composer

        model = Composer.from_pretrained("weights").cuda()
        for x in loader:
            loss = model(x.cuda(non_blocking=True))
            loss.backward()
            optimizer.step()
        """)
    result = run_cli("scan", ".", "--select", "SF304", "--no-summary", cwd=tmp_path)
    assert result.stdout.startswith("composer.py:19:9: SF304") == (factory != "other class"), result.stdout


@pytest.mark.parametrize("guarded", [False, True])
def test_cudnn_autotuning_a_helper_of_another_file_switches_on(run_cli, tmp_path, write, guarded):
    """`initialize(args, seed=42)` of `utility/initialize.py` sets `cudnn.benchmark = True`: the
    training script that calls it chooses cuDNN's algorithms (SAM's layout). A helper that does
    so only under an `if` of its own does not count."""
    write("utility/__init__.py", "")
    write("utility/initialize.py", f"""\
        import torch

        def initialize(args, seed):
            torch.manual_seed(seed)
            {"if args.benchmark:" if guarded else "if True:"}
                pass
            {"    " if guarded else ""}torch.backends.cudnn.benchmark = True
        """)
    write("train.py", """\
        import torch
        from torch import nn
        from utility.initialize import initialize

        initialize(args, seed=42)
        model = nn.Sequential(nn.Conv2d(3, 64, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True)).backward()
            opt.step()
        """)
    found = run_cli("scan", ".", "--select", "SF601", "--no-summary", cwd=tmp_path).stdout
    assert ("train.py:6:" in found) is guarded, found


def test_a_step_defined_in_the_loop_and_handed_to_a_timer_makes_its_helpers_hot(run_cli, tmp_path, write):
    """I-JEPA's loop defines `def train_step():` in its body and runs it through `gpu_timer(train_step)`:
    the loop trains, so the helper of another file that the step calls every time (a gradient logger
    reading each parameter's norm on the host) waits for the GPU every step."""
    write("stats.py", """\
        import torch

        def grad_logger(named_params):
            return {n: float(torch.norm(p.grad)) for n, p in named_params}

        def gpu_timer(closure):
            return closure()
        """)
    write("train.py", """\
        import torch
        from stats import grad_logger, gpu_timer

        def main():
            model = Net().cuda()
            opt = torch.optim.AdamW(model.parameters(), fused=True)
            for epoch in range(100):
                for x in loader:
                    def train_step():
                        loss = model(x.cuda(non_blocking=True)).sum()
                        loss.backward()
                        opt.step()
                        return grad_logger(model.named_parameters())
                    stats = gpu_timer(train_step)

        if __name__ == "__main__":
            main()
        """)
    found = run_cli("scan", ".", "--select", "SF301", "--no-summary", cwd=tmp_path).stdout
    assert found.startswith("stats.py:4:16: SF301"), found


def test_a_step_function_handed_to_a_timer_in_the_loop_makes_it_a_training_loop(run_cli, tmp_path, write):
    """`def train_step(x):` at module level, run as `gpu_timer(train_step, x)` in the loop: the
    loop trains though it calls `train_step` only through the timer, so the loader another file's
    factory makes for it is a training loader restarted every epoch."""
    write("data.py", """\
        from torch.utils.data import DataLoader

        def make_loader(dataset):
            return DataLoader(dataset, batch_size=64, num_workers=8, pin_memory=True)
        """)
    write("train.py", """\
        import torch
        from data import make_loader

        def gpu_timer(closure, *args):
            return closure(*args)

        def train_step(x):
            loss = model(x.cuda(non_blocking=True)).sum()
            loss.backward()
            opt.step()

        def main():
            loader = make_loader(dataset)
            for epoch in range(100):
                for x in loader:
                    gpu_timer(train_step, x)

        if __name__ == "__main__":
            main()
        """)
    found = run_cli("scan", ".", "--select", "SF103", "--no-summary", cwd=tmp_path).stdout
    assert found.startswith("data.py:4:12: SF103"), found


def test_an_optimizer_class_of_another_file_trains_the_model_and_a_scheduler_class_is_no_frozen_module(
        run_cli, tmp_path, write):
    """davda54/sam: `optimizer = SAM(model.parameters(), torch.optim.SGD, ...)` with `class
    SAM(torch.optim.Optimizer)` in sam.py at the project's top (the script is run from example/
    after `sys.path.append("..")`), and `scheduler(epoch)` under `torch.no_grad()` in the step, a
    `class StepLR:` of utility/step_lr.py beside the script: the model is trained, so SF501 reports
    it, with its fix (no 'frozen module' to compile instead)."""
    write("sam.py", """\
        import torch

        class SAM(torch.optim.Optimizer):
            def __init__(self, params, base_optimizer, **kwargs):
                super().__init__(params, dict(**kwargs))
                self.base_optimizer = base_optimizer(self.param_groups, **kwargs)

            def second_step(self):
                self.base_optimizer.step()
        """)
    write("example/utility/step_lr.py", """\
        class StepLR:
            def __init__(self, optimizer, lr):
                self.optimizer = optimizer

            def __call__(self, epoch):
                pass
        """)
    write("example/train.py", """\
        import sys
        import torch
        import torch.nn as nn
        from utility.step_lr import StepLR
        sys.path.append("..")
        from sam import SAM

        if __name__ == "__main__":
            device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
            model = nn.Linear(512, 10).to(device)
            optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1)
            scheduler = StepLR(optimizer, 0.1)
            for epoch in range(200):
                for x in torch.randn(100, 128, 512):
                    model(x.to(device)).mean().backward()
                    optimizer.second_step()
                    with torch.no_grad():
                        scheduler(epoch)
        """)
    result = run_cli("scan", ".", "--select", "SF501", "--no-summary", "--output-format", "json", cwd=tmp_path)
    [finding] = json.loads(result.stdout)
    assert (finding["path"], finding["line"], finding.get("no_fix_reason")) == ("example/train.py", 10, None)
    assert finding["fix"] is not None


def test_a_network_whose_convolutions_come_from_a_layer_helper_of_another_file_is_a_conv_net(run_cli, tmp_path, write):
    """improved-diffusion: `UNetModel` (unet.py) builds its layers with `conv_nd(dims, ...)` of
    nn.py, which returns `nn.Conv2d` for 2 dims, and the script gets the model from a factory of a
    third file: the script trains a conv net (SF601's cuDNN autotuning advice)."""
    write("nn_utils.py", """\
        import torch.nn as nn

        def conv_nd(dims, *args, **kwargs):
            if dims == 1:
                return nn.Conv1d(*args, **kwargs)
            elif dims == 2:
                return nn.Conv2d(*args, **kwargs)
            raise ValueError(dims)
        """)
    write("unet.py", """\
        import torch.nn as nn
        from nn_utils import conv_nd

        class UNet(nn.Module):
            def __init__(self, dims=2):
                super().__init__()
                self.conv = conv_nd(dims, 3, 64, 3, padding=1)

            def forward(self, x):
                return self.conv(x)
        """)
    write("script_util.py", """\
        from unet import UNet

        def create_model():
            return UNet()
        """)
    write("train.py", """\
        import torch
        from script_util import create_model

        model = create_model().cuda()
        opt = torch.optim.AdamW(model.parameters())
        for x in loader:
            model(x.cuda()).mean().backward()
            opt.step()
        """)
    result = run_cli("scan", ".", "--select", "SF601", "--no-summary", cwd=tmp_path)
    assert findings(result.stdout) == {("train.py", 4, "SF601")}


def test_an_autocast_behind_a_flag_the_entry_passes_as_false_leaves_the_run_in_fp32(run_cli, tmp_path, write):
    # YOLOv7's train.py: `fp16 = False` in its `__main__` block, handed to `fit_one_epoch(..., fp16)`
    write("utils_fit.py", "from torch.cuda.amp import autocast\n\n\ndef fit_one_epoch(model, opt, loader, fp16):\n"
          "    for x in loader:\n        opt.zero_grad()\n        if not fp16:\n            loss = model(x.cuda()).mean()\n"
          "            loss.backward()\n        else:\n            with autocast():\n"
          "                loss = model(x.cuda()).mean()\n            loss.backward()\n        opt.step()\n")
    write("train.py", "import torch\nfrom utils_fit import fit_one_epoch\n\nif __name__ == '__main__':\n"
          "    fp16 = False\n    model = torch.nn.Linear(8, 8).cuda()\n"
          "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for epoch in range(10):\n"
          "        fit_one_epoch(model, opt, loader, fp16)\n")
    scan = ["scan", ".", "--select", "SF202", "--no-summary", "--no-cache"]
    assert "utils_fit.py:11:18: SF202 autocast runs only when `fp16`, which is off by default" \
        in run_cli(*scan, cwd=tmp_path).stdout
    write("train.py", (tmp_path / "train.py").read_text().replace("fp16 = False", "fp16 = True"))
    assert "SF202" not in run_cli(*scan, cwd=tmp_path).stdout


UNUSED_HELPER_SCRIPT = """\
    import torch

    def check_memory():
        torch.autograd.set_detect_anomaly(True)
        torch.cuda.empty_cache()
        print("freed", torch.cuda.memory_reserved())

    {decorator}def train(model, loader, optimizer):
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()

    {main}
    """


@pytest.mark.parametrize("case", ["unused", "called_here", "named_in_a_string", "imported_elsewhere", "decorated",
                                  "no_main_block", "named_in_a_config", "globals", "project_above", "notebook"])
def test_findings_in_a_function_nothing_uses_are_left_out_with_a_note(run_cli, tmp_path, write, case):
    """MedicalGPT: `check_and_optimize_memory()` of an entry script is called nowhere in the
    project, so its advice changes nothing the run does. Every sign of a use keeps it."""
    main = ('if __name__ == "__main__":\n        model = torch.nn.Linear(4, 2).cuda()\n'
            '        train(model, [], torch.optim.SGD(model.parameters(), lr=0.1))')
    if case == "called_here":
        main += "\n        check_memory()"
    if case == "named_in_a_string":
        main += '\n        getattr(__import__(__name__), "check_memory")'
    if case == "no_main_block":
        main = ""
    decorator = "@torch.no_grad()\n    " if case == "decorated" else ""
    script = UNUSED_HELPER_SCRIPT.format(main=main, decorator=decorator)
    if case == "decorated":  # the decorated function is `train`: `check_memory` gets one
        script = script.replace("def check_memory", "@torch.compiler.disable\n    def check_memory")
    write("train.py", script)
    if case == "imported_elsewhere":
        write("tools/memory.py", "from train import check_memory\n\ncheck_memory()\n")
    if case == "named_in_a_config":  # hydra builds it: `_target_: train.check_memory`
        write("conf/debug.yaml", "hook:\n  _target_: train.check_memory\n")
    if case == "globals":  # a registry of the file's own functions
        write("train.py", script + "    HOOKS = {k: v for k, v in globals().items() if k.startswith('check_')}\n")
    if case == "notebook":  # a cell's source as one JSON string: "...\ncheck_memory()"
        write("explore.ipynb", '{"cells": [{"cell_type": "code", "source": "from train import *\\ncheck_memory()"}]}')
    cwd = tmp_path
    if case == "project_above":  # scanned from a folder inside a project whose top is above it
        write("pyproject.toml", "[project]\nname = 'p'\n")
        write("src/train.py", script)
        write("tools/memory.py", "from train import check_memory\n")
        cwd = tmp_path / "src"
    result = run_cli("scan", "train.py", "--select", "SF303,SF603", "--no-summary", cwd=cwd)
    lines = result.stdout.splitlines()
    in_helper = [line for line in lines if " SF603 " in line]  # anomaly detection in the helper
    in_loop = [line for line in lines if " SF303 " in line]
    assert in_loop, result.stdout  # the training loop's own finding is always reported
    if case == "unused":
        assert not in_helper
        assert "train.py: note: 1 finding in `check_memory()` left out: nothing in the project calls or names it" in lines
    else:
        assert in_helper, result.stdout
        assert "left out" not in result.stdout


@pytest.mark.parametrize("guard, reported", [
    ("step % sample_every == 0", False),  # REPA: a sample now and then
    ("step == 1 or (step % sample_every == 0 and step > 0)", False),
    ("not step % sample_every", False),
    ("step % sample_every != 0", True),  # all steps but one in N
    ("step % 2 == 0", True),  # every other step
])
def test_a_conv_net_the_loop_calls_only_now_and_then_is_not_the_training(run_cli, tmp_path, guard, reported):
    """SF601's VALID example of REPA's VAE, decoding samples under other guards."""
    from speedfix.rules.sf601_cudnn_benchmark_off import CudnnBenchmarkOff

    (example,) = [valid.code for valid in CudnnBenchmarkOff.VALID if "step % sample_every == 0" in valid.code]
    (tmp_path / "train.py").write_text(example.replace("step % sample_every == 0", guard)
                                       + '\nif __name__ == "__main__":\n    main([])\n')
    result = run_cli("scan", "train.py", "--select", "SF601", "--no-summary", cwd=tmp_path)
    assert (" SF601 " in result.stdout) is reported, result.stdout


FUSE = """
    def fuse(self):  # for inference: conv and batch norm folded into one conv
        w = torch.mm(self.bn.weight.diag(), self.conv.weight.view(16, -1))
        self.conv.weight.copy_(w.view_as(self.conv.weight))
"""


@pytest.mark.parametrize("extra, reported", [("", False), ("        self.fc = nn.Linear(16, 10)\n", True),
                                             (FUSE, False)])
def test_a_conv_net_another_file_hands_to_the_training_function_asks_for_no_tf32(run_cli, tmp_path, write, extra,
                                                                                   reported):
    """YOLO tutorials: `fit_one_epoch(model_train, ...)` in utils_fit.py trains whatever train.py
    hands it, `model_train = YoloBody(...).train()`, wrapped in DataParallel and moved to the GPU.
    A class of convolutions only multiplies no matrices TF32 would speed up, even with a `fuse()`
    for inference that multiplies weights; with a linear head it may."""
    write("nets/yolo.py", "import torch\nimport torch.nn as nn\n\n\nclass YoloBody(nn.Module):\n"
          "    def __init__(self):\n        super().__init__()\n        self.conv = nn.Conv2d(3, 16, 3)\n"
          "        self.bn = nn.BatchNorm2d(16)\n" + (extra if "fc" in extra else "") +
          "\n    def forward(self, x):\n        return self.bn(self.conv(x))\n" + (extra if "fuse" in extra else ""))
    write("utils/utils_fit.py", """\
        import torch


        def fit_one_epoch(model_train, optimizer, gen):
            model_train.train()
            for images, targets in gen:
                images = images.cuda(non_blocking=True)
                optimizer.zero_grad(set_to_none=True)
                loss = model_train(images).float().mean()
                loss.backward()
                optimizer.step()
        """)
    write("train.py", """\
        import torch
        from nets.yolo import YoloBody
        from utils.utils_fit import fit_one_epoch

        if __name__ == "__main__":
            model = YoloBody()
            model_train = model.train()
            model_train = torch.nn.DataParallel(model)
            model_train = model_train.cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for epoch in range(10):
                fit_one_epoch(model_train, optimizer, [])
        """)
    result = run_cli("scan", ".", "--select", "SF201", "--no-summary", cwd=tmp_path)
    assert ("SF201" in result.stdout) is reported, result.stdout


@pytest.mark.parametrize("method, counted", [("def fuse(self):", False), ("def switch_to_deploy(self):", False),
                                             ("def reparameterize(self, mu, logvar):", True)])
def test_only_a_method_that_folds_layers_for_inference_is_left_out_of_the_class_layers(method, counted):
    """YOLO's `fuse()` multiplies weights for inference; a VAE's `reparameterize(self, mu, logvar)`
    runs in every training step: its matrix product is the class's."""
    source = textwrap.dedent(f"""\
        import torch
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 16, 3)

            {method}
                return torch.mm(self.conv.weight.view(16, -1), self.conv.weight.view(16, -1).t())
        """)
    facts = extract_facts(source.encode()).functions["Net"]
    assert facts.conv_dims == (2,)
    assert facts.matmul is counted


@pytest.mark.parametrize("workers, reported", [("0", True), ("8", False), ("0 if DEBUG else 8", False)])
def test_a_config_modules_constant_is_the_loaders_setting(run_cli, tmp_path, write, workers, reported):
    """`num_workers=CFG.num_workers` after `import config as CFG` (OpenAI-CLIP's config.py), and
    `from config import num_workers`: the scanned module's top-level constant is the value; one
    that is not a constant stays unknown (no finding)."""
    write("config.py", f"""\
        import torch
        DEBUG = True
        num_workers = {workers}
        device = torch.device("cuda")
        """)
    write("main.py", """\
        import torch
        import config as CFG
        from config import num_workers
        from torch.utils.data import DataLoader

        def main(train_set, model, optimizer):
            train_loader = DataLoader(train_set, batch_size=8, shuffle=True, num_workers=CFG.num_workers)
            other_loader = DataLoader(train_set, batch_size=8, shuffle=True, num_workers=num_workers)
            for loader in (train_loader, other_loader):
                for x, y in loader:
                    loss = model(x.to(CFG.device), y.to(CFG.device))
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()

        if __name__ == "__main__":
            main(None, None, None)
        """)
    lines = _sf101_lines(run_cli, tmp_path)
    if reported:
        assert [line.split(" ", 1)[0] for line in lines] == ["main.py:7:20:", "main.py:8:20:"], lines
        assert all("resolves to 0" in line for line in lines), lines
    else:
        assert lines == [], lines


def _sf101_lines(run_cli, tmp_path) -> list[str]:
    result = run_cli("scan", ".", "--select", "SF101", "--no-summary", "--no-cache", cwd=tmp_path)
    return [line for line in result.stdout.splitlines() if "SF101" in line]


@pytest.mark.parametrize("config, main_change, reported", [
    ('cfg = {"num_workers": 0, "lr": 1e-3}', "", True),
    ("cfg = dict(num_workers=0, lr=1e-3)", "", True),
    ('cfg = {"num_workers": 8}', "", False),
    ('cfg = {"num_workers": 0}\ncfg["num_workers"] = 8', "", False),  # changed where it is made
    ('cfg = {"num_workers": 0}\ncfg.update(num_workers=8)', "", False),
    ('cfg = {"num_workers": 0}\nif DEBUG:\n    cfg = {"num_workers": 8}', "", False),  # bound twice
    ('cfg = {"num_workers": 0}', 'cfg["num_workers"] = 8', False),  # changed by the script that imports it
    ('cfg = {"num_workers": 0}', "cfg.update(num_workers=8)", False),
])
def test_an_item_of_a_config_modules_dict_is_the_loaders_setting(run_cli, tmp_path, write, config, main_change, reported):
    """simple_GRPO's `config.py` holds `base_config = {"model_path": ..., ...}` and the training
    script reads `base_config["model_path"]`: the item of a dict literal that a scanned module
    binds once, and that neither it nor the script changes, is the value."""
    write("config.py", "DEBUG = False\n" + config + "\n")
    write("main.py", f"""\
        import torch
        from config import cfg
        from torch.utils.data import DataLoader
        {main_change}

        def main(train_set, model, optimizer):
            for (x,) in DataLoader(train_set, batch_size=8, shuffle=True, num_workers=cfg["num_workers"]):
                model(x.cuda()).sum().backward()
                optimizer.step()

        main(None, None, None)
        """)
    lines = _sf101_lines(run_cli, tmp_path)
    assert (len(lines) == 1 and lines[0].startswith("main.py:7:") and "resolves to 0" in lines[0]) if reported \
        else lines == [], lines


def test_a_parameter_hides_the_config_modules_constant_of_its_name(run_cli, tmp_path, write):
    write("config.py", "num_workers = 0\n")
    write("main.py", """\
        import torch
        from config import num_workers
        from torch.utils.data import DataLoader

        def make_loader(train_set, num_workers):
            return DataLoader(train_set, batch_size=8, shuffle=True, num_workers=num_workers)

        def main(train_set, model, optimizer, workers):
            for x, y in make_loader(train_set, workers):
                loss = model(x.cuda(), y.cuda())
                loss.backward()
                optimizer.step()
        """)
    result = run_cli("scan", ".", "--select", "SF101", "--no-summary", "--no-cache", cwd=tmp_path)
    assert "SF101" not in result.stdout, result.stdout


def test_a_dataset_of_another_file_that_reads_images_makes_the_samples_images(run_cli, tmp_path, write):
    """OpenAI-CLIP: the script loads a tokenizer for the captions, and its Dataset (dataset.py)
    decodes an image file per item: the loader's samples are images, whose workers matter most."""
    write("dataset.py", """\
        import cv2
        import torch

        class CLIPDataset(torch.utils.data.Dataset):
            def __init__(self, paths, captions, tokenizer):
                self.paths, self.encoded = paths, tokenizer(list(captions), padding=True)

            def __getitem__(self, idx):
                image = cv2.cvtColor(cv2.imread(self.paths[idx]), cv2.COLOR_BGR2RGB)
                item = {key: torch.tensor(values[idx]) for key, values in self.encoded.items()}
                item["image"] = torch.tensor(image).permute(2, 0, 1).float()
                return item

            def __len__(self):
                return len(self.paths)
        """)
    write("main.py", """\
        import torch
        from transformers import DistilBertTokenizer
        from dataset import CLIPDataset

        def main(paths, captions, model, optimizer):
            tokenizer = DistilBertTokenizer.from_pretrained("distilbert-base-uncased")
            loader = torch.utils.data.DataLoader(CLIPDataset(paths, captions, tokenizer), batch_size=32, shuffle=True)
            for batch in loader:
                loss = model({k: v.cuda() for k, v in batch.items()})
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        """)
    result = run_cli("scan", ".", "--select", "SF101", "--no-cache", "--output-format", "json", cwd=tmp_path)
    (finding,) = json.loads(result.stdout)
    assert (finding["path"], finding["line"], finding["impact"]) == ("main.py", 7, "high"), finding


@pytest.mark.parametrize("base", ["object", "torch.utils.data.DataLoader"])
def test_the_batches_of_a_hand_written_iterator_of_the_project_gain_nothing_from_non_blocking(run_cli, tmp_path, write, base):
    """The Transformers tutorial's `SequenceLoader(object)`: its own `__next__` makes the batches
    in pageable memory, and no DataLoader pins them, so `non_blocking=True` alone blocks all the
    same (SF104 is about a DataLoader's batches). A DataLoader subclass is still one."""
    write("dataloader.py", f"""\
        import torch

        class SequenceLoader({base}):
            def __init__(self, path):
                self.path = path

            def __iter__(self):
                return self

            def __next__(self):
                return torch.ones(8, 16, dtype=torch.long), torch.ones(8, 16, dtype=torch.long)
        """)
    write("train.py", """\
        import torch
        from dataloader import SequenceLoader

        def train(train_loader, model, optimizer):
            for source, target in train_loader:
                source = source.to("cuda")
                loss = model(source, target.to("cuda")).sum()
                loss.backward()
                optimizer.step()

        def main():
            loader = SequenceLoader("data")
            model = Net().cuda()
            train(loader, model, torch.optim.Adam(model.parameters(), fused=True))

        main()
        """)
    result = run_cli("scan", ".", "--select", "SF104", "--no-summary", cwd=tmp_path)
    assert ("SF104" in result.stdout) is (base != "object"), result.stdout


SUPERSEDED_TRAIN = """\
import torch
from torch.utils.data import DataLoader
from legacy.data import evaluate, make_set


def main():
    loader = DataLoader(make_set(), batch_size=32)
    for x, y in loader:
        loss = model(x.cuda(), y.cuda())
        loss.backward()
    evaluate(model, make_set())


if __name__ == "__main__":
    main()
"""

LEGACY_DATA = """\
from torch.utils.data import DataLoader


def evaluate(model, data):
    for x, y in DataLoader(data, batch_size=8):
        loss = model(x.cuda(), y.cuda())
        loss.backward()
"""


def test_a_folder_of_superseded_code_is_left_out_unless_the_project_imports_it_or_it_is_named(run_cli, write, tmp_path):
    # ChatGLM-finetune-LoRA keeps its first train.py and notebooks in `old/`: advice there is for a
    # run nobody makes. `legacy/data.py`, imported by train.py, is part of the run and keeps its own.
    write("project/train.py", SUPERSEDED_TRAIN)
    write("project/old/train.py", SUPERSEDED_TRAIN)
    write("project/old/notes/helpers.py", LEGACY_DATA)  # imported only by a file of old/ (here: none)
    write("project/legacy/data.py", LEGACY_DATA + "\n\ndef make_set():\n    return list(range(8))\n")
    project = tmp_path / "project"
    result = run_cli("scan", ".", "--output-format", "json", cwd=project)
    found = {finding["path"] for finding in json.loads(result.stdout)}
    assert {"train.py", "legacy/data.py"} <= found and not any(path.startswith("old/") for path in found)
    assert re.search(r"old/train.py: note: \d+ findings left out: `old/` holds superseded code", result.stderr)
    assert "name the file to scan it" in result.stderr
    # named, or its own folder scanned, it is scanned as any file
    named = run_cli("scan", "old/train.py", "--output-format", "json", cwd=project)
    assert {finding["path"] for finding in json.loads(named.stdout)} == {"old/train.py"}
    assert json.loads(run_cli("scan", "old", "--output-format", "json", cwd=project).stdout)
    both = run_cli("scan", ".", "old/train.py", "--output-format", "json", cwd=project)
    assert "old/train.py" in {finding["path"] for finding in json.loads(both.stdout)}
    # `apply` leaves it as it was, as the scan does
    run_cli("apply", "--unsafe-fixes", ".", cwd=project)
    assert (project / "old" / "train.py").read_text() == SUPERSEDED_TRAIN
    assert (project / "train.py").read_text() != SUPERSEDED_TRAIN


UNREFERENCED_LAYER = '''\
"""Attention layers."""
import math

import torch
from torch import nn

try:
    from apex.normalization import FusedLayerNorm as LayerNorm
except ImportError:
    LayerNorm = nn.LayerNorm


class FullAttention(nn.Module):
    def forward(self, q, k, v):
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return torch.matmul(torch.softmax(scores, dim=-1), v)
'''

UNREFERENCED_TRAIN = '''\
import torch
from models.net import Net

model = Net().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.randn(100, 8, 8).cuda():
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
'''


@pytest.mark.parametrize("mention, left_out", [
    (None, True),  # Time-LLM's `layers/SelfAttention_Family.py`: no file imports it
    ("models/net.py", False),  # imported
    ("configs/model.yaml", False),  # named by a config (hydra's `_target_`)
    ("notebook.ipynb", False),  # imported by a notebook
    ("tools/registry.py", False),  # a file imports modules by names made at run time
    ("setup.py", False),  # a package the project distributes: its users may import any module
])
def test_a_library_module_no_file_of_the_project_imports_or_names_is_left_out(mention, left_out, run_cli, write,
                                                                             tmp_path):
    write("project/train.py", UNREFERENCED_TRAIN)
    write("project/layers/attention.py", UNREFERENCED_LAYER)
    write("project/models/net.py", "import torch\n\n\nclass Net(torch.nn.Linear):\n    def __init__(self):\n"
          "        super().__init__(8, 8)\n"
          + ("\n\nfrom layers.attention import FullAttention\n" if mention == "models/net.py" else ""))
    if mention == "configs/model.yaml":
        write("project/configs/model.yaml", "attention:\n  _target_: layers.attention.FullAttention\n")
    if mention == "notebook.ipynb":
        write("project/notebook.ipynb", json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "outputs": [],
                                                               "source": ["from layers.attention import FullAttention\n"],
                                                               "execution_count": None}],
                                                    "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    if mention == "setup.py":
        write("project/setup.py", "from setuptools import setup\n\nsetup(name='layers', packages=['layers'])\n")
        write("project/layers/__init__.py", "")
    if mention == "tools/registry.py":
        write("project/tools/registry.py", "import importlib, os\n\n\ndef load_all(folder):\n"
              "    return [importlib.import_module(name[:-3]) for name in os.listdir(folder)]\n")
    project = tmp_path / "project"
    result = run_cli("scan", ".", "--select", "SF503", "--output-format", "json", cwd=project)
    found = {finding["path"] for finding in json.loads(result.stdout)}
    assert (found == set()) is left_out and found <= {"layers/attention.py"}
    assert ("layers/attention.py: note: 1 finding in its classes left out: no file of the project imports or names "
            "this module" in result.stderr) is left_out
    # named on the command line, or scanned without the code that trains, it is scanned as any file
    assert json.loads(run_cli("scan", "layers/attention.py", "--select", "SF503", "--output-format", "json",
                              cwd=project).stdout)
    assert json.loads(run_cli("scan", "layers", "--select", "SF503", "--output-format", "json", cwd=project).stdout)


def test_a_module_that_runs_something_is_no_library_module(run_cli, write, tmp_path):
    """A script nothing imports (its own entry point) keeps its findings: only a module that
    defines things and runs nothing is dead code when nothing names it."""
    write("project/train.py", UNREFERENCED_TRAIN)
    write("project/models/net.py", "import torch\n\n\nclass Net(torch.nn.Linear):\n    def __init__(self):\n"
          "        super().__init__(8, 8)\n")
    write("project/bench_attention.py", UNREFERENCED_LAYER + "\n\nif __name__ == '__main__':\n"
          "    FullAttention()(*torch.randn(3, 4, 8, 8).cuda())\n")
    project = tmp_path / "project"
    result = run_cli("scan", ".", "--select", "SF503", "--output-format", "json", cwd=project)
    assert {finding["path"] for finding in json.loads(result.stdout)} == {"bench_attention.py"}


def test_a_config_that_starts_naming_a_module_nothing_imported_brings_its_findings_back(run_cli, write, tmp_path,
                                                                                      counted):
    """The project's other files are the module's inputs: a cached scan follows their edits."""
    write("project/train.py", UNREFERENCED_TRAIN)
    write("project/layers/attention.py", UNREFERENCED_LAYER)
    write("project/models/net.py", "import torch\n\n\nclass Net(torch.nn.Linear):\n    def __init__(self):\n"
          "        super().__init__(8, 8)\n")
    project = tmp_path / "project"

    def found() -> set[str]:
        return {finding["path"] for finding in json.loads(
            run_cli("scan", ".", "--select", "SF503", "--output-format", "json", cwd=project).stdout)}

    assert found() == set() and "attention.py" in counted
    counted.clear()
    assert found() == set() and counted == []  # from the cache
    write("project/configs/model.yaml", "attention:\n  _target_: layers.attention.FullAttention\n")
    assert found() == {"layers/attention.py"} and counted == ["attention.py"]
    (project / "configs" / "model.yaml").unlink()
    assert found() == set()


def test_a_base_class_loop_trains_through_the_step_its_subclasses_in_other_files_define(run_cli, tmp_path, write):
    """safe-rlhf: `SupervisedTrainer.train()` calls `self.train_step(...)`, abstract there; the
    SFT and DPO trainers of other files define it with a step. The base class's loop trains, and
    an `empty_cache()` in it runs every step."""
    write("trainers/__init__.py", "")
    write("trainers/base.py", """\
        import torch


        class SupervisedTrainer:
            def __init__(self, model, loader):
                self.model = model.cuda()
                self.train_dataloader = loader

            def train_step(self, batch):
                raise NotImplementedError

            def train(self):
                for epoch in range(3):
                    for batch in self.train_dataloader:
                        self.train_step({k: v.cuda(non_blocking=True) for k, v in batch.items()})
                        torch.cuda.empty_cache()
        """)
    scan = ("scan", ".", "--select", "SF303", "--no-summary", "--no-cache")
    assert "SF303" not in run_cli(*scan, cwd=tmp_path).stdout  # no step anywhere: no training loop
    write("algorithms/__init__.py", "")
    write("algorithms/sft.py", """\
        from trainers.base import SupervisedTrainer


        class SFTTrainer(SupervisedTrainer):
            def train_step(self, batch):
                loss = self.model(**batch).loss
                self.model.backward(loss)
                self.model.step()
                return {"loss": loss}
        """)
    assert "trainers/base.py:16:17: SF303" in run_cli(*scan, cwd=tmp_path).stdout


def test_a_test_found_in_a_walked_folder_is_no_run_but_a_test_named_on_the_command_line_is_scanned(run_cli, tmp_path,
                                                                                                   write):
    loop = ("import torch\nmodel = Net().cuda()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for x in loader:\n    loss = model(x.cuda()).sum()\n    loss.backward()\n    optimizer.step()\n")
    write("train.py", loop)
    write("tests/test_train.py", "def test_one_step():\n" + "".join(f"    {line}\n" for line in loop.splitlines()))
    walked = run_cli("scan", ".", "--select", "SF202", "--no-summary", cwd=tmp_path)
    assert "train.py:6:5: SF202" in walked.stdout and "tests/test_train.py:" not in walked.stdout.replace(
        "tests/test_train.py: note: 1 finding left out: a test", "")
    assert "tests/test_train.py: note: 1 finding left out: a test" in walked.stdout + walked.stderr
    named = run_cli("scan", "tests/test_train.py", "--select", "SF202", "--no-summary", cwd=tmp_path)
    assert "tests/test_train.py:7:9: SF202" in named.stdout
    write("copy_test.py", loop)  # an experiment its README runs
    write("README.md", "```\npython copy_test.py\n```\n")
    write("add_test.py", "import argparse\nparser = argparse.ArgumentParser()\nargs = parser.parse_args()\n" + loop)
    found = run_cli("scan", ".", "--select", "SF202", "--no-summary", cwd=tmp_path).stdout
    assert "copy_test.py:6:5: SF202" in found and "add_test.py:9:5: SF202" in found  # TCN's: it has options


def test_the_facts_of_a_parser_take_what_set_defaults_sets():
    """diffpool's `parser.set_defaults(num_workers=1, ...)`: what the scripts that run a module
    default to (``Links.options``), over the `add_argument` default."""
    facts = extract_facts(b"import argparse\nparser = argparse.ArgumentParser()\n"
                          b"parser.add_argument('--num_workers', type=int, default=8)\n"
                          b"parser.add_argument('--lr', type=float, default=0.1)\n"
                          b"parser.set_defaults(num_workers=1, unknown=3)\n")
    assert dict(facts.options) == {"num_workers": "1", "lr": "0.1"}


@pytest.mark.parametrize("where", ["models/utils.py", "train.py"])
def test_no_worker_or_pinning_advice_where_the_run_makes_cuda_the_default_for_new_tensors(run_cli, tmp_path, write,
                                                                                         where):
    """knowledge-tracing-collection: models/utils.py makes `torch.cuda.FloatTensor` the default
    tensor type, so the collate function the loaders take makes CUDA tensors: workers cannot make
    them and pinning raises."""
    default = "if torch.cuda.is_available():\n    torch.set_default_tensor_type(torch.cuda.FloatTensor)\n"
    write("models/utils.py", "import torch\n" + (default if where == "models/utils.py" else "")
          + "\n\ndef collate_fn(batch):\n    return torch.tensor(batch)\n")
    write("train.py", "import torch\nfrom torch.utils.data import DataLoader\nfrom models.utils import collate_fn\n"
          + ('torch.set_default_device("cuda")\n' if where == "train.py" else "")
          + "loader = DataLoader(dataset, batch_size=64, collate_fn=collate_fn)\nmodel = Net().cuda()\n"
          "for x in loader:\n    model(x).sum().backward()\n    optimizer.step()\n")
    found = {finding["code"] for finding in json.loads(run_cli("scan", ".", "--select", "SF101,SF102", "--output-format",
                                                               "json", cwd=tmp_path).stdout)}
    assert found == set()
    write("models/utils.py", "import torch\n\n\ndef collate_fn(batch):\n    return torch.tensor(batch)\n")
    write("train.py", (tmp_path / "train.py").read_text().replace('torch.set_default_device("cuda")\n', ""))
    found = {finding["code"] for finding in json.loads(run_cli("scan", ".", "--select", "SF101,SF102", "--output-format",
                                                               "json", cwd=tmp_path).stdout)}
    assert found == {"SF101", "SF102"}


@pytest.mark.parametrize("layout", ["direct", "star and nested helper"])
def test_tf32_chosen_in_a_helper_the_entry_script_calls_holds_for_the_modules_it_imports(run_cli, tmp_path, write,
                                                                                        layout):
    """nanoT5: `main.py` calls a start-up helper of another file that sets `allow_tf32` (there,
    through the package's `from .gen_utils import *` and a second helper); the training loop
    lives in a third module `main.py` imports."""
    if layout == "direct":
        write("utils/gen_utils.py", "import torch\n\n\ndef setup_basics():\n"
              "    torch.backends.cuda.matmul.allow_tf32 = True\n")
    else:
        write("utils/__init__.py", "from .gen_utils import *\n")
        write("utils/gen_utils.py", "import torch\n\n\ndef opti_flags():\n"
              "    torch.backends.cuda.matmul.allow_tf32 = True\n\n\ndef setup_basics():\n    opti_flags()\n")
    write("utils/train_utils.py", "def train(model, loader, optimizer):\n    for x, y in loader:\n"
          "        loss = (model(x.cuda()) - y.cuda()).pow(2).mean()\n        loss.backward()\n"
          "        optimizer.step()\n")
    imported = "from utils.gen_utils import setup_basics" if layout == "direct" else "from utils import setup_basics"
    write("main.py", f"import torch\n{imported}\nfrom utils.train_utils import train\n\n\n"
          "def main():\n    setup_basics()\n    model = torch.nn.Linear(4096, 4096).cuda()\n"
          "    train(model, loader, torch.optim.SGD(model.parameters(), lr=0.1))\n\n\n"
          'if __name__ == "__main__":\n    main()\n')
    scan = ["scan", ".", "--select", "SF201", "--output-format", "json", "--no-cache"]
    assert json.loads(run_cli(*scan, cwd=tmp_path).stdout) == []
    write("utils/gen_utils.py", "import torch\n\n\ndef opti_flags():\n    pass\n\n\ndef setup_basics():\n"
          "    torch.manual_seed(0)\n")
    assert [finding["path"] for finding in json.loads(run_cli(*scan, cwd=tmp_path).stdout)] == ["utils/train_utils.py"]


@pytest.mark.parametrize("config, script_sets, reported", [
    ("class Config(object):\n    optimizer = 'sgd'\n", False, False),
    ("class Config(object):\n    optimizer = 'adam'\n", False, True),
    ("class Config(object):\n    optimizer = 'sgd'\n", True, True),  # the script sets it from its options
    ("class Config(object):\n    optimizer = 'sgd'\n\n    def parse(self, kwargs):\n"
     "        self.optimizer = kwargs['optimizer']\n", False, True),  # a method may set it
])
def test_a_plain_settings_class_of_another_file_gives_its_attributes(run_cli, tmp_path, write, config, script_sets,
                                                                     reported):
    """arcface: `opt = Config()` with `class Config(object): optimizer = 'sgd'` in config.py; the
    `Adam` of `else:` after `if opt.optimizer == 'sgd':` is no run's optimizer."""
    write("config.py", config)
    write("train.py", "import torch\nfrom config import Config\n\nopt = Config()\n"
          + ("opt.optimizer = args.optimizer\n" if script_sets else "") +
          "model = Net().cuda()\nif opt.optimizer == 'sgd':\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
          "else:\n    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)\nfor x in loader:\n"
          "    model(x.cuda()).sum().backward()\n    optimizer.step()\n")
    found = json.loads(run_cli("scan", ".", "--select", "SF401", "--torch-version", "2.4", "--output-format", "json",
                               cwd=tmp_path).stdout)
    assert bool(found) is reported


@pytest.mark.parametrize("items", ["torch.no_grad()", "tqdm(total=10) as pbar, torch.no_grad()"])
def test_a_loop_under_no_grad_takes_no_step_through_a_function_that_steps_on_a_flag(run_cli, tmp_path, write, items):
    """Wave-U-Net: `compute_loss(..., compute_grad=False)` steps only when asked; the validation
    loop calls it inside `with tqdm(...) as pbar, torch.no_grad():` (autograd off in the `with`'s
    second item), so that loop is no training loop: its copies get no SF104, while the training
    loop's do."""
    write("utils.py", """\
        def compute_loss(model, x, y, criterion, compute_grad=False):
            loss = criterion(model(x), y)
            if compute_grad:
                loss.backward()
            return loss
        """)
    write("evaluate.py", f"""\
        import torch
        from tqdm import tqdm
        import utils

        def validate(model, loader, criterion):
            model.eval()
            with {items}:
                for x, y in loader:
                    x = x.cuda()
                    utils.compute_loss(model, x, y.cuda(), criterion)
        """)
    write("train.py", """\
        import torch
        import utils
        from evaluate import validate

        def train(model, loader, optimizer, criterion):
            for x, y in loader:
                utils.compute_loss(model, x.cuda(), y.cuda(), criterion, compute_grad=True)
                optimizer.step()
            validate(model, loader, criterion)

        if __name__ == "__main__":
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(8, 2)), batch_size=4, pin_memory=True)
            train(torch.nn.Linear(2, 2).cuda(), loader, torch.optim.SGD([], lr=0.1), torch.nn.MSELoss())
        """)
    result = run_cli("scan", ".", "--select", "SF104", "--no-summary", cwd=tmp_path)
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == ["train.py"]


def test_cudnn_switched_off_when_the_trainer_imports_a_module_is_found_there(run_cli, tmp_path, write):
    """crnn: evaluate.py switches cuDNN off at its top and train.py imports it for `evaluate()`:
    the switch runs with the import, so the finding is at evaluate.py's line (high: the CRNN's
    convolutions lose cuDNN), and train.py is not told to enable `cudnn.benchmark`, which the
    switched-off cuDNN would ignore (evaluate.py builds the CRNN for a run of its own: its
    impact is known there)."""
    write("model.py", """\
        from torch import nn

        class CRNN(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(1, 64, 3)
                self.rnn = nn.LSTM(64, 256, bidirectional=True)
        """)
    write("evaluate.py", """\
        import torch
        from model import CRNN

        torch.backends.cudnn.enabled = False

        def evaluate(model, loader):
            model.eval()
            with torch.no_grad():
                return [model(x.cuda()) for x in loader]

        if __name__ == "__main__":
            evaluate(CRNN().cuda(), torch.load("test_batches.pt"))
        """)
    write("train.py", """\
        import torch
        from model import CRNN
        from evaluate import evaluate

        def main():
            model = CRNN().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = torch.utils.data.DataLoader(range(8), num_workers=4, pin_memory=True)
            for x in loader:
                model(x.cuda(non_blocking=True)).sum().backward()
                optimizer.step()
            evaluate(model, loader)

        if __name__ == "__main__":
            main()
        """)
    result = run_cli("scan", ".", "--select", "SF601", "--no-summary", cwd=tmp_path)
    assert result.stdout.splitlines() == [
        "evaluate.py:4:1: SF601 cuDNN is switched off (`torch.backends.cudnn.enabled = False`, when train.py imports "
        "this module): convolutions, recurrent layers and batch norm run PyTorch's own kernels, far slower than "
        "cuDNN's (impact: high)"]


@pytest.mark.parametrize("imported", ["import pkg.modules.commons as commons", "from pkg.modules import commons"])
def test_a_helper_that_a_lightning_training_step_calls_runs_every_step(run_cli, tmp_path, write, imported):
    """so-vits-svc: the LightningModule's `training_step` logs `commons.clip_grad_value_(...)`,
    a helper of another file that reads each parameter's gradient norm with `.item()`: a sync per
    parameter tensor on every step (SF301), found in the helper's file."""
    write("src/pkg/__init__.py", "")
    write("src/pkg/modules/__init__.py", "")
    write("src/pkg/modules/commons.py", """\
        def clip_grad_value_(parameters, clip_value):
            total_norm = 0
            for p in parameters:
                param_norm = p.grad.data.norm(2)
                total_norm += param_norm.item() ** 2
            return total_norm
        """)
    write("src/pkg/train.py", f"""\
        import lightning.pytorch as pl
        import torch
        {imported}

        class VitsLightning(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net_g = torch.nn.Conv1d(1, 1, 3)

            def training_step(self, batch, batch_idx):
                loss = self.net_g(batch).mean()
                self.log("grad_norm_g", commons.clip_grad_value_(self.net_g.parameters(), None))
                return loss

        def train():
            pl.Trainer(precision="bf16-mixed").fit(VitsLightning())
        """)
    result = run_cli("scan", ".", "--select", "SF301", "--no-summary", cwd=tmp_path)
    assert [line.split(" ")[:2] for line in result.stdout.splitlines()] == [["src/pkg/modules/commons.py:5:23:", "SF301"]]


@pytest.mark.parametrize(("declared", "which"), [("setup.py", "`which stylegan2_deepspeed`"),
                                                  ("setup.cfg", "$(which stylegan2_deepspeed)"),
                                                  ("pyproject.toml", "stylegan2_deepspeed"),
                                                  ("poetry", "`which stylegan2_deepspeed`")])
def test_a_console_script_of_the_project_runs_its_module_in_launch_commands(run_cli, tmp_path, write, declared, which):
    """stylegan2-deepspeed: the README runs `deepspeed \\`which stylegan2_deepspeed\\` --deepspeed
    --deepspeed_config ./config/stylegan2.json`, a console script setup.py maps to `cli.py`'s
    `main()` (no `__main__` block), which builds the trainer of `trainer.py`: the engine's config
    is that JSON file, which enables neither bf16 nor fp16 (SF905, high: fp32 training)."""
    write("pyproject.toml" if declared == "poetry" else declared, {
        "setup.py": """\
            from setuptools import setup, find_packages
            setup(name="gan", packages=find_packages(),
                  entry_points={"console_scripts": ["stylegan2_deepspeed = gan.cli:main"]})
            """,
        "setup.cfg": "[metadata]\nname = gan\n\n[options.entry_points]\nconsole_scripts =\n"
                     "    stylegan2_deepspeed = gan.cli:main\n",
        "pyproject.toml": '[project]\nname = "gan"\n\n[project.scripts]\nstylegan2_deepspeed = "gan.cli:main"\n',
        "poetry": '[tool.poetry]\nname = "gan"\n\n[tool.poetry.scripts]\nstylegan2_deepspeed = "gan.cli:main"\n',
    }[declared])
    write("readme.md", f"""\
        ```
        deepspeed {which} --deepspeed --deepspeed_config ./config/stylegan2.json -d images
        ```
        """)
    write("config/stylegan2.json", '{\n  "train_batch_size": 16,\n  "zero_optimization": {"stage": 0}\n}\n')
    write("gan/__init__.py", "")
    write("gan/cli.py", """\
        import argparse
        import deepspeed
        from gan.trainer import Trainer

        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("-d", "--data_dir")
            parser = deepspeed.add_config_arguments(parser)
            Trainer().train(parser.parse_args())
        """)
    write("gan/trainer.py", """\
        import deepspeed
        import torch
        import torchvision

        class Trainer:
            def train(self, args):
                model = torchvision.models.resnet50().cuda()
                optimizer = torch.optim.Adam(model.parameters())
                engine, optimizer, loader, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
                for images in loader:
                    loss = engine(images.cuda(non_blocking=True)).mean()
                    engine.backward(loss)
                    engine.step()
        """)
    result = run_cli("scan", ".", "--select", "SF905", "--no-summary", cwd=tmp_path)
    assert result.stdout.splitlines()[0] == (
        'config/stylegan2.json:1:1: SF905 the DeepSpeed config enables neither "bf16" nor "fp16": the engine trains in '
        'fp32; `"bf16": {"enabled": true}` runs the matmuls on the tensor cores (impact: high)')


@pytest.mark.parametrize("forward", ["if exists(cond_images):\n                    x = x + self.cond_proj(cond_images)",
                                     "x = x + self.cond_proj(cond_images)"])
def test_ddp_keeps_find_unused_parameters_for_a_model_of_another_file_that_skips_submodules(
        run_cli, tmp_path, write, forward):
    """imagen-pytorch: trainer.py asks Accelerate's DDP for `find_unused_parameters=True` (its
    `Accelerator(**{...})` may get more keywords, none by default: no DeepSpeed there), and the
    Unet of imagen_pytorch.py projects its conditioning images only when given some: a step
    without them leaves that layer without gradients, so the flag is needed (no SF803). A Unet
    that always runs it gets the finding."""
    write("imagen_pytorch.py", f"""\
        from torch import nn

        def exists(value):
            return value is not None

        class Unet(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 3, 3)
                self.cond_proj = nn.Conv2d(3, 3, 1)

            def forward(self, x, cond_images=None):
                x = self.conv(x)
                {forward}
                return x
        """)
    write("trainer.py", """\
        import torch
        from accelerate import Accelerator, DistributedDataParallelKwargs
        from imagen_pytorch import Unet

        def train(loader, accelerate_kwargs={}):
            accelerator = Accelerator(**{
                "mixed_precision": "bf16",
                "kwargs_handlers": [DistributedDataParallelKwargs(find_unused_parameters=True)],
                **accelerate_kwargs})
            unet = Unet()
            optimizer = torch.optim.Adam(unet.parameters(), fused=True)
            unet, optimizer, loader = accelerator.prepare(unet, optimizer, loader)
            for images in loader:
                accelerator.backward(unet(images).mean())
                optimizer.step()
        """)
    result = run_cli("scan", ".", "--select", "SF803", "--no-summary", cwd=tmp_path)
    expected = [] if forward.startswith("if") else [
        "trainer.py:8:29: SF803 `find_unused_parameters=True` walks the autograd graph again after every forward pass "
        "(impact: medium)"]
    assert result.stdout.splitlines() == expected


@pytest.mark.parametrize(("folder", "other"), [("configs", "false"), ("pkg/preprocessing/config_templates", "false"),
                                               ("configs", "true")])
def test_a_trainer_precision_from_a_config_every_run_config_sets_is_read(run_cli, tmp_path, write, folder, other):
    """so-vits-svc: `precision=("16-mixed" if hparams.train.fp16_run else "bf16-mixed" if
    hparams.train.get("bf16_run", False) else 32)`, where `hparams` is loaded from a JSON file
    named on the command line: every config template of the project says `"fp16_run": false` and
    none sets `bf16_run`, so the run trains in fp32 (SF901, no fix: the config decides). Where
    the templates disagree, the precision is unknown: nothing is said about it."""
    write("pyproject.toml", '[project]\nname = "pkg"\n')
    write("pkg/__init__.py", "")
    write("pkg/utils.py", "import json\n\ndef get_hparams(path):\n    return json.load(open(path))\n")
    write(f"{folder}/base.json", '{"train": {"fp16_run": false, "epochs": 10}}\n')
    write(f"{folder}/quickvc.json", '{"train": {"fp16_run": %s, "epochs": 20}}\n' % other)
    write("pkg/train.py", """\
        import lightning.pytorch as pl
        import torch
        from . import utils

        class Net(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv1d(1, 1, 3)

            def training_step(self, batch, batch_idx):
                return self.conv(batch).mean()

        def train(config_path):
            hparams = utils.get_hparams(config_path)
            trainer = pl.Trainer(
                max_epochs=hparams.train.epochs,
                precision=("16-mixed" if hparams.train.fp16_run else "bf16-mixed" if hparams.train.get("bf16_run", False)
                           else 32),
                benchmark=True,
            )
            trainer.fit(torch.compile(Net()))
        """)
    result = run_cli("scan", ".", "--select", "SF901", "--no-summary", cwd=tmp_path)
    fp32 = [line for line in result.stdout.splitlines() if "trains in fp32" in line]
    assert fp32 == ([] if other == "true" else [
        "pkg/train.py:17:9: SF901 `Trainer` trains in fp32 (`precision` is 32 with the defaults of the project's options "
        "and run configs): bf16 mixed precision runs on the tensor cores (impact: high)"])


def test_a_launch_script_with_a_bash_array_costs_the_script_nothing(run_cli, tmp_path, write):
    """wavenet_vocoder's egs/*/run.sh sets `datasets=($train_set $dev_set $eval_set)` and
    `eval_checkpoint=` before the command that runs train.py: the script keeps its analysis, and
    the command is read (its `--num_workers 8` overrides the default of 0: no SF101)."""
    write("egs/mulaw256/run.sh", """\
        train_set="train_no_dev"
        datasets=($train_set $dev_set $eval_set)
        eval_checkpoint=
        python ../../train.py --num_workers 8 --dump-root=dump
        """)
    write("train.py", """\
        import argparse
        import torch
        import torchvision

        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--num_workers", type=int, default=0)
            args = parser.parse_args()
            model = torch.nn.Linear(8, 8).cuda()
            optimizer = torch.optim.Adam(model.parameters(), fused=True)
            dataset = torchvision.datasets.ImageFolder("data", transform=torchvision.transforms.ToTensor())
            for x, y in torch.utils.data.DataLoader(dataset, num_workers=args.num_workers, pin_memory=True):
                loss = model(x.cuda(non_blocking=True)).sum()
                loss.backward()
                optimizer.step()
                print(loss.item())

        if __name__ == "__main__":
            main()
        """)
    result = run_cli("scan", ".", "--select", "SF101,SF301", "--no-summary", cwd=tmp_path)
    assert [line.split(" ")[:2] for line in result.stdout.splitlines()] == [["train.py:16:15:", "SF301"]]
    assert "internal error" not in result.stderr + result.stdout


def test_a_project_file_no_script_can_read_is_noted_once(run_cli, tmp_path, write, monkeypatch):
    """FlagEmbedding: a Latin-1 `run.py` that every other script's project search meets was noted
    under each of them (40 times); the note is said once, under the first file."""
    script = """\
        import torch

        if __name__ == "__main__":
            model = torch.nn.Linear(2, 2).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in range(3):
                model(torch.ones(2, device="cuda")).sum().backward()
                opt.step()
        """
    write("a.py", script)
    write("b.py", script)
    (tmp_path / "c.py").write_bytes(b"# caf\xe9\nimport torch\n")
    for _cold_then_cached in range(2):
        result = run_cli("scan", ".", "--no-summary", cwd=tmp_path)
        monkeypatch.delenv("SPEEDFIX_NO_CACHE", raising=False)  # the second scan, with a cache kept by the first
        assert [line for line in result.stderr.splitlines() + result.stdout.splitlines() if "not read" in line] == [
            "a.py: note: c.py: not read, it is not UTF-8 text"]
    result = run_cli("scan", ".", "--no-summary", cwd=tmp_path)  # every file's record from the cache
    assert [line for line in result.stderr.splitlines() + result.stdout.splitlines() if "not read" in line] == [
        "a.py: note: c.py: not read, it is not UTF-8 text"]
    assert (tmp_path / ".speedfix_cache").is_dir()


def test_a_launch_file_the_reader_cannot_follow_costs_only_its_commands(run_cli, tmp_path, write, monkeypatch):
    """Should a launch script hold a line the command reader fails on, the script keeps its
    findings and the report names the launch file."""
    from speedfix.model import launch

    def fails(words):
        raise IndexError("string index out of range")

    monkeypatch.setattr(launch, "_held_command", fails)
    write("run.sh", "python train.py --epochs 3\n")
    write("train.py", """\
        import argparse
        import torch

        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--workers", type=int, default=0)
            args = parser.parse_args()
            model = torch.nn.Linear(2, 2).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in torch.utils.data.DataLoader(range(4), num_workers=args.workers):
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
                print(loss.item())
        """)
    result = run_cli("scan", ".", "--select", "SF301", "--no-summary", cwd=tmp_path)
    assert [line.split(" ")[1] for line in result.stdout.splitlines() if line.startswith("train.py:1")] == ["SF301"]
    assert "run.sh: its commands were not read (IndexError: string index out of range)" in result.stdout + result.stderr
    assert "internal error" not in result.stdout + result.stderr


@pytest.mark.parametrize("others", ["", "num_workers=8, "])
def test_a_loader_helper_whose_callers_leave_num_workers_out_of_its_kwargs(run_cli, tmp_path, write, others):
    """audiolm-pytorch: `get_dataloader(ds, **kwargs)` in the package's data.py builds every
    loader; one trainer passes `num_workers=`, the other leaves it out, so that trainer's loader
    runs in the main process (SF101, no fix: the first caller would get it twice). The package
    also holds a module named like itself (audiolm_pytorch/audiolm_pytorch.py), which its files'
    `from audiolm_pytorch.data import ...` does not mean."""
    write("audiolm_pytorch/__init__.py", "")
    write("audiolm_pytorch/audiolm_pytorch.py", "class AudioLM:\n    pass\n")
    write("audiolm_pytorch/data.py", """\
        import torchaudio
        from torch.utils.data import DataLoader, Dataset

        class SoundDataset(Dataset):
            def __init__(self, files):
                self.files = files

            def __len__(self):
                return len(self.files)

            def __getitem__(self, index):
                return torchaudio.load(self.files[index])[0]

        def get_dataloader(ds, pad_to_longest=True, **kwargs):
            return DataLoader(ds, **kwargs)
        """)
    write("audiolm_pytorch/trainer.py", f"""\
        import torch
        from audiolm_pytorch.data import SoundDataset, get_dataloader

        def train(model, files, steps):
            optimizer = torch.optim.Adam(model.parameters(), fused=True)
            first = get_dataloader(SoundDataset(files), batch_size=4, num_workers=8, pin_memory=True)
            second = get_dataloader(SoundDataset(files), batch_size=4, {others}pin_memory=True)
            for loader in (first, second):
                for wave in loader:
                    loss = model(wave.cuda(non_blocking=True)).mean()
                    loss.backward()
                    optimizer.step()
        """)
    result = run_cli("scan", ".", "--select", "SF101", "--no-summary", cwd=tmp_path)
    assert result.stdout.splitlines() == ([] if others else [
        "audiolm_pytorch/data.py:15:12: SF101 `DataLoader` loads every batch in the main process where its callers leave "
        "`num_workers` out of the `**kwargs` they pass (impact: high)"])


@pytest.mark.parametrize("create_graph", ["self.training", "False"])
def test_no_compile_advice_where_an_imported_module_differentiates_a_gradient(run_cli, tmp_path, write, create_graph):
    """schnetpack: the model's forces are `grad(energy, positions, create_graph=self.training)`
    in atomistic/response.py, and the loss on them differentiates that gradient again, which
    compiled graphs cannot run: cli.py, which trains the model, gets no compile advice (it does
    where the gradient is not differentiated again)."""
    write("potential.py", f"""\
        import torch
        from torch import nn
        from torch.autograd import grad

        class Potential(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = nn.Sequential(nn.Linear(3, 256), nn.SiLU(), nn.Linear(256, 1))

            def forward(self, positions):
                energy = self.net(positions).sum()
                forces = -grad([energy], [positions], create_graph={create_graph})[0]
                return energy, forces
        """)
    write("train.py", """\
        import torch
        from potential import Potential

        def main():
            model = Potential().cuda()
            optimizer = torch.optim.Adam(model.parameters(), fused=True)
            for positions, target in torch.utils.data.DataLoader(range(8), num_workers=4, pin_memory=True):
                positions = positions.cuda(non_blocking=True).requires_grad_()
                energy, forces = model(positions)
                loss = (forces - target.cuda(non_blocking=True)).pow(2).mean()
                loss.backward()
                optimizer.step()

        if __name__ == "__main__":
            main()
        """)
    result = run_cli("scan", ".", "--select", "SF501", "--no-summary", cwd=tmp_path)
    assert [line.split(" ")[1] for line in result.stdout.splitlines()] == ([] if create_graph != "False" else ["SF501"])
