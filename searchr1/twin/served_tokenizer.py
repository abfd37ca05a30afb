"""The tokenizer the SDK loads for the twin's model, served from the local exact tokenizer.

pytrio loads the model's tokenizer itself, inside the first ``forward``/``forward_backward``
of a training client (and in ``get_tokenizer()``), with ModelScope's ``AutoTokenizer`` on the
``model_id`` that run creation returned: first ``local_files_only=True``, then the network.
A directory path is a valid ``model_id`` for that loader, and it needs no ModelScope cache
layout or environment variable (both differ across ModelScope versions), so the twin answers
run creation with the path of a tokenizer directory holding the exact Qwen3.5 tokenizer
(:mod:`searchr1.runtime.tokenizer`). The catalog (``get_server_capabilities()``) and ``model_alias``
keep the real model name, so code that names models sees ``Qwen/Qwen3.5-4B`` as live; only
``training_client.model_id`` and ``sampling_client.model_id`` show the path.

The directory (``$SEARCHR1_CACHE_DIR/twin-tokenizer/<key>``, written once per machine,
write-then-rename) holds the same ``tokenizer.json`` and chat template, and a
``tokenizer_config.json`` that also lists the added tokens (``added_tokens_decoder``):
transformers then skips re-reading the 33 MB ``tokenizer.json`` in Python, which halves every
load the SDK makes. The loaded tokenizer is the same (a test compares its serialisation).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from searchr1.basics.fileio import staging_directory
from searchr1.runtime.tokenizer import Qwen35Tokenizer, list_added_tokens

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"


def _fill(staging: Path, tokenizer: Qwen35Tokenizer, source: Path | None) -> None:
    if source is None:
        tokenizer.save_pretrained(str(staging))
    else:
        for item in source.iterdir():
            if not item.is_file() or item.name == "searchr1-manifest.json":
                continue
            try:
                if item.name == CONFIG_FILE:  # rewritten below: a copy, never a link into the cache
                    raise OSError
                os.link(item, staging / item.name)
            except OSError:
                shutil.copy2(item, staging / item.name)
    list_added_tokens(staging, tokenizer)


def served_tokenizer_dir(tokenizer: Qwen35Tokenizer, root: Path | None = None) -> Path:
    """A directory ModelScope's ``AutoTokenizer.from_pretrained`` loads ``tokenizer`` from."""
    if root is None:
        from searchr1.runtime.tokenizer import cache_root

        root = cache_root() / "twin-tokenizer"
    named = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    saved = bool(str(named)) and (named / TOKENIZER_FILE).is_file() and (named / CONFIG_FILE).is_file()
    source = named if saved else None
    key = source.resolve().name if source is not None else \
        hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:20]
    target = root / key
    if (target / TOKENIZER_FILE).is_file() and (target / CONFIG_FILE).is_file():
        return target.resolve()
    root.mkdir(parents=True, exist_ok=True)
    staging = staging_directory(".staging-", root)
    try:
        _fill(staging, tokenizer, source)
        os.replace(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / TOKENIZER_FILE).is_file():
            raise
    return target.resolve()
