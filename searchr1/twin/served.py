"""What a twin served, counted on the server's side: the twin's own bill.

The client counts its usage (:mod:`searchr1.run.usage`); the twin counts what it answered,
from the requests and events it ran, so a test can check the two agree. Kinds carry the
client's names where the thing counted is the same: sampling requests and tokens (a request
asking for prompt logprobs counts as ``kl_*``), tokens of ``forward_backward`` events
(``train_tokens``), ``optim_steps``, ``weight_saves``, ``state_saves``. PyTRIO may split one
``forward_backward`` call into several events: ``forward_backward_events`` counts events.

Only answered requests and succeeded events count. The count is kept per twin and, for a twin
with a home, written to ``<home>/served.json`` after every event it runs (added to what a
previous twin on the same home served).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from searchr1.core.types import Counts

SERVED_FILE = "served.json"


@dataclass
class ServedUsage(Counts):
    """What one twin (or every twin on one home) answered, by kind; :meth:`add` sums field by field."""

    sample_requests: int = 0
    sample_prompt_tokens: int = 0
    sample_generated_tokens: int = 0
    kl_requests: int = 0
    kl_prompt_tokens: int = 0
    kl_generated_tokens: int = 0
    train_tokens: int = 0
    forward_backward_events: int = 0
    optim_steps: int = 0
    weight_saves: int = 0
    state_saves: int = 0

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, int]) -> ServedUsage:
        known = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in known})


class ServedCounter:
    """Thread-safe :class:`ServedUsage` of one twin, mirrored to ``home/served.json``."""

    def __init__(self, home: Path | None) -> None:
        self._lock = threading.Lock()
        self._path = None if home is None else Path(home) / SERVED_FILE
        self._usage = ServedUsage()
        if self._path is not None and self._path.is_file():
            try:
                self._usage = ServedUsage.from_json(json.loads(self._path.read_text()))
            except (OSError, ValueError, TypeError):
                self._usage = ServedUsage()

    def sampled(self, prompt_tokens: int, generated_tokens: int, *, prompt_logprobs: bool) -> None:
        with self._lock:
            if prompt_logprobs:
                self._usage.kl_requests += 1
                self._usage.kl_prompt_tokens += prompt_tokens
                self._usage.kl_generated_tokens += generated_tokens
            else:
                self._usage.sample_requests += 1
                self._usage.sample_prompt_tokens += prompt_tokens
                self._usage.sample_generated_tokens += generated_tokens

    def event(self, kind: str, train_tokens: int = 0) -> None:
        """A succeeded event: ``forward_backward``, ``optimize_step``, ``save_weights``, ``save_state``."""
        with self._lock:
            if kind == "forward_backward":
                self._usage.forward_backward_events += 1
                self._usage.train_tokens += train_tokens
            elif kind == "optimize_step":
                self._usage.optim_steps += 1
            elif kind == "save_weights":
                self._usage.weight_saves += 1
            elif kind == "save_state":
                self._usage.state_saves += 1
            else:
                return
            self._write()

    def snapshot(self) -> ServedUsage:
        with self._lock:
            return ServedUsage(**asdict(self._usage))

    def _write(self) -> None:
        if self._path is None or not self._path.parent.is_dir():
            return
        temporary = self._path.with_suffix(".json.tmp")
        try:
            temporary.write_text(json.dumps(self._usage.to_json(), sort_keys=True))
            os.replace(temporary, self._path)
        except OSError:
            pass  # the count in memory stays right; the file is a convenience for tests


def read_served(home: str | Path) -> ServedUsage:
    """What the twins on ``home`` served (zero when none wrote a count)."""
    path = Path(home) / SERVED_FILE
    if not path.is_file():
        return ServedUsage()
    return ServedUsage.from_json(json.loads(path.read_text()))
