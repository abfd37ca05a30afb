"""``mutants``: refuses outside a checkout, counts a timeout as killed and a mutant no test reaches as\nnot killed."""

from __future__ import annotations

from click.testing import CliRunner

from searchr1.cli import main
from searchr1.commands.mutants import MutationStats


def test_outside_a_checkout_it_says_where_to_run_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["mutants"])
    assert result.exit_code == 2 and "from a checkout of searchr1" in result.output
    assert not (tmp_path / "mutants").exists()


def test_the_kill_rate_counts_timeouts_as_killed_and_untested_mutants_as_not_killed():
    stats = MutationStats(killed=80, survived=10, timeout=10, no_tests=50, total=150)
    assert stats.tested == 100 and stats.kill_rate == 90 / 150
    assert MutationStats(0, 0, 0, 0, 0).kill_rate == 0.0
