"""``searchr1 bench``: how much faster and cheaper than the lab port's way (see ``searchr1.bench``)."""

from __future__ import annotations

import sys
import time

import click

from searchr1.commands.help_layout import SectionedCommand

TITLES = {
    1: "rollout scheduling",
    2: "protocol CPU",
    3: "packing",
    4: "search calls saved",
    5: "local overhead of a step",
    6: "overlapping rollouts with training",
    7: "learning speed on the offline world",
    8: "BM25 of our own: build, queries, serve",
    9: "agreement and speed against Lucene BM25",
    10: "algorithm options and the KL penalty's cost",
    11: "pytrio's CPU per request, alone and beside our loop",
    12: "one tool against two on the page questions",
    13: "one paper-sized step's search over wiki-18's size",
    14: "credit per turn: GRPO, GiGPO, GiGPO with step rewards",
    15: "thinking mode: what reasoning costs and changes",
    16: "context management on the long-horizon world: full against fold",
    17: "off-policy correction against a mismatched sampler: none, tis, decoupled",
    18: "which questions to train on: uniform against the probe's filter and the curriculum",
    19: "partial rollouts against the bounded overlap on mixed trajectory lengths",
}


@click.command("bench", cls=SectionedCommand)
@click.option("--output", "-o", default="bench.json", show_default=True,
              type=click.Path(dir_okay=False, writable=True), help="Where to write the JSON report.")
@click.option("--quick", is_flag=True, help="Tiny sizes and one repetition: a smoke run, not for quoting.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the workloads and latencies.")
@click.option("--only", default=None, metavar="1,2,...",
              help=f"Run only these figures (1-{max(TITLES)}; without it 1-7: figures 8-10 and 12-19 take minutes, 11 "
                   "explains 5, "
                   "and 9 needs `python -m searchr1.bench.lucene setup` first).")
@click.option("--passages", type=click.IntRange(min=1000), default=None,
              help="Generated corpus size of figures 8, 9 and 13 [default: wiki-18's 21,015,324 for 8 and 13, "
                   "1,000,000 for 9; 20,000 with --quick].")
@click.option("--paper-sizes", is_flag=True,
              help="Figure 5's scaling rows also at 2,560 (the paper's 512 prompts x 5) and 4,096 trajectories: "
                   "about 2.5 minutes more on two cores.")
@click.option("--strict", is_flag=True, help="Exit with status 1 when a figure misses a target (not with --quick).")
def bench(output: str, quick: bool, seed: int, only: str | None, strict: bool, passages: int | None,
          paper_sizes: bool) -> None:
    """Measure this implementation against the lab port's way, side by side in one run.

    \b
    1  rollout makespan / lower bound, ours and lock-step rounds (simulated latencies)
    2  chat-template renders and CPU per tool turn, ours and the lab port's fit
    3  micro-batches / lower bound and padding of the lab port's packer
    4  search requests saved by single-flight and the query cache
    5  local CPU of one offline training step, ours and with the lab port's observation fitting, by phase
    6  steps per hour with rollouts overlapping training
    7  steps to reward 0.8 on the offline world
    8  BM25 of our own over 21M generated passages (wiki-18's size): build rate and memory, queries/s, serve
    9  top-3 agreement and speed against Lucene BM25 (pyserini's Anserini; own set-up step)
    10 steps to reward 0.8 for each loss, KL penalty and dynamic sampling, and the KL's cost per step
    11 pytrio's CPU per sampling request with our loop idle and busy (why 5's wire costs 2x)
    12 steps to reward 0.8 on the page questions with search + open_page and with search alone
    13 one paper-sized step's search (2,560 trajectories) through retriever serve with 1, 2, N workers
    14 steps to reward 0.8, repeated searches and dev EM with trajectory credit, GiGPO, GiGPO + step rewards
    15 tokens sampled per trajectory and steps to reward 0.8 with --thinking off and on
    16 reward on the long-horizon world with --context full and fold at one window, tokens and datums per trajectory
    17 steps to reward 0.8 with --correction none, tis and decoupled on a sampler with the mismatch fault
    18 steps to reward 0.8 on the questions needing search and the batch spent on solved or guessable ones,
       uniform against --drop-guessable 1 --curriculum
    19 steps per hour, makespan / training-queue bound and steps to reward 0.8 with --partial-rollouts against
       the bounded overlap, on short and long-horizon questions mixed

    Every figure is a ratio of two things measured in the same run. Prints a table and writes
    OUTPUT (value, target and "met" per figure). Exit status 0 even when a target is missed,
    unless --strict.
    """
    from rich.console import Console

    from searchr1.bench.report import Figure, bench_json, print_report, write_json_atomically
    from searchr1.basics.wording import plural
    from searchr1.bench.runner import parse_only, run_figures

    if strict and quick:
        raise click.UsageError("--strict and --quick contradict each other: --quick is a smoke run, not held "
                               "to the targets")
    try:
        numbers = parse_only(only)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--only") from None
    from searchr1.basics.fileio import check_writable

    check_writable(output, "bench report", click.ClickException)  # before minutes of measuring
    if 9 in numbers:
        from searchr1.bench.lucene import lucene_missing

        missing = lucene_missing()
        if missing is not None:  # before any figure is paid for
            raise click.ClickException(missing)
    console = Console(stderr=True)
    started = time.perf_counter()
    console.print("[dim]loading the Qwen3.5 tokenizer...[/dim]")
    from searchr1.runtime.tokenizer import shared_tokenizer

    tokenizer = shared_tokenizer()
    figures: list[Figure] = []  # every figure finished, kept when a later one fails
    running: list[int] = []

    def starting(number: int) -> None:
        running[:] = [number]
        console.print(f"[dim]figure {number}: {TITLES[number]}...[/dim]")

    def finished(figure: Figure) -> None:
        figures.append(figure)
        console.print(f"[dim]figure {figure.number} done in {figure.seconds:.1f} s[/dim]")

    try:
        run_figures(numbers, tokenizer=tokenizer, seed=seed, quick=quick, passages=passages, paper_sizes=paper_sizes,
                    on_start=starting, on_done=finished)
    except (RuntimeError, OSError) as error:  # a figure's child process or set-up failed: one line
        kept = ""
        if figures:
            payload = bench_json(figures, quick=quick, seed=seed, argv=sys.argv[1:])
            kept = f"; {plural(len(figures), 'figure')} finished, written to {write_json_atomically(output, payload)}"
        first = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
        raise click.ClickException(f"figure {running[0] if running else '?'} failed: {first}{kept}") from None
    payload = bench_json(figures, quick=quick, seed=seed, argv=sys.argv[1:])
    payload["seconds"] = round(time.perf_counter() - started, 1)
    path = write_json_atomically(output, payload)
    print_report(figures, output=path, quick=quick)
    if strict and not payload["all_met"]:
        sys.exit(1)
