"""A run's checkpoints on PyTRIO: the names they are saved under (never reused, so no save needs
``overwrite``) and the save itself."""

from __future__ import annotations

import secrets

from searchr1.core.types import TrainingClient
from searchr1.training.config import TrainConfig


def new_run_id() -> str:
    """Eight random hex digits: the part of checkpoint names that tells runs apart."""
    return secrets.token_hex(4)


def checkpoint_prefix(config: TrainConfig) -> str:
    """What every checkpoint name of this run starts with: ``<run-name>-<run-id>-``."""
    return f"{config.run_name}-{config.run_id}-" if config.run_id else f"{config.run_name}-"


def checkpoint_name(config: TrainConfig, completed_steps: int, session: int = 0) -> str:
    """The name of the checkpoint taken after ``completed_steps`` steps in the run's
    ``session``-th start (0 fresh, 1 after the first ``--resume``...). One start saves at
    most once per step count, and the session tells apart a save that a crash left half
    written from its retry after the resume, so no name is ever reused (no ``overwrite``)."""
    name = f"{checkpoint_prefix(config)}step-{completed_steps:06d}"
    return f"{name}-resume{session}" if session else name


async def save_checkpoint(client: TrainingClient, name: str) -> tuple[str, str]:
    """Save the training state (weights and optimizer) and the sampler weights under ``name``;
    returns their paths. A name is never reused (no ``overwrite``)."""
    state = await (await client.save_state_async(name=f"{name}-state", overwrite=False))
    weights = await (await client.save_weights_for_sampler_async(name=f"{name}-weights"))
    return state.path, weights.path
