"""``--tools``: every command that rolls out takes it, its help names every declared tool, and a
tool the search backend cannot run (open_page with deepseek or zhihu: no pages to read) is one
line naming the flag before any work."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.core.tools import DECLARED

ROLLING_OUT = ("train", "eval", "rollout", "ask", "serve")


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*map(str, args)])
    return result.exit_code, result.output


@pytest.mark.parametrize("command", ROLLING_OUT)
def test_the_tools_help_names_every_declared_tool(command):
    code, output = invoke(command, "--help")
    assert code == 0
    text = " ".join(output.split())
    assert "--tools NAMES" in text
    for name in DECLARED:
        assert name in text.split("--tools NAMES", 1)[1].split("--", 1)[0], name


@pytest.mark.parametrize("command", ROLLING_OUT)
@pytest.mark.parametrize("backend", ["deepseek", "zhihu"])
def test_open_page_with_a_backend_that_has_no_pages_is_one_line_before_any_work(tmp_path, command, backend):
    extra = {"train": ["--run-dir", tmp_path / "run", "--max-steps", "1"], "eval": ["--output", tmp_path / "e.jsonl"],
             "ask": ["who wrote the novel the little prince?"], "rollout": [], "serve": []}[command]
    code, output = invoke(command, "--offline", "--backend", backend, "--tools", "search,open_page", *extra)
    assert code == 2, output
    assert "Traceback" not in output
    assert output.strip().splitlines()[-1] == (
        f"Error: --tools open_page reads the pages of --backend local, wikipedia or retriever only (this command "
        f"searches with {backend}); pass --backend local or drop open_page")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("tools, reason", [("search,calculator", "names an undeclared tool 'calculator'"),
                                           ("search,search", "names a tool twice")])
def test_an_undeclared_or_repeated_tool_is_refused_by_its_declaration(tmp_path, tools, reason):
    code, output = invoke("train", "--offline", "--run-dir", tmp_path / "run", "--tools", tools)
    assert code == 2 and reason in output.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []
