"""Every usage counter adds up through one mechanism, :class:`searchr1.core.types.Counts`: for any
two counts of one class, ``a.add(b)`` holds the field-wise sums (tables summed key by key), and
what is serialized keeps its field names."""

from __future__ import annotations

import copy
from dataclasses import asdict, fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.core.types import Counts, ReportedUsage
from searchr1.run.usage import JudgeUsage, SearchUsage, ToolUsage, Usage
from searchr1.twin.served import ServedUsage

NUMBER = st.integers(0, 10**12)
FLAT = (ReportedUsage, SearchUsage, ToolUsage, JudgeUsage, ServedUsage)


def flat(cls: type) -> st.SearchStrategy:
    return st.builds(cls, **{f.name: NUMBER for f in fields(cls)})


def tables(cls: type) -> st.SearchStrategy:
    return st.dictionaries(st.sampled_from(["deepseek", "zhihu", "local", "open_page"]), flat(cls), max_size=3)


USAGE = st.builds(Usage, **{f.name: NUMBER for f in fields(Usage) if f.name not in ("search", "tools", "judge")},
                  search=tables(SearchUsage), tools=tables(ToolUsage), judge=tables(JudgeUsage))


def summed(a: dict, b: dict) -> dict:
    """Field-wise sums of two ``asdict`` forms, nested tables key by key (absent: zero)."""
    out = {}
    for name in a.keys() | b.keys():
        x, y = a.get(name), b.get(name)
        if isinstance(x if x is not None else y, dict):
            out[name] = summed(x or {}, y or {})
        else:
            out[name] = (x or 0) + (y or 0)
    return out


@pytest.mark.parametrize("cls", [*FLAT, Usage])
def test_every_usage_counter_is_a_counts(cls):
    assert issubclass(cls, Counts)


@given(st.one_of(*(st.tuples(flat(cls), flat(cls)) for cls in FLAT), st.tuples(USAGE, USAGE)))
def test_adding_two_counts_gives_the_field_wise_sums_of_every_field(pair):
    a, b = pair
    before_a, before_b = asdict(a), asdict(b)
    kept_b = copy.deepcopy(b)
    a.add(b)
    assert asdict(a) == summed(before_a, before_b)
    assert b == kept_b  # the added one is left as it was


def test_serialized_names_stay_those_users_have():
    assert [f.name for f in fields(ReportedUsage)] == ["input_tokens", "cache_read_input_tokens", "output_tokens",
                                                       "web_search_requests"]
    assert list(ServedUsage().to_json()) == [
        "sample_requests", "sample_prompt_tokens", "sample_generated_tokens", "kl_requests", "kl_prompt_tokens",
        "kl_generated_tokens", "train_tokens", "forward_backward_events", "optim_steps", "weight_saves",
        "state_saves"]
    usage = Usage(sample_requests=1)
    usage.add(Usage(search={"deepseek": SearchUsage(calls=2)}, tools={"open_page": ToolUsage(units=3)}))
    kinds = usage.kinds()
    assert kinds["sample_requests"] == 1 and kinds["search_deepseek_calls"] == 2 and kinds["tool_open_page_pages"] == 3
