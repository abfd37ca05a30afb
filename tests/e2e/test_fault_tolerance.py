"""Fault tolerance end to end: does a bad night of the search service or the
training service cost a run? Everything here is offline and in-process (or a CLI run on the
offline twin).

Where tests/e2e/test_train.py already covers an item, it is referenced, not repeated:

* Crash and resume (SIGKILL after a checkpoint, resume, equal to an uninterrupted run of the
  same seed): ``test_train.py::test_a_killed_run_resumes_at_its_checkpoint_and_matches_an_uninterrupted_run``.
  Added here: a kill in the middle of writing a metrics line.
* Bad input, the error message half: contradictory flags
  (``test_train.py::test_contradictory_flags_are_refused``), a resume of a directory that is
  not a run (``test_resuming_a_directory_that_is_not_a_run_names_it``), an unwritable run
  directory (``test_an_unwritable_run_directory_is_named``; the blocker is a file, so nothing
  can be written), a missing PyTRIO key (``test_a_live_run_without_a_key_fails_fast``).
  Added here: that those refusals write nothing (an existing run stays byte for byte, no run
  directory appears), and the items test_train.py lacks.
* Live-path secrets (real backends with canary keys over mock transports, success and
  failure paths: results, exceptions, reprs, logs, recorded cassettes):
  ``tests/search/test_search_secrets.py``. Added here: whole offline train and eval runs per backend.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import textwrap
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner
from pytrio import PyTrioError

import searchr1.core.trainer as trainer_module
from searchr1.cli import main
from searchr1.data.dataset import shuffled_examples, take_batch
from searchr1.offline import CASSETTE_SPEC, TRAIN, cassette_path
from searchr1.core.rollout import RolloutConfig
from searchr1.run.directory import RunDir
from searchr1.search.cache import normalise_query
from searchr1.search.factory import BACKEND_NAMES
from searchr1.search.fake_service import FakeSearchService, wikipedia_query
from searchr1.search.testing import mock_backend
from searchr1.wiring.services import offline_scenario
from searchr1.training.config import TrainConfig
from searchr1.training.loop import TrainingRun, TrainingStopped
from searchr1.twin import TwinFaults, start_twin
from searchr1.twin.client import FAST_RETRIES
from searchr1.twin.config import SampleRequestInfo
from searchr1.twin.scripted_policy import ScriptedPolicy
from twin_support import without_timing_metrics
from warm_python import run_python

REPO = Path(__file__).resolve().parents[2]
RESUME_HINT = "searchr1 train --resume"  # outside a command-line run, hints name the installed script
BASE = ["train", "--offline", "--quiet", "--questions-per-batch", "4", "--group-size", "4"]


def cli(*args: str, **kwargs: Any):
    return CliRunner().invoke(main, list(args), **kwargs)


comparable = without_timing_metrics


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` with its bytes (an absent directory is {})."""
    if not directory.exists():
        return {}
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# =========================================================================================
# Chaos run: faults at every boundary, in-process
# =========================================================================================

QUESTIONS_PER_BATCH = 4
GROUP_SIZE = 4
MAX_STEPS = 6
SAVE_EVERY = 2

# Search faults per query of the shipped offline question set (wikipedia wire format).
STORM = "The Little Prince author"            # 429 with Retry-After on every attempt
TIMEOUT = "Berlin Wall fall date"               # httpx.ReadTimeout on every attempt
HTML = "capital of Hungary"                    # an HTML error page with status 200
TRUNCATED = "discovery of penicillin"          # a JSON body cut in the middle
PASSING_STORM = "capital of Australia"         # two 429s, then the answer (recovers)
FLAKY_NETWORK = "Forrest Gump film director"   # one ConnectError, then the answer (recovers)


