"""The run directory: everything a training run writes, written so a crash loses nothing.

    config.json          the exact configuration (rewritten only to add a segment: flags a resume changed)
    metrics.jsonl        one line per finished step, appended and fsynced
    checkpoints.jsonl    one line per checkpoint (the resume points), appended and fsynced
    run_state.json       step, data cursor, seeds and last checkpoint (atomic rewrite)
    metrics.rewound.jsonl  lines of steps that were undone by a resume, and torn last lines a
                         resume cut off (kept, not deleted)
    checkpoints.rewound.jsonl, transcripts.rewound.jsonl
                         what a restart from an earlier step (``--from-step K``) set aside
    .lock                the pid of the process training in it, while one is (an flock the kernel
                         drops on exit; the file is removed when the command ends)

Order inside a step: metrics line, then checkpoint line, then run state. A resume restarts at
the last checkpoint, so steps finished after it are run again; their old metrics lines move
to ``metrics.rewound.jsonl`` instead of being duplicated or lost. ``train --resume RUN
--from-step K`` restarts at the checkpoint of step K instead (:meth:`RunDir.restart_at`): later
checkpoints and transcripts move to their ``.rewound.jsonl`` files, and ``config.json`` gains a
segment saying which flags changed from step K on.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from searchr1.core.errors import UserError
from searchr1.basics.json_types import JsonObject, JsonValue, as_object
from searchr1.basics.jsonl import JsonLines, Surrogates, TornLines, read_json_document
from searchr1.basics.wording import plural
from searchr1.basics.fileio import (
    append_json_line,
    append_text,
    check_writable,
    cut_torn_tail,
    exclusive_lock,
    json_line,
    write_json_atomically,
    write_text_atomically,
)

CONFIG = "config.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints.jsonl"
STATE = "run_state.json"
REWOUND = "metrics.rewound.jsonl"
CHECKPOINTS_REWOUND = "checkpoints.rewound.jsonl"
TRANSCRIPTS = "transcripts.jsonl"  # written by searchr1.evaluation.transcripts
TRANSCRIPTS_REWOUND = "transcripts.rewound.jsonl"
TWIN_HOME = "twin"  # the offline twin's runs and checkpoints, kept with the run (offline runs only)
LOCK = ".lock"
# append-only: each must end on a newline
APPENDED = (METRICS, CHECKPOINTS, TRANSCRIPTS, REWOUND, CHECKPOINTS_REWOUND, TRANSCRIPTS_REWOUND)


class RunDirError(UserError, ValueError):
    """The run directory is unusable; the message names it and says why."""


def _json_lines(path: Path) -> tuple[list[tuple[int, JsonValue]], list[str]]:
    """Every complete line's value with its line number, and any torn lines (a crash in the middle
    of a write)."""
    if not path.exists():
        return [], []
    lines = JsonLines(path, error=RunDirError, torn=TornLines.SKIP, surrogates=Surrogates.MEND)
    return list(lines), lines.torn_text


def read_json_lines(path: Path, *, objects_only: bool = True) -> tuple[list[JsonObject], list[str]]:
    """Complete records, and any torn lines (a crash in the middle of a write). A line that holds
    JSON but not an object is a RunDirError naming it (skipped instead with ``objects_only=False``)."""
    values, torn = _json_lines(path)
    records: list[JsonObject] = []
    for number, record in values:
        if isinstance(record, dict):
            records.append(record)
        elif objects_only:
            raise RunDirError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
    return records, torn


def _int(value: object, name: str) -> int:
    """A record's whole-number field as :func:`int` reads a JSON value (a number, or digits in a string)."""
    if not isinstance(value, int | float | str):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    return int(value)


def recorded_checkpoints(root: Path) -> dict[str, Path]:
    """Every checkpoint name recorded by a run directory directly under ``root``, with the
    ``checkpoints.jsonl`` that records it."""
    names: dict[str, Path] = {}
    if not root.is_dir():
        return names
    for ledger in sorted(root.glob(f"*/{CHECKPOINTS}")):
        for entry in read_json_lines(ledger, objects_only=False)[0]:
            name = entry.get("name")
            if isinstance(name, str):
                names.setdefault(name, ledger)
    return names


