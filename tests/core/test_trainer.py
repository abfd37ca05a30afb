"""The trainer's step: sample -> score -> advantage -> datum -> update, on one batch.

What one step sends is held against the reference step (:mod:`searchr1.core.reference`, which
shares none of the engine's helpers), and the order of its calls against a batch source and a
training client that write down what they are asked. The settings a step reads (reward,
advantage mode, environment failures, surplus groups, substeps, micro-batches, the KL penalty,
the vocabulary, the optimiser) each change what is sent in a way checked here.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import time
import pytest
from twin_support import MODEL

from searchr1.core.config import StepConfig
from searchr1.core.reference import reference_step
from searchr1.core.rollout import RolloutConfig, rollout_batch_async
from searchr1.training.checkpoints import save_checkpoint
from searchr1.search.tool import with_search
from searchr1.core.datum import DatumError
from searchr1.core.trainer import OnPolicy, RolloutBatch, Trainer
from searchr1.core.update import substep_batches
from searchr1.core.types import Exclusion, SearchExample, SearchItem, SearchResult
from searchr1.twin import Strictness, start_twin
from searchr1.twin.client import FAST_RETRIES
from searchr1.twin.offline_world import load_world, passages_by_query
from searchr1.twin.scenario import parse_scenario
from searchr1.twin.scripted_policy import ScriptedPolicy
from searchr1.twin.scripted_search import ScriptedSearch

NOTHING = SearchResult(True, ())
CALL = "<tool_call>\n<function=search>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"
# One group whose three scores disagree (exact match, token F1, cover EM), one hit by a search
# failure, one whose answers are all equal (no signal).
SCENARIO = parse_scenario({"questions": [
    {"id": "scores", "question": "Where is Paris?", "answers": ["France"],
     "samples": [["Answer: France"], ["Answer: la France"], ["Answer: Spain"], ["I do not know."]]},
    {"id": "failure", "question": "Where is Lyon?", "answers": ["France"],
     "samples": [[CALL.format("down"), "Answer: France"], ["Answer: Spain"], ["Answer: France"],
                 ["Answer: Italy"]]},
    {"id": "flat", "question": "Where is Nice?", "answers": ["France"], "samples": [["Answer: Spain"]] * 4},
]})
RESULTS = {"down": SearchResult(False, (), status=503, error="HTTP 503")}


@pytest.fixture(scope="module")
def twins(tmp_path_factory, tokenizer):
    """The learning policy's twin (trainable) and a twin serving the scripted scenario above."""
    # two substeps train the second mini-batch on weights one optimiser step newer than its sampler's
    learning = start_twin(home=tmp_path_factory.mktemp("learning"), tokenizer=tokenizer, policy="learning",
                          strictness=Strictness(max_staleness=1))
    scripted = start_twin(home=tmp_path_factory.mktemp("scripted"), tokenizer=tokenizer, policy="toy")
    scripted.policy = ScriptedPolicy(SCENARIO, tokenizer)
    yield learning, scripted
    learning.close()
    scripted.close()


@pytest.fixture(scope="module")
def learned_batch(twins, tokenizer):
    """The learning policy's rollouts of four offline-world questions (rolled out once; each test
    trains on its own copy), with the sampler and the search results they came from."""
    examples, results = world()
    trajectories, sampler = rolled_out(twins[0], tokenizer, examples[:4], results, step_config().rollout)
    return trajectories, sampler, examples[:4], results


@pytest.fixture(scope="module")
def scripted_batch(twins, tokenizer):
    """The scripted scenario's rollouts (rolled out once; each test scores its own copy)."""
    trajectories, _ = rolled_out(twins[1], tokenizer, [q.example for q in SCENARIO.questions], RESULTS,
                                 step_config().rollout)
    return trajectories


def world() -> tuple[list[SearchExample], dict[str, SearchResult]]:
    questions = [q for q in load_world() if q.split == "train"]
    hops = list(passages_by_query(questions).items())
    results = {query: SearchResult(True, (SearchItem(hop.title, hop.text, "Wikipedia"),)) for query, hop in hops}
    return [SearchExample(q.id, q.question, q.answers, q.data_source) for q in questions], results


def step_config(**changes) -> StepConfig:
    values = {"base_model": MODEL, "lora_rank": 8, "seed": 5, "learning_rate": 0.2,
              "rollout": RolloutConfig(group_size=4, seed=3, sample_retry_backoff=0.0)}
    return StepConfig(**{**values, **changes})