class SearchChaos:
    """An httpx handler playing the offline passages, with faults for some queries."""

    def __init__(self) -> None:
        spec = json.loads(CASSETTE_SPEC.read_text("utf-8"))
        self.results = {normalise_query(q["query"]): q["results"] for q in spec["queries"] if "results" in q}
        for query in (STORM, TIMEOUT, HTML, TRUNCATED, PASSING_STORM, FLAKY_NETWORK):
            assert normalise_query(query) in self.results, f"the offline set no longer asks {query!r}"
        self.fake = FakeSearchService("wikipedia", {})
        self.requests: Counter[str] = Counter()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        query = wikipedia_query(request)
        self.requests[query] += 1
        attempt = self.requests[query]
        if query == STORM or (query == PASSING_STORM and attempt % 3 in (1, 2)):
            return httpx.Response(429, headers={"Retry-After": "3"}, content=b"")
        if query == TIMEOUT:
            raise httpx.ReadTimeout("the search service is not answering", request=request)
        if query == FLAKY_NETWORK and attempt % 2 == 1:
            raise httpx.ConnectError("connection refused", request=request)
        if query == HTML:
            return httpx.Response(200, headers={"content-type": "text/html"},
                                  content=b"<html><body><h1>Bad gateway</h1></body></html>")
        ok = self.fake.render({"results": self.results[query]}, request, query)
        if query == TRUNCATED:
            return httpx.Response(200, headers={"content-type": "application/json"}, content=ok.content[:40])
        return ok


class SamplerChaos:
    """A twin sampling fault hook, keyed by what is asked (question, turn, samples: read from the
    prompt by the scripted policy), so it does not depend on the order requests arrive in.
    Transient failures on every first turn that pytrio's own retries cure (a 503 or a lost
    answer); on one trajectory of two questions per batch a failure that ends it (a 400, not
    retryable, and a 503 that outlasts every retry); ``outage`` fails every first turn for good."""

    def __init__(self, policy: ScriptedPolicy, doomed_non_retryable: set[str], doomed_retryable: set[str]) -> None:
        self.policy = policy
        self.doomed_non_retryable = doomed_non_retryable
        self.doomed_retryable = doomed_retryable
        self.victim: dict[str, tuple] = {}   # question id -> the one request key that fails for good
        self.transient_done: set[tuple] = set()
        self.outage = False
        self.injected: Counter[str] = Counter()

    def __call__(self, request: SampleRequestInfo) -> int | str | None:
        scripted, turn, indices = self.policy.locate(request.prompt, request.num_samples)
        question = scripted.example.id
        key = (question, turn, tuple(indices))
        if self.outage and turn == 0:
            self.injected["outage"] += 1
            return 400
        if turn == 0 and key not in self.transient_done:
            self.transient_done.add(key)
            self.injected["transient"] += 1
            return "drop" if sum(map(ord, question)) % 2 else 503
        doomed = question in self.doomed_non_retryable | self.doomed_retryable
        if turn != 1 or not doomed or self.victim.setdefault(question, key) != key:
            return None
        if question in self.doomed_non_retryable:
            self.injected["non_retryable"] += 1
            return 400
        self.injected["retryable_exhausted"] += 1
        return 503


