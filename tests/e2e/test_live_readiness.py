"""What a first paid run depends on, checked before it costs anything: the reward does not
depend on the sampler's stop-string convention, checkpoint names never collide across runs,
the trainer refuses settings that bias the importance ratio, and the default accumulation
never packs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.core.types import SearchExample, Trajectory, Turn
from searchr1.core.protocol import parse_assistant
from searchr1.core.reward import score_trajectories
from searchr1.core.rollout import RolloutConfig, record_turn

EXAMPLE = SearchExample(id="q1", question="Which country?", answers=("France",), data_source="nq")
STOP_STRINGS = ("<|im_end|>", "<|endoftext|>", "<|im_end|>\n", "<|im_end|><|endoftext|>")


def _scored(tokenizer, text: str) -> Trajectory:
    trajectory = Trajectory(EXAMPLE, 0, 0, [{"role": "user", "content": EXAMPLE.question}])
    turn = Turn(prompt_tokens=[1, 2, 3], completion_tokens=[4, 5], logprobs=[-0.1, -0.2], text=text)
    assert record_turn(trajectory, turn, tokenizer, RolloutConfig()) is None
    score_trajectories([trajectory])
    return trajectory


answers = st.sampled_from(["France", "Spain", "france.", "The France", ""])
lines = st.lists(st.sampled_from(["I checked.", "Answer: {}", "answer:{}", "Final."]), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(lines=lines, answer=answers, stop=st.sampled_from(STOP_STRINGS))
def test_reward_is_the_same_whether_or_not_the_sampler_keeps_the_stop_string(tokenizer, lines, answer, stop):
    text = "\n".join(line.format(answer) for line in lines)
    plain, stopped = _scored(tokenizer, text), _scored(tokenizer, text + stop)
    assert (stopped.reward, stopped.score.exact_match, stopped.score.valid_format) == (
        plain.reward, plain.score.exact_match, plain.score.valid_format)
    assert stopped.final_text == plain.final_text
    assert stopped.messages[-1]["content"] == plain.messages[-1]["content"]


def test_a_correct_answer_followed_by_the_stop_string_earns_full_reward(tokenizer):
    trajectory = _scored(tokenizer, "Answer: France<|im_end|>")
    assert trajectory.reward == 1.0 and trajectory.score.exact_match
    assert "<|im_end|>" not in trajectory.final_text


def test_the_parser_reports_the_text_it_classified_without_the_stop_string():
    call = "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n</function>\n</tool_call>"
    for body in ("Answer: France", call, "<tool_call>{}</tool_call>"):
        assert parse_assistant(body + "<|im_end|>").text == body
        assert parse_assistant(body).text == body


# --- prompts are the user's to set, and recorded -------------------------------------------

from click.testing import CliRunner  # noqa: E402

from searchr1.cli import main  # noqa: E402
from searchr1.core.protocol import initial_messages  # noqa: E402
from searchr1.core.rollout import effective_system_prompt, make_request  # noqa: E402

CUSTOM_PROMPT = "Answer briefly. You may search {max_search_calls} times; {braces} stay as written.\n"


def test_a_custom_system_prompt_and_tool_description_reach_the_first_prompt(tokenizer):
    config = RolloutConfig(system_prompt=CUSTOM_PROMPT, tool_description="Find passages in the archive.",
                           max_search_calls=3)
    messages = initial_messages(EXAMPLE.question, max_search_calls=3, system_template=config.system_prompt)
    request = make_request(tokenizer, [Trajectory(EXAMPLE, 0, 0, messages)], 7, config)
    text = tokenizer.decode(request.prompt_tokens, skip_special_tokens=False)
    assert "You may search 3 times; {braces} stay as written." in text
    assert "Find passages in the archive." in text
    assert effective_system_prompt(config) == CUSTOM_PROMPT.replace("{max_search_calls}", "3")
    default = make_request(tokenizer, [Trajectory(EXAMPLE, 0, 0, initial_messages(EXAMPLE.question))], 7,
                           RolloutConfig())
    assert "Find passages in the archive." not in tokenizer.decode(default.prompt_tokens)


def _offline_eval(tmp_path, name, *extra):
    output = tmp_path / f"{name}.jsonl"
    result = CliRunner().invoke(main, ["eval", "--offline", "--quiet", "--limit", "2", "--backend", "wikipedia",
                                       "--output", str(output), *extra])
    assert result.exit_code == 0, result.output
    return output


def test_eval_records_the_prompt_and_plot_refuses_to_mix_prompts(tmp_path):
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(CUSTOM_PROMPT, "utf-8")
    default = _offline_eval(tmp_path, "default")
    custom = _offline_eval(tmp_path, "custom", "--system-prompt-file", str(prompt_file),
                           "--tool-description", "Find passages in the archive.")
    import json

    config = json.loads(custom.read_text().splitlines()[0])["config"]
    assert config["system_prompt"] == CUSTOM_PROMPT.replace("{max_search_calls}", "4")
    assert config["tool_description"] == "Find passages in the archive."
    figure = tmp_path / "em.png"
    refused = CliRunner().invoke(main, ["plot", "eval", str(default), str(custom), "-o", str(figure)])
    assert refused.exit_code != 0 and "system_prompt" in refused.output and not figure.exists()
    allowed = CliRunner().invoke(main, ["plot", "eval", str(default), str(custom), "--allow-mixed", "-o", str(figure)])
    assert allowed.exit_code == 0, allowed.output
    assert figure.stat().st_size > 0


def test_training_records_the_prompt_it_used(tmp_path):
    import json

    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(CUSTOM_PROMPT, "utf-8")
    result = CliRunner().invoke(main, ["train", "--offline", "--quiet", "--max-steps", "1", "--questions-per-batch",
                                       "2", "--group-size", "2", "--backend", "wikipedia", "--system-prompt-file", str(prompt_file),
                                       "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["rollout"]["system_prompt"] == CUSTOM_PROMPT


def test_an_empty_system_prompt_file_is_refused_by_name(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    result = CliRunner().invoke(main, ["eval", "--offline", "--quiet", "--system-prompt-file", str(empty)])
    assert result.exit_code == 2 and "empty.txt is empty" in result.output


# --- preflight: server limits and the service's tokenizer -----------------------------------

import concurrent.futures  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import httpx  # noqa: E402
import pytest  # noqa: E402

from searchr1.runtime.preflight import (  # noqa: E402
    OperationLimits,
    PreflightError,
    ServerLimits,
    check_service_tokenizer,
    fit_trajectory_budget,
    limits_from_capabilities,
    load_service_tokenizer,
    tokenizer_differences,
)
from searchr1.runtime.failures import describe_failure, is_service_failure  # noqa: E402


def limits(train_seq=None, train_request=None, sample_seq=None, context=None, available=True, batch=None):
    return ServerLimits("Qwen/Qwen3.5-4B", context, OperationLimits(available, None, train_request, train_seq),
                        OperationLimits(True, batch, None, sample_seq))


@pytest.mark.parametrize("bounds, name", [
    (dict(train_seq=4096), "training max_seq_len"),
    (dict(train_request=4096), "training max_tokens_per_request"),
    (dict(sample_seq=4096), "sampling max_seq_len"),
    (dict(context=4096), "context length"),
])
def test_a_trajectory_budget_over_any_server_limit_stops_with_both_numbers_and_the_flag(bounds, name):
    with pytest.raises(PreflightError) as refused:
        fit_trajectory_budget(limits(**bounds), 8192, clamp=False, group_size=8)
    message = str(refused.value)
    assert "8192" in message and "4096" in message and "--max-trajectory-tokens" in message and name in message
    clamped = fit_trajectory_budget(limits(**bounds), 8192, clamp=True, group_size=8)
    assert clamped.max_trajectory_tokens == 4096 and "8192" in clamped.warnings[0]


def test_the_tightest_limit_wins_and_unknown_limits_do_not_bind():
    fit = fit_trajectory_budget(limits(train_seq=6000, sample_seq=5000), 8192, clamp=True, group_size=8)
    assert fit.max_trajectory_tokens == 5000
    assert fit_trajectory_budget(limits(), 100_000, clamp=False, group_size=8).max_trajectory_tokens == 100_000
    assert fit_trajectory_budget(limits(train_seq=8192), 8192, clamp=False, group_size=8).warnings == ()


def test_a_model_unavailable_for_training_or_missing_from_the_catalog_is_refused_by_name():
    with pytest.raises(PreflightError, match="not available for training"):
        fit_trajectory_budget(limits(available=False), 8192, clamp=True, group_size=8)
    catalog = SimpleNamespace(supported_models=[SimpleNamespace(model_name="Qwen/Qwen3.5-9B")])
    with pytest.raises(PreflightError, match=r"Qwen3\.5-4B.*Qwen3\.5-9B"):
        limits_from_capabilities(catalog, "Qwen/Qwen3.5-4B")


class _Renamed:
    """The real tokenizer with one special id moved and one extra token: a different model."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __len__(self):
        return len(self.tokenizer) + 1

    def convert_tokens_to_ids(self, token):
        return 7 if token == "</tool_call>" else self.tokenizer.convert_tokens_to_ids(token)

    def encode(self, text, **kwargs):
        return self.tokenizer.encode(text, **kwargs)


