"""How a transcript record reads: the conversation in order, its outcome in a few words, long
text shortened with a visible count of what was left out, and text made safe to print.

Pure functions over the records of :mod:`searchr1.evaluation.transcripts` (and eval files, which hold the
same records); the terminal view (rich) is here too, the HTML page in
:mod:`searchr1.view.html`. Records come from the model and from the web, so nothing in
them is markup: rich gets :class:`rich.text.Text` objects (never markup strings) and control
characters, which could move a terminal's cursor or change its colours, are replaced.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from searchr1.basics.wording import plural

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

REPLACEMENT = "\ufffd"
TURN_CHARS, TURN_LINES = 1200, 30
OBSERVATION_CHARS, OBSERVATION_LINES = 400, 8


def printable(text: object) -> str:
    """``text`` as a string with CR and CRLF line breaks turned into newlines and every other
    control character except tab replaced by U+FFFD (escape sequences, NUL, the C1 range)."""
    value = "" if text is None else str(text)
    value = value.replace("\r\n", "\n").replace("\r", "\n")
    return "".join(
        ch if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cs") else REPLACEMENT for ch in value
    )


def answers_text(value: object) -> str:
    """A record's gold answers, ``a | b``, whatever the file holds (a list, one string, a number)."""
    if isinstance(value, (list, tuple)):
        return " | ".join(printable(answer) for answer in value)
    return printable(value if value is not None else "")


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def count(value: object) -> int:
    """A count from a record (``0`` for anything that is not a whole number)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return 0


def abbreviate(text: str, max_chars: int, max_lines: int) -> str:
    """``text`` unchanged when it fits both limits; otherwise its first ``max_chars`` characters
    (cut further to ``max_lines`` lines) and a marker saying how many characters were left out."""
    if max_chars < 1 or max_lines < 1:
        raise ValueError("abbreviate needs max_chars >= 1 and max_lines >= 1")
    lines = text.split("\n")
    if len(text) <= max_chars and len(lines) <= max_lines:
        return text
    head = "\n".join(lines[:max_lines])[:max_chars].rstrip()
    return f"{head} … [{len(text) - len(head)} more characters]"


@dataclass(frozen=True)
class TurnEvent:
    number: int  # 1-based
    text: str  # what the turn said (after its reasoning, when it had one)
    stop_reason: str
    credit: str = ""  # with credit per turn: its advantage, step group and step reward
    reasoning: str | None = None  # thinking on: the reasoning before </think>, shown folded
    folded: bool = False  # --context fold: its prompt is a new context (earlier tool results as stubs)


FOLD_MARK = "context folded: earlier tool results are one-line stubs from here on"


def turn_event(number: int, text: str, stop_reason: str, credit: str = "", *, folded: bool = False) -> TurnEvent:
    """A recorded turn, its reasoning (the text before ``</think>``, which a turn writes with
    thinking on) set apart from what it said."""
    reasoning, closed, said = text.partition("</think>")
    if not closed:
        return TurnEvent(number, text, stop_reason, credit, folded=folded)
    return TurnEvent(number, said.lstrip("\n"), stop_reason, credit, reasoning.strip(), folded)


def reasoning_fold(reasoning: str) -> str:
    """The one line a folded reasoning shows."""
    words = len(reasoning.split())
    return f"reasoning: {words} word{'s' if words != 1 else ''}"


def turn_credit(turn: Mapping[str, object]) -> str:
    """``advantage +0.123 · step group of 4 · step reward -0.100`` for a training transcript's turn
    that was credited on its own (``--credit gigpo``, ``--step-reward``); "" for any other."""
    if "step_group" not in turn and "step_reward" not in turn:
        return ""
    parts = [f"advantage {_signed(turn.get('advantage'), 3)}"]
    if "step_group" in turn:
        parts.append(f"step group of {count(turn.get('step_group'))}")
    if "step_reward" in turn:
        parts.append(f"step reward {_signed(turn.get('step_reward'), 3)}")
    return " · ".join(parts)


@dataclass(frozen=True)
class SearchEvent:
    """One tool call and what the model read back (a search, another tool's call, or a refusal)."""

    number: int  # 1-based, among the trajectory's calls
    query: str
    ok: bool
    error: str | None
    observation: str
    items: int
    cached: bool
    truncated: bool
    tool: str = "search"
    refused: bool = False

    @property
    def status(self) -> str:
        if self.refused:
            return "refused"
        if not self.ok:
            return f"failed: {self.error or 'error'}"
        parts = [f"{self.items} item{'s' if self.items != 1 else ''}"]
        if self.cached:
            parts.append("cached")
        if self.truncated:
            parts.append("truncated to fit")
        return ", ".join(parts)


def conversation(record: Mapping[str, object]) -> list[TurnEvent | SearchEvent]:
    """Assistant turns and tool calls in the order they happened: each call after the turn that
    made it (its ``turn``; a record without one, written before calls named their turn, answers
    the turn of its own position: one call a turn)."""
    turns = [t for t in _list(record.get("turns")) if isinstance(t, Mapping)]
    searches = [s for s in _list(record.get("searches")) if isinstance(s, Mapping)]
    made_by = [count(s.get("turn")) if isinstance(s.get("turn"), int) else index + 1 for index,
               s in enumerate(searches)]

    def call(number: int, s: Mapping[str, object]) -> SearchEvent:
        return SearchEvent(
            number=number, query=printable(s.get("query")), ok=bool(s.get("ok")),
            error=printable(s.get("error")) if s.get("error") else None,
            observation=printable(s.get("observation")), items=count(s.get("items")),
            cached=bool(s.get("cached")), truncated=bool(s.get("truncated")),
            tool=printable(s.get("tool") or "search"), refused=bool(s.get("refused")),
        )
    events: list[TurnEvent | SearchEvent] = []
    contexts = [count(turn.get("context")) for turn in turns]  # 0 for a record without folds
    for index, turn in enumerate(turns, 1):
        folded = index > 1 and contexts[index - 1] != contexts[index - 2]
        events.append(turn_event(index, printable(turn.get("text")), printable(turn.get("stop_reason") or ""),
                                 turn_credit(turn), folded=folded))
        events += [call(number, s) for number, s in enumerate(searches, 1) if made_by[number - 1] == index]
    # a call whose turn is not in the record comes last, in order
    events += [call(number, s) for number, s in enumerate(searches, 1) if not 1 <= made_by[number - 1] <= len(turns)]
    return events


def _signed(value: object, digits: int) -> str:
    return f"{float(value):+.{digits}f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "?"


def title(record: Mapping[str, object]) -> str:
    """``step 3 · nq/test_12 · sample 2`` (step only for training transcripts)."""
    parts = []
    if "step" in record:
        parts.append(f"step {printable(record['step'])}")
    parts.append(printable(record.get("id", "?")))
    if record.get("data_source") and not str(record.get("id", "")).startswith(f"{record['data_source']}/"):
        parts.append(printable(record["data_source"]))
    if "group_index" in record and ("step" in record or record["group_index"]):
        parts.append(f"sample {printable(record['group_index'])}")
    return " · ".join(parts)


def outcome(record: Mapping[str, object]) -> list[tuple[str, str]]:
    """(name, value) pairs: reward, EM, format, how it ended, searches, for training
    transcripts the advantage and why no datum was sent, if none was, and for a judged eval
    record the judge's verdict and words. Every value is
    :func:`printable`: a record is read from a file anyone may have written."""
    searches = record.get("searches")
    pairs = [
        ("reward", _signed(record.get("reward"), 1)),
        ("EM", "yes" if record.get("exact_match") else "no"),
        ("format", "ok" if record.get("valid_format") else "bad"),
        ("ended", printable(record.get("termination") or "unfinished")),
        ("searches", printable(record.get("search_calls", len(searches) if isinstance(searches, list) else 0))),
    ]
    tokens = token_counts(record)
    if tokens:
        pairs.append(("tokens", tokens))
    if "advantage" in record:
        pairs.append(("advantage", _signed(record.get("advantage"), 3)))
    turned = [turn.get("advantage") for turn in _list(record.get("turns")) if isinstance(turn, Mapping)]
    if any(value != record.get("advantage") for value in turned if value is not None):
        pairs.append(("turn advantages", " ".join(_signed(value, 3) for value in turned)))
    if record.get("excluded"):
        pairs.append(("not trained", printable(record["excluded"])))
    if record.get("env_error"):
        pairs.append(("search error", "yes"))
    judge = record.get("judge")
    if isinstance(judge, Mapping) and judge.get("error"):  # a training judge that failed: no reward
        pairs.append(("judge", f"failed ({printable(judge['error'])})"))
    elif isinstance(judge, Mapping) and isinstance(judge.get("correct"), bool):
        said = f" said {printable(judge.get('reply'))!r}" if judge.get("asked", True) else ", no answer to judge"
        pairs.append(("judge", f"{'yes' if judge['correct'] else 'no'} ({printable(judge.get('model'))}"
                               f" v{printable(judge.get('prompt_version'))}{said})"))
    return pairs


# What each name in :func:`outcome` means, for the one-line legend above the transcripts.
OUTCOME_MEANINGS: dict[str, str] = {
    "reward": "the outcome reward (the EM, F1 or cover EM that --reward names; -0.1 for a bad format)",
    "EM": "exact match with a gold answer",
    "format": "one non-empty Answer: line",
    "ended": "why the trajectory stopped",
    "searches": "search calls",
    "tokens": "generated over the turns, and the last prompt+reply",
    "advantage": "the reward against its group's, the weight of its tokens in the update",
    "turn advantages": "what each turn's tokens carried, where credit differs by turn",
    "not trained": "why no datum was sent",
    "search error": "a search failed (its group is left out of the update by default)",
    "judge": "the judge's verdict on the answer (with --judge-weight, mixed into the reward)",
}


def legend(records: Sequence[Mapping[str, object]]) -> str:
    """``outcome: reward = …; EM = …; …``: what the outcome line's names mean, for those that
    ``records`` show ("" when there are none)."""
    shown: list[str] = []
    for record in records:
        shown += [name for name, _ in outcome(record) if name not in shown]
    return ("outcome: " + "; ".join(f"{name} = {OUTCOME_MEANINGS[name]}" for name in shown)) if shown else ""


def token_counts(record: Mapping[str, object]) -> str:
    """``N generated over T turns, S in the last prompt+reply`` from the turns' counts ("" when
    the record has none: files written before they were recorded)."""
    turns = [t for t in _list(record.get("turns")) if isinstance(t, Mapping)]
    counted = [t for t in turns if isinstance(t.get("generated_tokens"), int) and isinstance(t.get("prompt_tokens"),
                                                                                             int)]
    if not counted or len(counted) != len(turns):
        return ""
    generated = sum(t["generated_tokens"] for t in counted)
    last = counted[-1]["prompt_tokens"] + counted[-1]["generated_tokens"]
    return f"{generated} generated over {plural(len(counted), 'turn')}, sequence {last}"


def verdict(record: Mapping[str, object]) -> str:
    """``correct``, ``wrong`` or ``bad-format``: one word for colouring."""
    if record.get("exact_match"):
        return "correct"
    return "wrong" if record.get("valid_format") else "bad-format"


# --- terminal (rich) ----------------------------------------------------------------------

_VERDICT_STYLE = {"correct": "green", "wrong": "yellow", "bad-format": "red"}


def renderables(record: Mapping[str, object], *, full: bool = False) -> list[RenderableType]:
    """Rich objects for one transcript; model and web text abbreviated unless ``full``."""
    from rich.rule import Rule
    from rich.text import Text

    style = _VERDICT_STYLE[verdict(record)]
    out: list[RenderableType] = [Rule(Text(title(record), style=f"bold {style}"), align="left", style=style)]
    facts = Text()
    facts.append("question  ", style="bold").append(printable(record.get("question")))
    facts.append("\ngold      ", style="bold").append(answers_text(record.get("answers")))
    facts.append("\noutcome   ", style="bold")
    for index, (name, value) in enumerate(outcome(record)):
        facts.append("  " if index else "").append(f"{name} ", style="dim").append(value)
    out.append(facts)
    for event in conversation(record):
        if isinstance(event, TurnEvent):
            if event.folded:
                out.append(Rule(Text(FOLD_MARK, style="yellow"), style="yellow", align="left"))
            head = Text(f"assistant {event.number}", style="bold cyan")
            if event.stop_reason and event.stop_reason != "stop":
                head.append(f"  (stopped: {event.stop_reason})", style="dim")
            if event.credit:
                head.append(f"  {event.credit}", style="dim")
            body = event.text if full else abbreviate(event.text, TURN_CHARS, TURN_LINES)
            if event.reasoning is not None:  # folded to one line unless --full
                out.append(head)
                head = Text("  " + reasoning_fold(event.reasoning) + ("" if full else " (--full shows it)"),
                            style="dim italic")
                if full:
                    head.append("\n" + "\n".join("    " + line for line in event.reasoning.split("\n")))
        else:
            head = Text(f"{event.tool or 'call'} {event.number}  ", style="bold magenta").append(event.query)
            head.append(f"  [{event.status}]", style="red" if not event.ok else "dim")
            body = event.observation if full else abbreviate(event.observation, OBSERVATION_CHARS, OBSERVATION_LINES)
        out.append(head)
        out.append(Text("\n".join("  " + line for line in body.split("\n"))))
    return out


def print_transcripts(console: Console, records: Sequence[Mapping[str, object]], *, full: bool = False) -> None:
    for record in records:
        for item in renderables(record, full=full):
            console.print(item)
        console.print()
