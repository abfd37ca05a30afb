"""``show`` and the HTML page put every tool call after the turn that made it, under its tool's
name, whatever the record says about its turn."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from searchr1.view.html import transcript_page
from searchr1.view.terminal import SearchEvent, TurnEvent, conversation


def call(query: str, tool: str = "search", turn: int | None = None, **more) -> dict:
    record = {"query": query, "ok": True, "observation": f"read {query}", "items": 1, "tool": tool, **more}
    return record if turn is None else {**record, "turn": turn}


RECORD = {
    "id": "q", "question": "Q?", "turns": [{"text": "two calls"}, {"text": "a bad call"}, {"text": "Answer: x"}],
    "searches": [call("Seine"), call("page=Seine", "open_page", 1),
                 call("open_page", "open_page", 2, ok=False, refused=True, error="open_page needs the parameter page")],
}
RECORD["searches"][0]["turn"] = 1


def test_calls_of_one_turn_follow_it_in_order_under_their_tools_names():
    events = conversation(RECORD)
    assert [(type(e).__name__, e.number) for e in events] == [
        ("TurnEvent", 1), ("SearchEvent", 1), ("SearchEvent", 2), ("TurnEvent", 2), ("SearchEvent", 3), ("TurnEvent", 3)]
    calls = [e for e in events if isinstance(e, SearchEvent)]
    assert [(c.tool, c.status) for c in calls] == [("search", "1 item"), ("open_page", "1 item"), ("open_page", "refused")]
    page = transcript_page([(None, [RECORD])], heading="run")
    assert "open_page 2: " in page and "search 1: " in page


def test_a_record_written_before_calls_named_their_turn_pairs_the_ith_call_with_the_ith_turn():
    old = {"turns": [{"text": "a"}, {"text": "b"}], "searches": [{"query": "x", "ok": True}]}
    assert [type(e) for e in conversation(old)] == [TurnEvent, SearchEvent, TurnEvent]


@given(st.lists(st.integers(-2**63, 2**63) | st.none() | st.text(max_size=3), max_size=5), st.integers(0, 4))
def test_any_turn_a_record_names_keeps_every_call_once_and_every_turn_in_order(turns_named, turn_count):
    record = {"turns": [{"text": str(i)} for i in range(turn_count)],
              "searches": [{"query": str(i), "turn": t} for i, t in enumerate(turns_named)]}
    events = conversation(record)
    assert sorted(e.number for e in events if isinstance(e, SearchEvent)) == list(range(1, len(turns_named) + 1))
    assert [e.number for e in events if isinstance(e, TurnEvent)] == list(range(1, turn_count + 1))


def test_a_turn_credited_on_its_own_shows_its_advantage_step_group_and_step_reward_beside_it():
    credited = {**RECORD, "turns": [{"text": "two calls", "advantage": 0.25, "step_group": 4, "step_reward": -0.1},
                                    {"text": "a bad call", "advantage": -0.5, "step_group": 1, "step_reward": 0.0},
                                    {"text": "Answer: x", "advantage": 0.75}]}
    turns = [e for e in conversation(credited) if isinstance(e, TurnEvent)]
    assert [t.credit for t in turns] == ["advantage +0.250 · step group of 4 · step reward -0.100",
                                         "advantage -0.500 · step group of 1 · step reward +0.000", ""]
    page = transcript_page([(None, [credited])], heading="run")
    assert page.count('<span class="credit">') == 2 and "step group of 4" in page
    assert not any(e.credit for e in conversation(RECORD) if isinstance(e, TurnEvent))  # trajectory credit: none
    assert '<span class="credit">' not in transcript_page([(None, [RECORD])], heading="run")
