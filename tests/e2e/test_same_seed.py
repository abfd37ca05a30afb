"""Two offline runs with one seed write the same metrics, wall-clock timings (``time/*``) aside:
search usage and its cost included, however the searches happen to interleave."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from click.testing import CliRunner

from searchr1.cli import main
from searchr1.run.directory import RunDir
from searchr1.run.usage import MeteredSampler
from searchr1.search.replay import CassetteTransport

PRICES = Path(__file__).resolve().parents[2] / "docs" / "prices.example.toml"  # prices DeepSeek's searches too
ARGS = ["train", "--offline", "--quiet", "--max-steps", "2", "--prices", str(PRICES)]


def pause_before(monkeypatch, owner: type, method: str, pause: tuple[float, float]) -> None:
    """``owner.method`` answers after a pause of so many seconds, drawn between ``pause``'s bounds."""
    pauses = random.Random(0)
    answer = getattr(owner, method)

    async def slowly(self, *args, **kwargs):
        await asyncio.sleep(pauses.uniform(*pause))
        return await answer(self, *args, **kwargs)

    monkeypatch.setattr(owner, method, slowly)


def without_time(line: dict) -> dict:
    return {key: value for key, value in line.items() if not key.startswith("time/")}


def differences(first: dict, second: dict) -> dict:
    """key -> (first's value, second's value) where two metrics lines differ."""
    return {key: (first.get(key), second.get(key)) for key in sorted(first.keys() | second.keys())
            if first.get(key) != second.get(key)}


def test_two_offline_runs_with_one_seed_write_the_same_metrics(tmp_path, monkeypatch):
    """Run "together": the trajectories' turns come back at once and each search stays in flight
    for 0.2 s, so trajectories asking the same query together share its request. Run "apart":
    turns come back up to 0.2 s apart and searches answer at once, so the same query asked
    again usually finds the first request finished. Both runs must count the same requests."""
    runs = []
    for name, sampling, searching in (("together", (0, 0), (0.2, 0.2)), ("apart", (0, 0.2), (0, 0))):
        with monkeypatch.context() as patched:
            pause_before(patched, MeteredSampler, "sample_async", sampling)
            pause_before(patched, CassetteTransport, "handle_async_request", searching)
            run_dir = tmp_path / name
            result = CliRunner().invoke(main, [*ARGS, "--run-dir", str(run_dir)])
        assert result.exit_code == 0, result.output
        runs.append([without_time(line) for line in RunDir(run_dir).metrics()])
    first, second = runs
    assert [line["step"] for line in first] == [0, 1] == [line["step"] for line in second]
    assert [differences(a, b) for a, b in zip(first, second)] == [{}, {}]
    # the comparison covers what the search service was asked and what that cost
    assert first[-1]["usage/total_search_deepseek_requests"] > 0 and first[-1]["cost/total"] > 0
    assert first[-1]["usage/total_search_deepseek_calls"] > first[-1]["usage/total_search_deepseek_requests"]
