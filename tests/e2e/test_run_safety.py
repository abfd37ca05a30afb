"""Nothing lost, nothing misleading: one process per run directory and eval output (an OS lock
the kernel drops when the process dies), resumes that refuse directories whose files disagree
and mend a torn last line, and full, read-only or forbidden disks reported in one line naming
the file before or instead of a traceback."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from warm_python import run_python

from searchr1.cli import main
from searchr1.basics.fileio import cut_torn_tail, write_json_atomically, write_text_atomically
from searchr1.run.directory import RunDir
from searchr1.evaluation.transcripts import TRANSCRIPTS_FILE, read_run_transcripts

REPO = Path(__file__).resolve().parents[2]
TRAIN = ["train", "--offline", "--offline-policy", "scripted", "--quiet", "--questions-per-batch", "4",
         "--group-size", "4", "--backend", "wikipedia"]
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
as_non_root = pytest.mark.skipif(IS_ROOT, reason="root ignores file permissions")

HOLD_LOCK = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    kind, path = sys.argv[1], Path(sys.argv[2])
    if kind == "run":
        from searchr1.run.directory import RunDir
        held = RunDir(path).locked()
    else:
        from searchr1.commands.eval import output_lock_path
        from searchr1.basics.fileio import exclusive_lock
        held = exclusive_lock(output_lock_path(path), "eval output")
    with held:
        print("locked", flush=True)
        sys.stdin.readline()
    """
)


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*map(str, args)])
    return result.exit_code, result.output


def holder(kind: str, path: Path) -> subprocess.Popen:
    """Another process holding the lock of ``path`` until it is killed."""
    process = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, kind, str(path)], cwd=REPO, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline().strip() == "locked", process.stderr.read()
    return process


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """Two scripted steps, a checkpoint after each (built once, copied by each test)."""
    path = tmp_path_factory.mktemp("trained") / "run"
    code, output = run_cli(*TRAIN, "--max-steps", "2", "--save-every", "1", "--run-dir", path)
    assert code == 0, output
    return path


@pytest.fixture
def run_copy(trained_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy)
    return copy


# --- one process per run directory ---------------------------------------------------------------


def test_a_locked_run_directory_refuses_a_second_train_at_once_and_a_killed_holder_leaves_no_lock(run_copy):
    before = (run_copy / "metrics.jsonl").read_bytes()
    process = holder("run", run_copy)
    try:
        for args in (["--resume", run_copy, "--max-steps", "3"], [*TRAIN[1:], "--run-dir", run_copy]):
            code, output = run_cli("train", *args)
            assert code == 1, output
            assert str(run_copy) in output and f"pid {process.pid}" in output and "in use" in output
            assert "Traceback" not in output and len(output.strip().splitlines()) <= 3
        assert (run_copy / "metrics.jsonl").read_bytes() == before
    finally:
        process.kill()  # SIGKILL: nothing of the holder runs any more
        process.wait()
    code, output = run_cli("train", "--resume", run_copy, "--max-steps", "3")
    assert code == 0, output
    assert [m["step"] for m in RunDir(run_copy).metrics()] == [0, 1, 2]


def test_train_holds_its_run_directory_for_its_whole_life(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    attempts = []
    original = RunDir.append_metrics

    def append_and_try_the_lock(self, record):
        original(self, record)
        attempts.append(subprocess.run(
            [sys.executable, "-c", "import sys; from searchr1.run.directory import RunDir\n"
             "with RunDir(sys.argv[1]).locked(): pass", str(run_dir)],
            cwd=REPO, capture_output=True, text=True, timeout=60))

    monkeypatch.setattr(RunDir, "append_metrics", append_and_try_the_lock)
    code, output = run_cli(*TRAIN, "--max-steps", "1", "--run-dir", run_dir)
    assert code == 0, output
    assert len(attempts) == 1 and attempts[0].returncode != 0
    assert f"run directory {run_dir} is in use by another process (pid {os.getpid()})" in attempts[0].stderr


def test_an_eval_output_another_eval_is_writing_is_refused_before_any_work(tmp_path):
    output = tmp_path / "eval.jsonl"
    process = holder("eval", output)
    try:
        code, text = run_cli("eval", "--offline", "--quiet", "--limit", "1", "--output", output)
    finally:
        process.kill()
        process.wait()
    assert code == 1, text
    assert f"eval output {output}" in text and f"pid {process.pid}" in text
    assert not output.exists()


# --- a resume checks the directory before it trusts it -------------------------------------------


def _duplicate_a_step(run: Path) -> None:
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines + lines[:1]))


