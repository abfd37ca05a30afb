"""Per-step training metrics, computed from what the step produced (pure functions).

Names follow the lab port (``reward/mean``, ``rollout/degenerate_group_rate``,
``train/tokens_per_rollout_batch``, …) so its dashboards and plots keep working; additions
are termination-reason rates, groups left out for environment failures, tokens actually
sent to the trainer, and the step time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from statistics import fmean

from searchr1.core.context import ContextPolicy
from searchr1.core.advantage import GroupSummary
from searchr1.training.config import TrainConfig
from searchr1.core.datum import TrainingDatum
from searchr1.core.trainer import StepRecord
from searchr1.core.types import Termination, Trajectory
from searchr1.health.diagnostics import mean as _mean
from searchr1.health.diagnostics import mismatch_metrics, policy_diagnostics


def step_metrics(record: StepRecord, config: TrainConfig) -> dict[str, float]:
    """The metrics line of one step, from what it produced (the run loop adds the pipeline's and
    the search backend's counters and the health verdict)."""
    metrics: dict[str, float] = {}
    metrics.update(rollout_metrics(record.trajectories, record.groups, config.rollout.tools))
    metrics.update(policy_diagnostics(record.trajectories))
    metrics.update(datum_metrics(record.datums, record.micro_batches))
    metrics["train/datums_dropped_out_of_vocab"] = float(record.dropped_out_of_vocab)
    metrics.update(record.batch.metrics)
    metrics.update(record.kl_metrics)
    metrics.update(record.credit_metrics)
    metrics.update(record.correction_metrics)  # --correction: none adds nothing
    if config.rollout.context == ContextPolicy.FOLD:
        metrics.update(context_metrics(record.trajectories))
    if config.dynamic_sampling:
        metrics["train/groups_trained"] = record.batch.metrics["dynamic/groups_kept"]
    update = record.update
    if update is not None:
        metrics.update(trainer_metrics(update.outputs))
        metrics.update(update.optim_metrics)
        metrics.update(mismatch_metrics(update.tokens, loss_fn=config.loss_fn,
                                        loss_fn_config=config.loss_fn_config or None))
        for index, tokens in enumerate(update.substep_tokens):  # --num-substeps N > 1: per mini-batch
            clipped = mismatch_metrics(tokens, loss_fn=config.loss_fn, loss_fn_config=config.loss_fn_config or None)
            if "health/clipped_fraction" in clipped:
                metrics[f"health/clipped_fraction/substep_{index}"] = clipped["health/clipped_fraction"]
    metrics.setdefault("train/optimizer_steps", 0.0)
    metrics["train/forward_backward_calls"] = float(update.calls if update is not None else 0)
    metrics["train/tokens_sent"] = float(sum(d.num_tokens for d in record.datums))
    metrics["train/update_skipped"] = float(not record.datums)
    metrics["time/rollout_seconds"] = record.batch.seconds
    metrics["time/rollout_wait_seconds"] = record.waited_seconds
    metrics["time/train_seconds"] = record.train_seconds
    metrics["time/step_seconds"] = record.step_seconds
    return metrics


def context_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """How the trajectories' contexts folded (``--context fold``): folds and contexts (one datum
    each) per trajectory, the whole length of a trajectory and its longest context, in tokens."""
    sampled = [t for t in trajectories if t.turns]
    return {
        "context/folds": _mean([t.folds for t in sampled]),
        "context/contexts_per_trajectory": _mean([len({turn.context for turn in t.turns}) for t in sampled]),
        "context/whole_tokens": _mean([t.whole_tokens for t in sampled]),
        "context/longest": float(max((len(turn.prompt_tokens) + len(turn.completion_tokens)
                                      for t in sampled for turn in t.turns), default=0)),
    }


def rollout_metrics(trajectories: Sequence[Trajectory], groups: GroupSummary,
                    tools: Sequence[str] = ("search",)) -> dict[str, float]:
    """What the rollout did: rewards, turns, calls, terminations, groups; per declared tool
    (``tools``) ``tool/<name>/calls``, the calls of it that ran per trajectory, and
    ``tool/invalid_calls``, refused calls per trajectory (told to the model, or ending it as
    ``invalid``)."""
    scored = [t for t in trajectories if not t.sampler_error]
    metrics: dict[str, float] = {
        "reward/mean": _mean([t.reward for t in scored]),
        "reward/correct": _mean([float(t.score.exact_match) for t in scored]),
        "reward/format": _mean([float(t.score.valid_format) for t in scored]),
        "rollout/trajectories": float(len(trajectories)),
        "rollout/turns": _mean([len(t.turns) for t in trajectories]),
        "rollout/search_calls": _mean([t.search_calls for t in trajectories]),
        "rollout/trajectory_tokens": _mean([t.total_tokens for t in trajectories]),
        "rollout/env_error_rate": _mean([float(t.env_error) for t in trajectories]),
        "rollout/truncated_observation_rate": _mean(
            [float(any(call.truncated for call in t.calls)) for t in trajectories]
        ),
    }
    tool_turns = sum("<tool_call>" in turn.text for t in trajectories for turn in t.turns)
    ran = sum(not call.refused for t in trajectories for call in t.calls)
    metrics["rollout/valid_tool_call_rate"] = ran / max(tool_turns, 1)  # calls that ran per turn with a call
    for name in tools:
        metrics[f"tool/{name}/calls"] = _mean([t.calls_of(name) for t in trajectories])
    refused = [sum(call.refused for call in t.calls) + (t.termination == Termination.INVALID)
               for t in trajectories]
    metrics["tool/invalid_calls"] = _mean(refused)
    by_source: dict[str, list[float]] = {}
    for t in scored:
        by_source.setdefault(t.example.data_source.lower(), []).append(t.reward)
    for source, rewards in sorted(by_source.items()):
        metrics[f"reward/{source}"] = _mean(rewards)
    reasons = Counter(t.termination for t in trajectories)
    for reason in Termination:
        metrics[f"rollout/termination/{reason}"] = reasons.get(reason, 0) / max(len(trajectories), 1)
    denominator = max(groups.groups, 1)
    metrics["rollout/degenerate_group_rate"] = groups.degenerate / denominator
    metrics["rollout/env_failure_group_rate"] = groups.env_failure / denominator
    metrics["train/groups_dropped_env_failure"] = float(groups.env_failure)
    metrics["train/groups_trained"] = float(groups.trained)
    return metrics


def datum_metrics(
    datums: Sequence[TrainingDatum], micro_batches: Sequence[Sequence[TrainingDatum]] | None = None
) -> dict[str, float]:
    """Sizes of the step's datums; with ``micro_batches`` (manual accumulation only: the
    default sends one call and lets PyTRIO split it) also the lab port's packing metrics."""
    metrics = {
        "train/datums_per_rollout_batch": float(len(datums)),
        "train/tokens_per_rollout_batch": float(sum(d.num_tokens for d in datums)),
        "train/loss_tokens_per_rollout_batch": float(sum(d.loss_tokens for d in datums)),
    }
    if micro_batches is not None:
        padded = [len(batch) * max(d.num_tokens for d in batch) for batch in micro_batches if batch]
        metrics.update({
            "train/micro_batches_per_step": float(len(micro_batches)),
            "train/padded_tokens_per_rollout_batch": float(sum(padded)),
            "train/max_micro_batch_padded_tokens": float(max(padded, default=0)),
        })
    return metrics


def trainer_metrics(outputs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Server metrics of the step's ``forward_backward`` calls, prefixed ``trainer/``.

    ``loss_sum`` and ``token_count`` are totals, so they add up across calls; ``loss_mean``
    is recomputed from them (with one call, as by default, it is the server's value);
    other keys are averaged.
    """
    if not outputs:
        return {}
    merged: dict[str, float] = {}
    keys = sorted({key for output in outputs for key in output})
    for key in keys:
        values = [float(o[key]) for o in outputs if isinstance(o.get(key), (int, float))]
        if not values:
            continue
        merged[f"trainer/{key}"] = sum(values) if key in ("loss_sum", "token_count") else fmean(values)
    if "trainer/loss_sum" in merged and merged.get("trainer/token_count"):
        merged["trainer/loss_mean"] = merged["trainer/loss_sum"] / merged["trainer/token_count"]
    return merged
