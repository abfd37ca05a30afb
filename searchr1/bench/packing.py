"""Figure 3: the lab port's micro-batch packing (first-fit decreasing) against its lower bound.

Datum lengths are drawn from a trajectory-length model built on the real prompt length and
the lab port's limits (its ``train.py``: 32 items and 64,000 padded tokens per micro-batch): a
prompt of about 520 tokens (the system prompt with the tool block, measured with the real
tokenizer, plus the question), 0-4 searches, each assistant turn lognormal (median 120 tokens,
capped at ``max_assistant_tokens`` 1024), each observation three Wikipedia-sized items (60-300
tokens plus their title/source/URL lines), kept whole while under ``max_tool_response_tokens``
1024, and the trajectory cut at 8192.
All 64 trajectories of a step send a datum (the most packing pressure; degenerate groups
send none in practice).

Per step the lower bound on micro-batches is the largest of: the real tokens over the area cap
(64,000), the datums over the item cap (32), and ``sum_i 1 / min(32, floor(64000 / len_i))``
(a batch whose longest datum is ``L`` holds at most ``min(32, 64000 // L)`` datums, so each
datum needs at least that share of one). Reported over many steps: micro-batches / lower
bound, and padded tokens (items x longest, summed) / real tokens.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from searchr1.core.datum import TrainingDatum
from searchr1.core.types import Tokenizer
from searchr1.training.packing import (
    MAX_DATUM_TOKENS,
    MAX_MICRO_BATCH_ITEMS,
    MAX_MICRO_BATCH_PADDED_TOKENS,
    pack_micro_batches,
    padded_tokens,
)
from searchr1.bench.report import Figure, Measure
from searchr1.bench.workload import WorkloadSpec

OBSERVATION_WRAPPER = 17   # tokens the template puts around a tool observation (Qwen3.5)
ITEM_FRAME = 30            # "[k] Title: ...", "Source: Wikipedia", "URL: ..." lines of one item
MAX_TOOL_RESPONSE_TOKENS = 1024
MAX_ASSISTANT_TOKENS = 1024


@dataclass(frozen=True)
class LengthModel:
    prompt_tokens: int = 500
    question_tokens: tuple[int, int] = (8, 40)
    item_tokens: tuple[int, int] = (60, 300)
    items_per_search: int = 3
    spec: WorkloadSpec = field(default_factory=WorkloadSpec)

    def trajectory_tokens(self, rng: np.random.Generator) -> int:
        spec = self.spec
        weights = np.asarray(spec.search_weights, dtype=float)
        searches = int(rng.choice(len(weights), p=weights / weights.sum()))
        total = self.prompt_tokens + int(rng.integers(*self.question_tokens, endpoint=True))
        for turn in range(searches + 1):
            generated = rng.lognormal(math.log(spec.turn_tokens_median), spec.turn_tokens_sigma)
            total += int(min(MAX_ASSISTANT_TOKENS, max(spec.turn_tokens_min, generated)))
            if turn == searches:
                break
            content = 0
            for _ in range(self.items_per_search):
                item = int(rng.integers(*self.item_tokens, endpoint=True)) + ITEM_FRAME
                if content + item > MAX_TOOL_RESPONSE_TOKENS:
                    break
                content += item
            total += content + OBSERVATION_WRAPPER
        return min(total, MAX_DATUM_TOKENS + 1)


def _stub(num_tokens: int, index: int) -> TrainingDatum:
    """A datum as the packer sees it: only its size matters."""
    return TrainingDatum(datum=None, num_tokens=num_tokens, loss_tokens=0,
                         question_index=index // 8, group_index=index % 8)


def lower_bounds(lengths: list[int]) -> dict[str, int]:
    area = math.ceil(sum(lengths) / MAX_MICRO_BATCH_PADDED_TOKENS)
    count = math.ceil(len(lengths) / MAX_MICRO_BATCH_ITEMS)
    share = sum(1.0 / min(MAX_MICRO_BATCH_ITEMS, MAX_MICRO_BATCH_PADDED_TOKENS // n) for n in lengths)
    per_item = math.ceil(share - 1e-9)
    return {"area": area, "count": count, "per_item": per_item, "value": max(area, count, per_item)}


def packing_figure(tokenizer: Tokenizer | None = None, *, seed: int = 0, quick: bool = False, steps: int | None = None,
                   trajectories_per_step: int = 64, model: LengthModel | None = None) -> Figure:
    started = time.perf_counter()
    steps = steps if steps is not None else (20 if quick else 300)
    model = model or LengthModel()
    rng = np.random.default_rng(seed + 303)
    batches = bound = bound_area = bound_count = 0
    real = padded = 0
    worst = 0.0
    lengths_seen: list[int] = []
    for _ in range(steps):
        lengths = [model.trajectory_tokens(rng) - 1 for _ in range(trajectories_per_step)]  # shifted input
        lengths_seen.extend(lengths)
        packed = pack_micro_batches([_stub(n, i) for i, n in enumerate(lengths)])
        bounds = lower_bounds(lengths)
        batches += len(packed)
        bound += bounds["value"]
        bound_area += bounds["area"]
        bound_count += bounds["count"]
        worst = max(worst, len(packed) / bounds["value"])
        real += sum(lengths)
        padded += sum(padded_tokens(batch) for batch in packed)
    quantiles = np.percentile(lengths_seen, [10, 50, 90, 99]).tolist()
    figure = Figure(
        number=3, name="packing", title="Packing (the lab port's limits)",
        measures=[
            Measure("micro_batches_over_lower_bound", "micro-batches / lower bound", batches / bound,
                    1.25, "<=", "x", target_source="bench"),
            Measure("padded_over_real_tokens", "padded tokens / real tokens", padded / real, unit="x"),
            Measure("micro_batches_per_step", "micro-batches per step", batches / steps, digits=2),
            Measure("area_bound_per_step", "  bound: real tokens / 64,000", bound_area / steps, digits=2),
            Measure("count_bound_per_step", "  bound: datums / 32", bound_count / steps, digits=2),
        ],
        details={
            "steps": steps, "datums_per_step": trajectories_per_step,
            "limits": {"max_datum_tokens": MAX_DATUM_TOKENS, "max_items": MAX_MICRO_BATCH_ITEMS,
                       "max_padded_tokens": MAX_MICRO_BATCH_PADDED_TOKENS},
            "micro_batches": batches, "lower_bound": bound, "worst_step_ratio": worst,
            "real_tokens": real, "padded_tokens": padded,
            "datum_tokens_p10_p50_p90_p99": quantiles,
            "length_model": {"prompt_tokens": model.prompt_tokens, "question_tokens": model.question_tokens,
                             "item_tokens": model.item_tokens, "items_per_search": model.items_per_search,
                             "search_weights": model.spec.search_weights,
                             "turn_tokens_median": model.spec.turn_tokens_median,
                             "turn_tokens_sigma": model.spec.turn_tokens_sigma},
        },
        notes=[(f"{steps} steps x {trajectories_per_step} datums, median {quantiles[1]:.0f} tokens "
               f"(p90 {quantiles[2]:.0f}); lower bound per step = max(area, count, per-datum share). "
               "Sorted by length, first-fit closes batches in order (it packs exactly as next-fit "
               "decreasing), so the padding comes from the spread of lengths within a batch")],
    )
    figure.seconds = time.perf_counter() - started
    return figure
