"""The code as bytes, text and trees: reading and writing a file without losing a byte, parsing it
in time linear in its size, walking the tree once, positions, names as written, comments, blocks.

Nothing here knows PyTorch; everything above builds on it.
"""
