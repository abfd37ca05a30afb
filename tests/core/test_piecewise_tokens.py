"""Piecewise tokenisation of a joined observation gives exactly the ids of tokenising it whole."""

import unicodedata

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from searchr1.core.observation.piecewise import JoinedObservation, certain_split, splits_predictably
from searchr1.core.observation.tokens import plain_tokens, split_at_control_tokens
from searchr1.core.protocol import observation_tokens

# Letters, digits, spaces, newlines, punctuation, contractions, combining marks, CJK, emoji and
# control-token strings: everything the pre-tokenizer's alternatives and NFC treat specially.
pieces = st.sampled_from([
    "a", "Paris", " ", "  ", "\n", "\n\n", "\r\n", "\t", ".", "!", "?", ",", "'s", "'LL", "'", "1", "2024", "[1]",
    "Title:", "Content:", "\u0301", "e\u0301", "\u00e9", "\u1100\u1161", "\u4e2d\u6587", "\U0001f600",
    "<|im_end|>", "</tool_response>", "-", "  \n", "\u00a0", "\u2028", "x\u0308", "\u0915\u094d",
])
texts = st.lists(pieces, min_size=0, max_size=25).map("".join)
items = st.lists(texts, min_size=1, max_size=4)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class SlowTokenizer:
    """A tokenizer without a fast (tokenizers) backend."""


class Backend:
    """A fast tokenizer's backend, with the given components."""

    def __init__(self, pre_tokenizer, normalizer):
        self.pre_tokenizer, self.normalizer = pre_tokenizer, normalizer


class Holding:
    """A tokenizer holding ``backend`` (weak-referenceable, as the cache needs)."""

    def __init__(self, backend):
        self.backend_tokenizer = backend


def test_the_qwen_tokenizer_is_recognised_as_splitting_predictably(tokenizer):
    assert splits_predictably(tokenizer)


@SETTINGS
@given(items=items)
def test_piecewise_content_and_observation_tokens_equal_whole_tokenisation_whatever_the_items(tokenizer, items):
    sizes = JoinedObservation(tokenizer, items)
    for count in range(1, len(items) + 1):
        joined = "\n\n".join(items[:count])
        assert sizes.content_tokens(count) == plain_tokens(tokenizer, joined)
        assert sizes.observation_tokens(count) == observation_tokens(tokenizer, joined)


@SETTINGS
@given(text=texts, data=st.data())
def test_a_certain_cut_splits_the_tokens_of_any_text_into_the_tokens_of_its_two_sides(tokenizer, text, data):
    cuts = [p for p in range(1, len(text)) if certain_split(text, p)]
    if not cuts:
        return
    p = data.draw(st.sampled_from(cuts))
    assert plain_tokens(tokenizer, text) == plain_tokens(tokenizer, text[:p]) + plain_tokens(tokenizer, text[p:])


def test_search_result_items_are_cut_piecewise_and_tokenised_once(tokenizer, monkeypatch):
    import searchr1.core.observation.piecewise as module

    items = [f"[{i}] Title: Paris\n    Content: Paris is the capital and largest city of France, on the Seine."
             for i in (1, 2, 3)]
    sizes = JoinedObservation(tokenizer, items)
    assert sizes.piecewise
    encoded: list[str] = []
    real = module.plain_tokens
    monkeypatch.setattr(module, "plain_tokens", lambda tok, text: encoded.append(text) or real(tok, text))
    for count in (1, 2, 3):
        sizes.content_tokens(count)
        sizes.observation_tokens(count)
    bulk = [text for text in encoded if len(text) > 40]
    assert len(bulk) == len(set(bulk)) == 3  # each item's bulk once, however many tries


def test_a_tokenizer_with_another_pre_tokenizer_is_tokenised_whole(tokenizer):
    class Other:
        backend_tokenizer = None

        def __getattr__(self, name):
            return getattr(tokenizer, name)

    assert not splits_predictably(Other())


def test_the_decision_reads_the_tokenizers_own_pre_tokenizer_and_normalizer(tokenizer):
    """Decided afresh for each tokenizer object (the real one's answer is cached): the same
    backend is supported, one whose components cannot be read, or are missing, is not."""
    real = tokenizer.backend_tokenizer
    assert splits_predictably(Holding(real))
    assert splits_predictably(Holding(Backend(real.pre_tokenizer, None)))  # no normalizer: nothing changes the text
    assert not splits_predictably(Holding(Backend(object(), real.normalizer)))  # unreadable: not assumed
    assert not splits_predictably(Holding(Backend(None, real.normalizer)))
    assert not splits_predictably(Holding(Backend(real.pre_tokenizer, object())))


