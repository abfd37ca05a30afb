"""Observation text as tokens that can never be control tokens: the tokenizer's BPE without its
added tokens, and the template's observation wrapper split where plain text meets the template's
own tokens (:func:`searchr1.core.protocol.observation_tokens` puts them together)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from searchr1.core.types import Tokenizer

if TYPE_CHECKING:
    from tokenizers import Tokenizer as Encoder

    from searchr1.core.protocol import TemplateBoundaries

_PLAIN_ENCODERS: "weakref.WeakKeyDictionary[Tokenizer, Encoder]" = weakref.WeakKeyDictionary()


def _plain_encoder(tokenizer: Tokenizer) -> Encoder:
    """The tokenizer's normaliser, pre-tokeniser and BPE model without its added tokens
    (shares the model, costs nothing to build), cached per tokenizer."""
    encoder = _PLAIN_ENCODERS.get(tokenizer)
    if encoder is None:
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
        _PLAIN_ENCODERS[tokenizer] = encoder
    return encoder


def plain_tokens(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` read as plain text: a string such as ``<|im_end|>`` or
    ``</tool_response>`` is spelled with ordinary vocabulary tokens, never turned into the
    control token of that name. For text holding no such string this equals
    ``tokenizer.encode(text, add_special_tokens=False)``."""
    return list(_plain_encoder(tokenizer).encode(text, add_special_tokens=False).ids)


@dataclass(frozen=True)
class Wrapper:
    """The observation wrapper split where plain text meets the template's own tokens."""

    head: tuple[int, ...]  # tokens up to and including the prefix's last added token
    head_text: str  # prefix text after that token (joins the content's tokenisation)
    tail_text: str  # suffix text before its first added token (joins the content's too)
    tail: tuple[int, ...]  # tokens from the suffix's first added token on


_WRAPPERS: "weakref.WeakKeyDictionary[Tokenizer, tuple[TemplateBoundaries, Wrapper]]" = weakref.WeakKeyDictionary()


def observation_wrapper(tokenizer: Tokenizer, boundaries: TemplateBoundaries) -> Wrapper:
    """The wrapper of ``boundaries`` (the template's, :func:`searchr1.core.protocol.template_boundaries`),
    cached per tokenizer."""
    cached = _WRAPPERS.get(tokenizer)
    if cached is not None and cached[0] is boundaries:
        return cached[1]
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
    _WRAPPERS[tokenizer] = (boundaries, wrapper)
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