class Recorder:
    """What a step asked of its batch source and its training client, in order."""

    def __init__(self, trajectories, surplus=frozenset()):
        self.trajectories, self.surplus, self.calls = trajectories, surplus, []

    async def batch(self, step):
        self.calls.append(("batch", step))
        return RolloutBatch(step, 0, self.trajectories, 0.0, surplus_questions=frozenset(self.surplus))

    async def before_update(self, step):
        self.calls.append(("before_update", step))

    def weights_updated(self, step):
        self.calls.append(("weights_updated", step))


class RecordedClient:
    """A pytrio training client that notes each call in ``calls``."""

    def __init__(self, client, calls):
        self.client, self.calls = client, calls

    async def forward_backward_async(self, data, loss_fn, **options):
        self.calls.append(("forward_backward", len(data), loss_fn) + ((options,) if options else ()))
        return await self.client.forward_backward_async(data, loss_fn=loss_fn, **options)

    async def optim_step_async(self, adam):
        self.calls.append(("optim_step", adam.learning_rate, adam.beta1, adam.beta2))
        return await self.client.optim_step_async(adam)

    async def save_weights_and_get_sampling_client_async(self):
        self.calls.append(("sampler",))
        return await self.client.save_weights_and_get_sampling_client_async()

    async def save_state_async(self, name, **options):
        self.calls.append(("save_state", name, options))
        return await self.client.save_state_async(name, **options)

    async def save_weights_for_sampler_async(self, name, **options):
        self.calls.append(("save_weights", name, options))
        return await self.client.save_weights_for_sampler_async(name, **options)


@functools.cache
def service_of(twin):
    """One pytrio ServiceClient per twin for the whole module (each makes its own HTTP clients)."""
    return twin.service_client(sdk_options=FAST_RETRIES)


def rolled_out(twin, tokenizer, examples, results, config: RolloutConfig, step=0):
    sampler = service_of(twin).create_sampling_client(base_model=MODEL)
    return asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(ScriptedSearch(results, default=NOTHING)), examples,
                                           config, step=step)), sampler


def trainer_on(twin, config, tokenizer, recorder, **options) -> Trainer:
    trainer = Trainer(config, service=service_of(twin), tokenizer=tokenizer, **options)
    trainer.training_client = RecordedClient(trainer.connect(), recorder.calls)
    return trainer


def datum_values(datum):
    inputs = datum.loss_fn_inputs
    return (datum.model_input.to_ints(), *(list(inputs[k].data) for k in ("target_tokens", "logprobs", "advantages")))


@pytest.mark.slow  # a rollout and a training step through a twin (seconds)
def test_a_step_sends_what_the_reference_step_sends_in_order(twins, learned_batch, tokenizer):
    """Invariant: the trainer's step on the engine's rollouts sends the reference step's datums,
    in one forward_backward with the same loss, after ``before_update`` and before
    ``weights_updated``, then one optimiser step with the configured learning rate and betas."""
    learning, _ = twins
    batch, sampler, examples, results = learned_batch
    config = step_config()
    trajectories = copy.deepcopy(batch)
    recorder = Recorder(trajectories)
    trainer = trainer_on(learning, config, tokenizer, recorder)
    started = time.perf_counter()
    record = asyncio.run(trainer.step(0, recorder))
    elapsed = time.perf_counter() - started

    theirs = service_of(learning).create_lora_training_client(
        base_model=MODEL, rank=8, seed=5)
    search = {"search": lambda arguments: results.get(str(arguments["query"]).strip(), NOTHING)}
    _, sent, loss = reference_step(sampler, theirs, tokenizer, search, examples, config.rollout, step=0,
                                   learning_rate=0.2)
    assert sent, "the batch carries a signal"
    assert [datum_values(d.datum) for d in record.datums] == [datum_values(d) for d in sent]
    assert record.update is not None and record.update.outputs == [loss]
    assert recorder.calls == [("batch", 0), ("before_update", 0), ("forward_backward", len(sent), "importance_sampling"),
                              ("optim_step", 0.2, 0.9, 0.95), ("weights_updated", 0)]
    assert record.micro_batches is None and record.kl_metrics == {} and record.dropped_out_of_vocab == 0
    assert record.step == 0 and record.trajectories is trajectories
    assert 0 <= record.waited_seconds <= record.step_seconds and 0 <= record.train_seconds <= record.step_seconds
    assert record.step_seconds <= elapsed


