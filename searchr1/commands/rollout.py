"""``python cli.py rollout --offline``: one scripted batch through the engine, outcome per trajectory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from ..search.cli_options import SearchOptions, search_options
from .options import rollout_config_from, rollout_options, run_guarded


@click.command()
@click.option("--offline", is_flag=True, required=True,
              help="Required: rollouts run against the scripted policy and search cassettes.")
@click.option("--scenario", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Scenario file [default: the shipped offline scenario]; golden/scenarios/*.json also work.")
@click.option("--questions", type=click.IntRange(min=1), default=4, show_default=True,
              help="How many of the scenario's questions to roll out.")
@click.option("--seed", type=int, default=42, show_default=True)
@rollout_options(group_size=8)
@search_options(default_backend="wikipedia")
def rollout(offline: bool, scenario: Path | None, questions: int, seed: int, search: SearchOptions, **kwargs: Any) -> None:
    """Roll out a scripted batch and print each trajectory's outcome.

    Without --cassette, search replays the scenario's cassette (or cassettes/<backend>/offline.yaml).
    """
    run_guarded(lambda: _rollout(scenario, questions, seed, search, kwargs))


def _rollout(scenario_path: Path | None, questions: int, seed: int, search: SearchOptions, kwargs: dict[str, Any]) -> None:
    from dataclasses import replace

    from ..offline import REPO_ROOT
    from ..progress import CountingBar
    from ..rollout import rollout_batch_async
    from ..scripted import ScriptedSampler
    from ..services import load_tokenizer, offline_scenario, search_backend

    config = rollout_config_from(kwargs, seed=seed)
    scenario = offline_scenario(scenario_path)
    if scenario_path is not None and search.cassette is None and scenario.cassette:
        search = replace(search, backend=scenario.backend or search.backend, cassette=REPO_ROOT / scenario.cassette)
    if scenario.rollout:
        config = replace(config, **{k: v for k, v in scenario.rollout.items() if k != "group_size"},
                         group_size=min(config.group_size, scenario.rollout.get("group_size", config.group_size)))
    examples = scenario.examples[:questions]
    tokenizer = load_tokenizer()

    async def main() -> list[Any]:
        backend = search_backend(search, offline=True)
        try:
            with CountingBar("trajectories", len(examples) * config.group_size) as bar:
                return await rollout_batch_async(ScriptedSampler(scenario, tokenizer), tokenizer, backend,
                                                 examples, config, bar.advance)
        finally:
            await backend.aclose()

    trajectories = asyncio.run(main())
    click.echo(f"{'question':<16} {'g':>2}  {'end':<14} {'turns':>5} {'search':>6} {'reward':>6} {'adv':>7}  queries")
    for t in trajectories:
        queries = "; ".join(s.query + ("" if s.ok else " [error]") for s in t.searches)
        click.echo(f"{t.example.id:<16} {t.group_index:>2}  {t.termination:<14} {len(t.turns):>5} "
                   f"{t.search_calls:>6} {t.reward:>6.1f} {t.advantage:>+7.3f}  {queries}")
    mean = sum(t.reward for t in trajectories) / max(len(trajectories), 1)
    click.echo(f"{len(trajectories)} trajectories, mean reward {mean:+.3f}")
