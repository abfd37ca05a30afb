"""--num-substeps: the step's datums in a seeded order, cut into mini-batches, each its own
forward_backward and optim_step, each normalised by its own totals."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pytrio.types import Datum, ModelInput, TensorData

from searchr1.training.config import TrainConfig
from searchr1.core.datum import TrainingDatum
from searchr1.core.settings import SettingError
from searchr1.core.update import UpdateConfig, apply_substeps, substep_batches


@given(n=st.integers(0, 60), substeps=st.integers(1, 8), seed=st.integers(-5, 5), step=st.integers(0, 50))
def test_the_mini_batches_partition_the_datums_evenly_and_depend_only_on_seed_and_step(n, substeps, seed, step):
    """Invariant: every datum is in exactly one mini-batch, there are min(N, n) of them with sizes
    differing by at most one, the same (seed, step) gives the same cut, and one substep keeps the
    datums in their order."""
    parts = substep_batches(n, substeps, seed=seed, step=step)
    assert sorted(i for part in parts for i in part) == list(range(n))
    assert len(parts) == min(substeps, n) and all(parts)
    assert not parts or max(map(len, parts)) - min(map(len, parts)) <= 1
    assert parts == substep_batches(n, substeps, seed=seed, step=step)
    if substeps == 1:
        assert parts == ([list(range(n))] if n else [])


def test_the_order_changes_with_the_step():
    orders = {tuple(map(tuple, substep_batches(16, 4, seed=1, step=step))) for step in range(6)}
    assert len(orders) > 1


def datum(index: int, tokens: int = 3) -> TrainingDatum:
    advantages = np.full(tokens, 1.0 + index, np.float32)
    built = Datum(model_input=ModelInput.from_ints(list(range(1, tokens + 1))), loss_fn_inputs={
        "target_tokens": TensorData.from_numpy(np.arange(2, tokens + 2, dtype=np.int64)),
        "logprobs": TensorData.from_numpy(np.full(tokens, -1.0, np.float32)),
        "advantages": TensorData.from_numpy(advantages),
    })
    return TrainingDatum(built, tokens, tokens, index, 0)


class RecordingClient:
    """Records each event in order; forward_backward answers with the sampler's logprobs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, list[float]]] = []

    async def forward_backward_async(self, data, loss_fn, **options):
        advantages = [float(d.loss_fn_inputs["advantages"].to_numpy()[0]) for d in data]
        self.events.append(("forward_backward", advantages))
        outputs = [{"logprobs": d.loss_fn_inputs["logprobs"]} for d in data]
        return asyncio.sleep(0, SimpleNamespace(metrics={"loss_sum": 1.0, "token_count": 3.0}, loss_fn_outputs=outputs))

    async def optim_step_async(self, adam):
        self.events.append(("optim_step", []))
        return asyncio.sleep(0, SimpleNamespace(metrics={"grad_norm": float(len(self.events))}))


def run_update(config: TrainConfig, datums: list[TrainingDatum], micro_batches=None, step: int = 3):
    """The core's update of ``datums`` under ``config`` (``micro_batches`` given: the run loop's
    manual micro-batching of each mini-batch); its events, metrics and forward_backward calls."""
    from searchr1.training.loop import manual_micro_batches

    client = RecordingClient()
    update_config = UpdateConfig(config.learning_rate, config.beta1, config.beta2, config.loss_fn,
                                 config.loss_fn_config)
    cut = manual_micro_batches(config) if micro_batches is not None else None
    result = asyncio.run(apply_substeps(client, datums, cut, update_config, num_substeps=config.num_substeps,
                                        seed=config.seed, step=step))
    metrics = {**result.optim_metrics}
    sent = [[float(d.datum.loss_fn_inputs["advantages"].to_numpy()[0]) for d in call] for call in result.sent]
    assert sent == [advantages for name, advantages in client.events if name == "forward_backward"]
    return client.events, metrics, result.calls


def test_sdk_substeps_send_each_mini_batch_in_one_call_then_step_the_optimiser():
    datums = [datum(i) for i in range(7)]
    config = TrainConfig(max_steps=1, data="x", num_substeps=3, seed=5)
    events, metrics, calls = run_update(config, datums)
    assert [name for name, _ in events] == ["forward_backward", "optim_step"] * 3
    sent = [advantages for name, advantages in events if name == "forward_backward"]
    parts = substep_batches(7, 3, seed=5, step=3)
    assert sent == [[1.0 + i for i in part] for part in parts]  # whole, unscaled: PyTRIO normalises per call
    assert sorted(a for call in sent for a in call) == [1.0 + i for i in range(7)]
    assert metrics["train/optimizer_steps"] == 3 and calls == 3
    assert metrics["optim/grad_norm"] == pytest.approx((2 + 4 + 6) / 3)  # the mean over the substeps


def test_manual_substeps_pack_each_mini_batch_and_weight_it_as_its_own_mean():
    datums = [datum(i) for i in range(6)]
    config = TrainConfig(max_steps=1, data="x", num_substeps=2, accumulation="manual", max_micro_batch_items=2)
    events, metrics, calls = run_update(config, datums, micro_batches=[datums])
    names = [name for name, _ in events]
    assert names == ["forward_backward", "forward_backward", "optim_step"] * 2  # 3 datums -> micro-batches of 2 + 1
    parts = substep_batches(6, 2, seed=config.seed, step=3)
    sent = [advantages for name, advantages in events if name == "forward_backward"]
    for part, calls_of_part in zip(parts, (sent[:2], sent[2:])):
        # each micro-batch's advantages are scaled by n_k / 3 (the mini-batch's datums): its own mean
        unscaled = sorted(a * 3 / len(call) for call in calls_of_part for a in call)
        assert unscaled == pytest.approx(sorted(1.0 + i for i in part))
    assert metrics["train/optimizer_steps"] == 2 and calls == 4


def test_one_substep_is_one_call_and_one_optimiser_step_in_the_datums_order():
    datums = [datum(i) for i in range(4)]
    events, metrics, _ = run_update(TrainConfig(max_steps=1, data="x"), datums)
    assert events == [("forward_backward", [1.0, 2.0, 3.0, 4.0]), ("optim_step", [])]
    assert metrics["train/optimizer_steps"] == 1 and not any("substep" in key for key in metrics)


def test_num_substeps_is_a_setting_of_at_least_one_recorded_in_the_config():
    with pytest.raises(SettingError, match="--num-substeps"):
        TrainConfig(max_steps=1, data="x", num_substeps=0)
    config = TrainConfig(max_steps=1, data="x", num_substeps=4)
    assert TrainConfig.from_json(config.to_json()).num_substeps == 4
