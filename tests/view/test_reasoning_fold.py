"""A turn that reasoned (``--thinking``) shows its reasoning folded: ``show`` prints one line for it
unless ``--full``, the HTML page a closed ``<details>``; what the turn said is shown as before."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from searchr1.view.html import transcript_page
from searchr1.view.terminal import TurnEvent, conversation, print_transcripts, turn_event

REASONING = "I have 0 of the 2 facts this question needs. I look for the next one."
RECORD = {"id": "q", "question": "Q?", "answers": ["x"],
          "turns": [{"text": f"{REASONING}\n</think>\n\nAnswer: x"}, ], "searches": []}


@given(st.text(max_size=40).filter(lambda s: "</think>" not in s), st.text(max_size=40))
def test_a_turn_is_its_reasoning_and_what_it_said(reasoning, said):
    with_reasoning = turn_event(1, f"{reasoning}</think>{said}", "stop")
    assert with_reasoning.reasoning == reasoning.strip() and with_reasoning.text == said.lstrip("\n")
    assert turn_event(1, reasoning, "stop") == TurnEvent(1, reasoning, "stop")  # no </think>: no reasoning


def _shown(full: bool) -> str:
    out = io.StringIO()
    print_transcripts(Console(file=out, width=200, color_system=None), [RECORD], full=full)
    return out.getvalue()


def test_show_folds_the_reasoning_to_one_line_unless_full():
    (event,) = conversation(RECORD)
    assert event.text == "Answer: x"
    folded, full = _shown(False), _shown(True)
    assert "reasoning: 16 words (--full shows it)" in folded and REASONING not in folded and "</think>" not in folded
    assert REASONING in full and "Answer: x" in folded and "Answer: x" in full


def test_the_html_page_folds_the_reasoning_into_a_closed_details():
    page = transcript_page([(None, [RECORD])], heading="t")
    start = page.index('<details class="reasoning">')
    assert REASONING in page[start:page.index("</details>", start)] and "</think>" not in page


FOLDED = {"id": "f", "question": "Q?", "answers": ["x"], "searches": [],
          "turns": [{"text": "one"}, {"text": "two", "context": 0}, {"text": "three", "context": 1},
                    {"text": "Answer: x", "context": 1}]}


def test_show_and_the_page_mark_where_a_context_folded_once_per_fold():
    from searchr1.view.terminal import FOLD_MARK

    assert [event.folded for event in conversation(FOLDED)] == [False, False, True, False]
    out = io.StringIO()
    print_transcripts(Console(file=out, width=200, color_system=None), [FOLDED])
    shown = out.getvalue()
    assert shown.count(FOLD_MARK) == 1 and shown.index(FOLD_MARK) < shown.index("assistant 3")
    page = transcript_page([(None, [FOLDED])], heading="t")
    assert page.count('<div class="fold">') == 1
