"""``--checkpoint`` of ``ask`` and ``serve`` resolved in one place: a run directory's records win
over the flags, a weights path keeps them, and each combination that cannot work is one usage
error, the same for both commands."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.commands.checkpoint_flag import resolve_checkpoint

FLAGS = {"base_model": "Qwen/Qwen3.5-4B", "offline": False, "offline_home": None, "offline_policy": "learning"}


def _run_dir(tmp_path: Path, *, offline: bool, policy: str | None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    config = {"offline": offline, "base_model": "recorded/model", "offline_policy": policy}
    (run / "config.json").write_text(json.dumps(config))
    (run / "run_state.json").write_text("{}")
    (run / "checkpoints.jsonl").write_text(json.dumps({"name": "c", "step": 3, "cursor": 24, "state_path": "trio://s",
                                                       "weights_path": "trio://w3"}) + "\n")
    return run


def test_no_checkpoint_is_the_base_model_as_flagged():
    chosen = resolve_checkpoint(None, **FLAGS)
    assert (chosen.model_path, chosen.base_model, chosen.from_run_dir) == (None, "Qwen/Qwen3.5-4B", False)


def test_a_weights_path_keeps_the_flags():
    home = Path("runs/r/twin")
    chosen = resolve_checkpoint("trio://w", **{**FLAGS, "offline": True, "offline_home": home})
    assert (chosen.model_path, chosen.offline, chosen.offline_home, chosen.from_run_dir) == ("trio://w", True, home,
                                                                                             False)


@pytest.mark.parametrize("offline, policy", [(True, "scripted"), (True, None), (False, None)])
def test_a_run_directory_s_records_replace_the_flags(tmp_path, offline, policy):
    run = _run_dir(tmp_path, offline=offline, policy=policy)
    chosen = resolve_checkpoint(str(run), **FLAGS)
    assert chosen.from_run_dir and chosen.model_path == "trio://w3" and chosen.base_model == "recorded/model"
    assert chosen.offline is offline
    assert chosen.offline_home == (run / "twin" if offline else None)
    assert chosen.offline_policy == (policy or FLAGS["offline_policy"])


@pytest.mark.parametrize("checkpoint, flags, message", [
    ("RUN", {"offline_home": Path("h")}, "--offline-home is for a checkpoint path"),
    ("trio://w", {"offline": True}, "an offline checkpoint path needs --offline-home"),
    ("trio://w", {"offline_home": Path("h")}, "--offline-home only applies with --offline"),
    (None, {"offline_home": Path("h")}, "--offline-home only applies with --offline"),
])
def test_combinations_that_cannot_work_are_one_usage_error(tmp_path, checkpoint, flags, message):
    if checkpoint == "RUN":
        checkpoint = str(_run_dir(tmp_path, offline=True, policy=None))
    with pytest.raises(click.UsageError, match=message):
        resolve_checkpoint(checkpoint, **{**FLAGS, **flags})


@pytest.mark.parametrize("command", [["ask", "Who wrote Dune?"], ["serve"]])
def test_ask_and_serve_refuse_the_same_combinations(command):
    result = CliRunner().invoke(main, [*command, "--checkpoint", "trio://w", "--offline"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "an offline checkpoint path needs --offline-home" in result.output