def test_the_service_tokenizer_check_names_every_difference(tokenizer):
    assert tokenizer_differences(tokenizer, tokenizer) == []
    problems = tokenizer_differences(tokenizer, _Renamed(tokenizer))
    assert any("vocabulary size" in p for p in problems) and any("</tool_call> is id 7" in p for p in problems)


def test_a_tokenizer_download_failure_becomes_one_line_naming_modelscope():
    class NetworkError(Exception):
        __module__ = "modelscope_hub.errors"

    def fail():
        raise NetworkError("[E1020] cannot reach modelscope.cn\nretrying...")

    client = SimpleNamespace(model_id="Qwen/Qwen3.5-4B", get_tokenizer=fail)
    with pytest.raises(PreflightError) as refused:
        load_service_tokenizer(client)
    message = str(refused.value)
    assert "ModelScope" in message and "Qwen/Qwen3.5-4B" in message and "\n" not in message


def test_the_sdk_loads_the_service_tokenizer_once_per_start(tokenizer, tmp_path, monkeypatch):
    """The preflight's load fills the real TrainingClient's cached vocabulary size, so the first
    forward_backward does not load the tokenizer a second time for its length."""
    import pytrio.client.training as sdk_training
    from twin_support import MODEL, running_twin

    loads = []
    loader = sdk_training.get_tokenizer
    monkeypatch.setattr(sdk_training, "get_tokenizer", lambda model_id: loads.append(model_id) or loader(model_id))
    with running_twin(tmp_path, tokenizer) as (_, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        check_service_tokenizer(tokenizer, trainer)
        assert len(loads) == 1
        assert trainer._tokenizer_vocab_size == len(tokenizer) and len(loads) == 1


def test_service_and_network_failures_are_told_apart_from_bugs():
    class ModelScopeError(Exception):
        __module__ = "modelscope.hub.errors"

    service_side = [httpx.ReadTimeout("read timed out"), httpx.ConnectError("refused"), ModelScopeError("E1020"),
                    concurrent.futures.TimeoutError(), TimeoutError("t"), ConnectionResetError("reset")]
    assert all(is_service_failure(error) for error in service_side)
    assert not any(is_service_failure(error) for error in (ValueError("bug"), KeyError("k"), AssertionError()))
    assert describe_failure(httpx.ReadTimeout("read timed out\nmore")) == "ReadTimeout: read timed out"


# --- run directories: nothing written before the checks, nothing stuck after a failed start --


@pytest.mark.parametrize("rendering", [[], ["--thinking", "--context", "fold", "--context-window", "2048",
                                             "--max-trajectory-tokens", "16384"]], ids=["default", "thinking-fold"])
def test_preflight_only_checks_and_writes_nothing(tmp_path, monkeypatch, rendering):
    import tempfile

    run_dir, scratch = tmp_path / "run", tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the twin's home for the check goes
    result = CliRunner().invoke(main, ["train", "--offline", "--quiet", "--preflight-only", *rendering,
                                       "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "preflight passed" in result.output
    assert not run_dir.exists()
    assert list(scratch.iterdir()) == []  # and is removed with everything in it


def test_a_run_that_failed_before_its_first_step_can_be_started_over_without_removing_it(tmp_path):
    run_dir = tmp_path / "run"
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("not: [a cassette")
    base = ["train", "--offline", "--quiet", "--max-steps", "1", "--questions-per-batch", "2", "--group-size", "2",
            "--backend", "wikipedia", "--run-dir", str(run_dir)]
    failed = CliRunner().invoke(main, [*base, "--cassette", str(garbage)])
    assert failed.exit_code == 1, failed.output
    retried = CliRunner().invoke(main, base)
    assert retried.exit_code == 0, retried.output
    from searchr1.run.directory import RunDir

    assert [m["step"] for m in RunDir(run_dir).metrics()] == [0]


# --- connecting: say where, wait a bounded time, name the cause -----------------------------


@pytest.mark.parametrize("command", [["probe-loss", "--yes"], ["eval", "--quiet", "--backend", "wikipedia"]])
def test_an_unreachable_service_fails_within_the_connect_timeout_naming_url_and_cause(monkeypatch, tmp_path,
                                                                                        command):
    import socket
    import threading
    import time

    import pytrio

    monkeypatch.setenv("PYTRIO_API_KEY", "sk-test-unreachable-0001")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "dev.jsonl").write_text(
        '{"id": "1", "question": "q?", "answers": ["a"], "data_source": "nq"}\n')
    silent = socket.create_server(("127.0.0.1", 0))  # accepts connections (the backlog), never answers
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    monkeypatch.setattr("searchr1.runtime.connect.pytrio_base_url", lambda: url)
    release = threading.Event()
    monkeypatch.setattr(pytrio, "ServiceClient", lambda *a, **k: release.wait(30))  # retries, silently
    started = time.monotonic()
    with silent:
        result = CliRunner().invoke(main, [*command, "--connect-timeout", "0.3"])
    release.set()
    assert time.monotonic() - started < 10
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == f"connecting to PyTRIO at {url}..."
    assert "no answer within 0.3 s" in lines[-1] and url.removeprefix("http://") in lines[-1]
    assert "--connect-timeout" in lines[-1] and "refused" not in lines[-1]
    assert "sk-test-unreachable-0001" not in result.output


def test_the_diagnosis_of_a_silent_service_waits_no_longer_than_it_is_told():
    import socket
    import time

    from searchr1.runtime.connect import diagnose

    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts connections, never answers
        started = time.monotonic()
        said = diagnose(f"http://127.0.0.1:{silent.getsockname()[1]}", within=0.2)
        waited = time.monotonic() - started
    assert said == "the connectivity probe had no answer within 0.2 s either"
    assert waited < 2.0  # pytrio's probe alone waits 3 s


# --- mutations of the update that no test caught before ------------------------------------

import asyncio  # noqa: E402

from searchr1.data.dataset import shuffled_examples  # noqa: E402
from searchr1.offline import TRAIN  # noqa: E402
from searchr1.run.directory import RunDir  # noqa: E402
from searchr1.search.options import SearchOptions  # noqa: E402
from searchr1.wiring.services import search_backend  # noqa: E402
from searchr1.training.config import TrainConfig
from searchr1.training.loop import TrainingRun, TrainingStopped  # noqa: E402


def _train_in_process(tmp_path, tokenizer, *, steps=2, reduction="per_token", **config_overrides):
    """Train on the twin serving the learning policy, in this process; returns (metrics, outcome)."""
    from searchr1.twin import start_twin

    config = TrainConfig(max_steps=steps, data=str(TRAIN), questions_per_batch=4, learning_rate=0.2, save_every=0,
                         offline=True, offline_policy="learning", run_id="cafe0002",
                         rollout=RolloutConfig(group_size=4), **config_overrides)
    run = RunDir(tmp_path / f"run-{config.accumulation}-{len(list(tmp_path.iterdir()))}")
    run.create(config.to_json())

    async def go():
        with start_twin(home=run.path / "twin", tokenizer=tokenizer, policy="learning", reduction=reduction) as twin:
            backend = search_backend(SearchOptions(backend="wikipedia", cache="off"), offline=True)
            trainer = TrainingRun(config, run, service=twin.service_client(), tokenizer=tokenizer, search=backend,
                                  examples=shuffled_examples(config.data, config.seed))
            try:
                return await trainer.run_steps(None)
            except TrainingStopped as stopped:
                return stopped
            finally:
                await backend.aclose()

    outcome = asyncio.run(go())
    return run.metrics(), outcome


def test_sampling_a_step_on_the_previous_steps_sampler_is_refused(tmp_path, tokenizer, monkeypatch):
    """The mutation: each step after the first reuses the sampler of the step before (while
    claiming fresh weights). The twin's strict mode refuses the stale samples."""
    import pytrio

    from searchr1.twin.server import untaken_violations

    original = pytrio.TrainingClient.save_weights_and_get_sampling_client_async
    made = []

    async def reuse_previous(self):
        made.append(await original(self))
        return made[-2] if len(made) > 1 else made[-1]

    monkeypatch.setattr(pytrio.TrainingClient, "save_weights_and_get_sampling_client_async", reuse_previous)
    metrics, outcome = _train_in_process(tmp_path, tokenizer, steps=3)
    assert isinstance(outcome, TrainingStopped) and "twin.protocol_violation" in str(outcome)
    assert [m["step"] for m in metrics] == [0]  # step 1 sampled on step 0's weights: refused
    violations = untaken_violations()
    assert violations and all("stale" in v for v in violations)


def test_the_optimizer_receives_exactly_the_configured_adam_parameters(tmp_path, tokenizer, monkeypatch):
    import pytrio

    received = []
    original = pytrio.TrainingClient.optim_step_async

    async def spy(self, adam_params):
        received.append(adam_params)
        return await original(self, adam_params)

    monkeypatch.setattr(pytrio.TrainingClient, "optim_step_async", spy)
    _train_in_process(tmp_path, tokenizer, steps=1, beta1=0.8, beta2=0.97)
    assert len(received) == 1
    sent = received[0]
    assert (sent.learning_rate, sent.beta1, sent.beta2) == (0.2, 0.8, 0.97)
    assert (sent.eps, sent.weight_decay, sent.grad_clip_norm) == (1e-12, 0.0, 0.0)  # pytrio's defaults


def test_manual_accumulation_applies_the_full_batch_gradient_when_the_server_averages_per_sample(tmp_path, tokenizer):
    """n_k/N weights over the lab port's micro-batches reproduce one call's gradient exactly under a
    per-sample mean; the gradient norm the optimizer reports tells N off by one apart (Adam's
    update alone would hide a rescaled gradient)."""
    sdk, _ = _train_in_process(tmp_path, tokenizer, steps=2, reduction="per_sample", accumulation="sdk")
    manual, _ = _train_in_process(tmp_path, tokenizer, steps=2, reduction="per_sample", accumulation="manual",
                                  max_micro_batch_items=3)
    assert [m["train/forward_backward_calls"] for m in manual] != [1.0, 1.0]  # really split
    for ours, theirs in zip(sdk, manual):
        assert theirs["optim/grad_norm"] == pytest.approx(ours["optim/grad_norm"], rel=1e-6)  # float32 advantages
        assert theirs["reward/mean"] == ours["reward/mean"]


def test_without_network_the_sdks_tokenizer_load_stops_the_run_before_any_sample(tmp_path, tokenizer, monkeypatch):
    """The twin answers with the model's real name, so pytrio's tokenizer load goes to
    ModelScope as it would for a user. Without a network ModelScope retries for about 25 s, then
    raises its NetworkError; the test raises that same error at once. One line, no sampling
    request, nothing trained."""
    import modelscope
    from modelscope_hub.errors import NetworkError

    from searchr1.twin import start_twin

    class Offline:
        @staticmethod
        def from_pretrained(name, *args, **kwargs):
            raise NetworkError(f"[E1020] failed to resolve modelscope.cn while fetching {name}\n(retried 3 times)")

    monkeypatch.setattr(modelscope, "AutoTokenizer", Offline)
    config = TrainConfig(max_steps=1, data=str(TRAIN), offline=True, offline_policy="learning")
    run = RunDir(tmp_path / "run")
    with start_twin(home=tmp_path / "twin", tokenizer=tokenizer, policy="learning", serve_tokenizer=False) as twin:
        trainer = TrainingRun(config, run, service=twin.service_client(), tokenizer=tokenizer, search=None,
                              examples=shuffled_examples(config.data, config.seed))
        with pytest.raises(PreflightError) as refused:
            trainer.connect(None)
        assert twin.calls("sample") == 0 and twin.calls("sampling_run_create") == 0
    message = str(refused.value)
    assert "ModelScope" in message and "Qwen/Qwen3.5-4B" in message and "\n" not in message


def _modelscope_error():
    from modelscope_hub.errors import NetworkError

    return NetworkError("[E1020] modelscope.cn unreachable")


@pytest.mark.parametrize("make_error", [
    lambda: httpx.ReadTimeout("the read timed out"),
    lambda: httpx.RemoteProtocolError("peer closed connection without sending complete message body"),
    _modelscope_error,
    lambda: concurrent.futures.TimeoutError(),
    lambda: ConnectionResetError(104, "Connection reset by peer"),
], ids=["httpx-timeout", "httpx-protocol", "modelscope", "future-timeout", "connection-reset"])
def test_a_non_pytrio_sdk_failure_after_paid_work_ends_train_with_one_line_and_a_resumable_run(
        tmp_path, monkeypatch, make_error):
    import pytrio

    calls = {"n": 0}
    original = pytrio.TrainingClient.forward_backward_async

    async def fail_the_second(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise make_error()
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(pytrio.TrainingClient, "forward_backward_async", fail_the_second)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", "--offline", "--quiet", "--max-steps", "3", "--questions-per-batch", "2",
                                       "--group-size", "4", "--save-every", "1", "--run-dir", str(run_dir)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "the training service failed" in result.output
    assert f"--resume {run_dir}" in result.output
    from searchr1.run.directory import RunDir as _RunDir

    assert _RunDir(run_dir).resume_point().step == 1  # the finished step and its checkpoint are kept
    monkeypatch.setattr(pytrio.TrainingClient, "forward_backward_async", original)
    resumed = CliRunner().invoke(main, ["train", "--resume", str(run_dir), "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert [m["step"] for m in _RunDir(run_dir).metrics()] == [0, 1, 2]
