"""A command that cannot start says everything that stops it in one message, a line each, within
a moment of starting: the data, every key the chosen search backend and judge need, the PyTRIO
key, whether PyTRIO's host refuses connections, the run directory. The tokenizer (seconds) is
loaded only after all of those have passed, and no key is ever printed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.offline import DEV, TRAIN

# What "within a moment" may take here: the checks answer in about a second on two idle cores
# (interpreter and imports included); the rest is margin for a busy machine. Loading the
# tokenizer first takes several seconds more.
START_UP_LIMIT = 2.0 + 4.0
FAKE_DEEPSEEK_KEY = "sk-fake-deepseek-key-0042"
FAKE_PYTRIO_KEY = "pytrio-fake-key-0043"
URL_PASSWORD = "url-pass-0044"

# The command, with a tokenizer loader that says so and stops the process: any check that runs
# after it shows as a missing line, and the exit code tells that the tokenizer was reached.
WITHOUT_TOKENIZER = textwrap.dedent(
    """
    import os, sys
    from searchr1.wiring import services
    def load_tokenizer(*args, **kwargs):
        sys.stderr.write("THE TOKENIZER WAS LOADED\\n")
        sys.stderr.flush()
        os._exit(99)
    services.load_tokenizer = load_tokenizer
    from searchr1.cli import main
    main(sys.argv[1:])
    """
)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when this returns: nothing listens there


def taken_run_dir(root: Path) -> Path:
    """A run directory with another run's finished step in it."""
    run_dir = root / "runs" / "taken"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    (run_dir / "notes.txt").write_text("mine\n")
    return run_dir