def expected_rewards(kind: str) -> list[list[float]]:
    """The scenario's rewards by group, worked out by hand: 'la France' has token F1 2/3 and is
    covered; a sample without an answer earns the format penalty."""
    scores = {"em": [1.0, 0.0, 0.0, -0.1], "f1": [1.0, 2 / 3, 0.0, -0.1], "cover_em": [1.0, 1.0, 0.0, -0.1]}[kind]
    return [scores, [1.0, 0.0, 1.0, 0.0], [0.0] * 4]


@pytest.mark.parametrize(("reward", "advantage", "keep_env_failures"), [
    ("em", "mean", False), ("f1", "none", True), ("cover_em", "mean", True), ("f1", "mean", False)])
def test_a_step_scores_ranks_and_leaves_out_groups_as_configured(twins, scripted_batch, tokenizer, reward, advantage,
                                                                keep_env_failures):
    """Invariant: each trajectory's reward is its configured score, its advantage the configured
    one of its group's rewards, and only groups with a signal (and, unless kept, no environment
    failure) send datums."""
    _, scripted = twins
    config = step_config(reward=reward, advantage_mode=advantage, keep_env_failures=keep_env_failures)
    trajectories = copy.deepcopy(scripted_batch)
    recorder = Recorder(trajectories)
    record = asyncio.run(trainer_on(scripted, config, tokenizer, recorder).step(3, recorder))
    groups = [trajectories[i:i + 4] for i in range(0, 12, 4)]
    rewards = expected_rewards(reward)
    assert [t.reward for t in trajectories] == pytest.approx([r for scores in rewards for r in scores])
    for group, scores in zip(groups, rewards):
        mean = sum(scores) / len(scores)
        expected = scores if advantage == "none" else [s - mean for s in scores]
        if group[0].excluded is None:
            assert [t.advantage for t in group] == pytest.approx(expected)
    assert [g[0].excluded for g in groups] == [
        None, None if keep_env_failures else Exclusion.ENV_FAILURE_GROUP, Exclusion.DEGENERATE_GROUP]
    assert (record.groups.groups, record.groups.degenerate, record.groups.env_failure) == (
        3, 1, 0 if keep_env_failures else 1)
    trained = [t for g in groups[:2 if keep_env_failures else 1] for t in g if t.advantage != 0.0]
    assert len(record.datums) == len(trained) and [c[0] for c in recorder.calls].count("forward_backward") == 1


def test_surplus_groups_send_nothing(twins, scripted_batch, tokenizer):
    _, scripted = twins
    config = step_config(keep_env_failures=True)
    trajectories = copy.deepcopy(scripted_batch)
    recorder = Recorder(trajectories, surplus={1})
    record = asyncio.run(trainer_on(scripted, config, tokenizer, recorder).step(0, recorder))
    assert {t.excluded for t in trajectories[4:8]} == {Exclusion.SURPLUS_GROUP}
    assert len(record.datums) == sum(t.advantage != 0.0 for t in trajectories[:4])


def test_micro_batches_and_substeps_record_what_was_sent(twins, learned_batch, tokenizer):
    """Invariant: with a micro-batcher and N substeps, the record's micro-batches are exactly the
    forward_backward calls made, N optimiser steps follow them, and every datum is sent once."""
    learning, _ = twins
    config = step_config(num_substeps=2)
    trajectories = copy.deepcopy(learned_batch[0])
    recorder = Recorder(trajectories)
    record = asyncio.run(trainer_on(learning, config, tokenizer, recorder,
                                    micro_batcher=lambda datums: [[d] for d in datums]).step(1, recorder))
    calls = [c for c in recorder.calls if c[0] == "forward_backward"]
    assert record.micro_batches == record.update.sent and len(record.datums) >= 2
    assert [len(m) for m in record.micro_batches] == [c[1] for c in calls] == [1] * len(record.datums)
    assert sorted(id(d) for m in record.micro_batches for d in m) == sorted(id(d) for d in record.datums)
    assert [c[0] for c in recorder.calls].count("optim_step") == 2
    assert record.update.optim_metrics["train/optimizer_steps"] == 2.0
    order = [i for part in substep_batches(len(record.datums), 2, seed=config.seed, step=1) for i in part]
    assert [id(m[0]) for m in record.micro_batches] == [id(record.datums[i]) for i in order]  # the run's own order


