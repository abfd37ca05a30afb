"""``rollout --offline``: one scripted batch through the engine (sampled with the
real PyTRIO client from the offline twin), outcome per trajectory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from searchr1.commands.help_layout import SectionedCommand, SectionOption
from searchr1.commands.search_options import search_options
from searchr1.search.options import SearchOptions
from searchr1.commands.options import rollout_config_from, rollout_options, run_guarded

if TYPE_CHECKING:
    from searchr1.core.types import SamplingClient, Trajectory


@click.command(cls=SectionedCommand)
@click.option("--offline", cls=SectionOption, section="run", is_flag=True, required=True,
              help="Required: rollouts run against the scripted policy and search cassettes.")
@click.option("--scenario", cls=SectionOption, section="run",
              type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Scenario file [default: the shipped offline scenario]; golden/scenarios/*.json also work.")
@click.option("--questions", cls=SectionOption, section="run", type=click.IntRange(min=1), default=None,
              help="How many of the scenario's questions to roll out [default: 4, or all if it has fewer].")
@click.option("--seed", cls=SectionOption, section="run", type=int, default=42, show_default=True)
@rollout_options(group_size=8)
@search_options(default_backend="deepseek")
def rollout(offline: bool, scenario: Path | None, questions: int | None, seed: int, search: SearchOptions,
            **kwargs: object) -> None:
    """Roll out a scripted batch and print each trajectory's outcome.

    Without --cassette, search replays the scenario's cassette (or cassettes/<backend>/offline.yaml).
    A scenario scripts a fixed number of samples per question (the shipped one, 8 samples), which
    is as large as --group-size can be; without the flag the group is capped to it.
    """
    run_guarded(lambda: _rollout(scenario, questions, seed, search, kwargs))


def _rollout(scenario_path: Path | None, questions: int | None, seed: int, search: SearchOptions,
             kwargs: dict[str, object]) -> None:
    from dataclasses import replace

    from searchr1.offline import REPO_ROOT
    from searchr1.run.progress import CountingBar
    from searchr1.core.advantage import assign_group_advantages
    from searchr1.core.reward import score_trajectories
    from searchr1.core.rollout import rollout_batch_async
    from searchr1.search.tool import with_search
    from searchr1.offline import SCENARIO
    from searchr1.wiring.services import (check_search_setup, check_tool_setup, load_tokenizer,
                                           scripted_sampling_client,
                                           search_backend, tool_backends)
    from searchr1.twin.scenario import load_scenario
    from searchr1.basics.wording import plural

    config = rollout_config_from(kwargs, seed=seed)
    scenario = load_scenario(scenario_path or SCENARIO)
    name = scenario_path or SCENARIO.name
    if questions is None:
        questions = min(4, len(scenario.questions))
    elif questions > len(scenario.questions):
        raise click.BadParameter(f"{questions} is more than the {plural(len(scenario.questions), 'question')} "
                                 f"scripted in {name}", param_hint="--questions")
    scripted = min(len(q.samples) for q in scenario.questions[:questions])
    if config.group_size > scripted:
        if click.get_current_context().get_parameter_source("group_size") == ParameterSource.COMMANDLINE:
            raise click.BadParameter(f"{config.group_size} is more than the {scripted} samples per question "
                                     f"scripted in {name}", param_hint="--group-size")
        config = replace(config, group_size=scripted)
    if scenario_path is not None and search.cassette is None and scenario.cassette:
        search = replace(search, backend=scenario.backend or search.backend, cassette=REPO_ROOT / scenario.cassette)
    if scenario.rollout:
        config = replace(config, **{k: v for k, v in scenario.rollout.items() if k != "group_size"},
                         group_size=min(config.group_size, scenario.rollout.get("group_size", config.group_size)))
    examples = scenario.examples[:questions]
    check_search_setup(search, offline=True)
    check_tool_setup(config.tools, search)
    tokenizer = load_tokenizer()

    async def main(sampler: SamplingClient) -> list[Trajectory]:
        backend = search_backend(search, offline=True)
        try:
            with CountingBar("trajectories", len(examples) * config.group_size) as bar:
                tools = with_search(backend, tool_backends(config.tools, backend))
                trajectories = await rollout_batch_async(sampler, tokenizer, tools, examples, config, bar.advance)
            score_trajectories(trajectories)
            assign_group_advantages(trajectories)
            return trajectories
        finally:
            await backend.aclose()

    with scripted_sampling_client(scenario, tokenizer) as sampler:
        trajectories = asyncio.run(main(sampler))
    click.echo(f"{'question':<16} {'g':>2}  {'end':<14} {'turns':>5} {'search':>6} {'reward':>6} {'adv':>7}  queries")
    for t in trajectories:
        queries = "; ".join(s.query + ("" if s.ok else " [error]") for s in t.calls)
        click.echo(f"{t.example.id:<16} {t.group_index:>2}  {t.termination:<14} {len(t.turns):>5} "
                   f"{t.search_calls:>6} {t.reward:>6.1f} {t.advantage:>+7.3f}  {queries}")
    mean = sum(t.reward for t in trajectories) / max(len(trajectories), 1)
    click.echo(f"{plural(len(trajectories), 'trajectory', 'trajectories')}, mean reward {mean:+.3f}")
