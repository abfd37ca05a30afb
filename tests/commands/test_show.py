"""``show``: transcripts from a run directory or an eval file, in the terminal and as one
self-contained HTML page. Model and web text must never become markup or terminal control."""

from __future__ import annotations

import html.parser
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from searchr1.cli import main
from searchr1.evaluation.intervals import FEW_QUESTIONS
from searchr1.view.html import CONTENT_SECURITY_POLICY, transcript_page
from searchr1.view.terminal import (
    OBSERVATION_CHARS,
    SearchEvent,
    TurnEvent,
    abbreviate,
    conversation,
    printable,
)
from searchr1.evaluation.transcripts import TRANSCRIPTS_FILE, append_transcripts

HOSTILE = '<script>document.title="pwned"</script><img src="http://127.0.0.1:9/x.png"> & "quotes" \x1b[31mred\x1b[0m'
LONG_OBSERVATION = "[1] Source: Long page\n" + "evidence " * 200


def record(qid: str, *, reward: float, em: bool, turns: list[str], searches: list[dict], **extra) -> dict:
    return {
        "type": "trajectory", "id": qid, "question": f"question {qid}?", "answers": ["Gold answer"],
        "data_source": "nq", "group_index": 0, "turns": [{"text": t, "stop_reason": "stop"} for t in turns],
        "searches": searches, "final_text": turns[-1] if turns else "", "termination": "answer",
        "reward": reward, "exact_match": em, "valid_format": reward >= 0, "search_calls": len(searches),
        "assistant_turns": len(turns), "env_error": False, **extra,
    }


def search(query: str, observation: str, ok: bool = True) -> dict:
    return {"query": query, "ok": ok, "error": None if ok else "HTTP 503", "observation": observation,
            "items": 1 if ok else 0, "cached": False, "truncated": False}


TWO_HOP = record(
    "nq/1", reward=1.0, em=True,
    turns=["I will search.\n<tool_call>first</tool_call>", "One more.\n<tool_call>second</tool_call>", "Answer: Gold answer"],
    searches=[search("first query", "[1] first passage"), search("second query", LONG_OBSERVATION)],
)
HOSTILE_RECORD = record("nq/2", reward=0.0, em=False, turns=[HOSTILE],
                        searches=[search(HOSTILE, HOSTILE)])
HOSTILE_RECORD["turns"].append({"text": "Answer: no", "stop_reason": "stop"})


@pytest.fixture
def eval_file(tmp_path: Path) -> Path:
    path = tmp_path / "eval_offline.jsonl"
    lines = [{"type": "eval_config", "config": {"offline": True, "base_model": "Qwen/Qwen3.5-4B",
                                                 "search_backend": "deepseek"}},
             TWO_HOP, HOSTILE_RECORD, {"type": "summary", "metrics": {}}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"run_name": "demo-run", "offline": True}))
    for step in range(3):
        records = [{**TWO_HOP, "id": f"nq/s{step}-a", "advantage": 0.5},
                   {**HOSTILE_RECORD, "id": f"nq/s{step}-b", "advantage": -0.5, "excluded": None}]
        append_transcripts(run, step, records)
    return run


def show(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["show", *map(str, args)])
    return result.exit_code, result.output


# --- reading order and text helpers (pure) -------------------------------------------------------


def test_each_search_follows_the_turn_that_asked_for_it():
    events = conversation(TWO_HOP)
    kinds = [(type(e).__name__, e.number) for e in events]
    assert kinds == [("TurnEvent", 1), ("SearchEvent", 1), ("TurnEvent", 2), ("SearchEvent", 2), ("TurnEvent", 3)]
    assert isinstance(events[1], SearchEvent) and events[1].query == "first query"
    assert isinstance(events[4], TurnEvent) and events[4].text == "Answer: Gold answer"


@given(st.text(), st.integers(1, 500), st.integers(1, 20))
def test_abbreviated_text_is_the_text_or_a_prefix_and_the_count_of_what_was_left_out(text, chars, lines):
    short = abbreviate(text, chars, lines)
    if len(text) <= chars and text.count("\n") < lines:
        assert short == text
    else:
        head, _, tail = short.rpartition(" … [")
        assert text.startswith(head)
        assert tail == f"{len(text) - len(head)} more characters]"
        assert len(head) <= chars and head.count("\n") < lines


@given(st.text())
def test_printable_text_holds_no_control_character_but_newline_and_tab(text):
    cleaned = printable(text)
    assert all(ch in "\n\t" or not (ord(ch) < 32 or 127 <= ord(ch) < 160) for ch in cleaned)
    assert printable(cleaned) == cleaned


