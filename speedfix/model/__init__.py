"""The semantic model of a training script: what its code means, answered once for every rule.

The file index (what the one walk records), its training loops and hot code, argument values and
control flow, loaders, models, tensors and devices, mixed precision, attention, the frameworks and
their configurations, and the torch version it targets. The model reports nothing and fixes
nothing: the rules decide.
"""
