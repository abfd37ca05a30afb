"""``mutants``: refuses outside a checkout, counts a timeout as killed and a mutant no test reaches as
not killed, reads the survivor table back, and says where a long run is from mutmut's status line."""

from __future__ import annotations

import io
import os
import sys
import threading
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from hypothesis import given, strategies as st

from searchr1.cli import main
from searchr1.commands.mutants import (MutationStats, MutmutProgress, explained_survivors, follow_progress,
                                       last_progress, mutant_statuses)


def test_outside_a_checkout_it_says_where_to_run_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["mutants"])
    assert result.exit_code == 2 and "from a checkout of searchr1" in result.output
    assert not (tmp_path / "mutants").exists()


def test_the_kill_rate_counts_timeouts_as_killed_and_untested_mutants_as_not_killed():
    stats = MutationStats(killed=80, survived=10, timeout=10, no_tests=50, total=150)
    assert stats.tested == 100 and stats.kill_rate == 90 / 150
    assert MutationStats(0, 0, 0, 0, 0).kill_rate == 0.0


MUTANT_NAMES = st.from_regex(r"searchr1\.core\.[a-z_]{1,12}\.x_[a-z_]{1,20}__mutmut_[1-9][0-9]{0,2}", fullmatch=True)
REASONS = st.text(st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="|`"), min_size=1,
                  max_size=80).map(str.strip).filter(bool)


@given(st.dictionaries(MUTANT_NAMES, REASONS, max_size=8), st.lists(st.text(max_size=40), max_size=4))
def test_every_row_of_the_survivor_table_is_read_back_and_nothing_else(rows, prose):
    """docs/mutants.md's table rows are read back exactly; text around them adds nothing."""
    table = ["| mutant | why it is left |", "|---|---|", *[f"| `{name}` | {why} |" for name, why in rows.items()]]
    text = "\n".join([*[line for line in prose if "__mutmut_" not in line], *table, "", "after the table"])
    assert explained_survivors(text) == rows


COUNTS = st.integers(0, 10**6)


def mutmut_status(tested, total, killed, survived, other):
    """A status line exactly as mutmut 3.8's ``print_stats`` writes it (mutmut/stats.py and
    mutmut/ui/terminal.py): a spinner, the counts, padding, rewritten in place with ``\\r``."""
    no_tests, timeout, suspicious, skipped, typed = other
    return (f"\r⠙ {tested}/{total}  🎉 {killed} 🫥 {no_tests}  ⏰ {timeout}  🤔 {suspicious}  🙁 {survived}  "
            f"🔇 {skipped}  🧙 {typed}   ")


@given(st.lists(st.tuples(COUNTS, COUNTS, COUNTS, COUNTS, st.tuples(*[COUNTS] * 5)), min_size=1, max_size=5),
       st.text(max_size=60).filter(lambda text: "/" not in text))
def test_the_last_status_line_mutmut_wrote_is_where_the_run_is(lines, noise):
    text = noise + "".join(mutmut_status(*line) for line in lines)
    tested, total, _, survived, _ = lines[-1]
    assert last_progress(text) == MutmutProgress(tested, total, survived)
    assert last_progress(noise) is None


def test_mutmuts_own_status_line_is_read(monkeypatch):
    """The line mutmut's own printer writes, when mutmut is installed (the mutation extra)."""
    stats = pytest.importorskip("mutmut.stats")
    out = io.StringIO()
    monkeypatch.setattr(sys, "__stdout__", out)
    monkeypatch.setattr(stats, "calculate_summary_stats", lambda _: stats.Stat(
        not_checked=1000, killed=2300, survived=89, total=3646, no_tests=3, skipped=0, suspicious=0, timeout=7,
        check_was_interrupted_by_user=0, segfault=0, caught_by_type_check=1500))
    stats.print_stats({}, force_output=True)
    assert last_progress(out.getvalue()) == MutmutProgress(tested=2646, total=3646, survived=89)


