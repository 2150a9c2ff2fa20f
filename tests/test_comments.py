"""Comments that explain code and comments that are old code (speedfix.syntax.comments.prose)."""

from __future__ import annotations

from speedfix.syntax.comments import prose


def test_commented_out_call_over_several_lines_is_not_prose():
    comments = [
        "# sampler = DistributedSampler(data)",
        "# loader = DataLoader(data, batch_size=64,",
        "#                     num_workers=0, sampler=sampler)",
        "# one process: the HDF5 handle cannot be forked",
    ]
    assert prose(comments) == ["# one process: the HDF5 handle cannot be forked"]


def test_prose_that_python_could_parse_stays_prose():
    comments = ["# workers", "# Note: h5py handles are not fork-safe", "# 0 workers, see issue 12", "# model.cuda()"]
    assert prose(comments) == comments[:3]