@dataclass(frozen=True)
class ResumePoint:
    step: int                # steps completed when the checkpoint was taken
    cursor: int              # data cursor at that point
    state_path: str          # save_state URI (weights + optimizer)
    weights_path: str        # save_weights_for_sampler URI (for eval)
    name: str
    # off-policy runs: weights version -> sampler URI of the batches in flight at the checkpoint
    sampler_paths: dict[int, str] = field(default_factory=dict)


class RunDir:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def file(self, name: str) -> Path:
        return self.path / name

    # -- creation and opening --------------------------------------------------------------

    def finished_steps(self) -> int:
        """Metrics lines on disk: the steps this run has finished (0 for a new directory)."""
        return len(self.metrics())

    def can_start_over(self) -> bool:
        """True for a directory a new run may take: missing, empty, or a run that stopped
        before finishing its first step (a bad flag, a failed preflight, a sampler that never
        answered) - it holds nothing worth keeping, so rerunning must not need ``rm -rf``."""
        if not self.path.exists():
            return True
        if not self.path.is_dir():
            return False
        entries = {entry.name for entry in self.path.iterdir()}
        if not entries:
            return True
        ours = {CONFIG, STATE, METRICS, CHECKPOINTS, TWIN_HOME, LOCK}  # rewound steps are work: keep them
        return entries <= ours and not self.finished_steps() and not self.checkpoints()

    def check_creatable(self) -> None:
        """Raise what :meth:`create` would raise about the location, without writing anything."""
        if not self.can_start_over():
            raise RunDirError(
                f"run directory {self.path} already exists and holds "
                + (plural(self.finished_steps(), "finished step") if (self.path / CONFIG).is_file() else "other files")
                + "; pick another --run-dir or --run-name, or continue it with --resume"
            )
        ancestor = self.path
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
            raise RunDirError(f"cannot write to run directory {self.path}: {ancestor} is not a writable directory")

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory for one process (creating it for a new run): a second ``train`` on
        it is refused at once, naming the directory and the holder's pid. The lock is the
        kernel's, so a killed process leaves none behind."""
        created = not self.path.exists()
        if created:
            self.check_creatable()
            try:
                self.path.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise RunDirError(f"cannot write to run directory {self.path}: {error.strerror or error}") from None
        elif not self.path.is_dir():
            raise RunDirError(f"run directory {self.path} is not a directory")
        try:
            with exclusive_lock(self.file(LOCK), f"run directory {self.path}"):
                try:
                    yield
                finally:
                    if created:
                        self._remove_if_only_locked()
        except OSError as error:
            if error.filename != str(self.file(LOCK)):
                raise
            raise RunDirError(f"cannot lock run directory {self.path}: it is not writable "
                              f"({error.strerror or error})") from None

    def _remove_if_only_locked(self) -> None:
        """A start that wrote nothing leaves nothing (best effort)."""
        try:
            if {entry.name for entry in self.path.iterdir()} == {LOCK}:
                self.file(LOCK).unlink()
                self.path.rmdir()
        except OSError:
            pass

    def check_writable(self) -> None:
        """Refuse, before any work, a run whose files could not be written (a read-only disk, a
        directory or a file without write permission): a resume would otherwise find out only
        at its first save, after the service's retries."""
        for name in (STATE, *APPENDED):
            check_writable(self.file(name), "run file", RunDirError)
        if self.file(TWIN_HOME).is_dir():  # an offline run's checkpoints are written there
            check_writable(self.file(TWIN_HOME) / "checkpoint", "the offline twin's checkpoints in", RunDirError)

    def mend_torn_tails(self) -> list[str]:
        """Cut a torn last line (a write a crash or a full disk cut short) off every append-only
        file, so the next record starts a line of its own, and keep it in ``metrics.rewound.jsonl``;
        one note per file that had one. (``metrics.jsonl`` is mended by :meth:`rewind_to`.)"""
        notes = []
        for name in (CHECKPOINTS, TRANSCRIPTS, REWOUND, CHECKPOINTS_REWOUND, TRANSCRIPTS_REWOUND):
            cut = cut_torn_tail(self.file(name))
            if cut:
                append_json_line(self.file(REWOUND), {"torn_line": cut.decode("utf-8", "replace"), "file": name})
                notes.append(f"{self.file(name)}: cut off a torn last line ({len(cut)} bytes, a write that did "
                             f"not finish; kept in {REWOUND})")
        return notes

    def check_consistent(self, config: Mapping[str, object]) -> None:
        """Refuse to resume a directory whose records disagree with each other: a step recorded
        twice in ``metrics.jsonl`` (two processes trained here at once), checkpoints of another
        run id than ``config.json``'s, a run state whose fields have the wrong types."""
        state = self.state()
        for key in ("step", "cursor"):
            value = state.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise RunDirError(f"{self.file(STATE)}: {key!r} must be a whole number >= 0, not {value!r}")
        last = state.get("last_checkpoint")
        if last is not None and (not isinstance(last, int) or isinstance(last, bool) or last < 0):
            raise RunDirError(f"{self.file(STATE)}: 'last_checkpoint' must be a step number or null, not {last!r}")
        steps = Counter(record.get("step") for record in self.metrics())
        repeated = sorted(step for step, count in steps.items() if count > 1 and isinstance(step, int))
        if repeated:
            raise RunDirError(f"{self.file(METRICS)} records step {repeated[0]} {steps[repeated[0]]} times: two "
                              "runs wrote into this directory at once, so it cannot be resumed; start a new run")
        run_id, run_name = config.get("run_id"), config.get("run_name")
        prefix = f"{run_name}-{run_id}-" if run_id and run_name else None
        foreign = [str(entry.get("name")) for entry in self.checkpoints()
                   if prefix and not str(entry.get("name") or "").startswith(prefix)]
        if foreign:
            raise RunDirError(f"{self.file(CHECKPOINTS)} records checkpoint {foreign[0]}, not one of run {run_id} "
                              f"that {self.file(CONFIG)} names (another run wrote here); it cannot be resumed")
        for entry in self.checkpoints():
            if not isinstance(entry.get("step"), int) or not isinstance(entry.get("cursor"), int):
                raise RunDirError(f"{self.file(CHECKPOINTS)}: checkpoint {entry.get('name')!r} has no whole-number "
                                  "'step' and 'cursor'")

    def create(self, config: Mapping[str, object]) -> None:
        """Start a new run; refuses a directory that already holds anything."""
        self.check_creatable()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".write-test"
            probe.write_text("ok", "utf-8")
            probe.unlink()
        except OSError as error:
            raise RunDirError(f"cannot write to run directory {self.path}: {error.strerror or error}") from None
        for stale in (METRICS, CHECKPOINTS):  # empty, left by a start that finished no step
            self.file(stale).unlink(missing_ok=True)
        write_json_atomically(self.file(CONFIG), config)
        self.write_state({"step": 0, "cursor": 0, "last_checkpoint": None})

    def open(self) -> JsonObject:
        """Validate an existing run and return its configuration."""
        if not self.path.exists():
            raise RunDirError(f"run directory {self.path} does not exist")
        if not self.path.is_dir():
            raise RunDirError(f"{self.path} is not a directory, so not a run directory")
        missing = [name for name in (CONFIG, STATE) if not self.file(name).is_file()]
        if missing:
            raise RunDirError(
                f"{self.path} is not a searchr1 run directory (missing {', '.join(missing)})"
            )
        config = self._read_object(CONFIG)
        self._read_object(STATE)
        return config

    def _read_object(self, name: str) -> JsonObject:
        """A run file that holds one JSON object; any other content is a RunDirError naming the
        file (and where in it the JSON breaks)."""
        path = self.file(name)
        try:
            value = read_json_document(path, error=RunDirError, surrogates=Surrogates.MEND)
        except OSError as error:
            raise RunDirError(f"cannot read {path}: {error.strerror or error}") from None
        if not isinstance(value, dict):
            raise RunDirError(f"{path} should hold a JSON object, not {type(value).__name__}")
        return value

    # -- records ---------------------------------------------------------------------------

    def append_metrics(self, record: Mapping[str, object]) -> None:
        append_json_line(self.file(METRICS), record)

    def metrics(self) -> list[JsonObject]:
        return read_json_lines(self.file(METRICS))[0]

    def record_checkpoint(self, entry: Mapping[str, object]) -> None:
        append_json_line(self.file(CHECKPOINTS), entry)

    def checkpoints(self) -> list[JsonObject]:
        return read_json_lines(self.file(CHECKPOINTS))[0]

    def write_state(self, state: Mapping[str, object]) -> None:
        write_json_atomically(self.file(STATE), state)

    def state(self) -> JsonObject:
        return self._read_object(STATE)

    def resume_point(self, step: int | None = None) -> ResumePoint | None:
        """The last checkpoint (of ``step``, when given) that a run can resume from."""
        entries = [e for e in self.checkpoints() if e.get("state_path")
                   and (step is None or _int(e.get("step", -1), "step") == step)]
        if not entries:
            return None
        last = entries[-1]
        paths = as_object(last.get("sampler_paths") or {}, "sampler_paths")
        samplers = {int(version): str(path) for version, path in paths.items()}
        return ResumePoint(_int(last["step"], "step"), _int(last["cursor"], "cursor"), str(last["state_path"]),
                           str(last.get("weights_path") or ""), str(last.get("name") or ""), samplers)

    def rewind_to(self, step: int) -> int:
        """Keep metrics of steps ``< step``; move the rest (and torn lines) aside. Returns the
        number of lines moved."""
        path = self.file(METRICS)
        records, torn = read_json_lines(path)
        keep = [r for r in records if _int(r.get("step", -1), "step") < step]
        moved = [r for r in records if _int(r.get("step", -1), "step") >= step]
        if not moved and not torn:
            return 0
        for record in moved:
            append_json_line(self.file(REWOUND), {**record, "rewound_to_step": step})
        for line in torn:
            append_json_line(self.file(REWOUND), {"torn_line": line, "rewound_to_step": step})
        write_text_atomically(path, "".join(json_line(record) for record in keep))
        return len(moved) + len(torn)

    def write_config(self, config: Mapping[str, object]) -> None:
        """Replace ``config.json`` (a resume that changes flags records them as a new segment)."""
        write_json_atomically(self.file(CONFIG), config)

    def checkpoint_steps(self) -> list[int]:
        """Steps with a checkpoint a run can resume from, in order."""
        return sorted({_int(e["step"], "step") for e in self.checkpoints() if e.get("state_path") and "step" in e})

    def restart_at(self, step: int, config: Mapping[str, object]) -> dict[str, int]:
        """Set aside what came after the checkpoint of ``step`` (checkpoint lines of later steps,
        transcripts of steps ``>= step``; metrics follow with :meth:`rewind_to` when the run
        starts) and write ``config`` (the new segment included). Returns how many lines of each
        file moved. Nothing is deleted; a second call for the same step moves nothing."""
        moved = {
            CHECKPOINTS: self._move_lines(CHECKPOINTS, CHECKPOINTS_REWOUND,
                                          lambda r: _int(r.get("step", -1), "step") > step, step),
            TRANSCRIPTS: self._move_lines(TRANSCRIPTS, TRANSCRIPTS_REWOUND,
                                          lambda r: _int(r.get("step", -1), "step") >= step, step),
        }
        self.write_config(config)
        state, point = self.state(), self.resume_point(step)
        self.write_state({**state, "step": step, "cursor": point.cursor if point else state.get("cursor"),
                          "last_checkpoint": step})
        return moved

    def _move_lines(self, name: str, aside: str, later: Callable[[JsonObject], bool], step: int) -> int:
        path = self.file(name)
        values, torn = _json_lines(path)
        records = [record for _, record in values]
        keep = [r for r in records if not (isinstance(r, dict) and later(r))]
        moved = [r for r in records if isinstance(r, dict) and later(r)]
        if not moved and not torn:
            return 0
        text = "".join(json_line({**r, "rewound_to_step": step}) for r in moved)
        text += "".join(json_line({"torn_line": line, "rewound_to_step": step}) for line in torn)
        append_text(self.file(aside), text)
        write_text_atomically(path, "".join(json_line(r) for r in keep))
        return len(moved) + len(torn)
