"""The probe's filters: what is dropped and why, never a question that is not a training one, and
never anything eval reads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.core.types import SearchExample
from searchr1.evaluation.probe import PassRate, ProbedQuestion
from searchr1.training.filters import DropReason, apply_recorded_drops, drop_reason, filter_examples

ATTEMPTS = 8


def probed(question_id: str, closed: int, with_tools: int, text: str | None = None) -> ProbedQuestion:
    return ProbedQuestion(question_id, text or f"question {question_id}?", PassRate(closed, ATTEMPTS),
                          PassRate(with_tools, ATTEMPTS))


def example(question_id: str) -> SearchExample:
    return SearchExample(question_id, f"question {question_id}?", ("a",), "nq")


ids = st.lists(st.text("abcdefgh", min_size=1, max_size=3), unique=True, max_size=12)


@settings(max_examples=200, deadline=None)
@given(ids, ids, st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3),
                                 st.tuples(st.integers(0, ATTEMPTS), st.integers(0, ATTEMPTS)), max_size=16),
       st.integers(0, ATTEMPTS), st.booleans())
def test_filtering_only_ever_drops_training_questions_and_eval_sees_its_whole_set(train_ids, eval_ids, rates, k,
                                                                                  solved):
    """Whatever the probe holds (eval questions included), the filter splits the training examples
    into kept and dropped, in order, and names no other question; the eval set is untouched."""
    train = [example(i) for i in train_ids]
    evaluation = [example(i) for i in eval_ids]
    before = list(evaluation)
    probe = {i: probed(i, closed, tools) for i, (closed, tools) in rates.items()}
    filtered = filter_examples(train, probe, drop_guessable=k, drop_solved=solved)
    dropped = {i for group in filtered.dropped.values() for i in group}
    assert dropped <= set(train_ids)
    assert [e.id for e in filtered.kept] == [i for i in train_ids if i not in dropped]
    assert filtered.unprobed == sum(i not in probe for i in train_ids)
    assert evaluation == before
    assert apply_recorded_drops(train, filtered.dropped) == filtered.kept  # what a resumed run rebuilds
    for reason, group in filtered.dropped.items():
        for i in group:
            assert drop_reason(probe[i], drop_guessable=k, drop_solved=solved) == DropReason(reason)


def test_the_reasons_at_their_edges():
    assert drop_reason(probed("a", 1, 0), drop_guessable=1, drop_solved=False) == DropReason.GUESSABLE
    assert drop_reason(probed("a", 1, 0), drop_guessable=2, drop_solved=False) is None
    assert drop_reason(probed("a", 8, 8), drop_guessable=0, drop_solved=False) is None  # 0 is off
    assert drop_reason(probed("a", 0, 8), drop_guessable=1, drop_solved=True) == DropReason.SOLVED
    assert drop_reason(probed("a", 0, 7), drop_guessable=1, drop_solved=True) is None
    assert drop_reason(probed("a", 3, 8), drop_guessable=1, drop_solved=True) == DropReason.GUESSABLE  # first


def test_a_probe_of_another_dataset_is_refused():
    import pytest

    from searchr1.training.filters import ProbeMismatch

    with pytest.raises(ProbeMismatch, match="probe is of another dataset"):
        filter_examples([example("a")], {"a": probed("a", 0, 0, text="another question?")}, drop_guessable=1,
                        drop_solved=False)


def test_eval_has_no_flag_that_reads_a_probe():
    """Eval is never filtered: it reads no probe and has no filter flag."""
    from searchr1.commands.eval import eval_command

    names = {option for param in eval_command.params for option in getattr(param, "opts", [])}
    assert not names & {"--probe", "--drop-guessable", "--drop-solved", "--curriculum"}
