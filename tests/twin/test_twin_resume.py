"""Checkpoints live on disk under the twin's home: a new twin on the same home (in this process
or after the old one was killed with SIGKILL) resumes a run bit for bit."""

from __future__ import annotations

import os
import signal
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytrio.errors.base import ValidationError
from pytrio.errors.control import ControlAPIError
from pytrio.errors.event import EventFailedError
from twin_support import MODEL, running_twin, train_steps
from warm_python import run_python


def state(twin, trainer):
    run = twin.training_run(trainer.training_run_cuid)
    return run.params.copy(), run.adam.m.copy(), run.adam.step


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 2), st.integers(1, 2), st.floats(1e-3, 0.2))
def test_save_and_resume_on_a_new_twin_continues_identically(tmp_path_factory, tokenizer, before, after, lr):
    home = tmp_path_factory.mktemp("home")
    with running_twin(home, tokenizer) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        train_steps(trainer, tokenizer, before, lr=lr)
        path = trainer.save_state("resume-here").result().path
        train_steps(trainer, tokenizer, after, start=before, lr=lr)
        uninterrupted = state(twin, trainer)
    with running_twin(home, tokenizer) as (twin, service):
        resumed = service.create_training_client_from_state_with_optimizer(path)
        train_steps(resumed, tokenizer, after, start=before, lr=lr)
        params, m, step = state(twin, resumed)
        weights_only = service.create_training_client_from_state(path)
        weights_only.save_state("weights-only").result()  # initialises it
        assert twin.training_run(weights_only.training_run_cuid).adam.step == 0
    assert np.array_equal(params, uninterrupted[0]) and np.array_equal(m, uninterrupted[1])
    assert step == uninterrupted[2] == before + after


def test_a_checkpoint_survives_sigkill_and_a_new_process_continues_bit_for_bit(tmp_path, tokenizer):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})
        from twin_support import MODEL, running_twin, train_steps
        from searchr1.runtime.tokenizer import shared_tokenizer
        tokenizer = shared_tokenizer()
        with running_twin({str(tmp_path / "home")!r}, tokenizer) as (twin, service):
            trainer = service.create_lora_training_client(MODEL, rank=8)
            train_steps(trainer, tokenizer, 2)
            print(trainer.save_state("step-2").result().path, flush=True)
            train_steps(trainer, tokenizer, 1, start=2)  # progress after the checkpoint is lost
            os.kill(os.getpid(), signal.SIGKILL)
        """)
    child = run_python(["-c", script], timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr
    path = child.stdout.strip()
    with running_twin(tmp_path / "home", tokenizer) as (twin, service):
        resumed = service.create_training_client_from_state_with_optimizer(path)
        train_steps(resumed, tokenizer, 1, start=2)
        params, _, step = state(twin, resumed)
    with running_twin(tmp_path / "reference", tokenizer) as (twin, service):
        reference = service.create_lora_training_client(MODEL, rank=8)
        train_steps(reference, tokenizer, 3)
        expected, _, expected_step = state(twin, reference)
    assert np.array_equal(params, expected)
    assert step == expected_step == 3


def test_checkpoint_paths_are_deterministic_per_home(tmp_path, tokenizer):
    paths = []
    for home in (tmp_path / "a", tmp_path / "b"):
        with running_twin(home, tokenizer) as (_, service):
            trainer = service.create_lora_training_client(MODEL, rank=8)
            paths.append(trainer.save_state("x").result().path)
    assert paths == ["trio://twin/run-0001/state/x"] * 2


def test_unknown_checkpoint_paths_and_other_policies_are_control_errors(tmp_path, tokenizer):
    with running_twin(tmp_path / "home", tokenizer) as (_, service):
        saved = service.create_lora_training_client(MODEL, rank=8).save_state("toy").result().path
        with pytest.raises(ControlAPIError) as missing:
            service.create_training_client_from_state("trio://twin/run-0042/state/nothing")
    assert missing.value.code == "checkpoint_not_found"
    with running_twin(tmp_path / "home", tokenizer, policy="scripted") as (_, service):
        with pytest.raises(ControlAPIError) as other:
            service.create_training_client_from_state(saved)
    assert other.value.code == "twin.policy_mismatch" and "toy-bigram" in str(other.value)


def test_load_state_refuses_a_checkpoint_of_another_lora_configuration(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer) as (_, service):
        saved = service.create_lora_training_client(MODEL, rank=8).save_state("rank-8").result().path
        other = service.create_lora_training_client(MODEL, rank=16)
        with pytest.raises(ValidationError) as refused:
            other.load_state(saved)
    assert refused.value.code == "validation.checkpoint_config_mismatch"


def test_saving_under_an_existing_name_needs_overwrite(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer) as (_, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        trainer.save_state("same").result()
        with pytest.raises(EventFailedError) as refused:
            trainer.save_state("same").result()
        assert trainer.save_state("same", overwrite=True).result().path.endswith("/state/same")
    assert refused.value.code == "twin.checkpoint_exists"
