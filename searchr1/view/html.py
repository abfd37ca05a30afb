"""One self-contained HTML page of transcripts (``python cli.py show ... --html OUT.html``).

The page needs nothing but itself: inline CSS, no script, no font, image or stylesheet from
anywhere, and a Content-Security-Policy that forbids loading any (so even a mistake here could
not make a browser fetch something). Long observations fold into ``<details>`` elements, which
browsers open and close without JavaScript. Every piece of text goes through
:func:`html.escape` after :func:`~searchr1.view.terminal.printable`: transcripts hold model
output and web pages, and neither may become markup.

Each transcript is an ``<article id="t-N">`` (N its position on the page, never text from the
file); an index after the heading links every answer that is not correct (wrong or in a bad
format) to its article, and an eval's page opens with its score summary
(:mod:`searchr1.view.html_scores`). The only links are these in-page fragments.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from searchr1.view.terminal import (SearchEvent, TurnEvent, answers_text, conversation, outcome, printable,
                                    FOLD_MARK, reasoning_fold, title, verdict)

INDEX_QUESTION_CHARS = 120  # a question longer than this is cut in the index (whole in its article)

CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; form-action 'none'"
OPEN_OBSERVATIONS_UP_TO = 600  # characters; longer observations start folded

STYLE = """
:root { color-scheme: light; --ink: #1d232b; --dim: #5d6875; --line: #d8dde3; --paper: #ffffff;
  --back: #f3f5f7; --correct: #1f7a3f; --wrong: #a86b00; --bad-format: #b3261e;
  --assistant: #eef4fb; --tool: #f7f3fb; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--back); color: var(--ink);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", sans-serif; }
header.page { padding: 20px 28px 12px; background: var(--paper); border-bottom: 1px solid var(--line); }
header.page h1 { margin: 0 0 4px; font-size: 20px; }
header.page p { margin: 2px 0; color: var(--dim); font-size: 13px; }
main { max-width: 1100px; margin: 0 auto; padding: 16px 20px 40px; }
h2.step { font-size: 16px; margin: 26px 0 8px; color: var(--dim); border-bottom: 1px solid var(--line); }
article { background: var(--paper); border: 1px solid var(--line); border-left: 6px solid var(--dim);
  border-radius: 6px; margin: 14px 0; padding: 12px 16px; }
article.correct { border-left-color: var(--correct); }
article.wrong { border-left-color: var(--wrong); }
article.bad-format { border-left-color: var(--bad-format); }
article h3 { margin: 0 0 8px; font-size: 15px; }
.verdict { display: inline-block; margin-left: 8px; padding: 0 8px; border-radius: 10px; color: #fff;
  font-size: 12px; font-weight: 600; vertical-align: 1px; }
.verdict.correct { background: var(--correct); } .verdict.wrong { background: var(--wrong); }
.verdict.bad-format { background: var(--bad-format); }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 0 0 10px; }
dl.facts dt { color: var(--dim); } dl.facts dd { margin: 0; }
ul.outcome { list-style: none; padding: 0; margin: 0; display: flex; flex-wrap: wrap; gap: 4px 16px; }
ul.outcome b { font-weight: 600; color: var(--dim); margin-right: 4px; }
.event { border-radius: 5px; margin: 8px 0; padding: 6px 10px; }
.assistant { background: var(--assistant); }
.tool { background: var(--tool); }
.role { font-size: 12px; font-weight: 600; color: var(--dim); text-transform: uppercase; letter-spacing: .04em; }
.role .query { text-transform: none; letter-spacing: 0; color: var(--ink); font-weight: 600; }
.role .status { text-transform: none; letter-spacing: 0; font-weight: 400; }
.role .credit { text-transform: none; letter-spacing: 0; font-weight: 400; margin-left: 8px; }
details.reasoning > summary { color: #666; font-style: italic; }
.fold { margin: 10px 0; padding: 4px 8px; border-left: 3px solid #c90; color: #855; font-size: 13px; }
.role .status.failed { color: var(--bad-format); }
details > summary { cursor: pointer; }
pre { margin: 4px 0 0; white-space: pre-wrap; overflow-wrap: anywhere;
  font: 13px/1.45 ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace; }
p.empty { color: var(--dim); font-style: italic; }
section.scores, nav.index { background: var(--paper); border: 1px solid var(--line); border-radius: 6px;
  margin: 14px 0; padding: 10px 16px; }
section.scores h2, nav.index h2 { font-size: 16px; margin: 0 0 6px; }
section.scores table { border-collapse: collapse; font-size: 13px; }
section.scores th, section.scores td { padding: 2px 10px; text-align: right; border-bottom: 1px solid var(--line); }
section.scores th[scope=row] { text-align: left; }
section.scores tr.overall th, section.scores tr.overall td { font-weight: 600; }
section.scores tr.few th { color: var(--wrong); }
.ci, p.note { color: var(--dim); font-size: 12px; }
nav.index ol { margin: 0; padding-left: 22px; font-size: 13px; }
nav.index a { color: inherit; }
"""


def _e(text: object) -> str:
    return html.escape(printable(text), quote=True)


def anchor(position: int) -> str:
    """The id of the page's ``position``-th transcript (1-based): positional, so nothing read
    from a file becomes an id or a link."""
    return f"t-{position}"


def _article(record: Mapping[str, object], position: int) -> str:
    kind = verdict(record)
    answers = answers_text(record.get("answers"))
    items = "".join(f"<li><b>{_e(name)}</b>{_e(value)}</li>" for name, value in outcome(record))
    parts = [
        f'<article id="{anchor(position)}" class="{kind}">',
        f'<h3>{_e(title(record))}<span class="verdict {kind}">{_e(kind)}</span></h3>',
        '<dl class="facts">',
        f"<dt>question</dt><dd>{_e(record.get('question'))}</dd>",
        f"<dt>gold</dt><dd>{_e(answers)}</dd>",
        f'<dt>outcome</dt><dd><ul class="outcome">{items}</ul></dd>',
        "</dl>",
    ]
    events = conversation(record)
    if not events:
        parts.append('<p class="empty">no assistant turn was recorded</p>')
    for event in events:
        if isinstance(event, TurnEvent):
            stopped = f" (stopped: {_e(event.stop_reason)})" if event.stop_reason not in ("", "stop") else ""
            credit = f' <span class="credit">{_e(event.credit)}</span>' if event.credit else ""
            if event.folded:
                parts.append(f'<div class="fold">{_e(FOLD_MARK)}</div>')
            reasoning = ("" if event.reasoning is None else  # folded until clicked
                         f'<details class="reasoning"><summary>{_e(reasoning_fold(event.reasoning))}, click to open'
                         f"</summary><pre>{_e(event.reasoning)}</pre></details>")
            parts.append(
                f'<div class="event assistant"><div class="role">assistant · turn {event.number}{stopped}{credit}</div>'
                f"{reasoning}<pre>{_e(event.text)}</pre></div>"
            )
        else:
            assert isinstance(event, SearchEvent)
            status_class = "status" if event.ok else "status failed"
            folded = len(event.observation) > OPEN_OBSERVATIONS_UP_TO
            opened = "" if folded else " open"
            size = f" · {len(event.observation):,} characters, click to open" if folded else ""
            parts.append(
                f'<details class="event tool"{opened}><summary class="role">{_e(event.tool or "call")} {event.number}: '
                f'<span class="query">{_e(event.query)}</span> '
                f'<span class="{status_class}">[{_e(event.status)}]{size}</span></summary>'
                f"<pre>{_e(event.observation)}</pre></details>"
            )
    parts.append("</article>")
    return "\n".join(parts)


def wrong_answers_index(records: Sequence[Mapping[str, object]]) -> str:
    """A ``<nav>`` listing every transcript whose answer is not correct, each linked to its
    article (``records`` in page order), or a line saying there is none."""
    wrong = [(position, record) for position, record in enumerate(records, 1) if verdict(record) != "correct"]
    if not wrong:
        return ('<nav class="index" id="index"><h2>Wrong answers</h2><p class="note">none: every answer on '
                "this page is correct</p></nav>")
    items = []
    for position, record in wrong:
        question = printable(record.get("question"))
        if len(question) > INDEX_QUESTION_CHARS:
            question = question[:INDEX_QUESTION_CHARS].rstrip() + " …"
        items.append(f'<li><a href="#{anchor(position)}">{_e(title(record))}</a> '
                     f'<span class="verdict {verdict(record)}">{_e(verdict(record))}</span> {_e(question)}</li>')
    return "\n".join([f'<nav class="index" id="index"><h2>Wrong answers ({len(wrong)} of {len(records)})</h2><ol>',
                      *items, "</ol></nav>"])


def transcript_page(
    sections: Sequence[tuple[str | None, Sequence[Mapping[str, object]]]],
    *,
    heading: str,
    notes: Sequence[str] = (),
    scores: str = "",
) -> str:
    """The whole page. ``sections`` are ``(section title or None, records)`` pairs, e.g. one per
    training step; ``notes`` are lines under the heading (source, what was left out); ``scores``
    is the score summary's markup (:func:`searchr1.view.html_scores.scores_section`), if any,
    placed before the index of wrong answers."""
    body = []
    shown: list[Mapping[str, object]] = []
    for name, records in sections:
        if name is not None:
            body.append(f'<h2 class="step">{_e(name)}</h2>')
        start = len(shown)
        body.extend(_article(record, start + offset) for offset, record in enumerate(records, 1))
        shown.extend(records)
    note_lines = "".join(f"<p>{_e(note)}</p>" for note in notes)
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="referrer" content="no-referrer">',
        f"<title>{_e(heading)}</title>",
        f"<style>{STYLE}</style>",
        "</head>",
        "<body>",
        f'<header class="page"><h1>{_e(heading)}</h1>{note_lines}</header>',
        "<main>",
        scores,
        wrong_answers_index(shown),
        *body,
        "</main>",
        "</body>",
        "</html>",
        "",
    ])
