"""The bundled benchmark: run training scripts unchanged, compare them, verify rewrites.

Importing this package never imports torch; only the child process (``child.py``) does. Its
modules are imported where they are used, so that `speedfix scan` does not pay for them.
"""
