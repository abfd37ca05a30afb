"""Reward: exact values, the single-Answer-line rule and normalisation invariants."""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.core.reward import REWARD_KINDS, extract_answer, normalize_answer, score_answer
from searchr1.core.types import FORMAT_PENALTY


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
def test_extract_answer_lab_port_cases(text, expected):
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


# --- F1 and cover EM ------------------------------------------------------------------------

words = st.lists(st.sampled_from(["paris", "france", "city", "of", "light", "x"]), min_size=1, max_size=5)


@given(words, st.lists(words, min_size=1, max_size=3))
def test_f1_is_between_zero_and_one_and_one_exactly_for_the_same_tokens_and_cover_em_is_at_least_em(
        answer, golds):
    text = "Answer: " + " ".join(answer)
    references = [" ".join(g) for g in golds]
    em = score_answer(text, references, reward="em")
    f1 = score_answer(text, references, reward="f1")
    cover = score_answer(text, references, reward="cover_em")
    assert 0.0 <= f1.reward <= 1.0 and f1.f1 == f1.reward == em.f1
    same_tokens = any(sorted(normalize_answer(" ".join(answer)).split()) == sorted(normalize_answer(r).split())
                      for r in references)
    assert (f1.reward == 1.0) == same_tokens and em.exact_match <= same_tokens  # F1 ignores word order
    assert cover.cover_em >= em.exact_match and cover.reward == float(cover.cover_em)


def test_f1_counts_tokens_with_multiplicity_and_takes_the_best_reference():
    result = score_answer("Answer: the city of light", ["Paris", "City of Light, Paris"], reward="f1")
    # "city of light" vs "city of light paris": precision 1, recall 3/4
    assert result.reward == pytest.approx(2 * 1 * 0.75 / 1.75)
    assert score_answer("Answer: x x", ["x"], reward="f1").reward == pytest.approx(2 * 0.5 / 1.5)


def _search_r1_normalize(s: str) -> str:
    """Search-R1's normalize_answer (verl/utils/reward_score/qa_em.py), restated."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _search_r1_subem(prediction: str, golden_answers: list[str]) -> int:
    """Search-R1's subem_check, restated: a normalised gold answer inside the normalised prediction."""
    return int(any(_search_r1_normalize(g) in _search_r1_normalize(prediction) for g in golden_answers))


def _search_r1_em(prediction: str, golden_answers: list[str]) -> int:
    return int(any(_search_r1_normalize(g) == _search_r1_normalize(prediction) for g in golden_answers))


pieces = st.sampled_from(["paris", "Paris", "parisian", "1", "1990", "in", "the", "a", "an", "The", ",", ".", "-",
                          "'s", "x", "france", "’"])
phrases = st.lists(pieces, min_size=1, max_size=5).map(" ".join)


@given(phrases, st.lists(phrases, min_size=1, max_size=3))
def test_cover_em_is_search_r1s_subem_and_em_its_em_check_under_the_official_normalisation(answer, golds):
    """Invariant: with normalization="official", cover EM equals Search-R1's subem_check and EM its
    em_check, on answers and gold answers full of articles, punctuation and word fragments."""
    result = score_answer("Answer: " + answer, golds, normalization="official")
    assert result.valid_format
    assert result.cover_em == bool(_search_r1_subem(answer, golds))
    assert result.exact_match == bool(_search_r1_em(answer, golds))


def test_cover_em_is_a_substring_match_as_search_r1_scores_it():
    assert score_answer("Answer: it was Paris, France", ["Paris"], reward="cover_em").reward == 1.0
    assert score_answer("Answer: Parisian", ["Paris"], reward="cover_em").reward == 1.0
    assert score_answer("Answer: in 1990", ["1"], reward="cover_em").reward == 1.0
    assert score_answer("Answer: Lyon", ["Paris"], reward="cover_em").reward == 0.0


@given(phrases, st.lists(phrases, min_size=1, max_size=3))
def test_an_exact_match_is_also_a_perfect_f1_and_a_cover_even_when_both_normalise_to_nothing(answer, golds):
    """Invariant: EM 1 implies F1 1 and cover EM 1, including answers and references that
    normalise to the empty string."""
    result = score_answer("Answer: " + answer, golds)
    if result.exact_match:
        assert result.f1 == 1.0 and result.cover_em


def test_the_empty_after_normalisation_case_is_a_match_in_all_three_scores():
    both_empty = score_answer("Answer: The", ["a"])
    assert (both_empty.exact_match, both_empty.f1, both_empty.cover_em) == (True, 1.0, True)
    empty_answer = score_answer("Answer: The", ["Paris"])
    assert (empty_answer.exact_match, empty_answer.f1, empty_answer.cover_em) == (False, 0.0, False)
    empty_reference = score_answer("Answer: Paris", ["the"])  # as Search-R1: "" is in every answer
    assert (empty_reference.exact_match, empty_reference.f1, empty_reference.cover_em) == (False, 0.0, True)


@pytest.mark.parametrize("kind", REWARD_KINDS)
def test_a_format_failure_is_the_penalty_whatever_the_reward(kind):
    assert score_answer("no answer line", ["Paris"], reward=kind).reward == FORMAT_PENALTY


def test_a_reply_without_an_answer_line_scores_exactly_the_format_penalty_and_matches_nothing():
    from searchr1.core.types import NOT_ANSWERED

    assert score_answer("I think it is Paris.", ["Paris"]) == NOT_ANSWERED
    assert (NOT_ANSWERED.reward, NOT_ANSWERED.valid_format, NOT_ANSWERED.exact_match) == (FORMAT_PENALTY, False, False)


def test_an_unknown_reward_is_refused_naming_it_and_the_choices():
    with pytest.raises(ValueError, match=r"unknown reward 'bleu'; choose one of \('em', 'f1', 'cover_em'\)"):
        score_answer("Answer: x", ["x"], reward="bleu")


def test_the_normalisation_asked_for_is_the_one_applied_to_answer_and_references():
    """An en dash is Unicode punctuation, not ASCII: the default (unicode) rule drops it, the
    official rule keeps it."""
    assert score_answer("Answer: 1990\u20131995", ["19901995"]).exact_match is True
    assert score_answer("Answer: 1990\u20131995", ["19901995"], normalization="official").exact_match is False
    assert score_answer("Answer: 1990\u20131995", ["1990\u20131995!"], normalization="official").exact_match is True


def test_an_answer_with_no_reference_scores_zero_on_every_measure():
    for reward in REWARD_KINDS:
        result = score_answer("Answer: Paris", [], reward=reward)
        assert (result.reward, result.exact_match, result.f1, result.cover_em) == (0.0, False, 0.0, False)


def test_every_trajectory_after_a_sampler_failure_is_still_scored():
    from training_strategies import plain_trajectory
    from searchr1.core.reward import score_trajectories
    from searchr1.core.types import Termination, Trajectory

    failed = Trajectory(plain_trajectory(0, 0, 0.0).example, 0, 0, [])
    failed.finish(Termination.SAMPLER_ERROR)
    answered = Trajectory(plain_trajectory(0, 1, 0.0).example, 0, 1, [])
    answered.finish(Termination.ANSWER, "Answer: " + answered.example.answers[0])
    score_trajectories([failed, answered])
    assert failed.reward_result is None and answered.reward_result.exact_match is True
