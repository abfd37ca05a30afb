"""A sample of each training step's trajectories, kept in the run directory so that people can
read what the model did (``python cli.py show RUN_DIR``).

    transcripts.jsonl    a few trajectory records per finished step, appended and fsynced

Each line is :func:`searchr1.evaluation.metrics.trajectory_record` (every turn's text, every query
and observation, reward, EM, format, termination) plus what only training has: ``step``,
``question_index``, ``advantage`` (the trajectory's, group-relative), each turn's ``advantage``
(what its tokens were trained with) and ``sampler`` (the weights that sampled it, in finished
steps), with ``--credit gigpo`` its ``step_group`` (turns its step advantage was measured among)
and with ``--step-reward`` its ``step_reward``, ``excluded`` (why the trajectory sent no datum,
if it did not) and, with ``--judge-weight``, the ``judge``'s verdict on its answer (an eval record's
``judge``, or the ``error`` that kept the judge from one). The trainer calls::

    records = [transcript_record(t, step) for t in select_transcripts(trajectories, count)]
    append_transcripts(run_dir, step, records)

A resumed run repeats the steps after its last checkpoint and appends their transcripts again.
Every append stamps its records with one random ``block`` id, and :func:`read_run_transcripts`
keeps, for every step, only the block written last (the metrics file does the same by moving
rewound lines aside).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from searchr1.core.errors import UserError
from searchr1.evaluation.metrics import EvalFileError, read_eval_records, trajectory_record, turn_record
from searchr1.basics.json_types import JsonObject, JsonValue
from searchr1.basics.fileio import append_text, json_line
from searchr1.basics.jsonl import JsonLines, Surrogates, TornLines, decode_json
from searchr1.core.types import Trajectory

TRANSCRIPTS_FILE = "transcripts.jsonl"
DEFAULT_TRANSCRIPTS_PER_STEP = 4


class TranscriptFileError(UserError, ValueError):
    """A transcript source cannot be read; the message names the path (and line)."""


# --- choosing what to keep (pure) --------------------------------------------------------


def _position(trajectory: Trajectory) -> tuple[int, int]:
    return trajectory.question_index, trajectory.group_index


def select_transcripts(
    trajectories: Sequence[Trajectory], count: int = DEFAULT_TRANSCRIPTS_PER_STEP
) -> list[Trajectory]:
    """``min(count, len(trajectories))`` trajectories of one step, chosen to show a mix.

    First one trajectory per distinct reward (highest reward first), each from a question not
    shown yet when there is one; then trajectories of questions not shown yet; then the rest.
    Within each pass the earliest (question, sample) position wins, so the choice depends only
    on the trajectories, not on the order they are given in. The result is in position order."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    pool = sorted(trajectories, key=_position)
    chosen: list[Trajectory] = []
    questions: set[int] = set()

    def take(candidate: Trajectory) -> None:
        chosen.append(candidate)
        questions.add(candidate.question_index)

    for reward in sorted({t.reward for t in pool}, reverse=True):
        if len(chosen) == count:
            break
        same = [t for t in pool if t.reward == reward]
        take(next((t for t in same if t.question_index not in questions), same[0]))
    for candidate in pool:
        if len(chosen) == count:
            break
        if candidate.question_index not in questions and all(candidate is not c for c in chosen):
            take(candidate)
    for candidate in pool:
        if len(chosen) == count:
            break
        if all(candidate is not c for c in chosen):
            take(candidate)
    return sorted(chosen, key=_position)


def transcript_record(trajectory: Trajectory, step: int) -> dict[str, object]:
    """The eval record of a trajectory plus the training-only fields: each turn's advantage (what
    its tokens were trained with), the weights that sampled it, and with step credit its step
    group's size and its step reward."""
    turns = []
    for turn in trajectory.turns:
        fields = turn_record(turn)
        fields.update(advantage=float(turn.advantage), sampler=turn.sampler)
        if turn.step_group:  # --credit gigpo: the turns its advantage was measured among
            fields.update(step_group=turn.step_group)
        if turn.reward is not None:  # --step-reward: what the turn earned on its own
            fields.update(step_reward=float(turn.reward))
        turns.append(fields)
    record = {
        **trajectory_record(trajectory),
        "turns": turns,
        "step": int(step),
        "question_index": trajectory.question_index,
        "advantage": float(trajectory.advantage),
        "excluded": trajectory.excluded,
    }
    if trajectory.verdict is not None:  # --judge-weight: the judge's verdict on its answer
        record["judge"] = dict(trajectory.verdict.record)
    return record


# --- the run directory's file --------------------------------------------------------------


def append_transcripts(
    run_dir: str | os.PathLike[str], step: int, records: Iterable[Mapping[str, object]]
) -> Path:
    """Append one step's records to ``<run_dir>/transcripts.jsonl`` in a single fsynced write,
    each stamped with ``step`` and this write's ``block`` id. A crash can tear only the last
    line, which readers skip."""
    path = Path(run_dir) / TRANSCRIPTS_FILE
    block = secrets.token_hex(4)
    text = "".join(json_line({**record, "step": int(step), "block": block}) for record in records)
    if text:
        append_text(path, text)
    return path


