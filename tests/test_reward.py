"""Reward: exact values, the single-Answer-line rule and normalisation invariants."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.reward import extract_answer, normalize_answer, score_answer


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: France", "France"),
        ("answer:   France  ", "France"),
        ("Answer:\nFrance", "France"),
        ("Answer:\n\nfoo", "foo"),
        ("Answer:", None),
        ("Answer: \n", None),
        ("Answer: Paris\nAnswer: Lyon", None),
        ("Final Answer: X", None),
        ("The answer: X", None),
        ("**Answer:** X", None),
        ("Answer: X\nmore text", "X"),
        ("Some reasoning.\n  Answer: Bern  ", "Bern"),
        ("", None),
    ],
)
def test_extract_answer_seed_cases(text, expected):
    assert extract_answer(text) == expected


def test_reward_values_are_exact():
    assert score_answer("Answer: France", ["France"]).reward == 1.0
    assert score_answer("Answer: Spain", ["France"]).reward == 0.0
    assert score_answer("France", ["France"]).reward == -0.1
    result = score_answer("Answer: the  France!", ["france"])
    assert (result.valid_format, result.exact_match, result.answer) == (True, True, "the  France!")


def test_unicode_and_official_normalisation_differ_as_documented():
    # curly quotes are Unicode punctuation but not ASCII; "$" is ASCII punctuation but a symbol
    assert normalize_answer("“Ode”") == "ode"
    assert normalize_answer("“Ode”", normalization="official") == "“ode”"
    assert normalize_answer("$5") == "$5"
    assert normalize_answer("$5", normalization="official") == "5"
    with pytest.raises(ValueError, match="normalization"):
        normalize_answer("x", normalization="bogus")


texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
answer_words = st.text(alphabet=string.ascii_letters + string.digits + " .,'-“”", min_size=1, max_size=20)


@given(texts, st.lists(texts, max_size=4))
def test_score_is_always_one_of_three_values(text, refs):
    assert score_answer(text, refs).reward in (-0.1, 0.0, 1.0)


@given(texts, st.sampled_from(["unicode", "official"]))
def test_normalize_answer_is_idempotent(text, mode):
    once = normalize_answer(text, normalization=mode)
    assert normalize_answer(once, normalization=mode) == once


@given(answer_words, st.lists(answer_words, min_size=1, max_size=5), st.randoms())
def test_exact_match_ignores_order_and_duplication_of_references(answer, refs, rnd):
    shuffled = refs + refs[: rnd.randint(0, len(refs))]
    rnd.shuffle(shuffled)
    text = f"Answer: {answer}"
    assert score_answer(text, refs).exact_match == score_answer(text, shuffled).exact_match


@given(answer_words.filter(lambda s: s.strip()))
def test_an_answer_always_matches_itself(answer):
    assert score_answer(f"Answer: {answer}", [answer.strip()]).reward == 1.0


@given(st.lists(answer_words.filter(lambda s: s.strip()), min_size=2, max_size=4))
def test_more_than_one_answer_line_is_a_format_failure(answers):
    text = "\n".join(f"Answer: {a}" for a in answers)
    assert score_answer(text, answers).reward == -0.1


@given(st.text(alphabet=string.ascii_letters + " \n", max_size=60).filter(lambda s: "answer:" not in s.lower()))
def test_text_without_an_answer_line_is_a_format_failure(text):
    assert score_answer(text, ["x"]).valid_format is False
