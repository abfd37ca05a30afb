"""Hand micro-batching and n_k/N reweighting, kept from the lab port for comparison.

The recommended path sends every datum of a step in ONE ``forward_backward`` call: pytrio
splits it internally and normalises every chunk by totals of the whole call, so the result
does not depend on the split (pytrio's ``forward_backward`` computes the totals before it
splits; proven in ``tests/core/test_accumulation.py``).

The lab port instead packed datums into micro-batches itself (first-fit decreasing over the
padded area ``items x longest``), sent one call per micro-batch and multiplied each
micro-batch's advantages by ``n_k / N``. That reproduces the full-batch gradient only if the
server takes a per-sample mean within each call and *sums* the calls' gradients; under a
per-token mean it does not (``test_nk_over_n_is_not_exact_under_per_token_mean``).
``python cli.py probe-loss`` tells which case a service is in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from searchr1.core.datum import TrainingDatum
from searchr1.core.types import DEFAULT_MAX_TRAJECTORY_TOKENS

if TYPE_CHECKING:
    from pytrio.types import Datum

MAX_DATUM_TOKENS = DEFAULT_MAX_TRAJECTORY_TOKENS
MAX_MICRO_BATCH_ITEMS = 32
MAX_MICRO_BATCH_PADDED_TOKENS = 64_000


class PackingError(ValueError):
    """A datum cannot be placed in any micro-batch. The message names it."""


def datum_size(item: TrainingDatum) -> int:
    return item.num_tokens


def padded_tokens(micro_batch: Sequence[TrainingDatum]) -> int:
    """The area a padded micro-batch occupies: items x longest item."""
    return len(micro_batch) * max((datum_size(i) for i in micro_batch), default=0)


def pack_micro_batches(
    datums: Sequence[TrainingDatum],
    *,
    max_datum_tokens: int = MAX_DATUM_TOKENS,
    max_items: int = MAX_MICRO_BATCH_ITEMS,
    max_padded_tokens: int = MAX_MICRO_BATCH_PADDED_TOKENS,
) -> list[list[TrainingDatum]]:
    """First-fit decreasing: longest datum first, each into the first micro-batch where
    ``items <= max_items`` and ``items x longest <= max_padded_tokens`` still hold.

    Every datum lands in exactly one micro-batch. Because items arrive longest first, a
    batch's longest item is its first one.
    """
    for name, value in (
        ("max_datum_tokens", max_datum_tokens),
        ("max_items", max_items),
        ("max_padded_tokens", max_padded_tokens),
    ):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    for item in datums:
        size = datum_size(item)
        if size > max_datum_tokens or size > max_padded_tokens:
            raise PackingError(
                f"datum of trajectory q{item.question_index}/g{item.group_index} has {size} "
                f"tokens, over max_datum_tokens={max_datum_tokens} or "
                f"max_padded_tokens={max_padded_tokens}"
            )
    batches: list[list[TrainingDatum]] = []
    for item in sorted(datums, key=datum_size, reverse=True):  # stable for equal sizes
        size = datum_size(item)
        for batch in batches:
            longest = datum_size(batch[0])
            if (
                len(batch) + 1 <= max_items
                and (len(batch) + 1) * max(longest, size) <= max_padded_tokens
            ):
                batch.append(item)
                break
        else:
            batches.append([item])
    return batches


def scale_advantages(datum: Datum, factor: float) -> Datum:
    """A copy of ``datum`` with its advantages multiplied by ``factor`` (in float32)."""
    from pytrio.types import Datum, TensorData  # loaded when the first datum is scaled

    inputs = dict(datum.loss_fn_inputs)
    advantages = inputs["advantages"].to_numpy().astype(np.float32)
    inputs["advantages"] = TensorData.from_numpy(advantages * np.float32(factor))
    return Datum(model_input=datum.model_input, loss_fn_inputs=inputs)


def weight_micro_batch_for_global_mean(
    micro_batch: Sequence[TrainingDatum], total_samples: int
) -> list[TrainingDatum]:
    """New datums with advantages multiplied by ``n_k / N`` (``n_k = len(micro_batch)``,
    ``N = total_samples``). The inputs are not modified.

    The lab port passed ``N = len(trajectories)``, counting trajectories that sent no datum; pass
    the number of datums instead if the weights are to sum to 1 over the micro-batches.
    """
    if not micro_batch:
        return []
    if total_samples <= 0:
        raise ValueError(f"total_samples must be positive, got {total_samples}")
    if len(micro_batch) > total_samples:
        raise ValueError(
            f"micro-batch of {len(micro_batch)} datums is larger than total_samples={total_samples}"
        )
    factor = len(micro_batch) / total_samples
    return [replace(item, datum=scale_advantages(item.datum, factor)) for item in micro_batch]