def test_the_last_certain_split_before_a_space_is_found_by_hand_worked_cases():
    """A split is certain before a space that follows a letter: in "ab cd  e" the space at 6
    follows a space, so the last certain one is at 5; "a b" splits at 1; no letter before any
    space, no split (0)."""
    from searchr1.core.observation.piecewise import last_word_split

    assert last_word_split("ab cd  e") == 5
    assert last_word_split("a b") == 1
    assert last_word_split("ab") == 0
    assert last_word_split(" ab") == 0
    assert last_word_split("1 2 3") == 0


def test_an_object_that_is_no_fast_tokenizer_is_not_split_piecewise():
    assert splits_predictably(SlowTokenizer()) is False


def test_a_pre_tokenizer_that_is_no_sequence_is_not_split_piecewise(tokenizer):
    """The Qwen split and byte-level steps count only inside a Sequence pre-tokenizer."""
    import json

    steps = json.loads(tokenizer.backend_tokenizer.pre_tokenizer.__getstate__())["pretokenizers"]

    class Component:
        def __init__(self, state):
            self.state = state

        def __getstate__(self):
            return json.dumps(self.state)

    other = Backend(Component({"type": "Other", "pretokenizers": steps}), None)
    assert splits_predictably(Holding(other)) is False
    sequence = Backend(Component({"type": "Sequence", "pretokenizers": steps}), None)
    assert splits_predictably(Holding(sequence)) is True


def test_a_split_is_certain_only_strictly_inside_the_text():
    """Hand-worked: before a space after a letter ("X b" at 1), after a line break; never at
    either end of the text, whatever surrounds it."""
    assert certain_split("X b", 1) is True
    assert certain_split("a\nb", 2) is True
    assert certain_split(" a", 0) is False  # the start: nothing before it
    assert certain_split("ab", 2) is False and certain_split("ab", 0) is False  # the ends


def test_plain_tokens_need_a_fast_tokenizer_and_say_so_naming_its_type():
    with pytest.raises(TypeError, match=r"^SlowTokenizer has no backend_tokenizer: observations need a fast "
                                        r"\(tokenizers-backed\) tokenizer to keep special-token strings as plain text$"):
        plain_tokens(SlowTokenizer(), "text")


@pytest.mark.parametrize("items", [
    ["\u0301x and y", "b"],  # a first item opening with a combining mark: it may join the wrapper's text
    [" leading space", "b"],  # the observation strips the content
    ["a", " b"],  # a later item opening with a space joins the separator's whitespace
    ["a", "\u0301b"],
])
def test_items_whose_joins_are_not_certain_splits_are_tokenised_as_the_whole_is(tokenizer, items):
    joined = JoinedObservation(tokenizer, items)
    for count in (1, 2):
        assert joined.content_tokens(count) == plain_tokens(tokenizer, "\n\n".join(items[:count]))
        assert joined.observation_tokens(count) == observation_tokens(tokenizer, "\n\n".join(items[:count]))


def test_plain_tokens_normalise_and_pre_tokenise_as_the_tokenizer_does(tokenizer):
    """A decomposed accent (e + combining acute) is NFC-composed first, as the tokenizer does."""
    for text in ("Cafe\u0301 de Flore", "e\u0301te\u0301 2024, Paris", "x"):
        assert plain_tokens(tokenizer, text) == tokenizer.encode(text, add_special_tokens=False)
    assert plain_tokens(tokenizer, "Cafe\u0301") == plain_tokens(tokenizer, "Caf\u00e9")


@SETTINGS
@given(text=texts)
@example(text="plain text, no control token")
@example(text="a</tool_response>b</tool_response>c<|im_end|>d</tool_response>e")  # the first and last repeat
def test_a_text_splits_before_its_first_control_token_and_after_its_last(tokenizer, text):
    """Invariant: the text is ``before`` + the middle + ``after``; neither side holds a control
    token's string; the middle runs from the first control token to the end of the last one and
    its tokens spell it (NFC, as the tokenizer normalises); no control token: all of it is before."""
    before, middle, after = split_at_control_tokens(tokenizer, text)
    controls = [token for token in tokenizer.get_added_vocab() if token]
    assert text.startswith(before) and text.endswith(after) and len(before) + len(after) <= len(text)
    assert not any(token in before or token in after for token in controls)
    between = text[len(before):len(text) - len(after)]
    if not any(token in text for token in controls):
        assert (before, middle, after) == (text, (), "")
    else:
        assert any(between.startswith(token) for token in controls)
        assert any(between.endswith(token) for token in controls)
        assert tokenizer.decode(list(middle)) == unicodedata.normalize("NFC", between)
