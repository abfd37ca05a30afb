"""Strict mode: every protocol rule fires on a violation, fails the event with a clear code and
is recorded (and a test whose twin recorded one it did not take fails)."""

from __future__ import annotations

import pytest
from pytrio.errors.event import EventFailedError
from pytrio.types import AdamParams
from twin_support import MODEL, PROMPT, RawTrainingRun, datum_from, running_twin, sample_once

from searchr1.twin import Strictness, TwinFaults, start_twin
from searchr1.twin.strict import VIOLATION_CODE

LR = AdamParams(learning_rate=0.05)
pytest_plugins = ["pytester"]


def rules(twin):
    return [v.rule for v in twin.take_violations()]


def sampled(trainer, tokenizer, *, seed=1, max_tokens=6):
    sampler = trainer.save_weights_and_get_sampling_client()
    prompt = tokenizer.encode(PROMPT)
    sequence = sample_once(sampler, prompt, seed=seed, max_tokens=max_tokens).sequences[0]
    return prompt, list(sequence.tokens), list(sequence.logprobs)


def train(trainer, datum):
    return trainer.forward_backward([datum], loss_fn="importance_sampling").result()


# --- the rules the real client can break ----------------------------------------------------


def test_a_datum_trained_as_the_sampler_returned_it_passes(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        prompt, tokens, logprobs = sampled(trainer, tokenizer)
        train(trainer, datum_from(prompt, tokens, logprobs))
        trainer.optim_step(LR).result()
        assert twin.violations == []


def test_logprobs_shifted_by_one_position_fail_the_step(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        prompt, tokens, logprobs = sampled(trainer, tokenizer)
        shifted = logprobs[1:] + [logprobs[0]]
        with pytest.raises(EventFailedError) as failed:
            train(trainer, datum_from(prompt, tokens, shifted))
        assert rules(twin) == ["sampled_logprob"]
    assert failed.value.code == VIOLATION_CODE and "sampled_logprob" in str(failed.value)


def test_a_trained_token_the_twin_never_sampled_fails_the_step(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        prompt, tokens, logprobs = sampled(trainer, tokenizer)
        forged = tokens[:-1] + [(tokens[-1] + 1) % len(tokenizer)]
        with pytest.raises(EventFailedError) as failed:
            train(trainer, datum_from(prompt, forged, logprobs))
        assert rules(twin) == ["sampled_action"]
    assert "never sampled" in str(failed.value)


def test_zero_advantage_positions_are_not_checked(tmp_path, tokenizer):
    """Prompt and observation tokens are the environment's: any token may sit there."""
    with running_twin(tmp_path, tokenizer) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        prompt, tokens, logprobs = sampled(trainer, tokenizer)
        train(trainer, datum_from(prompt, tokens, logprobs, advantage=0.0))
        train(trainer, datum_from(prompt, [5, 6, 7], [0.0, 0.0, 0.0], advantage=0.0))
        assert twin.violations == []


@pytest.mark.parametrize(("max_staleness", "fails"), [(0, True), (1, False)])
def test_samples_from_weights_older_than_allowed_fail_the_step(tmp_path, tokenizer, max_staleness, fails):
    strictness = Strictness(max_staleness=max_staleness)
    with running_twin(tmp_path, tokenizer, strictness=strictness) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        old = sampled(trainer, tokenizer, seed=1)
        train(trainer, datum_from(*sampled(trainer, tokenizer, seed=2)))
        trainer.optim_step(LR).result()  # the weights change: the first sampler is one step old
        if fails:
            with pytest.raises(EventFailedError) as failed:
                train(trainer, datum_from(*old))
            assert "stale_sampler" in str(failed.value)
            assert rules(twin) == ["stale_sampler"]
        else:
            train(trainer, datum_from(*old))
            assert twin.violations == []


def test_a_stale_sample_is_named_by_its_own_runs_sampler_when_another_run_drew_it_too():
    """A token whose logprob is the same under every weights (one the policy cannot but take) is
    in the ledger from several runs; a run's stale datum is reported against that run's own
    sampler, never against another run's newer one."""
    from searchr1.twin.policy import PolicySample
    from searchr1.twin.strict import ProtocolViolation, SampleLedger, check_sampled_actions

    prompt, tokens, logprobs = [1, 2, 3], [4, 5], [-0.5, 0.0]
    ledger = SampleLedger()
    ledger.record(prompt, [(tokens, logprobs)], lineage="run-0001", version=12)
    ledger.record(prompt, [(tokens, logprobs)], lineage="run-0002", version=0)
    sample = PolicySample.from_arrays(prompt + tokens[:-1], [-100, -100] + tokens, logprobs=[0, 0] + logprobs,
                                      advantages=[0, 0, 1.0, 1.0])
    with pytest.raises(ProtocolViolation) as failed:
        check_sampled_actions([sample], ledger, lineage="run-0002", version=4, max_staleness=3)
    assert "version 0 of run-0002; the run (run-0002)" in str(failed.value)


def test_a_step_that_leaves_the_weights_unchanged_does_not_age_a_sampler(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        first = sampled(trainer, tokenizer)
        train(trainer, datum_from(*first))
        trainer.optim_step(AdamParams(learning_rate=0.0)).result()
        train(trainer, datum_from(*first))
        assert twin.violations == []


def test_strict_mode_off_records_nothing_and_trains_anything(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer, strictness=Strictness(enabled=False)) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        train(trainer, datum_from(tokenizer.encode(PROMPT), [11, 12], [-1.0, -2.0]))
        trainer.optim_step(LR).result()
        assert twin.violations == []


# --- the rules only a wrong client breaks (spoken on the wire directly) -----------------------


def _raw(tmp_path, tokenizer):
    twin = start_twin(home=tmp_path, tokenizer=tokenizer, policy="toy",
                      strictness=Strictness(sampled_actions=False))
    return twin, RawTrainingRun(twin)


def _datum(n=6, token=7):
    return datum_from([token] * n, [token + 1, token + 2], [-1.0, -1.0])


def test_an_event_index_that_skips_one_fails(tmp_path, tokenizer):
    twin, run = _raw(tmp_path, tokenizer)
    with twin:
        assert run.init()["status"] == "succeeded"
        answer = run.optim_step(index=3, step=0)
        assert [v.rule for v in twin.take_violations()] == ["event_order"]
    assert answer["status"] == "failed" and answer["error"]["code"] == VIOLATION_CODE
    assert "index 3, expected 2" in answer["error"]["message"]


def test_an_event_before_init_run_fails(tmp_path, tokenizer):
    twin, run = _raw(tmp_path, tokenizer)
    with twin:
        answer = run.optim_step(index=1, step=0)
        assert [v.rule for v in twin.take_violations()] == ["event_order"]
    assert "before trainer.init_run" in answer["error"]["message"]


def test_a_step_number_that_does_not_count_the_calls_before_it_fails(tmp_path, tokenizer):
    twin, run = _raw(tmp_path, tokenizer)
    with twin:
        run.init()
        assert run.forward_backward([_datum()], index=2, step=0)["status"] == "succeeded"
        answer = run.optim_step(index=3, step=0)  # one forward_backward call came before: step 1
        assert [v.rule for v in twin.take_violations()] == ["event_order"]
    assert "carries step 0, but 1 forward_backward call came before it" in answer["error"]["message"]


def test_a_call_whose_chunks_fall_short_of_its_totals_fails_the_next_event(tmp_path, tokenizer):
    twin, run = _raw(tmp_path, tokenizer)
    with twin:
        run.init()
        datum = _datum()
        # totals announce two samples; only one chunk of one arrives before the optimiser step
        assert run.forward_backward([datum], index=2, totals={"total_samples": 2,
                                    "total_active_tokens": 14, "total_advantage_tokens": 4})["status"] == "succeeded"
        answer = run.optim_step(index=3, step=1)
        assert [v.rule for v in twin.take_violations()] == ["accumulation_totals"]
    assert "sent 1 of its 2 samples" in answer["error"]["message"]


def test_a_chunk_that_exceeds_its_totals_fails_itself(tmp_path, tokenizer):
    twin, run = _raw(tmp_path, tokenizer)
    with twin:
        run.init()
        answer = run.forward_backward([_datum()], index=2, totals={"total_active_tokens": 3})
        assert [v.rule for v in twin.take_violations()] == ["accumulation_totals"]
    assert answer["status"] == "failed" and "exceed the totals" in answer["error"]["message"]


def test_a_token_id_outside_the_vocabulary_fails(tmp_path, tokenizer):
    twin, run = _raw(tmp_path, tokenizer)
    with twin:
        run.init()
        outside = len(tokenizer)
        answer = run.forward_backward([_datum(token=outside - 1)], index=2, vocab_size=outside + 5)
        assert [v.rule for v in twin.take_violations()] == ["token_range"]
    assert f"outside [0, {outside})" in answer["error"]["message"]


# --- the suite fails a test whose twin recorded a violation it did not take -----------------------


@pytest.mark.parametrize("collected", [False, True], ids=["twin-alive", "twin-collected"])
def test_a_violation_nobody_takes_fails_the_test(pytester, tokenizer, collected):
    """Whether the twin is still alive at the test's teardown or was garbage-collected before
    it (which depends on when the collector runs), its untaken violation fails the test."""
    from pathlib import Path

    here = Path(__file__).parents[1]
    pytester.makeconftest((here / "conftest.py").read_text("utf-8"))
    pytester.syspathinsert(here)
    pytester.makepyfile(test_leak=f"""
        import gc
        import weakref
        from twin_support import MODEL, PROMPT, datum_from, running_twin

        KEPT = []

        def test_leaks(tmp_path, tokenizer):
            with running_twin(tmp_path, tokenizer) as (twin, service):
                trainer = service.create_lora_training_client(MODEL, rank=8)
                try:
                    trainer.forward_backward([datum_from(tokenizer.encode(PROMPT), [5], [-1.0])],
                                             loss_fn="importance_sampling").result()
                except Exception:
                    pass
            if {collected}:
                gone = weakref.ref(twin)
                del twin, service, trainer
                gc.collect()
                assert gone() is None
            else:
                KEPT.append(twin)  # still alive when the fixture looks
    """)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", "-p", "no:asyncio")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*the twin recorded protocol violations*", "*sampled_action: datum 0*"])


def test_fault_numbers_start_at_one_and_names_are_checked():
    with pytest.raises(ValueError, match="start at 1"):
        TwinFaults(failed_events={"forward_backward": {0: "x"}})
    with pytest.raises(ValueError, match="unknown name 'forward_backwards'"):
        TwinFaults(broken_runs={"forward_backwards": {1}})
    with pytest.raises(ValueError, match="not an HTTP error status"):
        TwinFaults(http_errors={"sample": {1: 200}})
    with pytest.raises(ValueError, match="max_staleness"):
        Strictness(max_staleness=-1)
