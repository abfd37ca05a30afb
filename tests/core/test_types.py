"""The core's data types that carry arithmetic or rules of their own."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.core.settings import SettingError
from searchr1.core.budgets import RolloutBudgets
from searchr1.core.types import ReportedUsage

COUNTS = st.integers(0, 10**9)
USAGES = st.builds(ReportedUsage, COUNTS, COUNTS, COUNTS, COUNTS)


@given(st.lists(USAGES, max_size=6))
def test_usage_added_call_by_call_is_the_sum_of_each_count(usages):
    total = ReportedUsage()
    for usage in usages:
        total.add(usage)
    assert total == ReportedUsage(sum(u.input_tokens for u in usages), sum(u.cache_read_input_tokens for u in usages),
                                  sum(u.output_tokens for u in usages), sum(u.web_search_requests for u in usages))


def test_budgets_on_their_own_hold_their_rules():
    """The budgets part is checked when made alone too (the reference takes only it)."""
    assert RolloutBudgets(group_size=2).group_size == 2
    with pytest.raises(SettingError, match="^--group-size must be >= 1, got 0$"):
        RolloutBudgets(group_size=0)


def test_the_whole_observation_text_is_the_items_as_the_reference_numbers_and_joins_them():
    """:func:`format_observation` against the reference loop's own rendering of a result."""
    from searchr1.core.observation.text import format_observation
    from searchr1.core.reference_text import observation_items
    from searchr1.core.types import SearchItem, SearchResult

    items = (SearchItem("Paris", "Capital of France."), SearchItem("Lyon", "A city.", "Wikipedia", "https://w/Lyon"))
    for result in (SearchResult(True, items), SearchResult(True, ()), SearchResult(False, (), error="HTTP 503")):
        assert format_observation(result) == "\n\n".join(observation_items(result))


def test_a_mutants_process_starts_with_every_core_cache_empty(tokenizer):
    """mutmut forks each mutant's process from one that ran the clean tests: the per-tokenizer
    caches of the core are emptied there, so the mutated code that fills them runs."""
    from mutation_support import core_caches, forget_core_caches
    from searchr1.core import protocol
    from searchr1.core.observation import piecewise, tokens
    from searchr1.core.observation.piecewise import JoinedObservation

    JoinedObservation(tokenizer, ["alpha beta", "gamma"]).observation_tokens(2)  # fills them all
    known = [protocol._BOUNDARIES, tokens._WRAPPERS, tokens._PLAIN_ENCODERS, piecewise._SUPPORTED]
    found = list(core_caches())
    assert all(any(cache is other for other in found) for cache in known) and all(len(cache) for cache in known)
    forget_core_caches()
    assert not any(len(cache) for cache in known)
