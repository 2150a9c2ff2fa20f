"""Small questions about one node: its code as written."""

from __future__ import annotations

import libcst as cst


def code_of(node: cst.CSTNode) -> str:
    """The source text of a node, as libcst prints it."""
    return cst.Module([]).code_for_node(node)