# --- terminal ---------------------------------------------------------------------------------------


def test_an_eval_file_reads_as_questions_turns_queries_and_outcomes(eval_file):
    code, output = show(eval_file)
    assert code == 0, output
    for expected in ("question nq/1?", "Gold answer", "first query", "[1] first passage", "second query",
                     "Answer: Gold answer", "reward +1.0", "EM yes", "ended answer", "OFFLINE"):
        assert expected in output
    assert output.index("first query") < output.index("One more.") < output.index("second query")


def test_long_observations_are_shortened_in_the_terminal_unless_full(eval_file):
    _, output = show(eval_file)
    assert "evidence " * 50 not in output
    kept = LONG_OBSERVATION[:OBSERVATION_CHARS].rstrip()  # two lines: the character cap applies
    shortened = f"{kept} … [{len(LONG_OBSERVATION) - len(kept)} more characters]"
    assert "\n  ".join(shortened.split("\n")) in output  # indented under its heading
    _, full = show(eval_file, "--full")
    assert "more characters]" not in full
    assert full.count("evidence") >= 200


def test_model_text_cannot_send_escape_sequences_to_the_terminal(eval_file):
    _, output = show(eval_file)
    assert "\x1b" not in output
    assert '<script>document.title="pwned"</script>' in output  # shown as text, as written


ESCAPE = "\x1b]0;owned\x07\x1b[2J"


def test_no_field_of_a_record_reaches_the_terminal_with_its_control_characters(tmp_path):
    hostile = {**HOSTILE_RECORD, "search_calls": ESCAPE, "group_index": ESCAPE,
               "termination": ESCAPE, "excluded": ESCAPE, "advantage": 0.1,
               "turns": [{"text": "t", "stop_reason": ESCAPE}, {"text": "Answer: no", "stop_reason": "stop"}],
               "searches": [{**search("q", "obs"), "items": ESCAPE}]}
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps(hostile) + "\n", encoding="utf-8")
    code, output = show(path)
    assert code == 0, output
    assert "\x1b" not in output and "\x07" not in output and "owned" in output


@pytest.mark.parametrize("answers", [5, "Gold", None, [1, None], {"a": 1}])
def test_a_record_whose_fields_have_other_types_is_shown_not_a_traceback(tmp_path, answers):
    odd = {**TWO_HOP, "answers": answers, "turns": 3, "searches": {"x": 1}}
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps(odd) + "\n", encoding="utf-8")
    code, output = show(path)
    assert code == 0 and "Traceback" not in output, output
    code, output = show(path, "--html", tmp_path / "page.html")
    assert code == 0, output


def test_a_run_directory_shows_its_last_step_by_default(run_dir):
    code, output = show(run_dir)
    assert code == 0, output
    assert "demo-run" in output and "nq/s2-a" in output and "nq/s1-a" not in output
    assert "advantage +0.500" in output


def test_a_legend_says_what_each_outcome_name_means_before_the_transcripts(run_dir, eval_file):
    from searchr1.view.terminal import OUTCOME_MEANINGS, outcome

    _, output = show(run_dir)
    (line,) = [line for line in output.splitlines() if line.startswith("outcome: ")]
    assert output.index(line) < output.index("nq/s2-a")
    for name in ("reward", "EM", "format", "ended", "searches", "advantage"):
        assert f"{name} = {OUTCOME_MEANINGS[name]}" in line
    _, output = show(eval_file)  # an eval record has no advantage: the legend does not explain one
    assert "reward = " in output and "advantage = " not in output
    judged = {**TWO_HOP, "advantage": 0.1, "excluded": "degenerate group", "env_error": True,
              "turns": [{"text": "Answer: Gold answer", "generated_tokens": 5, "prompt_tokens": 40,
                         "advantage": 0.3}],  # its own credit: not the trajectory's
              "judge": {"correct": True, "model": "twin", "prompt_version": 1, "reply": "yes"}}
    assert {name for name, _ in outcome(judged)} == set(OUTCOME_MEANINGS)  # every name has its meaning


def test_a_chosen_step_and_the_limit_are_honoured(run_dir):
    _, output = show(run_dir, "--step", "1", "--limit", "1")
    assert "nq/s1-a" in output and "nq/s1-b" not in output and "nq/s2-a" not in output
    assert "showing 1 of 2 transcripts" in output
    _, everything = show(run_dir, "--step", "all")
    assert all(f"nq/s{s}-{x}" in everything for s in range(3) for x in "ab")


