"""CONTRIBUTING's "Reading the core" names every module and package of searchr1/core once, and
nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import searchr1.core

CORE = Path(searchr1.core.__file__).parent
CONTRIBUTING = CORE.parent.parent / "CONTRIBUTING.md"


def reading_order(text: str) -> list[str]:
    """The module names of the numbered list under the heading ``## Reading the core``."""
    section = text.split("## Reading the core", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. `([^`]+)`", section, re.MULTILINE)


def core_parts() -> set[str]:
    """Every module directly in searchr1/core (``__init__`` aside) and every package in it."""
    modules = {path.name for path in CORE.glob("*.py") if path.name != "__init__.py"}
    packages = {path.name + "/" for path in CORE.iterdir() if (path / "__init__.py").exists()}
    return modules | packages


def test_the_reading_order_names_every_part_of_the_core_once():
    listed = reading_order(CONTRIBUTING.read_text("utf-8"))
    assert len(listed) == len(set(listed)), "a part is listed twice"
    assert set(listed) == core_parts()


def test_the_list_is_read_from_its_section_only():
    text = "## Reading the core\n\n1. `a.py`: x\n2. `b/`: y\n\n## Next\n\n3. `c.py`: z\n"
    assert reading_order(text) == ["a.py", "b/"]
