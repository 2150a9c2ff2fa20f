"""SF104 through a helper of another file: the training loop hands the batch to a function that
copies its parameter to the GPU with a blocking copy."""

from __future__ import annotations

import textwrap

LOOP = textwrap.dedent(
    """
    import torch
    from helpers import to_gpu

    def train(net, opt, loader):
        net.cuda()
        for epoch in range(10):
            for images, _ in loader:
                images = to_gpu(images)
                noise = to_gpu(torch.randn(images.size(0), 128))
                loss = net(images, noise).mean()
                loss.backward()
                opt.step()
    """
)


def _findings(run_cli, tmp_path, helper: str) -> list[str]:
    (tmp_path / "helpers.py").write_text(textwrap.dedent(helper), encoding="utf-8")
    (tmp_path / "train.py").write_text(LOOP, encoding="utf-8")
    result = run_cli("scan", "train.py", "helpers.py", "--select", "SF104", "--no-summary", cwd=tmp_path)
    return [line for line in result.stdout.splitlines() if " SF104 " in line]


def test_a_batch_copied_by_a_blocking_helper_is_reported_on_the_call(run_cli, tmp_path):
    found = _findings(run_cli, tmp_path, """
        import torch

        def to_gpu(x):
            if torch.cuda.is_available():
                x = x.cuda()
            return x
        """)
    assert len(found) == 1  # the batch; the noise is not a batch
    assert found[0].startswith("train.py:9:") and "`to_gpu()` copies the batch (`images`)" in found[0]


def test_a_helper_that_copies_without_blocking_is_left_alone(run_cli, tmp_path):
    assert _findings(run_cli, tmp_path, """
        def to_gpu(x):
            return x.cuda(non_blocking=True)
        """) == []


def test_a_helper_that_casts_is_left_alone(run_cli, tmp_path):
    assert _findings(run_cli, tmp_path, """
        import torch

        def to_gpu(x):
            return x.to(torch.float16)
        """) == []
