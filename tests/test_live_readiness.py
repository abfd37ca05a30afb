"""What a first paid run depends on, checked before it costs anything: the reward does not
depend on the sampler's stop-string convention, checkpoint names never collide across runs,
the trainer refuses settings that bias the importance ratio, and the default accumulation
never packs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.data import SearchExample
from searchr1.protocol import parse_assistant
from searchr1.rollout import RolloutConfig, consume_assistant, score_trajectory
from searchr1.trajectory import AssistantTurn, Trajectory

EXAMPLE = SearchExample(id="q1", question="Which country?", answers=("France",), data_source="nq")
STOP_STRINGS = ("<|im_end|>", "<|endoftext|>", "<|im_end|>\n", "<|im_end|><|endoftext|>")


def _scored(tokenizer, text: str) -> Trajectory:
    trajectory = Trajectory(EXAMPLE, 0, 0, [{"role": "user", "content": EXAMPLE.question}])
    turn = AssistantTurn(prompt_tokens=[1, 2, 3], completion_tokens=[4, 5], logprobs=[-0.1, -0.2], text=text)
    assert consume_assistant(trajectory, turn, tokenizer, RolloutConfig()) is None
    score_trajectory(trajectory)
    return trajectory


answers = st.sampled_from(["France", "Spain", "france.", "The France", ""])
lines = st.lists(st.sampled_from(["I checked.", "Answer: {}", "answer:{}", "Final."]), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(lines=lines, answer=answers, stop=st.sampled_from(STOP_STRINGS))
def test_reward_is_the_same_whether_or_not_the_sampler_keeps_the_stop_string(tokenizer, lines, answer, stop):
    text = "\n".join(line.format(answer) for line in lines)
    plain, stopped = _scored(tokenizer, text), _scored(tokenizer, text + stop)
    assert (stopped.reward, stopped.exact_match, stopped.valid_format) == (
        plain.reward, plain.exact_match, plain.valid_format)
    assert stopped.final_text == plain.final_text
    assert stopped.messages[-1]["content"] == plain.messages[-1]["content"]


def test_a_correct_answer_followed_by_the_stop_string_earns_full_reward(tokenizer):
    trajectory = _scored(tokenizer, "Answer: France<|im_end|>")
    assert trajectory.reward == 1.0 and trajectory.exact_match
    assert "<|im_end|>" not in trajectory.final_text


def test_the_parser_reports_the_text_it_classified_without_the_stop_string():
    call = "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n</function>\n</tool_call>"
    for body in ("Answer: France", call, "<tool_call>{}</tool_call>"):
        assert parse_assistant(body + "<|im_end|>").text == body
        assert parse_assistant(body).text == body