def _foreign_checkpoint(run: Path) -> None:
    entry = json.loads((run / "checkpoints.jsonl").read_text().splitlines()[0])
    entry["name"] = "search-r1-qwen35-4b-0badf00d-step-000001"
    with open(run / "checkpoints.jsonl", "a") as stream:
        stream.write(json.dumps(entry) + "\n")


def _bad_state(run: Path) -> None:
    (run / "run_state.json").write_text(json.dumps({"step": "x", "cursor": None}))


@pytest.mark.parametrize("damage, named, says", [
    (_duplicate_a_step, "metrics.jsonl", "records step 0 2 times"),
    (_foreign_checkpoint, "checkpoints.jsonl", "0badf00d"),
    (_bad_state, "run_state.json", "'step' must be a whole number"),
], ids=["duplicate-steps", "foreign-run-id", "bad-run-state"])
def test_resume_refuses_a_directory_whose_files_disagree(run_copy, damage, named, says):
    damage(run_copy)
    code, output = run_cli("train", "--resume", run_copy)
    assert code == 1, output
    assert str(run_copy / named) in output and says in output
    assert "Traceback" not in output and len(output.strip().splitlines()) <= 3


TEAR_TRANSCRIPTS = textwrap.dedent(
    """
    import os, sys
    from searchr1.evaluation import transcripts
    original = transcripts.append_text
    def append_then_die(path, text):
        if '"step": 1,' in text:  # the process dies half way through writing step 1's records
            with open(path, "a", encoding="utf-8") as stream:
                stream.write(text[: len(text) // 2])
            os._exit(9)
        original(path, text)
    transcripts.append_text = append_then_die
    from searchr1.cli import main
    main(sys.argv[1:])
    """
)


def test_a_resume_cuts_a_torn_last_line_so_no_record_is_swallowed(tmp_path):
    run_dir = tmp_path / "run"
    args = [*TRAIN, "--max-steps", "3", "--save-every", "1", "--run-dir", str(run_dir)]
    process = run_python(["-c", TEAR_TRANSCRIPTS, *args], cwd=REPO, timeout=300)
    assert process.returncode == 9, process.stderr[-2000:]
    assert not (run_dir / TRANSCRIPTS_FILE).read_bytes().endswith(b"\n")  # torn, as a crash leaves it
    code, output = run_cli("train", "--resume", run_dir)
    assert code == 0, output
    assert f"{run_dir / TRANSCRIPTS_FILE}: cut off a torn last line" in output
    kept = [json.loads(line) for line in (run_dir / "metrics.rewound.jsonl").read_text().splitlines()]
    assert [k["torn_line"][:2] for k in kept if k.get("file") == TRANSCRIPTS_FILE] == ['{"']  # kept, not lost
    found = read_run_transcripts(run_dir / TRANSCRIPTS_FILE)
    assert found.torn_lines == []
    assert {step: len(records) for step, records in found.by_step.items()} == {0: 4, 1: 4, 2: 4}


