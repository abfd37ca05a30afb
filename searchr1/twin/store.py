"""Checkpoints on disk under the twin's home, so that a process killed with SIGKILL can be
resumed by a new process (with a new twin on the same home) from the same paths, bit for bit.

Layout under ``home``::

    runs/<run>/run.json                 the run's LoRA configuration and policy kind
    runs/<run>/state/<name>.npz         save_state: params + Adam moments and step
    runs/<run>/weights/<name>.npz       save_weights (for samplers, temp-sampling-* too)

Paths are ``trio://twin/<run>/<state|weights>/<name>``. Run ids are ``run-0001``,
``run-0002``, ... allocated by creating the directory (two processes on one home never share
an id; a fresh home always gives the same ids). Each checkpoint is one file written to a
temporary name, fsynced and renamed into place: a kill mid-save leaves the old checkpoint or
the new one, never half of one. Arrays are float64 ``.npy`` payloads, so loading gives back
exactly what was saved. A checkpoint also records its weights *version* (how many
weight-changing optimiser steps produced them) and *lineage* (the run that started from the
base model), which strict mode uses to tell how stale a sampler is.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from pytrio.client.builders.training import CHECKPOINT_NAME_MAX_LENGTH, CHECKPOINT_NAME_PATTERN

from searchr1.basics.fileio import write_bytes_atomically

PATH_PREFIX = "trio://twin/"
PATH_PATTERN = re.compile(r"^trio://twin/(?P<run>run-\d+)/(?P<kind>state|weights)/(?P<name>[^/]+)$")
RUN_ID_PATTERN = re.compile(r"run-\d{4,9}")  # what new_run allocates
STATE = "state"
WEIGHTS = "weights"


class CheckpointNotFound(LookupError):
    """The path is not a twin checkpoint, or nothing was saved there."""


class InvalidName(ValueError):
    """A run id or checkpoint name the twin refuses (it would not name a file inside the home)."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_run_id(run_id: object) -> str:
    if not isinstance(run_id, str) or RUN_ID_PATTERN.fullmatch(run_id) is None:
        raise InvalidName(f"invalid training run id {_shown(run_id)}: the twin's ids are run-NNNN")
    return run_id


def check_checkpoint_name(name: object) -> str:
    """pytrio's own rule for checkpoint names (the SDK checks it on the client side only)."""
    if (
        not isinstance(name, str)
        or len(name) > CHECKPOINT_NAME_MAX_LENGTH
        or CHECKPOINT_NAME_PATTERN.fullmatch(name) is None
    ):
        raise InvalidName(
            f"invalid checkpoint name {_shown(name)}: it must match {CHECKPOINT_NAME_PATTERN.pattern} "
            f"and have at most {CHECKPOINT_NAME_MAX_LENGTH} characters (pytrio's rule)"
        )
    return name


@dataclass(frozen=True)
class RunConfig:
    """What pytrio compares on ``load_state``, plus the policy the params belong to."""

    base_model: str
    lora_rank: int
    seed: int | None
    train_mlp: bool
    train_attn: bool
    train_unembed: bool
    policy_kind: str


@dataclass(frozen=True)
class Checkpoint:
    path: str
    run_id: str
    kind: str
    name: str
    config: RunConfig
    params: np.ndarray
    adam_m: np.ndarray | None
    adam_v: np.ndarray | None
    adam_step: int | None
    version: int
    lineage: str
    size: int

    @property
    def has_optimizer(self) -> bool:
        return self.adam_m is not None


def checkpoint_path(run_id: str, kind: str, name: str) -> str:
    return f"{PATH_PREFIX}{run_id}/{kind}/{name}"


def _write_atomically(target: Path, payload: bytes) -> None:
    """Replace ``target`` whole (mode from the umask; a failure names ``target`` and leaves no
    temporary file)."""
    write_bytes_atomically(target, payload)


