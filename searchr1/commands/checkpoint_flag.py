"""``--checkpoint RUN_DIR|PATH`` of ``ask`` and ``serve``: which model they sample and from where.

A run directory names its last checkpoint, its base model and, offline, the twin's home and
policy; a sampler-weights path (``trio://...``) is taken as given, and offline needs
``--offline-home`` beside it. Every combination that cannot work is one usage error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from searchr1.commands.eval import RunRendering


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """The model a command samples: the flags as given, or as the run directory records them."""

    base_model: str
    model_path: str | None  # None: the base model itself
    offline: bool
    offline_home: Path | None  # the twin's checkpoint store (offline only)
    offline_policy: str
    from_run_dir: bool  # True when ``--checkpoint`` named a run directory, whose records won
    rendering: RunRendering | None = None  # how the run directory's run made its contexts



def resolve_checkpoint(checkpoint: str | None, *, base_model: str, offline: bool, offline_home: Path | None,
                       offline_policy: str) -> ResolvedCheckpoint:
    """The model ``--checkpoint`` and its companion flags name. A run directory's records replace
    ``base_model``, ``offline``, the twin's home and (when it records one) the policy; a
    sampler-weights path keeps them. ``--offline-home`` beside a run directory, an offline weights
    path without it, and ``--offline-home`` without ``--offline`` are usage errors."""
    from searchr1.commands.eval import checkpoint_of

    rendering = None
    if checkpoint is None:
        model_path, from_run_dir = None, False
    elif not checkpoint.startswith("trio://"):
        if offline_home is not None:
            raise click.UsageError("--offline-home is for a checkpoint path; a run directory names its own twin")
        found = checkpoint_of(Path(checkpoint))
        offline, base_model, model_path = found.offline, found.base_model, found.weights_path
        offline_home, offline_policy = found.offline_home, found.offline_policy or offline_policy
        from_run_dir, rendering = True, found.rendering
    else:
        model_path, from_run_dir = checkpoint, False
        if offline and offline_home is None:
            raise click.UsageError("an offline checkpoint path needs --offline-home (runs/<run>/twin), or pass "
                                   "the run directory")
    if offline_home is not None and not offline:
        raise click.UsageError("--offline-home only applies with --offline")
    return ResolvedCheckpoint(base_model, model_path, offline, offline_home, offline_policy, from_run_dir, rendering)
