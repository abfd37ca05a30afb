"""``serve`` and ``retriever serve`` on the command line: a host other machines reach needs
``--api-key`` (or ``$SEARCHR1_SERVE_API_KEY``) or ``--allow-anyone``, refused in one line before
anything starts; the key is a Secret from the moment it is read; ``serve`` offers no flag it
ignores."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.commands.retriever import serve as retriever_serve
from searchr1.commands.serve import refuse_overridden, serve
from searchr1.runtime.api_key import API_KEY_ENV
from searchr1.basics.secrets import Secret

KEY = "cli-test-key-0123456789abcdef"
COMMANDS = {"serve": ["serve"], "retriever serve": ["retriever", "serve", "--index", "no-such-index"]}


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env={API_KEY_ENV: None, **(env or {})})
    return result.exit_code, result.output


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "example.org", ""])
def test_a_host_other_machines_reach_needs_a_key_or_allow_anyone(command, host):
    code, output = invoke(*COMMANDS[command], "--host", host)
    assert code == 2 and "Traceback" not in output
    (line,) = [line for line in output.splitlines() if line.startswith("Error:")]
    assert "--api-key" in line and API_KEY_ENV in line and "--allow-anyone" in line


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("access", [["--allow-anyone"], ["--api-key", KEY], []])
def test_a_key_or_allow_anyone_lets_the_command_go_on(command, access):
    """Past the rule, each command stops at its next check (serve: --offline-policy without
    --offline; retriever serve: the missing index), which proves the rule let it through."""
    extra = ["--offline-policy", "scripted"] if command == "serve" else []
    env = {API_KEY_ENV: KEY} if not access else None
    code, output = invoke(*COMMANDS[command], "--host", "0.0.0.0", *access, *extra, env=env)
    assert "lets other machines call" not in output
    assert ("--offline-policy only applies with --offline" if command == "serve" else "no-such-index") in output
    assert KEY not in output


@pytest.mark.parametrize("command", COMMANDS)
def test_a_key_beside_allow_anyone_or_one_that_cannot_travel_in_a_header_is_refused_without_showing_it(command):
    code, output = invoke(*COMMANDS[command], "--allow-anyone", env={API_KEY_ENV: KEY})
    assert code == 2 and "--allow-anyone" in output and KEY not in output
    for bad in ("short-key", "a key with spaces in it", "ключ-" + "x" * 20):
        code, output = invoke(*COMMANDS[command], "--api-key", bad)
        assert code == 2 and "--api-key" in output and bad not in output


@pytest.mark.parametrize("command, args", [(serve, []), (retriever_serve, ["--index", "x"])])
def test_the_key_is_a_secret_from_the_moment_it_is_read(command, args):
    context = command.make_context("serve", ["--api-key", KEY, *args])
    assert isinstance(context.params["api_key"], Secret) and context.params["api_key"].reveal() == KEY
    assert KEY not in repr(context.params) and KEY not in str(context.params)


def test_serve_offers_no_group_size_it_would_ignore():
    code, output = invoke("serve", "--help")
    assert code == 0 and "--group-size" not in output and "--api-key" in output and "--allow-anyone" in output
    code, output = invoke("serve", "--group-size", "2")
    assert code == 2 and "No such option '--group-size'" in output


def test_a_flag_the_run_directory_would_override_is_refused():
    refuse_overridden({"--base-model": ("Qwen/Qwen3.5-4B", "Qwen/Qwen3.5-4B")}, {"base_model"}, "runs/r")
    refuse_overridden({"--base-model": ("other/model", "Qwen/Qwen3.5-4B")}, set(), "runs/r")  # not given: default
    with pytest.raises(click.UsageError, match=r"--base-model other/model contradicts runs/r.*drop --base-model"):
        refuse_overridden({"--base-model": ("other/model", "Qwen/Qwen3.5-4B")}, {"base_model"}, "runs/r")
    with pytest.raises(click.UsageError, match=r"^--offline contradicts runs/r, which records offline = False"):
        refuse_overridden({"--offline": (True, False)}, {"offline"}, "runs/r")
