"""The long-horizon world (searchr1/offline/long_world.py): chains of 6 to 10 searches whose long
passages each say which entity comes next, generated the same everywhere; and the learning twin's
notes, which let it keep count of what it found when a folded context no longer shows the passages."""

from __future__ import annotations

import re

import pytest

from searchr1.core.context import fold_messages
from searchr1.core.protocol import assistant_message, build_prompt, initial_messages, tool_message
from searchr1.core.types import CallRecord
from searchr1.offline import LONG, load_source
from searchr1.offline.long_world import HOPS, long_source
from searchr1.twin.learning_policy import LearningPolicy, candidate_text
from searchr1.twin.offline_world import load_world, load_worlds


@pytest.fixture(scope="module")
def source():
    return long_source()


def test_every_chain_is_6_to_10_searches_whose_passages_lead_to_the_answer(source):
    for question in source["train"] + source["dev"]:
        hops = question["hops"]
        assert len(hops) in HOPS
        for hop, following in zip(hops, [h["title"] for h in hops[1:]] + question["answers"]):
            relation = hop["query"][len(hop["title"]) + 1:]
            assert hop["query"].startswith(hop["title"] + " ")
            assert f"The {relation} of {hop['title']} is {following}." in hop["text"]
            assert hop["note"] == f"{relation} of {hop['title']}: {following}"
        assert question["wrong"] not in question["answers"]


def test_no_two_questions_share_an_entity_or_a_query_and_the_world_is_generated_the_same(source):
    queries = [hop["query"] for q in source["train"] + source["dev"] for hop in q["hops"]]
    titles = [hop["title"] for q in source["train"] + source["dev"] for hop in q["hops"]]
    assert len(set(queries)) == len(queries) and len(set(titles)) == len(titles)
    assert long_source() == source and long_source(seed=1) != source
    assert load_source(LONG) == source  # the shipped file is the generator's (offline-data --check holds it too)


def test_each_passage_fits_one_observation_whole(source, tokenizer):
    sizes = [len(tokenizer.encode(hop["text"])) for q in source["train"] + source["dev"] for hop in q["hops"]]
    assert max(sizes) < 1024 - 64  # --max-tool-response-tokens' default, with room for the item's header
    assert min(sizes) > 500  # and long: ten of them do not fit a 4,096-token context


def test_the_twin_knows_the_long_questions():
    long_questions = load_world(LONG)
    assert set(long_questions) <= set(load_worlds())
    assert all(hop.note for question in long_questions for hop in question.hops)


def _conversation(question, found):
    """The twin's own turns searching the first ``found`` hops, each answered by its passage."""
    messages = initial_messages(question.question)
    calls = []
    for index in range(found):
        messages += [assistant_message(candidate_text(question, index, "search_next")),
                     tool_message(f"call-{index}", question.hops[index].text)]
        calls.append(CallRecord(question.hops[index].query, True, question.hops[index].text, 1, tool="search"))
    return messages, calls


def test_with_its_notes_the_twin_counts_what_a_folded_context_no_longer_shows(tokenizer):
    policy = LearningPolicy(tokenizer)
    question = load_world(LONG)[0]
    messages, calls = _conversation(question, 4)
    assert policy.state(build_prompt(tokenizer, messages)).found == 4
    latest = messages[-1]  # folding keeps the latest result whole and stubs the ones before it
    folded = fold_messages(messages[:-1], calls[:-1]) + [latest]
    assert not any(hop.text in m["content"] for m in folded[:-1] for hop in question.hops)
    assert policy.state(build_prompt(tokenizer, folded)).found == 4
    # the notes are what carries it: the same folded prompt without them counts only the passage shown
    bare = [{**m, "content": re.sub(r"^Notes: .*?\n\n", "", m["content"], flags=re.S)}
            if m["role"] == "assistant" else m for m in folded]
    assert policy.state(build_prompt(tokenizer, bare)).found == 0