class RecordingRun(TrainingRun):
    """Keeps, per finished step, the trajectories, the datums built from them and the datums
    that reached ``forward_backward``."""

    def __init__(self, *args: Any, built: list, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.built = built
        self.sent: list[int] = []
        self.steps: dict[int, dict[str, Any]] = {}
        step = self.trainer.step

        async def recorded_step(number, batches):
            self.built.clear()
            self.sent.clear()
            client = self.trainer.training_client
            original = client.forward_backward_async

            async def forward_backward_async(data, *args, **kwargs):
                self.sent.append(len(data))
                return await original(data, *args, **kwargs)

            client.forward_backward_async = forward_backward_async
            try:
                return await step(number, batches)
            finally:
                del client.forward_backward_async

        self.trainer.step = recorded_step

    def metrics(self, record):
        metrics = super().metrics(record)
        (trajectories, datums), = self.built
        assert record.trajectories == list(trajectories)  # what the step records is what it trained on
        self.steps[record.step] = {"trajectories": trajectories, "datums": datums, "sent": list(self.sent),
                                   "metrics": metrics}
        return metrics


@pytest.fixture
def built(monkeypatch):
    """Records what ``build_training_datums`` got and returned (one entry per step)."""
    calls: list = []
    original = trainer_module.build_training_datums

    def recording(trajectories, **kwargs):
        datums = original(trajectories, **kwargs)
        calls.append((list(trajectories), list(datums)))
        return datums

    monkeypatch.setattr(trainer_module, "build_training_datums", recording)
    return calls


# pytrio gives up on a failing sampling request after 50 ms (instead of 15 minutes), so a 503
# that lasts reaches the rollout, whose own retries then run out.
CHAOS_SDK = {**FAST_RETRIES, "sampling_retry_timeout_seconds": 0.05}


async def chaos_phase(run: RunDir, config: TrainConfig, tokenizer, examples, policy: ScriptedPolicy, *,
                      faults: TwinFaults, sampler: SamplerChaos, search: SearchChaos, resume: bool, built: list,
                      after=None):
    """One process's worth of training: a fresh twin on the run's home (fault call numbers
    restart, as after a restart), a fresh search client, a fresh trainer. ``after(trainer)``
    runs before the twin stops."""
    faults = TwinFaults(**{**faults.__dict__, "sample_hook": sampler})
    with start_twin(home=run.path / "twin", tokenizer=tokenizer, policy=policy, faults=faults) as twin:
        service = twin.service_client(sdk_options=CHAOS_SDK)
        backend = mock_backend("wikipedia", search, max_retries=2)
        trainer = RecordingRun(config, run, service=service, tokenizer=tokenizer, search=backend,
                                   examples=examples, built=built)
        try:
            try:
                outcome = await trainer.run_steps(run.resume_point() if resume else None)
            except TrainingStopped as stopped:
                outcome = stopped
            if after is not None:
                await after(trainer)
            return trainer, outcome
        finally:
            await backend.aclose()


def assert_stopped_cleanly(run: RunDir, outcome: Any, cause: str) -> int:
    """A stop carries the resume hint; metrics hold exactly the finished steps 0..k-1."""
    assert isinstance(outcome, TrainingStopped), f"expected a clean stop ({cause}), got {outcome!r}"
    assert f"{RESUME_HINT} {run.path}" in str(outcome) and cause in str(outcome)
    steps = [m["step"] for m in run.metrics()]
    assert steps == list(range(outcome.step)), steps
    assert run.state()["step"] == outcome.step
    return outcome.step


def assert_env_failure_groups_sent_nothing(record: dict[str, Any]) -> tuple[int, int]:
    """Groups touched by a search or sampler failure send no datum and are counted; the
    datums built are the datums sent. Returns (env-failure groups, sampler-error trajectories)."""
    trajectories, datums, metrics = record["trajectories"], record["datums"], record["metrics"]
    failed_groups = {t.question_index for t in trajectories if t.env_error or t.sampler_error}
    for t in trajectories:
        if t.question_index in failed_groups:
            assert t.excluded == "env_failure_group", (t.question_index, t.group_index, t.excluded)
    assert not {d.question_index for d in datums} & failed_groups
    assert metrics["train/groups_dropped_env_failure"] == len(failed_groups)
    assert metrics["rollout/env_failure_group_rate"] == len(failed_groups) / QUESTIONS_PER_BATCH
    assert metrics["train/datums_per_rollout_batch"] == len(datums)
    assert record["sent"] == ([len(datums)] if datums else [])
    assert metrics["train/forward_backward_calls"] == len(record["sent"])
    assert metrics["train/update_skipped"] == float(not datums)
    return len(failed_groups), sum(t.sampler_error for t in trajectories)


async def test_a_chaos_run_stops_cleanly_resumes_and_ends_with_every_step_recorded_once(tmp_path, tokenizer, built):
    policy = ScriptedPolicy(offline_scenario(), tokenizer)
    rollout = RolloutConfig(group_size=GROUP_SIZE, seed=42, sample_retry_backoff=0.0, sample_retries=3)
    config = TrainConfig(max_steps=MAX_STEPS, data=str(TRAIN), questions_per_batch=QUESTIONS_PER_BATCH,
                         save_every=SAVE_EVERY, rollout=rollout, offline=True)
    examples = shuffled_examples(TRAIN, config.seed)
    batches = [take_batch(examples, s * QUESTIONS_PER_BATCH, QUESTIONS_PER_BATCH) for s in range(MAX_STEPS)]
    sampler = SamplerChaos(policy, {b[0].id for b in batches}, {b[1].id for b in batches})
    search = SearchChaos()
    run = RunDir(tmp_path / "run")
    run.create(config.to_json())
    records: dict[int, dict[str, Any]] = {}

    async def phase(faults: TwinFaults, *, resume: bool, after=None):
        trainer, outcome = await chaos_phase(run, config, tokenizer, examples, policy, faults=faults,
                                             sampler=sampler, search=search, resume=resume, built=built,
                                             after=after)
        records.update(trainer.steps)
        return trainer, outcome

    # 1. Search storms, timeouts and broken bodies, sampler failures of every kind, a 5xx and a
    #    lost answer on training events, then a failing forward_backward.
    _, outcome = await phase(TwinFaults(http_errors={"event_submit": {4: 503}, "event_get": {2: 502}},
                                        dropped_connections={"event_submit": {6}},
                                        failed_events={"forward_backward": {3: "twin.out_of_memory"}}), resume=False)
    stopped_at = assert_stopped_cleanly(run, outcome, "the training service failed")
    assert stopped_at >= 1 and "twin.out_of_memory" in str(outcome)

    # 2. The sampler is down for good: more than max_sampler_failure_fraction fails.
    sampler.outage = True
    _, outcome = await phase(TwinFaults(), resume=True)
    resumed_at = run.resume_point().step
    assert assert_stopped_cleanly(run, outcome, "could not be sampled") == resumed_at
    sampler.outage = False

    # 3. The training run breaks (training.run_broken): every later event of it fails; resume
    #    starts a new run from the last checkpoint.
    async def refused_after_the_break(trainer):
        with pytest.raises(PyTrioError) as broken:
            await (await trainer.trainer.training_client.save_state_async(name="after-the-break"))
        assert broken.value.code == "training.run_broken"

    _, outcome = await phase(TwinFaults(broken_runs={"forward_backward": {2}}), resume=True,
                             after=refused_after_the_break)
    assert_stopped_cleanly(run, outcome, "the training service failed")

    # 4. A quiet night: the run finishes.
    _, completed = await phase(TwinFaults(), resume=True)
    assert completed == MAX_STEPS

    metrics = run.metrics()
    assert [m["step"] for m in metrics] == list(range(MAX_STEPS))  # none lost, none duplicated
    assert run.state()["step"] == MAX_STEPS and run.resume_point().step == MAX_STEPS
    rewound = [json.loads(line) for line in run.file("metrics.rewound.jsonl").read_text().splitlines()]
    assert rewound and all(r["step"] >= r["rewound_to_step"] for r in rewound)
    for line in metrics:  # the kept line of each step is the one of its last, finished run
        numbers = {key: value for key, value in line.items() if key != "health/warnings"}  # texts: the file's only
        assert comparable(numbers) == comparable({"step": line["step"], **records[line["step"]]["metrics"]})

    env_groups = sampler_errors = 0
    for step in range(MAX_STEPS):
        groups, errors = assert_env_failure_groups_sent_nothing(records[step])
        env_groups, sampler_errors = env_groups + groups, sampler_errors + errors
    assert env_groups > 0 and sampler_errors > 0
    assert sum(m["train/groups_trained"] for m in metrics) > 0  # the faults did not stop learning
    for key in ("search/429_rate", "search/timeout_rate", "search/error_rate"):
        assert any(m.get(key, 0) > 0 for m in metrics), key
    assert {"transient", "outage", "non_retryable", "retryable_exhausted"} <= set(sampler.injected)
    for query in (STORM, TIMEOUT, HTML, TRUNCATED, PASSING_STORM, FLAKY_NETWORK):
        assert search.requests[query], f"the scripted policy never searched {query!r}: pick another query"


# =========================================================================================
# Crash and resume
# =========================================================================================
# SIGKILL right after a checkpoint, resume, equal to an uninterrupted run of the same seed:
# test_train.py::test_a_killed_run_resumes_at_its_checkpoint_and_matches_an_uninterrupted_run.

TEARING_KILLER = textwrap.dedent(
    """
    import json, os, signal, sys
    from searchr1.run import directory as run_dir
    kill_at = int(sys.argv[1])
    original = run_dir.RunDir.append_metrics
    def append_or_die_halfway(self, record):
        if record["step"] != kill_at:
            return original(self, record)
        line = json.dumps(record, sort_keys=True)
        with open(self.file(run_dir.METRICS), "a", encoding="utf-8") as stream:
            stream.write(line[: len(line) // 2])  # the power goes out in the middle of the line
            stream.flush()
            os.fsync(stream.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    run_dir.RunDir.append_metrics = append_or_die_halfway
    from searchr1.cli import main
    main(sys.argv[2:])
    """
)


def test_a_run_killed_halfway_through_a_metrics_line_resumes_to_the_uninterrupted_result(tmp_path):
    args = [*BASE, "--max-steps", "4", "--save-every", "2", "--run-dir"]
    killed = tmp_path / "killed"
    process = run_python(["-c", TEARING_KILLER, "3", *args, str(killed)], cwd=REPO, timeout=300)
    assert process.returncode == -9, process.stderr[-2000:]
    assert (killed / "metrics.jsonl").read_text().count("\n") == 3  # steps 0-2 and a torn line
    assert RunDir(killed).resume_point().step == 2

    resumed = cli(*BASE[:1], "--resume", str(killed), "--quiet")
    assert resumed.exit_code == 0, resumed.output
    straight = cli(*args, str(tmp_path / "straight"))
    assert straight.exit_code == 0, straight.output

    lines = (killed / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2, 3]  # no torn line, no duplicate
    assert [comparable(m) for m in RunDir(killed).metrics()] == [
        comparable(m) for m in RunDir(tmp_path / "straight").metrics()
    ]
    rewound = [json.loads(line) for line in (killed / "metrics.rewound.jsonl").read_text().splitlines()]
    assert [r.get("step") for r in rewound] == [2, None] and rewound[1]["torn_line"].startswith('{"')


# =========================================================================================
# Bad input: a clear error naming the culprit, and nothing half-done on disk
# =========================================================================================

GOOD_ROW = {"id": "q1", "question": "Who wrote The Little Prince?", "answers": ["Antoine de Saint-Exupery"],
            "data_source": "nq"}


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Work in an empty directory (no ./.env, no ./runs) with no search or PyTRIO keys."""
    monkeypatch.chdir(tmp_path)
    for name in ("DEEPSEEK_API_KEY", "ZHIHU_SEARCH_KEYS", "ZHIHU_SEARCH_KEY", "ZHIHU_ACCESS_SECRET",
                 "PYTRIO_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    from searchr1.runtime.tokenizer import cache_root

    monkeypatch.setenv("SEARCHR1_CACHE_DIR", str(cache_root()))  # keep the built tokenizer
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.pytrio profile
    return tmp_path


@pytest.fixture
def no_pytrio(monkeypatch):
    """Records every attempt to reach PyTRIO (and fails it, as without a network)."""
    import pytrio

    attempts: list[str] = []

    def service_client(*args: Any, **kwargs: Any):
        attempts.append("ServiceClient")
        raise AssertionError("PyTRIO was contacted")

    monkeypatch.setattr(pytrio, "ServiceClient", service_client)
    return attempts


@pytest.mark.parametrize(
    "text, culprit",
    [
        (json.dumps(GOOD_ROW) + "\n" + '{"id": "q2", "question": "Where is Lyon?"\n', "{data}:2: invalid JSON"),
        (json.dumps(GOOD_ROW) + "\n\n" + json.dumps({**GOOD_ROW, "answers": []}) + "\n", "{data}:3:"),
        ("\n", "no training examples in {data}"),
    ],
    ids=["torn-json", "empty-answers", "no-rows"],
)
def test_a_malformed_dataset_is_named_by_file_and_line_and_no_run_directory_is_created(isolated, text, culprit):
    data = isolated / "train.jsonl"
    data.write_text(text, "utf-8")
    result = cli(*BASE, "--data", str(data), "--max-steps", "1", "--run-dir", "run")
    assert result.exit_code == 1, result.output
    assert culprit.format(data=data) in result.output
    assert not (isolated / "run").exists()


def test_an_unknown_backend_is_refused_with_the_choices_and_no_run_directory_is_created(isolated):
    result = cli(*BASE, "--backend", "nope", "--max-steps", "1", "--run-dir", "run")
    assert result.exit_code == 2
    assert "'nope'" in result.output and all(name in result.output for name in BACKEND_NAMES)
    assert not (isolated / "run").exists()


@pytest.mark.parametrize("backend, variable", [("zhihu", "ZHIHU_SEARCH_KEYS"), ("deepseek", "DEEPSEEK_API_KEY")])
def test_a_missing_search_key_is_named_before_pytrio_is_contacted_or_anything_written(
        isolated, monkeypatch, no_pytrio, backend, variable):
    monkeypatch.setenv("PYTRIO_API_KEY", "pytrio-placeholder-key")
    data = isolated / "train.jsonl"
    data.write_text(json.dumps(GOOD_ROW) + "\n", "utf-8")
    result = cli("train", "--quiet", "--backend", backend, "--max-steps", "1", "--data", str(data),
                 "--run-dir", "run")
    assert result.exit_code == 1, result.output
    assert variable in result.output
    assert no_pytrio == []
    assert not (isolated / "run").exists()


def test_a_live_run_without_a_pytrio_key_writes_no_run_directory(isolated, no_pytrio):
    # The message is checked by test_train.py::test_a_live_run_without_a_key_fails_fast.
    data = isolated / "train.jsonl"
    data.write_text(json.dumps(GOOD_ROW) + "\n", "utf-8")
    result = cli("train", "--quiet", "--backend", "wikipedia", "--search-cache", "off", "--max-steps", "1",
                 "--data", str(data), "--run-dir", "run")
    assert result.exit_code == 1 and "PYTRIO_API_KEY" in result.output, result.output
    assert no_pytrio == [] and not (isolated / "run").exists()


class SearchSpy:
    """Wraps the command's search backend to note which queries each step asked."""

    def __init__(self, monkeypatch, run_dir: Path) -> None:
        from searchr1.wiring import services

        self.queries: list[tuple[int, str]] = []  # (step in progress, query)
        original = services.search_backend

        def spying(options, *, offline):
            backend = original(options, offline=offline)
            search = backend.search

            async def recorded(query: str):
                self.queries.append((len(RunDir(run_dir).metrics()), query))
                return await search(query)

            backend.search = recorded
            return backend

        monkeypatch.setattr(services, "search_backend", spying)


def test_a_query_missing_from_the_cassette_is_named_and_its_step_leaves_no_metrics_line(isolated, monkeypatch):
    # Which queries does step 1 ask that step 0 does not?
    spy = SearchSpy(monkeypatch, isolated / "probe")
    probe = cli(*BASE, "--backend", "wikipedia", "--max-steps", "2", "--run-dir", "probe")
    assert probe.exit_code == 0, probe.output
    first = {q for step, q in spy.queries if step == 0}
    missing = min({q for step, q in spy.queries if step == 1} - first)

    cassette = yaml.safe_load(cassette_path("wikipedia").read_text("utf-8"))
    wire = "gsrsearch=" + urllib.parse.quote_plus(missing) + "&"
    kept = [i for i in cassette["interactions"] if wire not in i["request"]["uri"]]
    assert len(kept) < len(cassette["interactions"])
    trimmed = isolated / "trimmed.yaml"
    trimmed.write_text(yaml.safe_dump({**cassette, "interactions": kept}, allow_unicode=True), "utf-8")

    result = cli(*BASE, "--backend", "wikipedia", "--cassette", str(trimmed), "--max-steps", "3",
                 "--save-every", "1", "--run-dir", "run")
    assert result.exit_code == 1, result.output
    assert repr(missing) in result.output and str(trimmed) in result.output
    run = RunDir(isolated / "run")
    assert [m["step"] for m in run.metrics()] == [0]  # nothing of the failed step
    assert run.state()["step"] == 1 and run.resume_point().step == 1


@pytest.fixture
def finished_run(tmp_path) -> Path:
    run_dir = tmp_path / "run"
    result = cli(*BASE, "--max-steps", "1", "--run-dir", str(run_dir))
    assert result.exit_code == 0, result.output
    return run_dir


@pytest.mark.parametrize(
    "args, culprit",
    [
        (["--group-size", "8"], "--group-size"),
        (["--run-dir", "elsewhere"], "--run-dir"),
        (["--seed", "7", "--learning-rate", "0.1"], "--learning-rate, --seed"),
        (["--backend", "zhihu"], "--search-backend"),
    ],
)
def test_contradictory_resume_flags_are_named_and_leave_the_run_byte_for_byte_unchanged(finished_run, args, culprit):
    # test_train.py::test_contradictory_flags_are_refused checks the first two messages.
    before = snapshot(finished_run)
    result = cli(*BASE[:1], "--quiet", "--resume", str(finished_run), *args)
    assert result.exit_code == 2 and culprit in result.output, result.output
    assert snapshot(finished_run) == before
    assert not Path("elsewhere").exists()


def test_resuming_a_directory_that_is_not_a_run_leaves_it_untouched(tmp_path):
    # The message is checked by test_train.py::test_resuming_a_directory_that_is_not_a_run_names_it.
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "metrics.jsonl").write_text('{"step": 5}\n')
    before = snapshot(tmp_path)
    result = cli(*BASE[:1], "--quiet", "--resume", str(tmp_path))
    assert result.exit_code == 1 and str(tmp_path) in result.output
    assert snapshot(tmp_path) == before


