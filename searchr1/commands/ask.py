"""``ask "QUESTION"``: run the agent on one question and watch it work.

The rollout is the training and evaluation engine's (:func:`searchr1.core.rollout.rollout_batch_async`,
one question, one sample); the sampler and the search backend are wrapped so that each turn is
printed as it happens: the model's text, each query, the results (folded to their first lines),
and the answer. ``--answer GOLD`` scores it and prints the reward, EM, F1 and cover EM."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from searchr1.commands.help_layout import SectionedCommand, SectionOption
from searchr1.commands.options import (connect_timeout_option, rollout_config_from, rollout_options, run_guarded,
                                       sigterm_exits)
from searchr1.commands.search_options import SearchOptions, search_options
from searchr1.commands.settings_options import pop_flag, pop_optional
from searchr1.offline import OFFLINE_POLICIES, OfflinePolicy

if TYPE_CHECKING:
    from pytrio.types import ModelInput, SampleResponse, SamplingParams

    from searchr1.core.types import SamplingClient, SearchResult, Trajectory
    from searchr1.search.tool import SearchBackend

FOLDED_LINES = 3
EXAMPLES_SHOWN = 3


def check_offline_question(question: str, policy: str) -> None:
    """Refuse, before anything starts, a question the offline twin's policies have no script or
    knowledge for: they answer only the shipped offline questions (``searchr1/offline``; the
    learning policy also the page questions of ``pages.json`` and the long ones of ``long.json``),
    and the sampler would fail on each turn. One line naming the files and showing a few of the
    questions."""
    import os
    import unicodedata

    from searchr1.offline import KNOWN, LONG, PAGES, QUESTIONS, load_source

    def key(text: str) -> str:  # how the twin recognises a question (searchr1.twin.offline_world.question_key)
        return unicodedata.normalize("NFC", text).strip()

    def shown(path: Path) -> str:
        where = os.path.relpath(path)
        return where if not where.startswith("..") else str(path)

    files = (QUESTIONS, PAGES, LONG, KNOWN) if policy == OfflinePolicy.LEARNING else (QUESTIONS,)
    known = [item["question"] for path in files for split in ("dev", "train")
             for item in load_source(path)[split]]
    if key(question) in {key(q) for q in known}:
        return
    where = " and ".join(shown(path) for path in files)
    datasets = ("dev.jsonl, train.jsonl, pages_dev.jsonl and pages_train.jsonl" if PAGES in files
                else "dev.jsonl and train.jsonl")
    examples = ", ".join(f'"{q}"' for q in known[:EXAMPLES_SHOWN])
    raise click.ClickException(
        f"offline, the twin's {policy} policy answers only the {len(known)} questions in {where} (also in "
        f"{datasets} beside {'them' if len(files) > 1 else 'it'}), not {question.strip()!r}; for example {examples}")


def _fold(text: str, lines: int = FOLDED_LINES) -> str:
    kept = text.strip().split("\n")
    shown = "\n".join("    " + line for line in kept[:lines])
    return shown + (f"\n    … {len(kept) - lines} more lines" if len(kept) > lines else "")


class _Printing:
    """The sampler, printing each assistant turn as it comes back."""

    def __init__(self, sampler: SamplingClient) -> None:
        self._sampler = sampler
        self.turns = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._sampler, name)

    async def sample_async(self, prompt: ModelInput, num_samples: int = 1,
                           sampling_params: SamplingParams | None = None, include_prompt_logprobs: bool = False,
                           return_text: bool = True) -> SampleResponse:
        # the call as the rollout made it: the sampler's own defaults for what it left out
        given = {"sampling_params": sampling_params} if sampling_params is not None else {}
        response = await self._sampler.sample_async(prompt=prompt, num_samples=num_samples,
                                                    include_prompt_logprobs=include_prompt_logprobs,
                                                    return_text=return_text, **given)
        from searchr1.view.terminal import turn_event

        for sequence in response.sequences:
            self.turns += 1
            turn = turn_event(self.turns, getattr(sequence, "text", None) or "", "")
            click.secho(f"assistant {self.turns}", bold=True, fg="cyan")
            if turn.reasoning is not None:  # thinking on: the reasoning, set apart and dimmed
                click.secho("\n".join("  (reasoning) " + line for line in turn.reasoning.split("\n")), dim=True)
            click.echo("\n".join("  " + line for line in turn.text.strip().split("\n")))
        return response


class _PrintingSearch:
    """The search backend, printing each query and its folded results."""

    def __init__(self, backend: SearchBackend) -> None:
        self._backend = backend
        self.name: str = getattr(backend, "name", "search")

    def __getattr__(self, name: str) -> object:
        return getattr(self._backend, name)

    async def search(self, query: str) -> SearchResult:
        from searchr1.core.observation.text import format_item

        click.secho(f"search: {query}", bold=True, fg="magenta")
        result = await self._backend.search(query)
        if not result.ok:
            click.secho(f"  search failed: {result.error}", fg="red")
        elif not result.items:
            click.echo("  no results")
        else:
            for index, item in enumerate(result.items, start=1):
                click.echo(_fold(format_item(item, index), 2))
        return result


@click.command("ask", cls=SectionedCommand)
@click.argument("question")
@click.option("--answer", "answers", cls=SectionOption, section="run", multiple=True, metavar="GOLD",
              help="A gold answer (repeatable): print the reward, EM, F1 and cover EM of the agent's answer.")
@click.option("--checkpoint", cls=SectionOption, section="run", default=None, metavar="RUN_DIR|PATH",
              help="A training run (its last checkpoint) or a sampler-weights path [default: the base model].")
@click.option("--offline", cls=SectionOption, section="run", is_flag=True,
              help="Against the offline twin (no key, no network); its policy answers.")
@click.option("--offline-home", cls=SectionOption, section="service",
              type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The twin's checkpoint store of an offline checkpoint path (runs/<run>/twin).")
@click.option("--offline-policy", cls=SectionOption, section="service",
              type=click.Choice(OFFLINE_POLICIES), default=OfflinePolicy.LEARNING.value,
              help="With --offline: the policy the twin serves.")
@click.option("--base-model", cls=SectionOption, section="run", default="Qwen/Qwen3.5-4B")
@rollout_options(group_size=1, temperature=0.0)
@click.option("--seed", cls=SectionOption, section="run", type=int, default=42, help="Sampling seed.")
@connect_timeout_option()
@search_options(default_backend="deepseek")
def ask(search: SearchOptions, question: str, **kwargs: object) -> None:
    """Ask the agent one question and print each turn as it happens.

    \b
    %(prog)s ask "Who is the father of the director of film Jurassic Park?" --offline \\
        --checkpoint runs/<run-name> --answer "Arnold Spielberg"
    %(prog)s ask "Who wrote Dune?" --backend zhihu --checkpoint runs/<run-name>
    """
    run_guarded(lambda: _ask(search, question, kwargs))


def _ask(search: SearchOptions, question: str, kwargs: dict[str, object]) -> None:
    from searchr1.commands.checkpoint_flag import resolve_checkpoint
    from searchr1.commands.eval import _sampling_client, rollout_as_trained
    from searchr1.core.rollout import rollout_batch_async
    from searchr1.search.tool import with_search
    from searchr1.data.dataset import SearchExample
    from searchr1.wiring.services import (
        check_base_model,
        check_search_setup,
        check_tool_setup,
        live_service,
        load_tokenizer,
        offline_scenario,
        offline_service,
        search_backend,
        tool_backends,
    )

    if not question.strip():
        raise click.BadParameter("the question is empty", param_hint="QUESTION")
    answers: tuple[str, ...] = tuple(a for a in pop_flag(kwargs, "answers", tuple))
    checkpoint, offline = pop_optional(kwargs, "checkpoint", str), pop_flag(kwargs, "offline", bool)
    offline_home, policy = pop_optional(kwargs, "offline_home", Path), pop_flag(kwargs, "offline_policy", str)
    base_model = pop_flag(kwargs, "base_model", str)
    connect_timeout = pop_optional(kwargs, "connect_timeout", float)
    rollout = rollout_config_from(kwargs, seed=pop_flag(kwargs, "seed", int))
    if rollout.group_size != 1:
        raise click.BadParameter("ask follows one trajectory; use eval for groups", param_hint="--group-size")
    chosen = resolve_checkpoint(checkpoint, base_model=base_model, offline=offline, offline_home=offline_home,
                                offline_policy=policy)
    base_model, model_path, offline = chosen.base_model, chosen.model_path, chosen.offline
    offline_home, policy = chosen.offline_home, chosen.offline_policy
    if chosen.rendering is not None:
        rollout = rollout_as_trained(rollout, chosen.rendering)
    if offline:
        check_offline_question(question, policy)
    check_base_model(base_model)
    check_search_setup(search, offline=offline)
    check_tool_setup(rollout.tools, search)
    tokenizer = load_tokenizer()
    example = SearchExample(id="ask", question=question.strip(), answers=answers, data_source="ask")
    who = (f"the offline twin's {policy} policy (not the model)" if offline else "live PyTRIO")
    click.echo(f"ask: {model_path or base_model}, answered by {who}, search {search.backend}", err=True)
    with sigterm_exits(), tempfile.TemporaryDirectory(prefix="searchr1-ask-") as scratch:
        home = offline_home or Path(scratch)
        capacity = rollout.sampling_concurrency
        service = (offline_service(home, tokenizer, offline_scenario(), policy=policy, sampling_concurrency=capacity)
                   if offline else live_service(connect_timeout, sampling_concurrency=capacity))
        sampler = _Printing(_sampling_client(service, base_model, model_path, offline=offline,
                                             offline_home=offline_home))

        async def main() -> Trajectory:
            backend = search_backend(search, offline=offline)
            try:
                tools = with_search(_PrintingSearch(backend), tool_backends(rollout.tools, backend))
                (trajectory,) = await rollout_batch_async(sampler, tokenizer, tools, [example], rollout)
                score_trajectories([trajectory], reward="em")
                return trajectory
            finally:
                await backend.aclose()

        from searchr1.core.reward import score_trajectories
        from searchr1.core.rollout import SamplerFailureError
        from searchr1.runtime.failures import describe_failure, is_service_failure

        try:
            trajectory = asyncio.run(main())
        except SamplerFailureError as error:
            cause = str(error).split("(first failure: ", 1)[-1].split(" | ", 1)[0]
            raise click.ClickException(f"the sampler could not answer: {cause}") from None
        except Exception as error:
            if is_service_failure(error):
                raise click.ClickException(f"the service or the network failed ({describe_failure(error)})") from None
            raise
    click.secho(f"ended: {trajectory.termination}", bold=True)
    from searchr1.core.reward import ANSWER_PATTERN

    found_answer = ANSWER_PATTERN.findall(trajectory.final_text or "")
    click.secho(f"answer: {found_answer[-1] if found_answer else '(none)'}", bold=True, fg="green")
    if answers:
        click.echo(f"reward {trajectory.reward:+.1f}   EM {'yes' if trajectory.score.exact_match else 'no'}   "
                   f"F1 {trajectory.score.f1:.3f}   cover EM {'yes' if trajectory.score.cover_em else 'no'}   "
                   f"(gold: {' | '.join(answers)})")
