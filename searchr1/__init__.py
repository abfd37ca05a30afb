"""searchr1: a test-first reference implementation of Search-R1 on PyTRIO."""

import os as _os

# transformers warns at import time that PyTorch is missing; this project never needs it.
_os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

__version__ = "0.1.0"
