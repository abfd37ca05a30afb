"""Command lines the program prints start the way the user started it, and only
:func:`searchr1.basics.invocation.command` writes that start: no other string the package can
print names the program (``python cli.py``, ``cli.py``, ``searchr1 <command>``)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import searchr1
from searchr1.commands.main import COMMANDS
from searchr1.basics import invocation

PACKAGE = Path(searchr1.__file__).resolve().parent
NAMES_THE_PROGRAM = re.compile(r"\bcli\.py\b|\bsearchr1 (?:%s)\b" % "|".join(map(re.escape, COMMANDS)))
# strings that name the program without telling the user what to run, each with its reason
NOT_HINTS = {
    ("searchr1/commands/export.py", "searchr1 export"),  # the producer in an exported file's metadata
}


def printable_strings(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every string constant in ``path`` (f-strings' literal parts, function
    and class docstrings, which click shows as help, included), except the module docstring,
    which only readers of the source see."""
    tree = ast.parse(path.read_text("utf-8"), filename=str(path))
    module_docstring = ast.get_docstring(tree, clean=False) is not None and tree.body[0].value
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node is not module_docstring]


def program_names(path: Path) -> list[str]:
    where = path.relative_to(PACKAGE.parent).as_posix()
    return [f"{where}:{line}: {text.strip()[:100]!r}" for line, text in printable_strings(path)
            if NAMES_THE_PROGRAM.search(text) and (where, text) not in NOT_HINTS]


@pytest.mark.slow  # reads every string in the package (a second)
def test_no_string_but_the_invocation_modules_names_the_program():
    own = PACKAGE / "basics" / "invocation.py"
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path != own for hit in program_names(path)]
    assert found == []
    assert program_names(own)  # the probe does see the one module that names it


def test_the_probe_reads_f_strings_and_help_docstrings_but_not_the_module_docstring(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text('"""Run ``python cli.py train``."""\n\n'
                      'def f(run):\n    """Example: searchr1 eval --offline"""\n'
                      '    return f"resume with: python cli.py train --resume {run}"\n', "utf-8")
    texts = [text for _, text in printable_strings(source)]
    assert texts == ["Example: searchr1 eval --offline", "resume with: python cli.py train --resume "]
    assert all(NAMES_THE_PROGRAM.search(text) for text in texts)
    assert not NAMES_THE_PROGRAM.search("this searchr1 reads format 3; the train command")


@pytest.mark.parametrize(("name", "program"), [
    ("searchr1", "searchr1"),
    ("python -m searchr1.cli", "python -m searchr1.cli"),
    ("cli.py", "python cli.py"),
])
def test_a_script_file_runs_with_python_and_any_other_name_as_it_is(name, program, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/usr/bin/pytest"])
    assert invocation.program_for(name) == program


def test_a_script_started_by_its_path_is_named_by_that_path(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["../checkout dir/cli.py", "train"])
    assert invocation.program_for("cli.py") == "python '../checkout dir/cli.py'"


def test_command_lines_start_with_the_recorded_program_and_outside_a_run_with_the_script(monkeypatch):
    monkeypatch.setattr(invocation, "_invoked", None)
    assert invocation.command("train --resume runs/x") == "searchr1 train --resume runs/x"
    invocation.record("python cli.py")
    assert invocation.command("train --resume runs/x") == "python cli.py train --resume runs/x"
    assert invocation.command() == "python cli.py"
    invocation.record(None)
    assert invocation.command("eval") == "searchr1 eval"


def test_generated_files_name_the_checkout_whoever_runs_the_generator(monkeypatch):
    monkeypatch.setattr(invocation, "_invoked", "searchr1")
    assert invocation.command("cassettes build", checkout=True) == "python cli.py cassettes build"


def test_fill_puts_the_program_wherever_a_help_text_says_so(monkeypatch):
    monkeypatch.setattr(invocation, "_invoked", "python cli.py")
    text = f"Live: {invocation.PROGRAM} train --max-steps 9\nOffline: {invocation.PROGRAM} train --offline"
    assert invocation.fill(text) == "Live: python cli.py train --max-steps 9\nOffline: python cli.py train --offline"
    assert invocation.fill("no program here {max_search_calls}") == "no program here {max_search_calls}"
