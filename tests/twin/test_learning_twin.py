"""The offline main job learns: the same seed gives the same run, and the two negative controls
that a policy could still learn from are refused by the twin's strict mode. That its reward
rises and its final checkpoint beats the base policy on the dev set, by the figures the README
quotes, ``tests/e2e/test_readme_blocks.py`` checks on the README's own commands.

The other two negative controls (advantages negated, advantages shuffled across
groups) produce valid datums that the twin accepts; they fail to learn, which
``tests/twin/test_learning_policy.py`` shows with the same reward, advantage, datum and loss code
(``test_negated_advantages_do_not_raise_the_reward``,
``test_advantages_shuffled_across_groups_do_not_raise_the_reward``)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from pytrio.types import Datum, TensorData

from searchr1.cli import main
from searchr1.core.datum import TrainingDatum
from searchr1.run.directory import RunDir
from twin_support import without_timing_metrics


def invoke(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_the_same_seed_gives_the_same_metrics_line_for_line(tmp_path):
    runs = []
    for name in ("a", "b"):
        invoke("train", "--offline", "--quiet", "--max-steps", "3", "--run-dir", str(tmp_path / name))
        runs.append([without_timing_metrics(line) for line in RunDir(tmp_path / name).metrics()])
    assert runs[0] == runs[1]
    assert runs[0][0]["reward/mean"] != runs[0][2]["reward/mean"] or runs[0][1] != runs[0][2]


def _rebuild(item: TrainingDatum, **arrays: np.ndarray) -> TrainingDatum:
    fields = {key: value.to_numpy() for key, value in item.datum.loss_fn_inputs.items()}
    fields.update(arrays)
    datum = Datum(model_input=item.datum.model_input,
                  loss_fn_inputs={k: TensorData.from_numpy(v) for k, v in fields.items()})
    return TrainingDatum(datum=datum, **{k: v for k, v in item.__dict__.items() if k != "datum"})


def shift_logprobs(item: TrainingDatum) -> TrainingDatum:
    logprobs = item.datum.loss_fn_inputs["logprobs"].to_numpy()
    return _rebuild(item, logprobs=np.roll(logprobs, 1))


def advantage_on_observations(item: TrainingDatum) -> TrainingDatum:
    advantages = item.datum.loss_fn_inputs["advantages"].to_numpy().copy()
    value = advantages[advantages != 0][0] if (advantages != 0).any() else 1.0
    advantages[advantages == 0] = value  # prompt and observation positions now carry the signal
    return _rebuild(item, advantages=advantages)


@pytest.mark.parametrize("mutate, rule", [(shift_logprobs, "logprob"), (advantage_on_observations, "sampled")])
def test_datums_the_policy_could_still_learn_from_are_refused_by_strict_mode(tmp_path, monkeypatch, mutate, rule):
    from searchr1.core import trainer

    original = trainer.build_training_datums
    monkeypatch.setattr(trainer, "build_training_datums",
                        lambda *a, **k: [mutate(item) for item in original(*a, **k)])
    result = CliRunner().invoke(main, ["train", "--offline", "--quiet", "--max-steps", "2",
                                       "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert "twin.protocol_violation" in result.output and rule in result.output
    assert RunDir(tmp_path / "run").metrics() == []  # refused before a single update
    from searchr1.twin.server import untaken_violations

    taken = untaken_violations()
    assert taken and all(rule in str(v) for v in taken)
