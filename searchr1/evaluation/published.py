"""Published exact-match numbers of Search-R1 and of independent reproductions, printed beside
ours by ``eval --protocol search-r1``. Every row names its model and its source; none is this
project's model (Qwen3.5), so each is marked as another model. An offline evaluation's row (the
twin's policy) is marked not comparable with them.

Numbers are as each row's source quotes them: the paper's (Jin et al., "Search-R1: Training
LLMs to Reason and Leverage Search Engines with Reinforcement Learning", arXiv 2503.09516; its
five versions moved some digits, these are the values secondary sources agree on), E5 retriever
over wiki-18, top-3 passages, trained on NQ + HotpotQA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from searchr1.evaluation.card import CARD_VERSION, METRIC_DEFINITIONS, table

BENCHMARKS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
LABELS = {"nq": "NQ", "triviaqa": "TriviaQA", "popqa": "PopQA", "hotpotqa": "HotpotQA",
          "2wikimultihopqa": "2Wiki", "musique": "MuSiQue", "bamboogle": "Bamboogle"}


PAPER = "Jin et al. 2025, arXiv 2503.09516"


def published_card(*, source: str, n_per_source: Mapping[str, int] | None = None) -> dict[str, object]:
    """The comparability card of a published Search-R1-protocol row, as its sources state it
    (fields they do not state are None)."""
    return {
        "card_version": CARD_VERSION,
        "protocol": "search-r1",
        "dataset_sha256": None,
        "corpus": {"name": "wiki-18 (DPR's 2018 Wikipedia, 21,015,324 passages)", "version": "2018-12-20 dump"},
        "retriever": "E5 (intfloat/e5-base-v2) dense retrieval, Faiss flat index",
        "top_k": 3,
        "budgets": {"max_search_calls": 4, "max_assistant_turns": None, "max_assistant_tokens": 500,
                    "max_tool_response_tokens": 500, "max_trajectory_tokens": 4096},
        "decoding": {"temperature": 0.0, "top_p": None, "samples_per_question": 1},
        "metrics": {"em": dict(METRIC_DEFINITIONS["em"])},
        "n_per_source": dict(n_per_source or {}),
        "interval": "none reported",
        "source": source,
    }


@dataclass(frozen=True)
class PublishedRow:
    label: str
    model: str
    source: str
    em: Mapping[str, float]  # benchmark -> EM
    reported_average: float  # the macro average the source states
    note: str = ""
    card: Mapping[str, object] = field(default_factory=dict)  # its comparability card, from its sources

    @property
    def average(self) -> float:
        """The macro mean of the seven numbers (computed as ours is)."""
        return sum(self.em[b] for b in BENCHMARKS) / len(BENCHMARKS)


def _row(label: str, model: str, source: str, values: tuple[float, ...], average: float,
         note: str = "") -> PublishedRow:
    return PublishedRow(label, model, source, dict(zip(BENCHMARKS, values)), average, note,
                        published_card(source=source))


PUBLISHED: tuple[PublishedRow, ...] = (
    _row("Search-R1 paper, GRPO", "Qwen2.5-3B-Instruct", "Jin et al. 2025, arXiv 2503.09516 (Table 3)",
         (0.397, 0.565, 0.391, 0.331, 0.310, 0.124, 0.232), 0.336),
    _row("Search-R1 paper, PPO", "Qwen2.5-7B-Base", "Jin et al. 2025, arXiv 2503.09516 (Table 2)",
         (0.480, 0.638, 0.457, 0.433, 0.382, 0.196, 0.432), 0.431),
    _row("reproduction, verl GRPO", "Qwen2.5-3B-Instruct",
         "Hugging Face blog 'Journey to Reproduce Search-R1' (S. Shin)",
         (0.406, 0.582, 0.420, 0.338, 0.332, 0.111, 0.296), 0.349,
         note="the source states an average of 0.349; the mean of its seven numbers is 0.355"),
    _row("Search-R1 paper, RAG baseline", "Qwen2.5-3B", "Jin et al. 2025, arXiv 2503.09516 (Table 2)",
         (0.348, 0.544, 0.387, 0.255, 0.226, 0.047, 0.080), 0.270),
)


def comparison_table(metrics: Mapping[str, float], *, model: str, retriever: str, offline: bool = False) -> str:
    """Our EM per benchmark and its macro average, then each published row (marked as another
    model) in the same columns; a benchmark we did not evaluate shows ``-``. An ``offline`` row
    (the twin's policy, ``model`` names it) is marked not comparable with the published rows."""
    head = f"  {'':<34}" + "".join(f"{LABELS[b]:>10}" for b in BENCHMARKS) + f"{'Avg':>8}"
    ours = [metrics.get(f"em/{b}") for b in BENCHMARKS]
    evaluated = [v for v in ours if v is not None]
    average = sum(evaluated) / len(evaluated) if evaluated else None

    def cells(values: list[float | None], avg: float | None) -> str:
        return "".join(f"{v:>10.3f}" if v is not None else f"{'-':>10}" for v in values) + (
            f"{avg:>8.3f}" if avg is not None else f"{'-':>8}")

    ours_label = "ours (offline, not comparable)" if offline else "ours"
    lines = [f"EM under the Search-R1 protocol (top-3, greedy), ours: {model} with {retriever}", head,
             f"  {ours_label:<34}" + cells(ours, average)]
    for row in PUBLISHED:
        lines.append(f"  {row.label + ' *':<34}" + cells([row.em.get(b) for b in BENCHMARKS], row.average))
    lines.append("  * another model (and E5 dense retrieval over wiki-18), as published:")
    for row in PUBLISHED:
        card, budgets = row.card, table(row.card, "budgets")
        lines.append(f"    {row.label}: {row.model}; {row.source}" + (f" ({row.note})" if row.note else ""))
        lines.append(f"      card: {table(card, 'corpus')['name']}, {card['retriever']}, top-{card['top_k']}, "
                     f"{budgets['max_search_calls']} searches, {budgets['max_assistant_tokens']}-token "
                     f"turns, greedy, intervals {card['interval']}")
    if offline:
        lines.append(f"  ours is {model} on the offline twin: it tests the pipeline, not a language model, "
                     "and is not comparable with the published rows")
    if len(evaluated) < len(BENCHMARKS):
        lines.append(f"  our average is over the {len(evaluated)} benchmarks evaluated, not all {len(BENCHMARKS)}")
    return "\n".join(lines)
