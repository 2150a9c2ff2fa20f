"""What a config-driven project's runs use: the classes its run configs train (`configs/*.yaml`
naming `model: {target: ...}` or LightningCLI's `class_path:`), the `trainer:` sections of its
LightningCLI configs, and the YAML a script loads itself (`yaml.safe_load` of an argparse
default) and passes to a Lightning `Trainer`. Small projects, scanned from their folder.
"""

from __future__ import annotations

MODELS = """\
import torch
import lightning as L


class Autoencoder(L.LightningModule):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class Distilled(Autoencoder):
    pass


class WithCritic(Autoencoder):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-4)
"""


def test_no_optimizer_advice_for_a_module_no_run_config_trains(write, run_cli, tmp_path):
    write("pkg/models.py", MODELS)
    write("configs/small.yaml", "model:\n  target: pkg.models.Distilled\n  params:\n    width: 64\n")
    result = run_cli("scan", ".", "--select", "SF401", "--no-summary", cwd=tmp_path)
    assert result.stdout.splitlines() == [  # Distilled runs Autoencoder's method; WithCritic is never trained
        "pkg/models.py:7:16: SF401 [*] `Adam` runs its update as several kernels per step; `fused=True` does it "
        "in one (impact: low)",
    ]
    write("configs/critic.yaml", "model:\n  target: pkg.models.WithCritic\n")
    assert run_cli("scan", ".", "--select", "SF401", "--no-summary", cwd=tmp_path).stdout.count("SF401") == 2


def test_a_lightning_cli_optimizer_replaces_the_modules_own(write, run_cli, tmp_path):
    write("src/pkg/models.py", MODELS)
    write("experiments/run.yaml", "model:\n  class_path: pkg.models.Autoencoder\noptimizer:\n"
          "  class_path: torch.optim.AdamW\n  init_args:\n    lr: 0.001\ntrainer:\n  precision: bf16-mixed\n")
    assert "SF401" not in run_cli("scan", ".", "--select", "SF401", "--no-summary", cwd=tmp_path).stdout
    write("experiments/run.yaml", "model:\n  class_path: pkg.models.Autoencoder\n")
    assert "models.py:7:16: SF401" in run_cli("scan", ".", "--select", "SF401", "--no-summary", cwd=tmp_path).stdout