def test_an_unwritable_run_directory_is_named_and_nothing_is_left_behind(tmp_path):
    # test_train.py::test_an_unwritable_run_directory_is_named covers a path through a file.
    if os.geteuid() == 0:
        pytest.skip("root writes to read-only directories")
    parent = tmp_path / "locked"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        result = cli(*BASE, "--max-steps", "1", "--run-dir", str(parent / "run"))
        assert result.exit_code == 1 and "cannot write to run directory" in result.output
        assert str(parent / "run") in result.output
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o700)


# =========================================================================================
# Secret scan: whole offline train and eval runs per backend, with recognisable fake keys
# =========================================================================================
# Live paths (real backends holding the canaries, success and failure answers over mock
# transports; results, exceptions, reprs, logs, recorded cassettes) are covered by
# tests/search/test_search_secrets.py.

CANARY_KEYS = {
    "DEEPSEEK_API_KEY": "sk-SECRET-canary-deepseek-1234567890",
    "ZHIHU_SEARCH_KEYS": "zh-SECRET-canary-one-1234567890,zh-SECRET-canary-two-0987654321",
    "PYTRIO_API_KEY": "trio-SECRET-canary-1234567890",
    "SEARCHR1_CONTACT": "contact-SECRET-canary@example.invalid",  # not a key; proves env is not dumped
}


