"""The HTML page's index of wrong answers and its score summary (pure: records in, markup out)."""

from __future__ import annotations

import html.parser

from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.evaluation.intervals import FEW_QUESTIONS
from searchr1.evaluation.metrics import evaluation_metrics
from searchr1.view.html import transcript_page
from searchr1.view.html_scores import scores_section

HOSTILE = '<script>alert(1)</script><a href="http://127.0.0.1:9/">x</a>'


class Elements(html.parser.HTMLParser):
    """Every start tag with its attributes, in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))


def elements(page: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = Elements()
    parser.feed(page)
    parser.close()
    return parser.elements


def record(index: int, source: str, right: bool, well_formed: bool) -> dict:
    return {"type": "trajectory", "id": f"{source}/{index}", "question": f"question {index}?", "answers": ["a"],
            "data_source": source, "turns": [{"text": "Answer: a", "stop_reason": "stop"}], "searches": [],
            "final_text": "Answer: a", "termination": "answer", "reward": 1.0 if right else 0.0,
            "exact_match": right, "valid_format": well_formed, "search_calls": 0, "assistant_turns": 1,
            "env_error": False}


OUTCOMES = st.lists(st.tuples(st.sampled_from(["nq", "popqa"]), st.booleans(), st.booleans()), min_size=1,
                    max_size=25)


@settings(max_examples=60, deadline=None)
@given(OUTCOMES, st.integers(1, 3))
def test_the_index_links_every_wrong_answer_and_only_those_to_its_own_article(outcomes, parts):
    """Invariant: the index's links are exactly the articles whose answer is not correct (wrong
    or badly formed), each to an id that one article on the page carries, in page order."""
    records = [record(i, source, right, well_formed) for i, (source, right, well_formed) in enumerate(outcomes)]
    size = -(-len(records) // parts)
    sections = [(f"step {k}", records[k * size:(k + 1) * size]) for k in range(parts)]
    page = transcript_page(sections, heading="t")
    found = elements(page)
    articles = [(attrs["id"], attrs["class"]) for tag, attrs in found if tag == "article"]
    assert len(articles) == len(records) and len({i for i, _ in articles}) == len(records)
    links = [attrs["href"] for tag, attrs in found if tag == "a"]
    assert links == [f"#{i}" for i, kind in articles if kind != "correct"]
    wrong = sum(1 for _, right, _ in outcomes if not right)
    assert f"Wrong answers ({wrong} of {len(records)})" in page if wrong else "none: every answer" in page


def test_a_hostile_source_name_or_question_stays_text_in_the_index_and_the_summary():
    records = [{**record(0, HOSTILE, False, True), "question": HOSTILE}, record(1, "nq", True, True)]
    page = transcript_page([(None, records)], heading="t", scores=scores_section(evaluation_metrics(records),
                                                                                 caption=HOSTILE))
    found = elements(page)
    assert "script" not in {tag for tag, _ in found}
    assert all(attrs["href"].startswith("#t-") for tag, attrs in found if tag == "a")


def test_the_summary_shows_each_score_with_its_interval_and_marks_small_sources():
    """Five right of ten in nq, one of one in popqa: the macro row holds the number of
    questions and the macro EM with its interval; popqa (under the threshold) is marked and the
    footnote names the threshold; nq, at it, is not."""
    records = ([record(i, "nq", i < 5, True) for i in range(FEW_QUESTIONS)]
               + [record(99, "popqa", True, True)])
    metrics = evaluation_metrics(records)
    section = scores_section(metrics, caption="all questions")
    macro = section.split('<th scope="row">macro</th>', 1)[1].split("</tr>", 1)[0]
    assert f"<td>{FEW_QUESTIONS + 1}</td>" in macro
    assert (f"<td>{metrics['em/macro']:.3f} <span class=\"ci\">[{metrics['em/macro_ci95_low']:.3f}, "
            f"{metrics['em/macro_ci95_high']:.3f}]</span></td>") in macro
    assert metrics["em/macro"] == 0.75  # (5/10 + 1/1) / 2
    assert '<th scope="row">popqa*</th>' in section and '<th scope="row">nq</th>' in section
    assert f"fewer than {FEW_QUESTIONS} questions" in section
