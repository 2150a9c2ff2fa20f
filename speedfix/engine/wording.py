"""How findings' messages name several things."""

from __future__ import annotations


def name_all(labels: list[str]) -> str:
    """`a`, `b` and `c`: each label once, in the order given."""
    labels = list(dict.fromkeys(labels))
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + f" and {labels[-1]}"
