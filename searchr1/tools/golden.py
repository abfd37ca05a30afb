"""Golden trajectories: scripted scenarios replayed through the real engine and frozen.

``golden/scenarios/<name>.json`` is a scenario (see :mod:`searchr1.twin.scenario`) that names
a search backend and a cassette; a scenario whose rollout declares ``open_page`` reads the pages
of the shipped offline corpus. :func:`generate` runs it through the real pytrio sampling
client against the twin serving the scenario's script, the real backend replaying the
cassette, the rollout engine, the reward, the group advantages and the datum builder, and
returns everything as plain JSON: messages, per-turn prompt and
completion ids, logprobs, termination, reward, advantage, and the arrays the trainer would
send. ``golden/<name>.json`` holds the frozen copy; ``python cli.py golden --update``
rewrites it and a test regenerates every scenario in memory and compares exactly.

A golden file records the scenario's rollout overrides, not the whole configuration: a new
setting (with its default) changes no golden file unless it changes a trajectory.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, fields
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from searchr1.core.datum import build_training_datums
from searchr1.offline import REPO_ROOT
from searchr1.core.advantage import assign_group_advantages
from searchr1.core.reward import score_trajectories
from searchr1.core.rollout import RolloutConfig, rollout_batch_async
from searchr1.search.tool import with_search
from searchr1.twin.scenario import Scenario, ScenarioError, load_scenario
from searchr1.core.tools import ToolBackend
from searchr1.core.types import CallRecord, Exclusion, Message, SamplingClient, Termination, Trajectory
from searchr1.runtime.tokenizer import Qwen35Tokenizer

if TYPE_CHECKING:
    from searchr1.twin.server import Twin

GOLDEN_DIR = REPO_ROOT / "golden"
SCENARIO_DIR = GOLDEN_DIR / "scenarios"
# Settings that would only make a replay slower, never different.
FIXED = {"sample_retry_backoff": 0.0}
# Fields that depend on completion order or timing, not on the scenario.
VOLATILE_SEARCH_FIELDS = {"cached"}


def scenario_paths(directory: Path = SCENARIO_DIR) -> list[Path]:
    return sorted(directory.glob("*.json"))


def golden_path(scenario: Path, directory: Path = GOLDEN_DIR) -> Path:
    return directory / scenario.name


def rollout_config(scenario: Scenario) -> RolloutConfig:
    known = {f.name for f in fields(RolloutConfig)}
    unknown = sorted(set(scenario.rollout) - known)
    if unknown:
        raise ScenarioError(f"{scenario.path}: unknown rollout settings {unknown}")
    return RolloutConfig(**{**dict(scenario.rollout), **FIXED})


class GoldenTurn(TypedDict):
    text: str
    stop_reason: str
    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]


class GoldenTrajectory(TypedDict):
    question_id: str
    question_index: int
    group_index: int
    termination: Termination | None
    reward: float
    advantage: float
    excluded: Exclusion | None
    env_error: bool
    search_calls: int
    final_text: str
    messages: list[Message]
    searches: list[dict[str, object]]  # each call's fields (_call_json)
    turns: list[GoldenTurn]


class GoldenDatum(TypedDict):
    question_index: int
    group_index: int
    model_input: list[int]
    target_tokens: list[int]
    logprobs: list[float]
    advantages: list[float]


class GoldenFile(TypedDict):
    """``golden/<name>.json``: the scenario, its trajectories and the datums the trainer would send."""

    scenario: str
    description: str
    backend: str
    cassette: str
    rollout: dict[str, object]  # the scenario's rollout overrides
    trajectories: list[GoldenTrajectory]
    datums: list[GoldenDatum]


def _call_json(call: CallRecord) -> dict[str, object]:
    """A call as the golden files hold it: a search that ran names no tool (the files' format)."""
    fields = {k: v for k, v in asdict(call).items() if k not in VOLATILE_SEARCH_FIELDS}
    if call.tool == "search" and not call.refused:
        del fields["tool"], fields["refused"]
    return fields


def _trajectory_json(t: Trajectory) -> GoldenTrajectory:
    return {
        "question_id": t.example.id,
        "question_index": t.question_index,
        "group_index": t.group_index,
        "termination": t.termination,
        "reward": t.reward,
        "advantage": t.advantage,
        "excluded": t.excluded,
        "env_error": t.env_error,
        "search_calls": t.search_calls,
        "final_text": t.final_text,
        "messages": t.messages,
        "searches": [_call_json(call) for call in t.calls],
        "turns": [
            {
                "text": turn.text,
                "stop_reason": turn.stop_reason,
                "prompt_tokens": turn.prompt_tokens,
                "completion_tokens": turn.completion_tokens,
                "logprobs": turn.logprobs,
            }
            for turn in t.turns
        ],
    }


def golden_tools(config: RolloutConfig) -> dict[str, ToolBackend]:
    """The declared tools other than search a scenario's rollout names: ``open_page`` reads the
    pages of the shipped offline corpus (:mod:`searchr1.bm25.shipped`), whatever the scenario's
    search backend."""
    if "open_page" not in config.tools:
        return {}
    from searchr1.bm25.index import BM25Index
    from searchr1.bm25.shipped import offline_index
    from searchr1.search.pages import LocalPageBackend

    return {"open_page": LocalPageBackend(BM25Index(offline_index()))}


async def _run(scenario: Scenario, tokenizer: Qwen35Tokenizer, sampler: SamplingClient, *, backend_name: str,
               cassette: str) -> tuple[RolloutConfig, list[Trajectory]]:
    from searchr1.search.replay import open_replay_backend

    config = rollout_config(scenario)
    backend = open_replay_backend(backend_name, REPO_ROOT / cassette)
    try:
        trajectories = await rollout_batch_async(sampler, tokenizer, with_search(backend, golden_tools(config)),
                                                 scenario.examples, config)
        score_trajectories(trajectories)
        assign_group_advantages(trajectories)
    finally:
        await backend.aclose()
    return config, trajectories


def generate(scenario_path: Path, tokenizer: Qwen35Tokenizer, *, twin: Twin | None = None) -> GoldenFile:
    """Replay one scenario (on ``twin`` when given, else on a twin started for it)."""
    from searchr1.wiring.services import scripted_sampling_client

    scenario = load_scenario(scenario_path)
    backend, cassette = scenario.backend, scenario.cassette
    if not backend or not cassette:
        raise ScenarioError(f"{scenario.path}: a golden scenario names its 'backend' and 'cassette'")
    with scripted_sampling_client(scenario, tokenizer, twin=twin) as sampler:
        config, trajectories = asyncio.run(_run(scenario, tokenizer, sampler, backend_name=backend,
                                                cassette=cassette))
    datums = build_training_datums(trajectories, max_tokens=config.window)
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "backend": backend,
        "cassette": cassette,
        "rollout": dict(scenario.rollout),
        "trajectories": [_trajectory_json(t) for t in trajectories],
        "datums": [
            {
                "question_index": d.question_index,
                "group_index": d.group_index,
                "model_input": d.datum.model_input.to_ints(),
                "target_tokens": d.datum.loss_fn_inputs["target_tokens"].data,
                "logprobs": d.datum.loss_fn_inputs["logprobs"].data,
                "advantages": d.datum.loss_fn_inputs["advantages"].data,
            }
            for d in datums
        ],
    }


