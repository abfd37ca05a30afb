"""``mutants``: refuses outside a checkout, counts a timeout as killed and a mutant no test reaches as
not killed, reads the survivor table back, and says where a long run is from mutmut's status line."""

from __future__ import annotations

import io
import os
import sys
import threading

import pytest
from click.testing import CliRunner
from hypothesis import given, strategies as st

from searchr1.cli import main
from searchr1.commands.mutants import (MutationStats, MutmutProgress, explained_survivors, follow_progress,
                                       last_progress)


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