def test_the_kl_penalty_sees_the_datums_and_its_result_is_sent(twins, learned_batch, tokenizer):
    learning, _ = twins
    config = step_config()
    trajectories = copy.deepcopy(learned_batch[0])
    seen = []

    async def penalty(datums):
        seen.append(list(datums))
        return datums[:1], {"kl/mean": 0.5}

    recorder = Recorder(trajectories)
    record = asyncio.run(trainer_on(learning, config, tokenizer, recorder, kl_penalty=penalty).step(0, recorder))
    assert len(seen) == 1 and len(seen[0]) >= 2
    assert record.datums == seen[0][:1] and record.kl_metrics == {"kl/mean": 0.5}
    assert ("forward_backward", 1, "importance_sampling") in recorder.calls


class TinyVocabulary:
    """A tokenizer whose vocabulary holds one id: every datum has an id out of it."""

    def __len__(self):
        return 1


def test_a_step_without_datums_sends_nothing_and_asks_no_penalty(twins, learned_batch, tokenizer):
    """Invariant: datums out of the vocabulary are dropped and counted; with none left, no
    penalty is asked, nothing is sent, the weights still count as updated for the batch source."""
    learning, _ = twins
    config = step_config()
    trajectories = copy.deepcopy(learned_batch[0])
    asked = []

    async def penalty(datums):
        asked.append(datums)
        return datums, {}

    recorder = Recorder(trajectories)
    trainer = Trainer(config, service=service_of(learning), tokenizer=TinyVocabulary(),
                      micro_batcher=lambda datums: [datums], kl_penalty=penalty)
    trainer.training_client = RecordedClient(trainer.connect(), recorder.calls)
    record = asyncio.run(trainer.step(0, recorder))
    signal = sum(t.advantage != 0.0 and t.excluded is None for t in trajectories)
    assert record.dropped_out_of_vocab == signal > 0 and record.datums == [] and asked == []
    assert record.update is None and record.micro_batches == []
    assert recorder.calls == [("batch", 0), ("before_update", 0), ("weights_updated", 0)]


class RecordingService:
    """A service client that notes how training clients are asked for."""

    def __init__(self):
        self.asked = []

    def create_lora_training_client(self, **options):
        self.asked.append(("new", options))
        return "client"

    def create_training_client_from_state_with_optimizer(self, path):
        self.asked.append(("restore", path))
        return "restored"


@pytest.mark.slow  # two rollouts and two training steps through a twin (seconds)
def test_on_policy_steps_sample_each_batch_on_the_weights_about_to_be_trained(twins, tokenizer):
    """Invariant: with the core's own source, every step saves the weights it is about to train
    and makes a sampling client of them before its rollout, rolls out that step's questions on
    it (each turn records the step as its sampler), and only then sends its update; the harness's
    watch sees each batch's sampler and tools and its tools are the ones called."""
    examples, results = world()
    recorder = Recorder([])
    config = step_config()
    trainer = trainer_on(twins[0], config, tokenizer, recorder)
    watched, called = [], []

    class Counted:
        def __init__(self, tool):
            self.tool = tool

        async def call(self, call):
            called.append(call.name)
            return await self.tool.call(call)

    def watch(step, sampler, tools):
        watched.append((step, sorted(tools)))
        return sampler, {name: Counted(tool) for name, tool in tools.items()}, None

    source = OnPolicy(trainer.training_client, tokenizer, with_search(ScriptedSearch(results, default=NOTHING)),
                      lambda step: examples[2 * step: 2 * step + 2], config.rollout, watch=watch)
    records = [asyncio.run(trainer.step(step, source)) for step in (0, 1)]
    for step, record in enumerate(records):
        assert [t.example for t in record.trajectories][::4] == examples[2 * step: 2 * step + 2]
        assert {turn.sampler for t in record.trajectories for turn in t.turns} == {step}
        assert record.batch.sampler_version == step and record.update is not None
    assert [call[0] for call in recorder.calls] == ["sampler", "forward_backward", "optim_step"] * 2
    assert watched == [(0, ["search"]), (1, ["search"])]
    searched = sum(t.search_calls for record in records for t in record.trajectories)
    assert searched > 0 and called == ["search"] * searched


@pytest.mark.parametrize("train_unembed", [True, False])
def test_connect_asks_for_the_configured_lora_or_restores_a_state(tokenizer, train_unembed):
    service = RecordingService()
    config = step_config(train_unembed=train_unembed, lora_rank=16, seed=11)
    trainer = Trainer(config, service=service, tokenizer=tokenizer)
    assert trainer.connect() == "client" and trainer.training_client == "client"
    assert trainer.connect("tinker://run/state") == "restored" and trainer.training_client == "restored"
    assert service.asked == [("new", {"base_model": MODEL, "rank": 16, "seed": 11, "train_mlp": True,
                                      "train_attn": True, "train_unembed": train_unembed}),
                             ("restore", "tinker://run/state")]


