"""The twin's model collapse (``TwinFaults.collapse_from``, ``--offline-fault collapse@N``).

A collapsed sampler ignores its policy and answers every request with the same degenerate
turn: one sentence said over and over, no ``Answer:`` line, no tool call, ended with
``<|im_end|>``, every token with logprob 0 (a policy that has become deterministic). The
rollout ends such a trajectory as a reply without an answer, so the format-valid rate and the
reward fall to their floor, every group is degenerate and the entropy estimate drops to 0:
what the Search-R1 collapse reports describe, produced on demand for the collapse guard's
tests. The ledger of strict mode records these tokens like any others.
"""

from __future__ import annotations

from searchr1.runtime.tokenizer import Qwen35Tokenizer
from searchr1.twin.policy import SampledSequence

COLLAPSED_TEXT = "Let me think about it again. " * 3
STOP_TOKEN = "<|im_end|>"


def is_collapsed(collapse_from: int | None, weights_version: int) -> bool:
    """Whether a sampler on weights with ``weights_version`` updates is collapsed."""
    return collapse_from is not None and weights_version >= collapse_from


def collapsed_sequences(tokenizer: Qwen35Tokenizer, count: int, *, max_tokens: int) -> list[SampledSequence]:
    """``count`` copies of the degenerate turn (cut at ``max_tokens``)."""
    tokens = list(tokenizer.encode(COLLAPSED_TEXT.strip(), add_special_tokens=False))
    tokens.append(int(tokenizer.convert_tokens_to_ids(STOP_TOKEN)))
    kept = tokens[:max_tokens]
    return [SampledSequence(list(kept), [0.0] * len(kept), len(kept) == len(tokens)) for _ in range(count)]