@dataclass
class RunTranscripts:
    """What ``transcripts.jsonl`` holds: records by step, and lines that could not be read."""

    path: Path
    by_step: dict[int, list[JsonObject]] = field(default_factory=dict)
    torn_lines: list[int] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return sorted(self.by_step)


def read_run_transcripts(path: str | os.PathLike[str]) -> RunTranscripts:
    """Records grouped by step. A step written more than once (a resumed run repeats steps)
    keeps the block written last: consecutive lines with the same ``step`` and ``block``.
    Lines that are not a JSON object with an integer ``step`` (a write torn by a crash) are
    skipped and their numbers listed."""
    path = Path(path)
    result = RunTranscripts(path)
    blocks: dict[int, list[JsonObject]] = {}
    previous: tuple[int, JsonValue] | None = None
    lines = JsonLines(path, error=TranscriptFileError, torn=TornLines.SKIP, surrogates=Surrogates.MEND)
    for number, record in lines:
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(record, dict) or not isinstance(step, int) or isinstance(step, bool):
            result.torn_lines.append(number)
            continue
        if (step, record.get("block")) != previous:
            blocks[step] = []  # a new block: a repeated step starts over
            previous = (step, record.get("block"))
        blocks[step].append(record)
    result.torn_lines = sorted(result.torn_lines + lines.torn_lines)
    result.by_step = {step: blocks[step] for step in sorted(blocks)}
    return result


def read_eval_transcripts(path: str | os.PathLike[str]) -> tuple[JsonObject | None, list[JsonObject]]:
    """An eval file's configuration (its ``eval_config`` line, if any) and its trajectory
    records in file order."""
    try:
        records = read_eval_records(path)
    except EvalFileError as error:
        raise TranscriptFileError(str(error)) from None
    config = next((r.get("config") for r in records if r.get("type") == "eval_config"), None)
    trajectories = [r for r in records if r.get("type", "trajectory") == "trajectory"]
    return (config if isinstance(config, dict) else None), trajectories


def is_run_transcript_file(path: str | os.PathLike[str]) -> bool:
    """Whether a JSONL file is a run's transcripts rather than an eval file."""
    return transcript_source_kind(path) == "run"


# What the files a transcript source is mistaken for hold, and where to point the reader.
_NOT_TRANSCRIPTS = (
    (("state_path", "weights_path"), "a run's checkpoint ledger (checkpoints.jsonl)"),
    (("reward/mean",), "a run's training metrics (metrics.jsonl; draw them with `plot run`)"),
    (("rewound_to_step",), "a run's rewound metrics (metrics.rewound.jsonl)"),
)
_WHAT_SHOW_READS = "show reads a run directory, its transcripts.jsonl, or an eval JSONL file"


def _is_transcript(record: Mapping[str, object]) -> bool:
    """A trajectory record: marked as one, or holding a question and the model's turns (whatever
    their shape: the viewer shows odd fields rather than refusing them)."""
    return record.get("type") == "trajectory" or ("turns" in record and "question" in record)


def transcript_source_kind(path: str | os.PathLike[str]) -> str:
    """``"run"`` for a run's ``transcripts.jsonl``, ``"eval"`` for an eval file; any other file
    (a run's metrics or checkpoints, a JSON document such as ``config.json``, text) is a
    :class:`TranscriptFileError` saying what it looks like and what ``show`` reads. Decided by
    the first JSON object (a torn first line is skipped)."""
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except UnicodeDecodeError:
        raise TranscriptFileError(f"{path}: not UTF-8 text; {_WHAT_SHOW_READS}") from None
    except OSError as error:
        raise TranscriptFileError(f"{path}: cannot read ({error.strerror or error})") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        try:
            document = decode_json(text, where=str(path), error=TranscriptFileError, surrogates=Surrogates.MEND)
        except TranscriptFileError:
            document = None
        if document is not None:  # one JSON value over several lines: not JSON Lines
            what = "a run's config.json" if isinstance(document, dict) and "run_id" in document else "a JSON document"
            raise TranscriptFileError(f"{path} is {what}, not JSON Lines; {_WHAT_SHOW_READS}")
    for line in lines:
        try:
            record = decode_json(line, where=str(path), error=TranscriptFileError, surrogates=Surrogates.MEND)
        except TranscriptFileError:
            continue
        if not isinstance(record, dict):
            break
        if record.get("type") in ("eval_config", "summary"):
            return "eval"
        if _is_transcript(record):
            return "run" if "step" in record else "eval"
        for keys, what in _NOT_TRANSCRIPTS:
            if all(key in record for key in keys):
                raise TranscriptFileError(f"{path} is {what}, not transcripts; {_WHAT_SHOW_READS}")
        break
    raise TranscriptFileError(f"{path} holds no transcript records; {_WHAT_SHOW_READS}")
