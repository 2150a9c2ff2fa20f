"""Fixes: the edits rules build (code generation, statement removal, the entry point of a
script, dropping a GradScaler), applied to a fixed point without losing a byte (``fixer``),
previewed one by one (``previews``) and mapped back to the original's positions (``linemap``).
"""
