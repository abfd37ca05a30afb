"""The real pytrio client against the twin: every call crosses a loopback socket, requests are
validated with pytrio's own protocol models, and the twin starts and stops in well under a
second."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest
import pytrio
from pytrio.errors.auth import AuthError
from pytrio.errors.control import ControlAPIError
from pytrio.types import AdamParams
from twin_support import MODEL, PROMPT, datum_from, running_twin, sample_once

from searchr1.twin import start_twin
from searchr1.twin.client import FAST_RETRIES, connect


def test_a_real_client_trains_samples_and_saves_through_the_socket(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer) as (twin, service):
        assert isinstance(service, pytrio.ServiceClient)
        trainer = service.create_lora_training_client(MODEL, rank=8)
        sampler = trainer.save_weights_and_get_sampling_client()
        prompt = tokenizer.encode(PROMPT)
        sequence = sample_once(sampler, prompt, max_tokens=5).sequences[0]
        assert len(sequence.tokens) == len(sequence.logprobs) == 5
        datum = datum_from(prompt, list(sequence.tokens), list(sequence.logprobs))
        out = trainer.forward_backward([datum], loss_fn="importance_sampling").result()
        assert out.metrics["token_count"] == len(prompt) + 5 - 1
        before = twin.training_run(trainer.training_run_cuid).params.copy()
        trainer.optim_step(AdamParams(learning_rate=0.01)).result()
        after = twin.training_run(trainer.training_run_cuid).params
        assert not np.array_equal(before, after)  # the server applied the update it computed
        state = trainer.save_state("smoke-state").result()
        assert state.path == f"trio://twin/{trainer.training_run_cuid}/state/smoke-state"
        events = [(e.type, e.index, e.status) for e in twin.event_log]
    assert events == [
        ("trainer.init_run", 1, "succeeded"), ("trainer.save_weights", 2, "succeeded"),
        ("trainer.forward_backward", 3, "succeeded"), ("trainer.optimize_step", 4, "succeeded"),
        ("trainer.save_state", 5, "succeeded"),
    ]
    assert [(e.prompt_tokens, e.output_tokens) for e in twin.sample_log] == [(len(prompt), (5,))]


def test_the_catalog_names_the_model_and_run_creation_serves_the_tokenizer_from_disk(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer) as (_, service):
        assert service.get_supported_models() == [MODEL]
        trainer = service.create_lora_training_client(MODEL, rank=8)
        loaded = trainer.get_tokenizer()  # ModelScope's loader, on the path the twin returned
    assert len(loaded) == len(tokenizer)
    assert loaded.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()  # the same tokenizer
    assert loaded.added_tokens_decoder == tokenizer.added_tokens_decoder
    assert loaded.chat_template == tokenizer.chat_template and loaded.eos_token == tokenizer.eos_token


def test_the_twin_starts_in_well_under_a_second_and_stops_cleanly(tmp_path, tokenizer):
    threads = set(threading.enumerate())
    started = time.perf_counter()
    twin = start_twin(home=tmp_path, tokenizer=tokenizer, policy="toy")
    elapsed = time.perf_counter() - started
    service = twin.service_client(sdk_options=FAST_RETRIES)
    service.create_lora_training_client(MODEL, rank=8)
    twin.close()
    twin.close()  # idempotent
    assert elapsed < 1.0  # it takes about 10 ms; the bound only guards against a start that blocks
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{twin.base_url}/api/models", timeout=1)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and twin_threads(threads):
        time.sleep(0.01)
    assert not twin_threads(threads)


def twin_threads(before):
    return {t.name for t in set(threading.enumerate()) - before if t.name.startswith("twin")}


def test_a_wrong_api_key_is_refused_like_the_service_refuses_it(tmp_path, tokenizer):
    with start_twin(home=tmp_path, tokenizer=tokenizer, policy="toy") as twin:
        with pytest.raises((AuthError, ControlAPIError)) as caught:
            connect(twin.base_url, home=tmp_path / "sdk", api_key="not-the-key", sdk_options=FAST_RETRIES)
    assert caught.value.code == "unauthorized"
    assert "not-the-key" not in str(caught.value)


@pytest.mark.parametrize(
    ("path", "body", "culprit"),
    [
        ("/api/openapi/v1/service-sessions", {"sdk_version": "0.2.9", "surprise": 1}, "surprise"),
        ("/api/openapi/v1/service-sessions", {}, "sdk_version"),
    ],
)
def test_a_request_pytrios_protocol_models_reject_is_rejected(tmp_path, tokenizer, path, body, culprit):
    with start_twin(home=tmp_path, tokenizer=tokenizer, policy="toy") as twin:
        response = httpx.post(twin.base_url + path, json=body, headers={"X-API-Key": twin.api_key})
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error" and culprit in response.json()["message"]


def test_an_event_submitted_twice_is_answered_as_already_accepted(tmp_path, tokenizer):
    """pytrio re-submits an event after a dropped answer; the twin must not run it twice."""
    from twin_support import sampled_datum

    from searchr1.twin import TwinFaults

    faults = TwinFaults(dropped_connections={"event_submit": {3}})  # the forward_backward's first answer
    with running_twin(tmp_path, tokenizer, faults=faults) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        sampler = trainer.save_weights_and_get_sampling_client()
        datum = sampled_datum(sampler, tokenizer.encode(PROMPT))
        trainer.forward_backward([datum], loss_fn="importance_sampling").result()
        trainer.optim_step(AdamParams(learning_rate=0.01)).result()
        kinds = [e.type for e in twin.event_log]
        submits = twin.calls("event_submit")
    assert kinds.count("trainer.forward_backward") == 1
    assert submits == len(kinds) + 1  # the answer was lost once and the event sent again


def test_the_rest_client_lists_the_checkpoints_on_the_twins_disk(tmp_path, tokenizer):
    with running_twin(tmp_path, tokenizer) as (_, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        state = trainer.save_state("listed").result()
        weights = trainer.save_weights_for_sampler("listed-weights").result()
        rest = service.create_rest_client()
        listed = rest.list_checkpoints(trainer.training_run_cuid).result()
        run = rest.get_training_run(trainer.training_run_cuid).result()
    assert sorted((c.checkpoint_type, c.path) for c in listed.checkpoints) == [
        ("sampler", weights.path), ("training", state.path)]
    assert run.lora_rank == 8


def test_without_the_served_tokenizer_the_sdk_goes_to_modelscope_as_a_user_without_network_would(
    tmp_path, tokenizer, monkeypatch
):
    import modelscope
    from modelscope_hub.errors import NetworkError

    asked = []

    class Offline:
        @staticmethod
        def from_pretrained(name, *args, **kwargs):
            asked.append((name, kwargs.get("local_files_only")))
            raise NetworkError("Connection failed: modelscope.cn is unreachable")

    monkeypatch.setattr(modelscope, "AutoTokenizer", Offline)
    with running_twin(tmp_path, tokenizer, serve_tokenizer=False) as (twin, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        sampler = trainer.save_weights_and_get_sampling_client()
        datum = datum_from(tokenizer.encode(PROMPT), [5], [-1.0], advantage=0.0)
        with pytest.raises(NetworkError):  # not a PyTrioError: pytrio lets ModelScope's error through
            trainer.forward_backward([datum], loss_fn="importance_sampling")
        sent = [e.type for e in twin.event_log]
    assert trainer.model_id == sampler.model_id == MODEL
    assert asked == [(MODEL, True), (MODEL, False)]  # the local cache, then the network
    assert "trainer.forward_backward" not in sent


def test_sdk_telemetry_is_accepted_when_a_client_sends_it(tmp_path, tokenizer):
    with start_twin(home=tmp_path, tokenizer=tokenizer, policy="toy") as twin:
        service = twin.service_client(sdk_options=FAST_RETRIES, telemetry=True)
        service.create_lora_training_client(MODEL, rank=8).save_state("seen").result()
    assert twin.backend.telemetry_batches >= 1  # flushed when the session closed, before the twin stopped


def test_train_offline_builds_the_real_client_and_every_pytrio_call_crosses_the_socket(tmp_path, monkeypatch):
    from collections import Counter

    from click.testing import CliRunner

    import searchr1.twin as twin_package
    from searchr1.cli import main

    started, built = [], []
    start, init = twin_package.start_twin, pytrio.ServiceClient.__init__

    def starting(**options):
        started.append(start(**options))
        return started[-1]

    def constructing(self, *args, **kwargs):
        built.append(type(self))
        init(self, *args, **kwargs)

    monkeypatch.setattr(twin_package, "start_twin", starting)
    monkeypatch.setattr(pytrio.ServiceClient, "__init__", constructing)
    result = CliRunner().invoke(main, ["train", "--offline", "--offline-policy", "scripted", "--max-steps", "2",
                                       "--quiet", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    (twin,) = started
    events = Counter(e.type for e in twin.event_log)
    assert built == [pytrio.ServiceClient]
    assert events["trainer.init_run"] == 1 and events["trainer.forward_backward"] == 2
    assert events["trainer.optimize_step"] == 2 and events["trainer.save_state"] == 1
    assert events["trainer.save_weights"] == 3  # two samplers and the final checkpoint's weights
    assert twin.calls("sampling_run_create") == 2 and len(twin.sample_log) > 2 * 8
    assert (tmp_path / "run" / "twin" / "runs" / "run-0001" / "run.json").is_file()
