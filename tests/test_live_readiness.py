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


# --- prompts are the user's to set, and recorded -------------------------------------------

from click.testing import CliRunner  # noqa: E402

from searchr1.cli import main  # noqa: E402
from searchr1.protocol import initial_messages  # noqa: E402
from searchr1.rollout import effective_system_prompt, make_request  # noqa: E402

CUSTOM_PROMPT = "Answer briefly. You may search {max_search_calls} times; {braces} stay as written.\n"


def test_a_custom_system_prompt_and_tool_description_reach_the_first_prompt(tokenizer):
    config = RolloutConfig(system_prompt=CUSTOM_PROMPT, tool_description="Find passages in the archive.",
                           max_search_calls=3)
    messages = initial_messages(EXAMPLE.question, max_search_calls=3, system_template=config.system_prompt)
    request = make_request(tokenizer, Trajectory(EXAMPLE, 0, 0, messages), 0, 1, 7, config)
    text = tokenizer.decode(request.prompt_tokens, skip_special_tokens=False)
    assert "You may search 3 times; {braces} stay as written." in text
    assert "Find passages in the archive." in text
    assert effective_system_prompt(config) == CUSTOM_PROMPT.replace("{max_search_calls}", "3")
    default = make_request(tokenizer, Trajectory(EXAMPLE, 0, 0, initial_messages(EXAMPLE.question)), 0, 1, 7,
                           RolloutConfig())
    assert "Find passages in the archive." not in tokenizer.decode(default.prompt_tokens)


def _offline_eval(tmp_path, name, *extra):
    output = tmp_path / f"{name}.jsonl"
    result = CliRunner().invoke(main, ["eval", "--offline", "--quiet", "--limit", "2", "--backend", "wikipedia",
                                       "--output", str(output), *extra])
    assert result.exit_code == 0, result.output
    return output


def test_eval_records_the_prompt_and_plot_refuses_to_mix_prompts(tmp_path):
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(CUSTOM_PROMPT, "utf-8")
    default = _offline_eval(tmp_path, "default")
    custom = _offline_eval(tmp_path, "custom", "--system-prompt-file", str(prompt_file),
                           "--tool-description", "Find passages in the archive.")
    import json

    config = json.loads(custom.read_text().splitlines()[0])["config"]
    assert config["system_prompt"] == CUSTOM_PROMPT.replace("{max_search_calls}", "4")
    assert config["tool_description"] == "Find passages in the archive."
    figure = tmp_path / "em.png"
    refused = CliRunner().invoke(main, ["plot", "eval", str(default), str(custom), "-o", str(figure)])
    assert refused.exit_code != 0 and "system_prompt" in refused.output and not figure.exists()
    allowed = CliRunner().invoke(main, ["plot", "eval", str(default), str(custom), "--allow-mixed", "-o", str(figure)])
    assert allowed.exit_code == 0, allowed.output
    assert figure.stat().st_size > 0


def test_training_records_the_prompt_it_used(tmp_path):
    import json

    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(CUSTOM_PROMPT, "utf-8")
    result = CliRunner().invoke(main, ["train", "--offline", "--quiet", "--max-steps", "1", "--questions-per-batch",
                                       "2", "--group-size", "2", "--backend", "wikipedia", "--system-prompt-file", str(prompt_file),
                                       "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["rollout"]["system_prompt"] == CUSTOM_PROMPT


def test_an_empty_system_prompt_file_is_refused_by_name(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    result = CliRunner().invoke(main, ["eval", "--offline", "--quiet", "--system-prompt-file", str(empty)])
    assert result.exit_code == 2 and "empty.txt is empty" in result.output
