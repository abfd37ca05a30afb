"""Checkpoints on disk, so that a training process killed with SIGKILL can be resumed by a
new process from ``trio://fake/...`` paths, bit for bit.

Layout under the service's ``home``::

    runs/<run_id>/run.json                 the run's LoRA configuration
    runs/<run_id>/state/<name>.npz         save_state: weights + Adam moments + step
    runs/<run_id>/weights/<name>.npz       save_weights_for_sampler: weights only

Paths are ``trio://fake/<run_id>/<state|weights>/<name>``. Run ids are ``run-0001``,
``run-0002``, ... allocated by creating the directory (so two processes on one home never
share an id, and a fresh home always gives the same ids). Each checkpoint is one file
written to a temporary name and renamed into place, so a kill mid-save leaves either the
old checkpoint or the new one, never half of one. Arrays are float64 ``.npy`` payloads:
loading gives back exactly what was saved.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from pytrio.errors.control import ControlAPIError

PATH_PREFIX = "trio://fake/"
_PATH_PATTERN = re.compile(
    r"^trio://fake/(?P<run>run-\d+)/(?P<kind>state|weights)/(?P<name>[^/]+)$"
)
STATE = "state"
WEIGHTS = "weights"


@dataclass(frozen=True)
class RunConfig:
    """What pytrio compares on ``load_state`` (plus the toy model's shape)."""

    base_model: str
    lora_rank: int
    seed: int | None
    train_mlp: bool
    train_attn: bool
    train_unembed: bool
    num_buckets: int
    vocab_size: int


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
    size: int


def checkpoint_path(run_id: str, kind: str, name: str) -> str:
    return f"{PATH_PREFIX}{run_id}/{kind}/{name}"


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
            self._write_atomically(
                self.home / "runs" / run_id / "run.json",
                json.dumps(asdict(config), indent=1).encode(),
            )
            return run_id

    # --- checkpoints ---

    def _file(self, run_id: str, kind: str, name: str) -> Path:
        return self.home / "runs" / run_id / kind / f"{name}.npz"

    def exists(self, run_id: str, kind: str, name: str) -> bool:
        return self._file(run_id, kind, name).is_file()

    def save(
        self,
        run_id: str,
        kind: str,
        name: str,
        config: RunConfig,
        params: np.ndarray,
        adam: tuple[np.ndarray, np.ndarray, int] | None = None,
    ) -> tuple[str, int]:
        """Write a checkpoint (replacing one of the same name); return its path and size."""
        arrays: dict[str, np.ndarray] = {
            "params": np.asarray(params, dtype=np.float64),
            "config": np.array(json.dumps(asdict(config))),
        }
        if adam is not None:
            m, v, step = adam
            arrays["adam_m"] = np.asarray(m, dtype=np.float64)
            arrays["adam_v"] = np.asarray(v, dtype=np.float64)
            arrays["adam_step"] = np.array(step, dtype=np.int64)
        target = self._file(run_id, kind, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".tmp-", delete=False) as handle:
            np.savez(handle, **arrays)  # type: ignore[arg-type]
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, target)
        return checkpoint_path(run_id, kind, name), target.stat().st_size

    def load(self, path: str) -> Checkpoint:
        match = _PATH_PATTERN.match(path) if isinstance(path, str) else None
        if match is None:
            raise ControlAPIError(
                f"not a fake checkpoint path: {path!r} (expected {PATH_PREFIX}<run>/<kind>/<name>)",
                status_code=404,
                code="checkpoint_not_found",
            )
        run_id, kind, name = match["run"], match["kind"], match["name"]
        file = self._file(run_id, kind, name)
        if not file.is_file():
            raise ControlAPIError(
                f"checkpoint {path!r} does not exist under {self.home}",
                status_code=404,
                code="checkpoint_not_found",
            )
        with np.load(file, allow_pickle=False) as archive:
            config = RunConfig(**json.loads(str(archive["config"])))
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
                size=file.stat().st_size,
            )

    @staticmethod
    def _write_atomically(target: Path, payload: bytes) -> None:
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".tmp-", delete=False) as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, target)
