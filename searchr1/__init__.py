"""searchr1: a test-first reference implementation of Search-R1 on PyTRIO."""

__version__ = "0.1.0"