def test_save_writes_the_state_and_the_sampler_weights_under_new_names(twins, tokenizer):
    learning, _ = twins
    recorder = Recorder([])
    trainer = trainer_on(learning, step_config(), tokenizer, recorder)
    state, weights = asyncio.run(save_checkpoint(trainer.training_client, "step-000001"))
    assert recorder.calls == [("save_state", "step-000001-state", {"overwrite": False}),
                              ("save_weights", "step-000001-weights", {})]
    assert state.endswith("step-000001-state") and weights.endswith("step-000001-weights")


def test_a_step_refuses_a_trajectory_longer_than_the_runs_token_budget(twins, learned_batch, tokenizer):
    """The datum limit is the run's --max-trajectory-tokens, whoever rolled the batch out."""
    learning, _ = twins
    trajectories = copy.deepcopy(learned_batch[0])
    shortest = min(len(t.turns[-1].prompt_tokens) + len(t.turns[-1].completion_tokens) for t in trajectories)
    # a datum's input is the whole sequence but its last token: every datum is one token too long
    config = step_config(rollout=RolloutConfig(group_size=4, seed=3, max_trajectory_tokens=shortest - 2))
    recorder = Recorder(trajectories)
    with pytest.raises(DatumError):
        asyncio.run(trainer_on(learning, config, tokenizer, recorder).step(0, recorder))


def test_a_trainer_must_be_connected_first(tokenizer):
    trainer = Trainer(step_config(), service=RecordingService(), tokenizer=tokenizer)
    with pytest.raises(AssertionError, match=r"^connect\(\) first$"):
        asyncio.run(trainer.step(0, Recorder([])))


def test_a_step_sends_the_configured_loss_and_its_options(twins, learned_batch, tokenizer):
    learning, _ = twins
    config = step_config(loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.7, "clip_high_threshold": 1.3})
    recorder = Recorder(copy.deepcopy(learned_batch[0]))
    record = asyncio.run(trainer_on(learning, config, tokenizer, recorder).step(0, recorder))
    assert [c for c in recorder.calls if c[0] == "forward_backward"] == [
        ("forward_backward", len(record.datums), "ppo",
         {"loss_fn_config": {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}})]


def test_a_step_mixes_the_judges_verdicts_and_leaves_out_a_group_it_failed_on(twins, scripted_batch, tokenizer):
    """Invariant (--judge-weight): the judge is asked about the answered trajectories only, after
    scoring; its verdicts make the rewards at weight 1, so a group the rule found flat can carry a
    signal; a group where it failed sends nothing, even with --keep-env-failures."""
    from searchr1.core.types import Verdict

    _, scripted = twins
    asked = []

    async def judge(trajectories):
        asked.extend((t.example.id, t.group_index) for t in trajectories)
        for t in trajectories:
            if t.example.id == "scores" and t.group_index == 2:
                t.verdict = Verdict(False, error="the judge could not be reached")
            else:  # the flat group's first two answers are judged right, the rule says wrong
                t.verdict = Verdict(t.score.answer == "France" or (t.example.id == "flat" and t.group_index < 2))

    config = step_config(judge_weight=1.0, keep_env_failures=True)
    trajectories = copy.deepcopy(scripted_batch)
    recorder = Recorder(trajectories)
    record = asyncio.run(trainer_on(scripted, config, tokenizer, recorder, judge=judge).step(0, recorder))
    assert ("scores", 3) not in asked and len(asked) == 11  # "I do not know." has no answer to judge
    groups = [trajectories[i:i + 4] for i in range(0, 12, 4)]
    assert [t.reward for t in groups[2]] == [1.0, 1.0, 0.0, 0.0]
    assert [g[0].excluded for g in groups] == [Exclusion.ENV_FAILURE_GROUP, None, None]
    assert not any(t.advantage for t in groups[0])
    assert len(record.datums) == 8 and record.groups.env_failure == 1
    assert record.credit_metrics["reward/judge_failed"] == pytest.approx(1 / 11)
    with pytest.raises(ValueError, match="--judge-weight"):
        Trainer(config, service=service_of(scripted), tokenizer=tokenizer)