def canary_forms() -> list[bytes]:
    """Each canary as it might leak: raw, URL-encoded, base64 (and Bearer-wrapped)."""
    values = {part for value in CANARY_KEYS.values() for part in value.split(",")}
    values.discard(CANARY_KEYS["SEARCHR1_CONTACT"])  # the contact is sent on purpose (live only)
    forms: set[str] = set()
    for value in values:
        forms |= {value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value),
                  base64.b64encode(value.encode()).decode(), base64.urlsafe_b64encode(value.encode()).decode(),
                  value[4:-4]}  # a fragment, for partially masked copies
    return sorted(form.encode() for form in forms)


def leaks(name: str, blob: bytes) -> list[str]:
    return [f"{name}: {form.decode()!r}" for form in canary_forms() if form in blob]


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_no_key_reaches_the_run_directory_eval_output_logs_or_cassettes(backend, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.chdir(tmp_path)
    for name, value in CANARY_KEYS.items():
        monkeypatch.setenv(name, value)
    env_file = tmp_path / "secrets.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in CANARY_KEYS.items()), "utf-8")

    trained = cli(*BASE, "--backend", backend, "--max-steps", "2", "--save-every", "1",
                  "--search-env-file", str(env_file), "--run-dir", "run")
    assert trained.exit_code == 0, trained.output
    weights = RunDir(tmp_path / "run").resume_point().weights_path
    evaluated = cli("eval", "--offline", "--quiet", "--backend", backend, "--limit", "4",
                    "--search-env-file", str(env_file), "--offline-home", "run/twin",
                    "--model-path", weights, "--output", "eval/out.jsonl")
    assert evaluated.exit_code == 0, evaluated.output
    assert (tmp_path / "eval" / "out.jsonl").stat().st_size > 0

    found: list[str] = []
    for path in sorted(tmp_path.rglob("*")):
        if path.is_file() and path != env_file:
            found += leaks(str(path.relative_to(tmp_path)), path.read_bytes())
    for path in sorted((REPO / "cassettes").rglob("*")):
        if path.is_file():
            found += leaks(str(path.relative_to(REPO)), path.read_bytes())
    found += leaks("train output", (trained.output + trained.stderr).encode())
    found += leaks("eval output", (evaluated.output + evaluated.stderr).encode())
    found += leaks("logs", (caplog.text + "\n".join(r.getMessage() for r in caplog.records)).encode())
    assert found == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval", "run", "secrets.env"]  # no stray cache


def test_the_secret_scan_would_see_a_leak(tmp_path):
    """Guard for the scan above: every encoded form of a canary is caught."""
    value = CANARY_KEYS["DEEPSEEK_API_KEY"]
    for text in (value, urllib.parse.quote_plus(value), base64.b64encode(value.encode()).decode(),
                 f"Bearer {value[:4]}****{value[4:-4]}****"):
        assert leaks("probe", f"header: {text}\n".encode())
