"""Run the selected figures with one tokenizer and collect them."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from searchr1.bench.report import Figure
from searchr1.runtime.tokenizer import Qwen35Tokenizer

FIGURE_NUMBERS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19)
# Figures 8 and 9 (BM25 over a generated 1M-passage corpus, and against Lucene) and 10 (six
# learning runs and the KL penalty's cost) take minutes and figure 9 needs its own set-up; figure
# 11 (pytrio's CPU per request beside a busy loop) explains figure 5 and holds no target; figure
# 12 (sixteen learning runs on the page questions, one tool against two) takes minutes; 13 (a
# paper-sized step's search over figure 8's index) builds that index first; 14 (24 learning runs:
# three kinds of credit on 8 seeds), 15 (16: thinking off and on) and 16 (16 runs of 26 steps:
# full and fold on the long-horizon world) and 17 (48 runs: three corrections under two losses on a
# mismatched sampler, 8 seeds) and 18 (16 runs, each evaluated after every step: uniform sampling
# against the probe's filter and the curriculum) and 19 (three served runs of 28 steps and 16 learning runs:
# partial rollouts against the bounded overlap) take minutes: they run only when named with --only.
DEFAULT_FIGURES = (1, 2, 3, 4, 5, 6, 7)


def _builders() -> dict[int, Callable[..., Figure]]:
    from searchr1.bench.algorithms import algorithms_figure
    from searchr1.bench.client_contention import client_contention_figure
    from searchr1.bench.correction import correction_figure
    from searchr1.bench.credit import credit_figure
    from searchr1.bench.curriculum import curriculum_figure
    from searchr1.bench.local_search import local_search_figure
    from searchr1.bench.long_horizon import long_horizon_figure
    from searchr1.bench.lucene import lucene_figure
    from searchr1.bench.off_policy import learning_speed_figure, off_policy_throughput_figure
    from searchr1.bench.packing import packing_figure
    from searchr1.bench.page_world import page_world_figure
    from searchr1.bench.paper_step import paper_step_figure
    from searchr1.bench.partial_rollouts import partial_rollouts_figure
    from searchr1.bench.protocol_cpu import protocol_cpu_figure
    from searchr1.bench.scheduling import scheduling_figure
    from searchr1.bench.search_calls import search_calls_figure
    from searchr1.bench.step_overhead import step_overhead_figure
    from searchr1.bench.thinking import thinking_figure

    return {
        1: scheduling_figure,
        2: protocol_cpu_figure,
        3: packing_figure,
        4: search_calls_figure,
        5: step_overhead_figure,
        6: off_policy_throughput_figure,
        7: learning_speed_figure,
        8: local_search_figure,
        9: lucene_figure,
        10: algorithms_figure,
        11: client_contention_figure,
        12: page_world_figure,
        13: paper_step_figure,
        14: credit_figure,
        15: thinking_figure,
        16: long_horizon_figure,
        17: correction_figure,
        18: curriculum_figure,
        19: partial_rollouts_figure,
    }


def parse_only(text: str | None) -> list[int]:
    """``"1,3"`` -> ``[1, 3]``; ``None`` or ``""`` -> the default figures (1-7)."""
    if not text:
        return list(DEFAULT_FIGURES)
    chosen = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) not in FIGURE_NUMBERS:
            raise ValueError(f"--only takes figure numbers from {FIGURE_NUMBERS}, got {part!r}")
        chosen.add(int(part))
    if not chosen:
        raise ValueError("--only named no figure")
    return sorted(chosen)


def run_figures(numbers: Iterable[int], *, tokenizer: Qwen35Tokenizer | None = None, seed: int = 0, quick: bool = False,
                passages: int | None = None, paper_sizes: bool = False,
                on_start: Callable[[int], None] | None = None,
                on_done: Callable[[Figure], None] | None = None) -> list[Figure]:
    if tokenizer is None:
        from searchr1.runtime.tokenizer import shared_tokenizer

        tokenizer = shared_tokenizer()
    builders = _builders()
    figures = []
    for number in numbers:
        if on_start is not None:
            on_start(number)
        extra: dict[str, int | bool | None] = {"passages": passages} if number in (8, 9, 13) else {}
        if number == 5:
            extra["paper_sizes"] = paper_sizes
        figure = builders[number](tokenizer, seed=seed, quick=quick, **extra)
        figures.append(figure)
        if on_done is not None:
            on_done(figure)
    return figures
