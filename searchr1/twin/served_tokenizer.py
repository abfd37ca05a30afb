"""The tokenizer the SDK loads for the twin's model, served from the local exact tokenizer.

pytrio loads the model's tokenizer itself, inside the first ``forward``/``forward_backward``
of a training client (and in ``get_tokenizer()``), with ModelScope's ``AutoTokenizer`` on the
``model_id`` that run creation returned: first ``local_files_only=True``, then the network.
A directory path is a valid ``model_id`` for that loader, and it needs no ModelScope cache
layout or environment variable (both differ across ModelScope versions), so the twin answers
run creation with the path of a ``save_pretrained`` directory of the exact Qwen3.5 tokenizer
(:mod:`searchr1.tokenizer`). The catalog (``get_server_capabilities()``) and ``model_alias``
keep the real model name, so code that names models sees ``Qwen/Qwen3.5-4B`` as live; only
``training_client.model_id`` and ``sampling_client.model_id`` show the path.

The directory is the tokenizer cache :mod:`searchr1.tokenizer` already wrote when it holds a
``tokenizer.json``; otherwise the tokenizer is saved once next to that cache
(``$SEARCHR1_CACHE_DIR/twin-tokenizer``), write-then-rename.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

TOKENIZER_FILE = "tokenizer.json"


def served_tokenizer_dir(tokenizer: Any, root: Path | None = None) -> Path:
    """A directory ModelScope's ``AutoTokenizer.from_pretrained`` loads ``tokenizer`` from."""
    cached = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    if str(cached) and (cached / TOKENIZER_FILE).is_file():
        return cached.resolve()
    if root is None:
        from ..tokenizer import cache_root

        root = cache_root()
    target = root / "twin-tokenizer"
    if (target / TOKENIZER_FILE).is_file():
        return target.resolve()
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".twin-tokenizer-", dir=root))
    try:
        tokenizer.save_pretrained(str(staging))
        os.replace(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / TOKENIZER_FILE).is_file():
            raise
    return target.resolve()
