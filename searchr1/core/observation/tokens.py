"""Observation text as tokens that can never be control tokens: the tokenizer's BPE without its
added tokens, and the template's observation wrapper split where plain text meets the template's
own tokens (:func:`searchr1.core.protocol.observation_tokens` puts them together)."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from searchr1.core.types import Tokenizer


@dataclass(frozen=True)
class TemplateBoundaries:
    """What the template puts around a tool observation, learnt once per tokenizer.

    ``closing``: tokens that end an assistant turn (Qwen3.5: ``<|im_end|>``, ``\\n``).
    ``observation_prefix`` / ``observation_suffix``: the text before and after the (trimmed)
    tool content in the observation, which runs from the end of ``closing`` to the end of the
    next generation prompt.
    """

    closing: tuple[int, ...]
    observation_prefix: str
    observation_suffix: str


# How many texts each tokenizer's plain encoder remembers: a step's trajectories read the same
# passages and the same wrapper pieces again and again (the offline job's 20 steps encode 49
# distinct texts 6,347 times), and encoding one is a call into the tokenizer every time.
PLAIN_TEXTS_REMEMBERED = 4096
_PLAIN_ENCODERS: "weakref.WeakKeyDictionary[Tokenizer, Callable[[str], tuple[int, ...]]]" = weakref.WeakKeyDictionary()


def _plain_encoder(tokenizer: Tokenizer) -> Callable[[str], tuple[int, ...]]:
    """Text to token ids through the tokenizer's normaliser, pre-tokeniser and BPE model without
    its added tokens (shares the model, costs nothing to build), cached per tokenizer, with its
    last :data:`PLAIN_TEXTS_REMEMBERED` answers."""
    remembered = _PLAIN_ENCODERS.get(tokenizer)
    if remembered is not None:
        return remembered
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(
            f"{type(tokenizer).__name__} has no backend_tokenizer: observations need a fast "
            "(tokenizers-backed) tokenizer to keep special-token strings as plain text"
        )
    from tokenizers import Tokenizer as Encoder

    encoder = Encoder(backend.model)
    encoder.normalizer = backend.normalizer
    encoder.pre_tokenizer = backend.pre_tokenizer

    @functools.lru_cache(maxsize=PLAIN_TEXTS_REMEMBERED)
    def encode(text: str) -> tuple[int, ...]:
        return tuple(encoder.encode(text, add_special_tokens=False).ids)

    _PLAIN_ENCODERS[tokenizer] = encode
    return encode


def forget_remembered_texts(tokenizer: Tokenizer) -> None:
    """Start the tokenizer's plain encoder again with no text remembered (what a measurement of
    the encoding cost starts from)."""
    _PLAIN_ENCODERS.pop(tokenizer, None)


def plain_tokens(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` read as plain text: a string such as ``<|im_end|>`` or
    ``</tool_response>`` is spelled with ordinary vocabulary tokens, never turned into the
    control token of that name. For text holding no such string this equals
    ``tokenizer.encode(text, add_special_tokens=False)``."""
    return list(_plain_encoder(tokenizer)(text))


@dataclass(frozen=True)
class Wrapper:
    """The observation wrapper split where plain text meets the template's own tokens."""

    head: tuple[int, ...]  # tokens up to and including the prefix's last added token
    head_text: str  # prefix text after that token (joins the content's tokenisation)
    tail_text: str  # suffix text before its first added token (joins the content's too)
    tail: tuple[int, ...]  # tokens from the suffix's first added token on


_WRAPPERS: "weakref.WeakKeyDictionary[Tokenizer, dict[TemplateBoundaries, Wrapper]]" = weakref.WeakKeyDictionary()


def observation_wrapper(tokenizer: Tokenizer, boundaries: TemplateBoundaries) -> Wrapper:
    """The wrapper of ``boundaries`` (the template's, :func:`searchr1.core.protocol.template_boundaries`),
    cached per tokenizer and boundaries (thinking on and off end the observation differently)."""
    known = _WRAPPERS.setdefault(tokenizer, {})
    if boundaries in known:
        return known[boundaries]
    added = [token for token in tokenizer.get_added_vocab() if token]
    prefix, suffix = boundaries.observation_prefix, boundaries.observation_suffix
    head_end = max((prefix.rfind(t) + len(t) for t in added if t in prefix), default=0)
    start = min((suffix.find(t) for t in added if t in suffix), default=len(suffix))
    wrapper = Wrapper(
        head=tuple(tokenizer.encode(prefix[:head_end], add_special_tokens=False)),
        head_text=prefix[head_end:],
        tail_text=suffix[:start],
        tail=tuple(tokenizer.encode(suffix[start:], add_special_tokens=False)),
    )
    known[boundaries] = wrapper
    return wrapper


def split_at_control_tokens(tokenizer: Tokenizer, text: str) -> tuple[str, tuple[int, ...], str]:
    """``text`` (template text between two contents) as the plain text before its first added
    token, the tokens from there to the end of its last added token, and the plain text after."""
    added = [token for token in tokenizer.get_added_vocab() if token and token in text]
    if not added:
        return text, (), ""
    start = min(text.find(token) for token in added)
    end = max(text.rfind(token) + len(token) for token in added)
    return text[:start], tuple(tokenizer.encode(text[start:end], add_special_tokens=False)), text[end:]