def test_a_step_without_transcripts_lists_the_recorded_steps(run_dir):
    code, output = show(run_dir, "--step", "9")
    assert code == 1
    assert "step 9 has no transcripts" in output and "recorded steps: 0-2" in output


def test_step_is_refused_for_an_eval_file(eval_file):
    code, output = show(eval_file, "--step", "1")
    assert code == 2 and "eval file" in output


def test_a_directory_without_transcripts_is_named(tmp_path):
    code, output = show(tmp_path)
    assert code == 1 and str(tmp_path) in output and TRANSCRIPTS_FILE in output
    assert len(output.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["--limit", "0"], ["--step", "-1"], ["--step", "last"]])
def test_impossible_options_are_one_line_errors(run_dir, args):
    code, output = show(run_dir, *args)
    assert code == 2 and "Error: Invalid value" in output
    assert "Traceback" not in output


@pytest.mark.parametrize("policy", ["learning", "scripted"])
def test_an_offline_run_is_described_by_the_policy_its_config_names(run_dir, policy):
    (run_dir / "config.json").write_text(json.dumps({"run_name": "demo-run", "offline": True,
                                                     "offline_policy": policy}))
    code, output = show(run_dir)
    assert code == 0, output
    assert f"OFFLINE twin ({policy} policy" in output
    assert {"learning": "scripted", "scripted": "learning"}[policy] + " policy" not in output


def test_every_step_goes_into_the_page_and_a_cut_is_said_with_both_counts(tmp_path):
    run = tmp_path / "long-run"
    run.mkdir()
    for step in range(12):  # 24 transcripts: more than the terminal's default limit of 20
        append_transcripts(run, step, [{**TWO_HOP, "id": f"nq/s{step}-a"}, {**HOSTILE_RECORD, "id": f"nq/s{step}-b"}])
    page = tmp_path / "all.html"
    code, output = show(run, "--step", "all", "--html", page)
    assert code == 0 and "(24 transcripts)" in output
    assert parse(page.read_text("utf-8")).tags.count("article") == 24
    code, output = show(run, "--step", "all", "--html", page, "--limit", "5")
    assert code == 0 and "5 of 24 transcripts" in output and "--limit" in output
    assert parse(page.read_text("utf-8")).tags.count("article") == 5
    code, output = show(run, "--step", "all")
    assert code == 0 and "showing 20 of 24 transcripts" in output


def _metrics_file(run: Path) -> Path:
    path = run / "metrics.jsonl"
    path.write_text(json.dumps({"step": 0, "reward/mean": 0.5, "trainer/loss_mean": 0.1}) + "\n")
    return path


def _checkpoints_file(run: Path) -> Path:
    path = run / "checkpoints.jsonl"
    path.write_text(json.dumps({"name": "x-step-000001", "step": 1, "cursor": 4, "state_path": "trio://s",
                                "weights_path": "trio://w"}) + "\n")
    return path


def _config_file(run: Path) -> Path:
    path = run / "config.json"
    path.write_text(json.dumps({"run_name": "demo-run", "run_id": "cafe0001", "offline": True}, indent=2))
    return path


def _any_object(run: Path) -> Path:
    path = run / "other.jsonl"
    path.write_text(json.dumps({"hello": "world"}) + "\n")
    return path


@pytest.mark.parametrize("make, says", [
    (_metrics_file, "training metrics (metrics.jsonl"),
    (_checkpoints_file, "checkpoint ledger"),
    (_config_file, "a run's config.json, not JSON Lines"),
    (_any_object, "holds no transcript records"),
], ids=["metrics", "checkpoints", "config", "other"])
def test_a_file_that_is_not_a_transcript_source_is_refused_saying_what_it_is(run_dir, make, says):
    path = make(run_dir)
    code, output = show(path)
    assert code == 1, output
    assert str(path) in output and says in output and "invalid JSON" not in output
    assert len(output.strip().splitlines()) == 1


def test_a_broken_eval_file_is_named_with_its_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(TWO_HOP) + "\n{not json\n")
    code, output = show(path)
    assert code == 1 and f"{path}:2" in output


# --- the HTML page ------------------------------------------------------------------------------------