@given(st.binary(max_size=200))
def test_cutting_a_torn_tail_keeps_exactly_the_lines_that_end_in_a_newline(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("tail") / "file.jsonl"
    path.write_bytes(data)
    cut = cut_torn_tail(path)
    kept = path.read_bytes()
    assert kept + cut == data
    assert kept == b"" or kept.endswith(b"\n")
    assert b"\n" not in cut


# --- full, read-only and forbidden disks -----------------------------------------------------------


@pytest.fixture
def full_disk(monkeypatch):
    """A fault-injecting writer at the OS boundary: the disk fills while a file whose name ends
    with one of ``armed`` is being flushed; part of the write reached the file, the rest did
    not, and fsync reports ENOSPC."""
    armed: dict[str, int] = {}  # name suffix -> flushes to let through first
    real_fsync = os.fsync

    def fsync(descriptor):
        target = os.readlink(f"/proc/self/fd/{descriptor}")
        for suffix in list(armed):
            if target.endswith(suffix):
                if armed[suffix] > 0:
                    armed[suffix] -= 1
                    break
                size = os.fstat(descriptor).st_size
                os.ftruncate(descriptor, size - min(size, 25))  # the tail never reached the disk
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(descriptor)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd")
    monkeypatch.setattr(os, "fsync", fsync)
    return armed


def test_a_full_disk_stops_train_with_one_line_and_the_resumed_run_loses_no_record(tmp_path, full_disk):
    run_dir = tmp_path / "run"
    full_disk[TRANSCRIPTS_FILE] = 1  # step 0's transcripts are written, step 1's fill the disk
    code, output = run_cli(*TRAIN, "--max-steps", "3", "--save-every", "1", "--run-dir", run_dir)
    assert code == 1, output
    assert output.strip().splitlines()[-1] == (f"Error: cannot write {run_dir / TRANSCRIPTS_FILE}: "
                                               "No space left on device")
    assert "Traceback" not in output
    assert (run_dir / TRANSCRIPTS_FILE).read_bytes().endswith(b"\n")  # the failed append was taken back
    full_disk.clear()  # space freed
    code, output = run_cli("train", "--resume", run_dir)
    assert code == 0, output
    found = read_run_transcripts(run_dir / TRANSCRIPTS_FILE)
    assert found.torn_lines == []
    assert {step: len(records) for step, records in found.by_step.items()} == {0: 4, 1: 4, 2: 4}


@pytest.fixture
def eval_file(tmp_path) -> Path:
    path = tmp_path / "eval.jsonl"
    code, output = run_cli("eval", "--offline", "--offline-policy", "scripted", "--quiet", "--limit", "2",
                           "--backend", "wikipedia", "--output", path)
    assert code == 0, output
    return path


@pytest.mark.parametrize("command, output_name", [
    (lambda src, out: ["show", src, "--html", out], "page.html"),
    (lambda src, out: ["plot", "eval", src, "-o", out], "figure.png"),
], ids=["show", "plot"])
def test_a_full_disk_while_writing_an_output_is_one_line_naming_it(eval_file, tmp_path, full_disk, command,
                                                                    output_name):
    output = tmp_path / output_name
    full_disk[".tmp"] = 0  # the temporary file the output is written through
    code, text = run_cli(*command(eval_file, output))
    assert code == 1, text
    assert text.strip().splitlines()[-1] == f"Error: cannot write {output}: No space left on device"
    assert not output.exists() and not list(tmp_path.glob(f".{output_name}.*"))


def test_eval_on_a_full_disk_is_one_line_naming_its_output(tmp_path, full_disk):
    output = tmp_path / "eval.jsonl"
    full_disk["eval.jsonl"] = 1
    code, text = run_cli("eval", "--offline", "--offline-policy", "scripted", "--quiet", "--limit", "2",
                         "--backend", "wikipedia", "--output", output)
    assert code == 1, text
    assert text.strip().splitlines()[-1] == f"Error: cannot write {output}: No space left on device"
    assert "Traceback" not in text


OUTPUT_COMMANDS = {
    "eval": lambda out: ["eval", "--offline", "--quiet", "--output", out / "eval.jsonl"],
    "plot": lambda out: ["plot", "run", REPO / "README.md", "-o", out / "run.png"],
    "show": lambda out: ["show", REPO / "README.md", "--html", out / "page.html"],
    "record": lambda out: ["record", "--backend", "wikipedia", "--query", "q", "--cassette", out / "c.yaml"],
}


@pytest.mark.parametrize("name", sorted(OUTPUT_COMMANDS))
def test_an_output_inside_a_file_is_refused_before_any_work(tmp_path, name):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    code, text = run_cli(*OUTPUT_COMMANDS[name](not_a_folder))
    assert code in (1, 2), text
    assert f"{not_a_folder} is not a directory" in text and "Traceback" not in text
    assert "README.md" not in text  # refused before the input was read


@as_non_root
@pytest.mark.parametrize("name", sorted(OUTPUT_COMMANDS))
def test_an_output_in_a_read_only_folder_is_refused_before_any_work(tmp_path, name):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        code, text = run_cli(*OUTPUT_COMMANDS[name](folder))
    finally:
        folder.chmod(0o755)
    assert code in (1, 2), text
    assert f"{folder} is not writable" in text and "Traceback" not in text


@as_non_root
def test_resuming_a_read_only_run_is_refused_before_any_service_call(run_copy):
    run_copy.chmod(0o555)
    try:
        code, output = run_cli("train", "--resume", run_copy, "--max-steps", "3")
    finally:
        run_copy.chmod(0o755)
    assert code == 1, output
    assert str(run_copy) in output and "not writable" in output and "service" not in output


# --- files get the mode the umask asks for ----------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_replaced_files_honour_the_umask_and_keep_an_existing_files_mode(tmp_path, umask):
    previous = os.umask(umask)
    try:
        write_json_atomically(tmp_path / "new.json", {"a": 1})
        existing = tmp_path / "existing.json"
        existing.write_text("{}")
        existing.chmod(0o640)
        write_text_atomically(existing, "{}\n")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640


# --- failures that used to mislead or wait ---------------------------------------------------------


def test_a_refused_pytrio_port_is_said_at_once_not_after_the_connect_timeout(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    env = {**os.environ, "PYTRIO_BASE_URL": f"http://127.0.0.1:{port}", "PYTRIO_API_KEY": "sk-test-refused-01"}
    process = subprocess.run(
        [sys.executable, "cli.py", "train", "--quiet", "--max-steps", "1", "--backend", "wikipedia",
         "--data", "searchr1/offline/train.jsonl", "--run-dir", str(tmp_path / "run"), "--connect-timeout", "600"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)  # far less than --connect-timeout
    assert process.returncode == 1, process.stderr[-2000:]
    last = process.stderr.strip().splitlines()[-1]
    assert f"127.0.0.1:{port} refused the connection" in last and "no answer within" not in last
    assert "sk-test-refused-01" not in process.stderr
    assert not (tmp_path / "run").exists()  # nothing written


INTERRUPT_START = textwrap.dedent(
    """
    import signal, sys
    from searchr1.wiring import services
    # Python's own Ctrl-C handler, as in a terminal (a shell starts background jobs with SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    def load_tokenizer(*args, **kwargs):
        # Ctrl-C while the run is starting: raise_signal runs the handler before it returns
        # (os.kill then pause could miss it: the signal may be handled only after pause began).
        signal.raise_signal(signal.SIGINT)
        raise AssertionError("the Ctrl-C was not delivered")
    services.load_tokenizer = load_tokenizer
    from searchr1.cli import main
    main(sys.argv[1:])
    """
)


def test_ctrl_c_during_start_up_exits_130_like_everywhere_else(tmp_path):
    process = subprocess.run([sys.executable, "-c", INTERRUPT_START, *TRAIN, "--run-dir", str(tmp_path / "r")],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert process.returncode == 130, process.stderr[-2000:]
    assert "interrupted" in process.stderr and "Traceback" not in process.stderr
    assert not (tmp_path / "r").exists()
    assert process.stderr.strip().splitlines()[-1] == (
        "train interrupted (Ctrl-C) during start-up, before the first step: nothing was trained, so nothing is "
        "lost or to resume; run the same command again to start")


def interrupt_start_up(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", INTERRUPT_START, *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_ctrl_c_while_a_resume_starts_says_the_run_is_as_it_was_and_how_to_continue(run_copy):
    before = (run_copy / "metrics.jsonl").read_bytes()
    process = interrupt_start_up("train", "--resume", run_copy, "--max-steps", "3")
    assert process.returncode == 130, process.stderr[-2000:]
    line = process.stderr.strip().splitlines()[-1]
    assert line.startswith("train interrupted (Ctrl-C) during start-up") and "Traceback" not in process.stderr
    assert f"{run_copy} is as it was, nothing in it lost" in line and f"train --resume {run_copy})" in line
    assert (run_copy / "metrics.jsonl").read_bytes() == before


def test_ctrl_c_while_an_eval_starts_names_the_output_and_says_nothing_is_lost(tmp_path):
    output = tmp_path / "eval.jsonl"
    process = interrupt_start_up("eval", "--offline", "--quiet", "--limit", "1", "--output", output)
    assert process.returncode == 130, process.stderr[-2000:]
    assert process.stderr.strip().splitlines()[-1] == (
        f"eval interrupted (Ctrl-C) during start-up, before any question was evaluated; {output} is as it was, "
        "nothing in it lost: run the same command again to start")
