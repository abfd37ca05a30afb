"""First-fit-decreasing packing and n_k/N reweighting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pytrio.types import Datum, ModelInput
from training_strategies import generated_trajectories

from searchr1.core.datum import TrainingDatum, build_datums
from searchr1.training.packing import (
    PackingError,
    datum_size,
    pack_micro_batches,
    padded_tokens,
    weight_micro_batch_for_global_mean,
)

# Packing looks only at sizes, so most tests share one tiny datum under many sizes.
TINY = Datum(
    model_input=ModelInput.from_ints([1]),
    loss_fn_inputs={"target_tokens": [2], "logprobs": [0.0], "advantages": [1.0]},
)


def sized(sizes):
    return [
        TrainingDatum(TINY, num_tokens=n, loss_tokens=1, question_index=i, group_index=0)
        for i, n in enumerate(sizes)
    ]


limits = st.fixed_dictionaries(
    {
        "max_datum_tokens": st.integers(1, 8192),
        "max_items": st.integers(1, 40),
        "max_padded_tokens": st.integers(1, 64_000),
    }
)


@given(limits, st.data())
def test_packing_respects_every_limit_and_neither_loses_nor_duplicates_a_datum(limit, data):
    ceiling = min(limit["max_datum_tokens"], limit["max_padded_tokens"])
    items = sized(data.draw(st.lists(st.integers(1, ceiling), max_size=60)))
    batches = pack_micro_batches(items, **limit)
    packed = [id(item) for batch in batches for item in batch]
    assert sorted(packed) == sorted(id(item) for item in items)
    for batch in batches:
        assert 1 <= len(batch) <= limit["max_items"]
        assert padded_tokens(batch) <= limit["max_padded_tokens"]
        assert padded_tokens(batch) == len(batch) * max(datum_size(i) for i in batch)


@given(st.lists(st.integers(1, 8192), max_size=60))
def test_each_batch_is_sorted_longest_first(sizes):
    for batch in pack_micro_batches(sized(sizes)):
        lengths = [datum_size(i) for i in batch]
        assert lengths == sorted(lengths, reverse=True)


def test_at_most_seven_full_length_datums_share_a_batch_under_the_lab_ports_limits():
    # 8 x 8192 = 65,536 > 64,000 (the lab port's padded-token limit)
    assert [len(b) for b in pack_micro_batches(sized([8192] * 8))] == [7, 1]


def test_the_item_limit_binds_for_short_datums():
    assert [len(b) for b in pack_micro_batches(sized([10] * 70))] == [32, 32, 6]


@pytest.mark.parametrize(
    "size, limit", [(8193, {}), (101, {"max_datum_tokens": 100}), (60, {"max_padded_tokens": 50})]
)
def test_an_oversized_datum_raises_naming_its_trajectory(size, limit):
    items = sized([5, size])
    with pytest.raises(PackingError, match=f"q1/g0 has {size} tokens"):
        pack_micro_batches(items, **limit)


def test_empty_input_gives_no_batches_and_bad_limits_are_rejected():
    assert pack_micro_batches([]) == []
    with pytest.raises(ValueError, match="max_items must be at least 1"):
        pack_micro_batches(sized([1]), max_items=0)


@given(st.lists(generated_trajectories(), min_size=1, max_size=10), st.integers(1, 6))
def test_nk_over_n_weights_sum_to_one_and_leave_inputs_untouched(items, max_items):
    datums = [build_datums(g.trajectory)[0] for g in items]
    originals = [d.datum.loss_fn_inputs["advantages"].to_numpy().copy() for d in datums]
    batches = pack_micro_batches(datums, max_items=max_items)
    factors = []
    for batch in batches:
        weighted = weight_micro_batch_for_global_mean(batch, total_samples=len(datums))
        assert [(w.question_index, w.group_index) for w in weighted] == [(b.question_index, b.group_index) for b in batch]
        for before, after in zip(batch, weighted):
            a = before.datum.loss_fn_inputs["advantages"].to_numpy()
            b = after.datum.loss_fn_inputs["advantages"].to_numpy()
            ratio = b[a != 0] / a[a != 0]
            assert np.allclose(ratio, len(batch) / len(datums), rtol=1e-6)
            assert after.datum.model_input == before.datum.model_input
            assert np.array_equal(
                after.datum.loss_fn_inputs["target_tokens"].to_numpy(),
                before.datum.loss_fn_inputs["target_tokens"].to_numpy(),
            )
        factors.append(len(batch) / len(datums))
    # one factor per batch, n_k / N, weighting each *batch mean*: they sum to 1
    assert sum(factors) == pytest.approx(1.0)
    for datum, original in zip(datums, originals):
        assert np.array_equal(datum.datum.loss_fn_inputs["advantages"].to_numpy(), original)


def test_weighting_validates_like_the_lab_port():
    items = sized([3, 4])
    assert weight_micro_batch_for_global_mean([], 5) == []
    with pytest.raises(ValueError, match="total_samples must be positive"):
        weight_micro_batch_for_global_mean(items, 0)
    with pytest.raises(ValueError, match="larger than total_samples=1"):
        weight_micro_batch_for_global_mean(items, 1)


@given(generated_trajectories())
def test_loss_token_count_reads_the_datum(generated):
    item = build_datums(generated.trajectory)[0]
    loss_tokens = int(np.count_nonzero(item.datum.loss_fn_inputs["advantages"].to_numpy()))
    assert loss_tokens == sum(generated.is_action) == item.loss_tokens
    assert datum_size(item) == len(generated.tokens) - 1
