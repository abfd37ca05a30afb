"""Where a sampled sequence ends and what is returned for it: the request's stop rules and
the twin's stop-token convention, applied to what the policy drew. Pure functions.

A sequence stops at the first token that is a requested stop token id, or that completes a
requested stop string (a stop string that is exactly one vocabulary token is matched as that
token), or at the policy's own end of turn. That token is *the stop token*. Drawing the whole
sequence and cutting it there is the same distribution as stopping while drawing, and the
logprobs of the kept tokens do not change. What is returned follows the
:class:`~searchr1.twin.config.StopConvention`: the stop token in ``tokens`` (with its logprob)
or not, the stop string at the end of ``text`` or not. ``text`` is the decoded content
(special tokens skipped). A sequence that never stops ends with ``length``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from searchr1.basics.json_types import as_int
from searchr1.core.types import Tokenizer
from searchr1.twin.config import StopConvention
from searchr1.twin.policy import SampledSequence

STOP = "stop"
LENGTH = "length"


def request_values(params: Mapping[str, object], name: str) -> list[object]:
    """What a sampling request's ``name`` field lists (absent, None or empty: nothing); a string
    ``stop`` is one stop string."""
    value = params.get(name) or ()
    if name == "stop" and isinstance(value, str):
        return [value]
    if not isinstance(value, Iterable):
        raise TypeError(f"sampling_params.{name}: expected a list, got {type(value).__name__}")
    return list(value)


@dataclass(frozen=True)
class StopRules:
    token_ids: frozenset[int]
    strings: tuple[str, ...]  # strings that are not a single vocabulary token

    @classmethod
    def from_request(cls, sampling_params: Mapping[str, object], tokenizer: Tokenizer) -> StopRules:
        """pytrio sends stop strings as ``stop`` and stop token ids as ``stop_token_ids``."""
        ids = {as_int(i, "stop_token_ids") for i in request_values(sampling_params, "stop_token_ids")}
        strings = [str(s) for s in request_values(sampling_params, "stop")]
        multi = []
        for text in strings:
            single = tokenizer.encode(text, add_special_tokens=False)
            if len(single) == 1 and tokenizer.decode(single, skip_special_tokens=False) == text:
                ids.add(int(single[0]))
            elif text:
                multi.append(text)
        return cls(frozenset(ids), tuple(multi))


@dataclass(frozen=True)
class FinishedSequence:
    tokens: list[int]
    logprobs: list[float]
    text: str | None
    stop_reason: str


def stop_position(tokens: Sequence[int], rules: StopRules,
                  decode: Callable[[list[int]], str]) -> tuple[int, str | None] | None:
    """Index of the stop token and the stop string it completed (``None`` for a token id),
    or ``None`` when no rule matches."""
    longest = max((len(s) for s in rules.strings), default=0)
    window = 4 * longest + 2  # a character spans at most four byte-level tokens
    for index, token in enumerate(tokens):
        if token in rules.token_ids:
            return index, None
        if rules.strings:
            text = decode(list(tokens[max(0, index - window): index + 1]))
            for string in rules.strings:
                if string in text:
                    return index, string
    return None


def finish(
    sequence: SampledSequence,
    rules: StopRules,
    convention: StopConvention,
    *,
    decode: Callable[[list[int], bool], str],
    return_text: bool,
) -> FinishedSequence:
    """Apply the stop rules and the convention to one sampled sequence."""
    tokens, logprobs = list(sequence.tokens), list(sequence.logprobs)
    found = stop_position(tokens, rules, lambda ids: decode(ids, False))
    if found is None and sequence.stopped and tokens:
        found = (len(tokens) - 1, None)
    if found is None:
        text = decode(tokens, True) if return_text else None
        return FinishedSequence(tokens, logprobs, text, LENGTH)
    end, string = found
    kept = end + 1 if convention.token_in_tokens else end
    text = None
    if return_text:
        if string is None:  # a stop token: the content is everything before it
            stop_text = decode([tokens[end]], False)
            content = decode(tokens[:end], True)
        else:  # a stop string: the content is the text before its first occurrence
            stop_text = string
            full = decode(tokens[: end + 1], False)
            content = full[: full.index(string)]
        text = content + (stop_text if convention.string_in_text else "")
    return FinishedSequence(tokens[:kept], logprobs[:kept], text, STOP)