def dumps(payload: Mapping[str, object]) -> str:
    """Pretty JSON with every list of numbers on one line (readable diffs, small files)."""
    text = json.dumps(payload, indent=1, ensure_ascii=False)
    lines: list[str] = []
    buffer: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if buffer is not None:
            if stripped in ("]", "],"):
                lines.append(buffer[0] + ", ".join(buffer[1:]) + stripped)
                buffer = None
                continue
            value = stripped.rstrip(",")
            if _is_number(value):
                buffer.append(value)
                continue
            lines.extend([buffer[0]] + [" " + v for v in buffer[1:]])  # not a number list after all
            buffer = None
        if stripped.endswith("[") and not stripped.startswith("{"):
            buffer = [line]
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def differences(expected: object, actual: object, path: str = "", limit: int = 20) -> list[str]:
    """Readable paths where two JSON values differ (at most ``limit``)."""
    found: list[str] = []

    def walk(a: object, b: object, where: str) -> None:
        if len(found) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if key not in a or key not in b:
                    found.append(f"{where}.{key}: {'missing in golden' if key not in a else 'missing now'}")
                else:
                    walk(a[key], b[key], f"{where}.{key}")
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                found.append(f"{where}: length {len(a)} in golden, {len(b)} now")
            for index, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{where}[{index}]")
        elif a != b:
            found.append(f"{where}: golden {a!r} != now {b!r}")

    walk(expected, actual, path or "$")
    return found