def environment(home: Path, **extra: str) -> dict[str, str]:
    """The test process's environment without any key or PyTRIO profile (HOME is ``home``)."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYTRIO_API_KEY", "PYTRIO_BASE_URL", "PYTRIO_ENV", "DEEPSEEK_API_KEY",
                           "ZHIHU_SEARCH_KEYS")}
    return {**env, "HOME": str(home), **extra}


def started(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """The command run as a process of its own, and its wall time from start to exit."""
    begun = time.monotonic()
    process = subprocess.run([sys.executable, "-c", WITHOUT_TOKENIZER, *args], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=120)
    return process, time.monotonic() - begun


def problem_lines(stderr: str) -> list[str]:
    return [line.removeprefix("  - ") for line in stderr.splitlines() if line.startswith("  - ")]


def test_train_says_every_missing_prerequisite_at_once_within_a_moment(tmp_path):
    run_dir = taken_run_dir(tmp_path)
    port = closed_port()
    env = environment(tmp_path, PYTRIO_BASE_URL=f"http://alice:{URL_PASSWORD}@127.0.0.1:{port}")
    process, seconds = started(["train", "--preflight-only", "--max-steps", "2", "--run-dir", str(run_dir)],
                               tmp_path, env)
    assert process.returncode == 1, process.stderr[-3000:]
    assert "THE TOKENIZER WAS LOADED" not in process.stderr and "Traceback" not in process.stderr
    assert "Error: 5 problems to fix before the run can start:" in process.stderr
    lines = problem_lines(process.stderr)
    assert len(lines) == 5, process.stderr
    data, search_key, taken, pytrio_key, refused = lines
    assert data.startswith("training data datasets/train.jsonl does not exist") and "--data" in data
    assert search_key.startswith("DEEPSEEK_API_KEY is not set") and ".env" in search_key
    assert taken.startswith(f"run directory {run_dir} already exists")
    assert pytrio_key.startswith("no PyTRIO API key") and "PYTRIO_API_KEY" in pytrio_key
    assert f"127.0.0.1:{port} refused the connection" in refused and "PYTRIO_BASE_URL" in refused
    assert URL_PASSWORD not in process.stderr and "alice" not in process.stderr
    assert seconds < START_UP_LIMIT, f"{seconds:.1f} s"
    assert sorted(path.name for path in run_dir.iterdir()) == ["metrics.jsonl", "notes.txt"]  # as it was


def test_train_with_data_and_keys_names_the_rest_before_the_tokenizer_and_never_a_key(tmp_path):
    run_dir = taken_run_dir(tmp_path)
    port = closed_port()
    env = environment(tmp_path, PYTRIO_BASE_URL=f"http://127.0.0.1:{port}", PYTRIO_API_KEY=FAKE_PYTRIO_KEY,
                      DEEPSEEK_API_KEY=FAKE_DEEPSEEK_KEY)
    process, seconds = started(["train", "--max-steps", "2", "--data", str(TRAIN), "--run-dir", str(run_dir)],
                               tmp_path, env)
    assert process.returncode == 1, process.stderr[-3000:]
    assert "THE TOKENIZER WAS LOADED" not in process.stderr
    taken, refused = problem_lines(process.stderr)
    assert taken.startswith(f"run directory {run_dir} already exists")
    assert f"127.0.0.1:{port} refused the connection" in refused
    assert FAKE_DEEPSEEK_KEY not in process.stderr and FAKE_PYTRIO_KEY not in process.stderr
    assert seconds < START_UP_LIMIT, f"{seconds:.1f} s"


def test_eval_says_every_missing_prerequisite_at_once_within_a_moment(tmp_path):
    port = closed_port()
    env = environment(tmp_path, PYTRIO_BASE_URL=f"http://127.0.0.1:{port}")
    process, seconds = started(["eval", "--quiet", "--judge", "deepseek-chat", "--output",
                                str(tmp_path / "out.jsonl")], tmp_path, env)
    assert process.returncode == 1, process.stderr[-3000:]
    assert "THE TOKENIZER WAS LOADED" not in process.stderr and "Traceback" not in process.stderr
    assert "Error: 4 problems to fix before the evaluation can start:" in process.stderr
    data, deepseek_key, pytrio_key, refused = problem_lines(process.stderr)  # the judge's key is the search's
    assert data.startswith("eval data datasets/dev.jsonl does not exist")
    assert deepseek_key.startswith("DEEPSEEK_API_KEY is not set")
    assert pytrio_key.startswith("no PyTRIO API key")
    assert f"127.0.0.1:{port} refused the connection" in refused
    assert seconds < START_UP_LIMIT, f"{seconds:.1f} s"
    assert not (tmp_path / "out.jsonl").exists()


def test_an_offline_run_needs_no_key_and_no_service(tmp_path):
    run_dir = taken_run_dir(tmp_path)
    env = environment(tmp_path, PYTRIO_BASE_URL=f"http://127.0.0.1:{closed_port()}")
    process, _ = started(["train", "--offline", "--run-dir", str(run_dir)], tmp_path, env)
    assert process.returncode == 1, process.stderr[-3000:]
    assert "THE TOKENIZER WAS LOADED" not in process.stderr
    last = process.stderr.strip().splitlines()[-1]  # one problem: one line, as a single failure always was
    assert last.startswith(f"Error: run directory {run_dir} already exists")
    assert "PyTRIO" not in process.stderr and "API_KEY" not in process.stderr


@pytest.fixture
def no_keys(tmp_path, monkeypatch):
    for name in ("PYTRIO_API_KEY", "DEEPSEEK_API_KEY", "ZHIHU_SEARCH_KEYS", "PYTRIO_ENV"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PYTRIO_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.chdir(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer was loaded before the start-up checks reported")

    monkeypatch.setattr("searchr1.wiring.services.load_tokenizer", refuse)


def test_the_first_problem_decides_the_exit_code(no_keys, tmp_path):
    # a flag the backend does not read is a usage error (2); a missing data file first makes it 1
    usage_first = CliRunner().invoke(main, ["train", "--max-steps", "1", "--data", str(TRAIN),
                                            "--search-topk", "3"])
    assert usage_first.exit_code == 2, usage_first.output
    assert "--search-topk" in usage_first.output and "PYTRIO_API_KEY" in usage_first.output
    data_first = CliRunner().invoke(main, ["train", "--max-steps", "1", "--search-topk", "3"])
    assert data_first.exit_code == 1, data_first.output
    assert "training data" in data_first.output and "--search-topk" in data_first.output


def test_a_preset_is_named_on_the_line_of_the_flag_it_set(no_keys, tmp_path):
    run_dir = taken_run_dir(tmp_path)
    preset = tmp_path / "preset.toml"
    preset.write_text(f'run_dir = "{run_dir}"\n')
    result = CliRunner().invoke(main, ["train", "--config", str(preset), "--max-steps", "1", "--data", str(DEV)])
    assert result.exit_code == 1, result.output
    lines = problem_lines(result.output)
    taken = next(line for line in lines if "already exists" in line)
    assert taken.endswith(f"(set in {preset}, line 1)")
    assert sum(f"set in {preset}" in line for line in lines) == 1