@pytest.mark.parametrize("every", [0.0, 3600.0])
def test_progress_is_said_at_most_every_so_often_and_reads_to_the_end(every, capsys):
    """Chunks split anywhere, even inside a character, are read to the end of the output."""
    read, write = os.pipe()
    text = "Running mutation testing\n" + "".join(mutmut_status(n, 50, n, n // 10, (0,) * 5) for n in range(51))
    data = text.encode("utf-8")

    def writer():
        with os.fdopen(write, "wb", buffering=0) as pipe:
            for start in range(0, len(data), 7):
                pipe.write(data[start:start + 7])

    thread = threading.Thread(target=writer)
    thread.start()
    with os.fdopen(read, "rb", buffering=0) as pipe:
        follow_progress(pipe, started=0.0, every=every)
    thread.join()
    said = [line for line in capsys.readouterr().err.splitlines() if line]
    if every:
        assert said == []
    else:
        assert said and said[-1].startswith("mutmut: 50 of 50 mutants tested, 5 survived so far")
        assert len(said) == len(set(said)) <= 51


STATUSES = ["killed", "caught by type check", "survived", "no tests", "timeout", "not checked", "suspicious",
            "skipped", "segfault", "check was interrupted by user"]  # mutmut/stats.py, status_by_exit_code


def mutmut_statuses():
    """mutmut's own status words where mutmut is installed, else the list above (copied from it)."""
    try:
        from mutmut.stats import status_by_exit_code
    except ImportError:
        return STATUSES
    return sorted(set(status_by_exit_code.values()) | {status_by_exit_code.default_factory()})


@given(st.dictionaries(st.from_regex(r"searchr1\.core\.[a-z]{1,8}\.x_[a-z_]{1,12}__mutmut_[1-9]\d{0,2}",
                                     fullmatch=True), st.sampled_from(mutmut_statuses()), max_size=30))
def test_every_mutant_of_mutmuts_listing_is_counted_once_and_an_untested_one_is_never_killed(statuses):
    listing = "".join(f"    {name}: {status}\n" for name, status in statuses.items())
    assert mutant_statuses("Listing\n" + listing) == statuses
    stats = MutationStats.of(statuses)
    assert stats.total == len(statuses)
    assert stats.killed + stats.timeout == sum(s in ("killed", "caught by type check", "timeout")
                                                 for s in statuses.values())
    assert stats.finished == ("not checked" not in statuses.values())
    assert 0.0 <= stats.kill_rate <= 1.0 and stats.tested <= stats.total


def test_a_run_that_stopped_early_is_not_reported_as_a_kill_rate(tmp_path, monkeypatch):
    """mutmut exits 0 after a Ctrl-C; the mutants it did not reach make the run unfinished."""
    import searchr1.commands.mutants as command

    (tmp_path / "pyproject.toml").write_text("[tool.mutmut]\n", "utf-8")
    monkeypatch.chdir(tmp_path)
    listing = "    a.x_f__mutmut_1: killed\n    a.x_f__mutmut_2: survived\n    a.x_f__mutmut_3: not checked\n"

    def mutmut(*args, check=True):
        return SimpleNamespace(returncode=0, stdout=listing if args[0] == "results" else "", stderr="")

    class StoppedRun:
        def __init__(self, *args, stdout, **kwargs):
            self.stdout = open(os.devnull, "rb")

        def wait(self):
            return 0

    monkeypatch.setattr(command, "_mutmut", mutmut)
    monkeypatch.setattr(command.subprocess, "Popen", StoppedRun)
    result = CliRunner().invoke(main, ["mutants", "--jobs", "1"])
    assert result.exit_code == 1
    assert "the run stopped with 1 of 3 mutants not tested yet (run `" in result.output
    assert " mutants` again to go on)" in result.output and "meets" not in result.output
    assert "1 not tested yet: the run stopped." in (tmp_path / "mutants-report.md").read_text("utf-8")
