"""CONTRIBUTING.md stays short enough to read before a first change, and the repository's own
Markdown links (README, CONTRIBUTING, docs/, cassettes/) lead to files and headings that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "cassettes" / "README.md",
         *sorted((REPO / "docs").glob("*.md"))]
LIMIT = 16_000


def test_contributing_stays_under_its_limit():
    size = len((REPO / "CONTRIBUTING.md").read_text("utf-8"))
    assert size < LIMIT, f"CONTRIBUTING.md is {size} characters; move depth to docs/contributing-details.md"


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page``: lower case, punctuation dropped, spaces
    made hyphens, a repeated heading numbered."""
    text = re.sub(r"```.*?```", "", page.read_text("utf-8"), flags=re.S)
    found: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def links(page: Path) -> list[tuple[str, str]]:
    """Each relative link of ``page`` as (path, anchor); code blocks and spans left out."""
    text = re.sub(r"```.*?```|`[^`\n]*`", "", page.read_text("utf-8"), flags=re.S)
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        out.append((path, anchor))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for path, anchor in links(page):
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{path}#{anchor}" if anchor else path)
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{path}#{anchor}")
    assert broken == []


def test_the_link_check_sees_a_broken_link_and_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A `code` heading, here\n\n[a](page.md#a-code-heading-here) [b](missing.md) "
                    "[c](#no-such-heading) [d](https://example.org)\n")
    assert anchors(page) == {"title", "a-code-heading-here"}
    assert links(page) == [("page.md", "a-code-heading-here"), ("missing.md", ""), ("", "no-such-heading")]
