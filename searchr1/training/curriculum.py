"""The curriculum (``--curriculum``): each step draws its questions with weight ``1 - success``.

Kimi k1.5's curriculum sampling (the RLVR chapter): a question's weight is one minus its success
rate, so questions the policy already solves stop taking the batch, and the hard ones come back
until they are learnt. Here:

* a question's success rate starts from the probe's pass rate with tools (``--probe``; 0 for a
  question the probe does not hold, or without a probe), and becomes the share of right answers
  (exact match) of the latest group the run sampled for it;
* its weight is ``max(--curriculum-floor, 1 - success)``: a solved question is still drawn now and
  then, and can come back if the policy forgets it;
* step ``b`` draws ``--questions-per-batch`` distinct questions, each draw in turn with probability
  proportional to the weights of those not yet drawn (numpy's ``choice`` without replacement), from a
  generator seeded by ``(seed, b)``;
* the weights of batch ``b`` follow the outcomes of batches ``< b - K`` (``K`` =
  ``--max-steps-off-policy``): those are the batches whose steps have finished when batch ``b``
  starts rolling out, whatever the timing.

Each step's outcomes are recorded in ``curriculum.jsonl`` in the run directory; a resumed run
replays those of the steps before its checkpoint, so it draws exactly what the uninterrupted run
drew. Pure apart from the file it reads and appends to (:class:`CurriculumRecord`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from searchr1.basics.fileio import append_text, write_text_atomically
from searchr1.core.types import SearchExample, Trajectory
from searchr1.evaluation.probe import Probe
from searchr1.training.config import TrainConfig

CURRICULUM_FILE = "curriculum.jsonl"
DRAW_STREAM = 0x6375_7272  # keeps the curriculum's generator apart from every other seeded stream

Outcomes = dict[str, tuple[int, int]]  # question id -> (right, attempts) of one group


def group_outcomes(trajectories: Iterable[Trajectory]) -> Outcomes:
    """Right answers (exact match) and attempts of each question sampled, by id; attempts whose
    sampling or environment failed are left out (they say nothing about the question)."""
    outcomes: dict[str, list[int]] = {}
    for trajectory in trajectories:
        if trajectory.sampler_error or trajectory.env_error:
            continue
        counted = outcomes.setdefault(trajectory.example.id, [0, 0])
        counted[0] += int(trajectory.score.exact_match)
        counted[1] += 1
    return {question: (right, attempts) for question, (right, attempts) in outcomes.items()}


def draw_weights(success: Sequence[float] | np.ndarray, floor: float) -> np.ndarray:
    """``max(floor, 1 - success)`` per question; all zero (floor 0, all solved) draws uniformly."""
    weights = np.maximum(floor, 1.0 - np.clip(np.asarray(success, dtype=np.float64), 0.0, 1.0))
    return weights if weights.sum() > 0 else np.ones_like(weights)


def weighted_draw(weights: np.ndarray, size: int, seed: int, batch_index: int) -> list[int]:
    """``size`` distinct indices (all of them when fewer), each drawn in turn with probability
    proportional to the weights of those left; questions of zero weight come last, uniformly, and
    before them those whose weight is too small to hold a share of the sum (it rounds to 0)."""
    rng = np.random.default_rng([DRAW_STREAM, seed, batch_index])
    total = float(weights.sum())
    drawable = np.flatnonzero(weights / total > 0) if total > 0 else np.array([], dtype=np.int64)
    first = min(size, len(drawable))
    chosen: list[int] = []
    if first:
        p = weights[drawable] / weights[drawable].sum()
        chosen = [int(i) for i in rng.choice(drawable, size=first, replace=False, p=p)]
    rest: list[int] = []
    tiny = np.setdiff1d(np.flatnonzero(weights > 0), drawable)
    if len(tiny):
        rest += [int(tiny[i]) for i in rng.permutation(len(tiny))]
    zero = np.flatnonzero(weights <= 0)
    rest += [int(zero[i]) for i in rng.permutation(len(zero))]
    return chosen + rest[:size - first]


class Curriculum:
    """Each step's questions by :func:`weighted_draw` over the success rates the outcomes of the
    steps so far give (see the module docstring)."""

    def __init__(self, examples: Sequence[SearchExample], prior: Mapping[str, float], *, seed: int, floor: float,
                 questions_per_batch: int, lag: int) -> None:
        self.examples = list(examples)
        self.seed, self.floor, self.size, self.lag = seed, floor, questions_per_batch, lag
        self.prior = np.array([prior.get(example.id, 0.0) for example in self.examples], dtype=np.float64)
        self.success = self.prior.copy()
        self._index = {example.id: i for i, example in enumerate(self.examples)}
        self.outcomes: dict[int, Outcomes] = {}  # batch index -> its groups' outcomes
        self._applied = 0  # outcomes of batches < this are in ``success``

    def record(self, batch_index: int, outcomes: Outcomes) -> None:
        self.outcomes[batch_index] = outcomes

    def weights_for(self, batch_index: int) -> np.ndarray:
        """The weights batch ``batch_index`` draws with: the outcomes of batches ``< batch_index - lag``
        applied in order to the prior (whatever order batches are asked in)."""
        upto = max(0, batch_index - self.lag)
        if upto < self._applied:  # an earlier batch than the last one asked: start again from the prior
            self.success, self._applied = self.prior.copy(), 0
        for batch in range(self._applied, upto):
            if batch not in self.outcomes:
                raise RuntimeError(f"batch {batch_index} draws before the outcomes of batch {batch} are known")
            for question, (right, attempts) in self.outcomes[batch].items():
                if question in self._index and attempts:
                    self.success[self._index[question]] = right / attempts
        self._applied = upto
        return draw_weights(self.success, self.floor)

    def batch(self, batch_index: int) -> list[SearchExample]:
        """The questions of batch ``batch_index`` (batches asked in increasing order)."""
        chosen = weighted_draw(self.weights_for(batch_index), self.size, self.seed, batch_index)
        return [self.examples[i] for i in chosen]


def curriculum_of(config: TrainConfig, examples: Sequence[SearchExample], probe: Probe | None) -> Curriculum | None:
    """The run's curriculum (``--curriculum``), its prior the probe's pass rates with tools; else None."""
    if not config.curriculum:
        return None
    prior = {} if probe is None else {q.id: q.with_tools.rate for q in probe.questions.values()}
    return Curriculum(examples, prior, seed=config.seed, floor=config.curriculum_floor,
                      questions_per_batch=config.questions_per_batch, lag=config.max_steps_off_policy)


def question_metrics(trajectories: Sequence[Trajectory], probe: Probe | None, drop_guessable: int) -> dict[str, float]:
    """What the step spent its batch on: ``data/solved_share``, the share of its questions whose
    group was all right, and with a probe ``data/guessable_share``, the share the probe answered
    right closed-book in at least ``max(1, --drop-guessable)`` attempts, and
    ``data/solved_or_guessable_share``, either."""
    outcomes = group_outcomes(trajectories)
    count = len(outcomes) or 1
    solved = {question for question, (right, attempts) in outcomes.items() if right == attempts > 0}
    metrics = {"data/solved_share": len(solved) / count}
    if probe is not None:
        threshold = max(1, drop_guessable)
        guessable = {q.id for q in probe.questions.values() if q.closed_book.right >= threshold} & set(outcomes)
        metrics["data/guessable_share"] = len(guessable) / count
        metrics["data/solved_or_guessable_share"] = len(solved | guessable) / count
    return metrics


@dataclass(frozen=True)
class CurriculumRecord:
    """``curriculum.jsonl`` of a run: one line per finished step, ``{"step": b, "outcomes": {id: [right, n]}}``."""

    path: Path

    @classmethod
    def of_run(cls, run_dir: str | Path) -> CurriculumRecord:
        return cls(Path(run_dir) / CURRICULUM_FILE)

    def append(self, step: int, outcomes: Outcomes) -> None:
        line = {"step": step, "outcomes": {question: list(counts) for question, counts in sorted(outcomes.items())}}
        append_text(self.path, json.dumps(line, ensure_ascii=False) + "\n")

    def read_before(self, step: int) -> dict[int, Outcomes]:
        """The outcomes of steps ``< step`` (the later lines of an interrupted session are dropped
        from the file: the resumed run writes them again)."""
        if not self.path.is_file():
            return {}
        kept: list[str] = []
        found: dict[int, Outcomes] = {}
        for line in self.path.read_text("utf-8").splitlines():
            try:
                record = json.loads(line)
                batch = int(record["step"])
                outcomes = {str(q): (int(c[0]), int(c[1])) for q, c in record["outcomes"].items()}
            except (ValueError, KeyError, TypeError, IndexError, AttributeError):
                continue  # a torn last line
            if batch < step:
                kept.append(line)
                found[batch] = outcomes
        write_text_atomically(self.path, "".join(f"{line}\n" for line in kept))
        return found
