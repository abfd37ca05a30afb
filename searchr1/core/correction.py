"""Off-policy correction, opt-in (``--correction``): the sampler that drew a step's tokens is not
exactly the learner that trains on them (a low-precision inference engine, other kernels), so
each trained token's advantage, and with ``decoupled`` the logprobs sent, are corrected for it.

Per trained token (a datum position whose advantage ``A`` is not 0), with ``q`` the sampler's
logprob (the datum's ``logprobs``), ``p`` the learner's before the update (one ``forward`` call on
the step's datums, the only extra call) and ``r = exp(p - q)``:

* ``none`` (default): nothing, and no ``forward`` call.
* ``tis``, truncated importance sampling (Yao et al. 2025; verl's token-level ``rollout_is``):
  ``A * min(r, C) / r``. The service's loss already weights each token by its ratio to the
  logprobs sent, the sampler's, which is ``r`` at the learner's weights before the update; tis
  caps that weight at ``C`` (``--tis-cap``, verl's default threshold 2.0).
* ``mis``, masked importance sampling (verl's token-level ``rollout_rs``): ``A`` where
  ``lo <= r <= hi`` (``--mis-low``, ``--mis-high``; verl's 2.0 and its reciprocal), else 0: the
  token leaves the loss.
* ``decoupled``, decoupled PPO (AReaL, arXiv 2505.24298): the learner's logprobs ``p`` are sent as
  ``logprobs`` (the proximal policy), so the service's ratio, and ppo's clip, are taken around
  them, and the behaviour weight ``min(r, C)`` multiplies ``A``.

With ``r == 1`` on every token each correction sends exactly what ``none`` sends. The metrics:
``correction/capped_share`` (tis, decoupled) and ``correction/masked_share`` (mis) among the
trained tokens, ``correction/forward_calls``, and the sampler-learner mismatch the forward call
measured, ``correction/mismatch_k3`` (the ``health/`` one compares the logprobs sent, which
under ``decoupled`` are the learner's own).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from searchr1.core.datum import NonFiniteValues, TrainingDatum
from searchr1.core.types import TrainingClient

if TYPE_CHECKING:
    from pytrio.types import TensorData


class Correction(enum.StrEnum):
    NONE = "none"
    TIS = "tis"
    MIS = "mis"
    DECOUPLED = "decoupled"


@dataclasses.dataclass(frozen=True)
class CorrectionConfig:
    correction: Correction = Correction.NONE
    tis_cap: float = 2.0
    mis_low: float = 0.5
    mis_high: float = 2.0


def correct_tokens(config: CorrectionConfig, sampled: np.ndarray, learned: np.ndarray,
                   advantages: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One datum's corrected ``(advantages, logprobs)`` and which trained positions were capped and
    masked (pure; aligned arrays; a position with advantage 0 keeps its values)."""
    sampled, learned = np.asarray(sampled, np.float64), np.asarray(learned, np.float64)
    advantages = np.asarray(advantages, np.float64)
    trained = advantages != 0.0
    ratio = np.exp(np.where(trained, learned - sampled, 0.0))
    capped = trained & (ratio > config.tis_cap)
    masked = np.zeros_like(trained)
    logprobs, out = sampled.copy(), advantages.copy()
    if config.correction == Correction.TIS:
        out = advantages * np.minimum(ratio, config.tis_cap) / ratio
    elif config.correction == Correction.DECOUPLED:
        out = advantages * np.minimum(ratio, config.tis_cap)
        logprobs = np.where(trained, learned, sampled)
    elif config.correction == Correction.MIS:
        masked = trained & ((ratio < config.mis_low) | (ratio > config.mis_high))
        out = np.where(masked, 0.0, advantages)
    if config.correction in (Correction.NONE, Correction.MIS):
        capped = np.zeros_like(trained)
    return out, logprobs, capped, masked


def learner_logprobs(datums: Sequence[TrainingDatum],
                     outputs: Sequence[Mapping[str, TensorData]]) -> list[np.ndarray]:
    """The learner's logprob of each datum's targets from a ``forward`` call's ``loss_fn_outputs``;
    a missing, misshapen or non-finite array at a trained position raises :class:`NonFiniteValues`."""
    arrays = []
    for index, item in enumerate(datums):
        values = outputs[index].get("logprobs") if index < len(outputs) else None
        learned = np.asarray(values.data if values is not None else [], np.float64)
        advantages = np.asarray(item.datum.loss_fn_inputs["advantages"].data, np.float64)
        if learned.shape != advantages.shape:
            raise NonFiniteValues(f"forward returned {learned.size} logprobs for datum {index} of "
                                  f"{advantages.size} positions (nothing was sent to forward_backward)")
        bad = np.flatnonzero(~np.isfinite(learned) & (advantages != 0.0))
        if bad.size:
            raise NonFiniteValues(f"forward returned logprobs[{int(bad[0])}] = {learned[bad[0]]!r} for datum {index} "
                                  "(nothing was sent to forward_backward)")
        arrays.append(learned)
    return arrays


def apply_correction(config: CorrectionConfig, datums: Sequence[TrainingDatum],
                     learned: Sequence[np.ndarray]) -> tuple[list[TrainingDatum], dict[str, float]]:
    """The datums with corrected advantages (and, ``decoupled``, the learner's logprobs), and the
    correction's metrics (pure)."""
    from pytrio.types import Datum, TensorData

    out: list[TrainingDatum] = []
    trained = capped = masked = 0
    k3: list[float] = []
    for item, values in zip(datums, learned, strict=True):
        inputs = dict(item.datum.loss_fn_inputs)
        sampled = np.asarray(inputs["logprobs"].data, np.float64)
        advantages = np.asarray(inputs["advantages"].data, np.float64)
        new_advantages, logprobs, capped_at, masked_at = correct_tokens(config, sampled, values, advantages)
        mask = advantages != 0.0
        trained += int(mask.sum())
        capped, masked = capped + int(capped_at.sum()), masked + int(masked_at.sum())
        log_ratio = values[mask] - sampled[mask]
        k3 += (np.expm1(log_ratio) - log_ratio).tolist()
        inputs["advantages"] = TensorData.from_numpy(new_advantages.astype(np.float32))
        inputs["logprobs"] = TensorData.from_numpy(logprobs.astype(np.float32))
        datum = Datum(model_input=item.datum.model_input, loss_fn_inputs=inputs)
        out.append(dataclasses.replace(item, datum=datum, loss_tokens=int(np.count_nonzero(inputs["advantages"].data))))
    share = 1.0 / trained if trained else 0.0
    metrics = {"correction/forward_calls": 1.0, "correction/mismatch_k3": math.fsum(k3) * share}
    if config.correction == Correction.MIS:
        metrics["correction/masked_share"] = masked * share
    else:
        metrics["correction/capped_share"] = capped * share
    return out, metrics


async def correct(client: TrainingClient, config: CorrectionConfig, datums: list[TrainingDatum], *, loss_fn: str,
                  loss_fn_config: Mapping[str, object]) -> tuple[list[TrainingDatum], dict[str, float]]:
    """One ``forward`` of the step's datums (the run's loss, as ``forward_backward`` sends it) on the
    weights about to be updated, and the datums corrected with the learner's logprobs it returns;
    ``none`` sends nothing."""
    if config.correction == Correction.NONE or not datums:
        return datums, {}
    options = {"loss_fn_config": dict(loss_fn_config)} if loss_fn_config else {}
    result = await (await client.forward_async([item.datum for item in datums], loss_fn=loss_fn, **options))
    learned = learner_logprobs(datums, result.loss_fn_outputs)
    return apply_correction(config, datums, learned)