class CheckpointStore:
    def __init__(self, home: str | os.PathLike[str]) -> None:
        self.home = Path(home)
        (self.home / "runs").mkdir(parents=True, exist_ok=True)

    # --- runs ---

    def new_run(self, config: RunConfig) -> str:
        number = 1
        while True:
            run_id = f"run-{number:04d}"
            try:
                (self.home / "runs" / run_id).mkdir()
            except FileExistsError:
                number += 1
                continue
            _write_atomically(self.home / "runs" / run_id / "run.json",
                              json.dumps(asdict(config), indent=1).encode())
            return run_id

    def _inside(self, *parts: str) -> Path:
        """``home/runs/<parts>``, refused unless it resolves inside the home."""
        path = self.home.joinpath("runs", *parts)
        home = self.home.resolve()
        if not path.resolve().is_relative_to(home):
            raise InvalidName(f"{_shown('/'.join(parts))} would name a file outside the twin's home")
        return path

    def run_config(self, run_id: str) -> RunConfig:
        try:
            return RunConfig(**json.loads(self._inside(check_run_id(run_id), "run.json").read_text("utf-8")))
        except FileNotFoundError:
            raise CheckpointNotFound(f"run {run_id} does not exist under {self.home}") from None

    # --- checkpoints ---

    def _file(self, run_id: str, kind: str, name: str) -> Path:
        if kind not in (STATE, WEIGHTS):
            raise InvalidName(f"invalid checkpoint kind {_shown(kind)}")
        return self._inside(check_run_id(run_id), kind, f"{check_checkpoint_name(name)}.npz")

    def exists(self, run_id: str, kind: str, name: str) -> bool:
        return self._file(run_id, kind, name).is_file()

    def names(self, run_id: str) -> list[tuple[str, str]]:
        """``(kind, name)`` of every checkpoint of a run, sorted."""
        found = []
        for kind in (STATE, WEIGHTS):
            directory = self._inside(check_run_id(run_id), kind)
            if directory.is_dir():
                found += [(kind, p.name[: -len(".npz")]) for p in directory.glob("*.npz")]
        return sorted(found)

    def save(
        self,
        run_id: str,
        kind: str,
        name: str,
        config: RunConfig,
        params: np.ndarray,
        *,
        version: int,
        lineage: str,
        adam: tuple[np.ndarray, np.ndarray, int] | None = None,
    ) -> tuple[str, int]:
        """Write a checkpoint (replacing one of the same name); return its path and size."""
        import io

        arrays: dict[str, np.ndarray] = {
            "params": np.asarray(params, dtype=np.float64),
            "config": np.array(json.dumps(asdict(config))),
            "meta": np.array(json.dumps({"version": version, "lineage": lineage})),
        }
        if adam is not None:
            m, v, step = adam
            arrays["adam_m"] = np.asarray(m, dtype=np.float64)
            arrays["adam_v"] = np.asarray(v, dtype=np.float64)
            arrays["adam_step"] = np.array(step, dtype=np.int64)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]  # mypy takes **arrays for allow_pickle too
        target = self._file(run_id, kind, name)
        _write_atomically(target, buffer.getvalue())
        return checkpoint_path(run_id, kind, name), target.stat().st_size

    def load(self, path: str) -> Checkpoint:
        match = PATH_PATTERN.fullmatch(path) if isinstance(path, str) else None
        if match is None:
            raise CheckpointNotFound(f"not a twin checkpoint path: {_shown(path)} "
                                     f"(expected {PATH_PREFIX}<run>/<kind>/<name>)")
        run_id, kind, name = match["run"], match["kind"], match["name"]
        file = self._file(run_id, kind, name)
        if not file.is_file():
            raise CheckpointNotFound(f"checkpoint {path!r} does not exist under {self.home}")
        with np.load(file, allow_pickle=False) as archive:
            config = RunConfig(**json.loads(str(archive["config"])))
            meta = json.loads(str(archive["meta"]))
            has_adam = "adam_m" in archive
            return Checkpoint(
                path=path,
                run_id=run_id,
                kind=kind,
                name=name,
                config=config,
                params=archive["params"].copy(),
                adam_m=archive["adam_m"].copy() if has_adam else None,
                adam_v=archive["adam_v"].copy() if has_adam else None,
                adam_step=int(archive["adam_step"]) if has_adam else None,
                version=int(meta["version"]),
                lineage=str(meta["lineage"]),
                size=file.stat().st_size,
            )
