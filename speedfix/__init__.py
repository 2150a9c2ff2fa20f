"""speedfix: find, fix and verify the speed a PyTorch training script leaves on the table."""

__version__ = "0.1.0"