class PageParser(html.parser.HTMLParser):
    """Tags, attributes and the text of every <pre> (the turns and observations)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str | None]] = []
        self.pre: list[str] = []
        self._in_pre = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes.extend(attrs)
        if tag == "pre":
            self._in_pre = True
            self.pre.append("")

    def handle_endtag(self, tag):
        if tag == "pre":
            self._in_pre = False

    def handle_data(self, data):
        if self._in_pre:
            self.pre[-1] += data


def parse(page: str) -> PageParser:
    parser = PageParser()
    parser.feed(page)
    parser.close()
    return parser


ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "p", "main",
                "article", "span", "dl", "dt", "dd", "ul", "li", "b", "div", "pre", "details", "summary",
                "nav", "ol", "a", "section", "table", "thead", "tbody", "tr", "th", "td"}


@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=200),
       st.text(st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_the_page_shows_turn_and_observation_text_exactly_whatever_it_holds(turn, observation):
    page = transcript_page([(None, [record("nq/h", reward=0.0, em=False, turns=[turn, "Answer: x"],
                                           searches=[search("q", observation)])])], heading="t")
    parsed = parse(page)
    assert parsed.pre == [printable(turn), printable(observation), "Answer: x"]
    assert set(parsed.tags) <= ALLOWED_TAGS


def test_the_page_needs_nothing_from_outside(eval_file, tmp_path):
    out = tmp_path / "page.html"
    code, output = show(eval_file, "--html", out)
    assert code == 0, output
    page = out.read_text("utf-8")
    parsed = parse(page)
    assert "script" not in parsed.tags and "link" not in parsed.tags and "img" not in parsed.tags
    assert not [name for name, _ in parsed.attributes if name in ("src", "srcset", "action")]
    ids = {value for name, value in parsed.attributes if name == "id"}
    links = [value for name, value in parsed.attributes if name == "href"]
    assert links and all(link.startswith("#") and link[1:] in ids for link in links)  # in-page fragments only
    assert ("content", CONTENT_SECURITY_POLICY) in parsed.attributes
    assert "default-src 'none'" in CONTENT_SECURITY_POLICY
    assert "url(" not in page and "@import" not in page
    assert HOSTILE.replace("\x1b", "\ufffd") in parsed.pre  # the hostile text is there, as text
    assert [p for p in out.parent.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_the_page_holds_every_chosen_transcript_under_its_step(run_dir, tmp_path):
    out = tmp_path / "run.html"
    code, output = show(run_dir, "--step", "all", "--html", out)
    assert code == 0 and "6 transcripts" in output
    page = out.read_text("utf-8")
    parsed = parse(page)
    assert parsed.tags.count("article") == 6
    assert page.count('<h2 class="step">') == 3


# --- a real browser (opt-in: SEARCHR1_BROWSER_TESTS=1, Debian's chromium) -------------------------------


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.mark.skipif(os.environ.get("SEARCHR1_BROWSER_TESTS") != "1", reason="set SEARCHR1_BROWSER_TESTS=1")
def test_a_browser_renders_the_page_and_runs_nothing_from_the_transcripts(eval_file, tmp_path):
    browser = chromium()
    assert browser, "SEARCHR1_BROWSER_TESTS=1 needs chromium (apt-get install -y chromium)"
    out = tmp_path / "page.html"
    assert show(eval_file, "--html", out)[0] == 0
    base = [browser, *BROWSER_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*base, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    parsed = parse(dom)
    assert parsed.tags.count("article") == 2
    assert "script" not in parsed.tags and "img" not in parsed.tags
    assert "pwned" not in dom.split("</title>")[0]  # the model's script never ran
    assert "first query" in dom and "Gold answer" in dom
    png = tmp_path / "page.png"
    subprocess.run([*base, "--window-size=1200,1600", f"--screenshot={png}", out.as_uri()],
                   capture_output=True, timeout=120, check=True)
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(header[16:20], "big") == 1200
    if os.environ.get("SEARCHR1_BROWSER_PNG"):
        shutil.copy(png, os.environ["SEARCHR1_BROWSER_PNG"])  # to look at by eye


def test_an_eval_page_opens_with_its_scores_over_every_question_and_marks_a_small_source(eval_file, tmp_path):
    """The summary is over the whole file (one of the two questions is right: EM 0.5), even when
    --limit shows one transcript; the source has two questions, so it is marked and footnoted."""
    out = tmp_path / "page.html"
    code, output = show(eval_file, "--html", out, "--limit", "1")
    assert code == 0, output
    page = out.read_text("utf-8")
    scores = page.split('<section id="scores"', 1)[1].split("</section>", 1)[0]
    macro = scores.split('<th scope="row">macro</th>', 1)[1].split("</tr>", 1)[0]
    assert "<td>2</td>" in macro and "<td>0.500 " in macro  # 2 questions, EM 1/2
    assert '<th scope="row">nq*</th>' in scores and f"fewer than {FEW_QUESTIONS} questions" in scores
    assert parse(page).tags.count("article") == 1
