"""Every command the README shows runs as printed and exits 0, in a fresh folder, block after
block as a reader types them (the install lines are CI's own: ``.ci/run`` runs them). A command
that needs a key or the network runs as its offline variant: ``train`` gets ``--offline``, and
``prepare-data`` (it downloads the QA release) is the one command left out, by name.

The offline blocks' run is the main job's default (20 steps of the twin's learning policy): the
figures the README quotes for it (the reward's rise, micro EM before and after) are checked
against what the commands printed and wrote."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from readme_support import README, cli_commands, readme_blocks, readme_lines

from searchr1.cli import main
from searchr1.run.directory import RunDir

NEEDS_THE_NETWORK = {"prepare-data"}  # no offline variant: it downloads the QA release


def offline_variant(words: list[str]) -> list[str]:
    """The command as it runs with no key: training on the offline twin."""
    return [*words, "--offline"] if words[0] == "train" and "--offline" not in words else words


def run_block(commands: list[list[str]], folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Run the commands in ``folder``, in this process (the CLI's entry point, as ``python cli.py``
    calls it); what each printed, by its words (the ones left out print nothing)."""
    printed = {}
    monkeypatch.chdir(folder)
    for words in commands:
        if words[0] in NEEDS_THE_NETWORK:
            printed[shlex.join(words)] = ""
            continue
        done = CliRunner().invoke(main, offline_variant(words))
        assert done.exit_code == 0, f"`{shlex.join(words)}` exited {done.exit_code}:\n{done.output[-3000:]}"
        printed[shlex.join(words)] = done.output
    return printed


def left_out(printed: dict[str, str]) -> list[str]:
    return sorted({command.split()[0] for command in printed} & NEEDS_THE_NETWORK)


def flag_value(words: list[str], flag: str) -> str:
    """The word after ``flag`` in a README command."""
    return words[words.index(flag) + 1]


def micro_em(path: Path) -> float:
    """An eval output's micro EM (its last line is the summary)."""
    return json.loads(path.read_text("utf-8").splitlines()[-1])["metrics"]["em/micro"]


COSTS = README.parent / "docs" / "costs.md"


def quoted(pattern: str, source: Path = README) -> tuple[str, ...]:
    """The groups of ``pattern`` in the prose of ``source`` (whitespace taken as it wraps)."""
    found = re.search(pattern, " ".join(source.read_text("utf-8").split()))
    assert found, f"{source.name} no longer says {pattern!r}"
    return found.groups()


def whole(number: str) -> int:
    """A count as the docs print it (``1,269``)."""
    return int(number.replace(",", ""))


def costs_table(header: str) -> str:
    """The table of docs/costs.md that starts with the ``header`` row."""
    text = COSTS.read_text("utf-8")
    return text[text.index(header):].split("\n\n")[0]


def worked_example_totals() -> dict[str, int]:
    """docs/costs.md's worked example: each usage kind's total in its table (``| `kind` | 1,234 ... |``)."""
    return {name: whole(number) for name, number in
            re.findall(r"^\| `(\w+)` \| ([\d,]+)", costs_table("| kind | total |"), flags=re.MULTILINE)}


def worked_example_costs() -> tuple[list[tuple[int, float, float]], float]:
    """docs/costs.md's cost table: (usage, price per unit, cost) of each row, and its total."""
    table = costs_table("| kind | usage | example price | cost |")
    rows = [(whole(usage), float(price) / (1e6 if per == "/ M" else 1), float(cost))
            for usage, price, per, cost in
            re.findall(r"^\| [^|]+ \| ([\d,]+) \| ([\d.]+) (/ M|each) \| ([\d.]+) \|$", table,
                       flags=re.MULTILINE)]
    (total,) = re.findall(r"^\| \*\*total\*\* \|.*\*\*([\d.]+)\*\* \|$", table, flags=re.MULTILINE)
    return rows, float(total)


BLOCKS = readme_blocks(install=False)


def test_the_readme_shows_blocks_of_commands():
    assert len(BLOCKS) >= 3 and all(BLOCKS)


def test_every_line_of_a_block_is_a_command_run_here_or_an_export():
    """A line this test would not run (another program, a pipe) would go unchecked."""
    for block in readme_lines(install=False):
        for words in block:
            assert words[0] == "export" or (words[:2] == ["python", "cli.py"] and cli_commands(words) == [words[2:]]), \
                f"README command not understood: {shlex.join(words)}"


def test_the_offline_blocks_run_one_after_another_as_printed_and_give_the_figures_it_quotes(tmp_path, monkeypatch):
    offline = [block for block in BLOCKS if all("--offline" in words or words[0] != "train" for words in block)]
    assert offline, "the README has no offline block"
    printed = {}
    for block in offline:
        printed.update(run_block(block, tmp_path, monkeypatch))
    assert left_out(printed) == []

    (trained,) = [words for words in offline[0] if words[0] == "train"]
    run_dir = flag_value(trained, "--run-dir")
    output = printed[shlex.join(trained)]
    (reward_line,) = quoted(r"`(mean reward: first 5 steps [+-][\d.]+, last 5 steps [+-][\d.]+)` \(seed 42\)")
    assert reward_line in output  # the figure the README quotes is what the run printed
    assert f"eval --checkpoint {run_dir}" in output  # and it names the next command
    metrics = RunDir(tmp_path / run_dir).metrics()
    assert all(line["trainer/loss_mean"] != 0.0 for line in metrics[:5])  # a real loss

    # the usage docs/costs.md quotes for this run, in its table and its prose (prices change no usage)
    totals = worked_example_totals()
    assert len(totals) >= 10 and totals == {kind: metrics[-1][f"usage/total_{kind}"] for kind in totals}
    rows, total = worked_example_costs()
    assert len(rows) >= 5 and {usage for usage, _, _ in rows} <= set(totals.values())
    assert all(round(usage * price, 4) == cost for usage, price, cost in rows)
    assert round(sum(cost for _, _, cost in rows), 4) == total
    requests, searches, asked = quoted(
        r"used ([\d,]+) sampling requests .*? and ([\d,]+) DeepSeek searches, (\d+) of them", COSTS)
    assert (whole(requests), whole(searches), whole(asked)) == (
        totals["sample_requests"], totals["search_deepseek_calls"], totals["search_deepseek_requests"])

    questions, base, final = quoted(r"micro EM on the (\d+) offline dev questions goes from ([\d.]+) .*? to ([\d.]+)")
    (base_eval,) = [words for words in offline[0] if words[0] == "eval" and "--checkpoint" not in words]
    (final_eval,) = [words for words in offline[0] if words[0] == "eval" and "--checkpoint" in words]
    base_file, final_file = tmp_path / flag_value(base_eval, "--output"), tmp_path / flag_value(final_eval, "--output")
    assert (micro_em(base_file), micro_em(final_file)) == (float(base), float(final))
    records = [json.loads(line)["type"] for line in base_file.read_text("utf-8").splitlines()]
    assert records.count("trajectory") == int(questions)


@pytest.mark.parametrize("block", [block for block in BLOCKS if any(words[0] == "train" and "--offline" not in words
                                                                    for words in block)])
def test_the_live_block_runs_offline_in_a_fresh_folder(block, tmp_path, monkeypatch):
    assert left_out(run_block(block, tmp_path, monkeypatch)) == sorted(NEEDS_THE_NETWORK)
