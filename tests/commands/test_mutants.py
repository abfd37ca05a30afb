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


from hypothesis import given, strategies as st

from searchr1.commands.mutants import explained_survivors

MUTANT_NAMES = st.from_regex(r"searchr1\.core\.[a-z_]{1,12}\.x_[a-z_]{1,20}__mutmut_[1-9][0-9]{0,2}", fullmatch=True)
REASONS = st.text(st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="|`"), min_size=1,
                  max_size=80).map(str.strip).filter(bool)


@given(st.dictionaries(MUTANT_NAMES, REASONS, max_size=8), st.lists(st.text(max_size=40), max_size=4))
def test_every_row_of_the_survivor_table_is_read_back_and_nothing_else(rows, prose):
    """docs/mutants.md's table rows are read back exactly; text around them adds nothing."""
    table = ["| mutant | why it is left |", "|---|---|", *[f"| `{name}` | {why} |" for name, why in rows.items()]]
    text = "\n".join([*[line for line in prose if "__mutmut_" not in line], *table, "", "after the table"])
    assert explained_survivors(text) == rows
