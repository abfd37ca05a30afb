"""A full disk is one line naming the path, whichever writer meets it (ours, the twin's, a
library's inside ``index build``); and everything written keeps the mode the umask gives."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from searchr1.bm25.corpus import passage_row
from searchr1.cli import main

TRAIN = ["train", "--offline", "--offline-policy", "scripted", "--quiet", "--questions-per-batch", "4",
         "--group-size", "4", "--backend", "wikipedia"]
PASSAGES = [("Hamlet", "Hamlet is a tragedy written by William Shakespeare."),
            ("Paris", "Paris is the capital of France, on the Seine.")]


def run_cli(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*map(str, args)])
    return result.exit_code, result.output


def write_corpus(path: Path) -> Path:
    path.write_text("".join(passage_row(f"doc-{i}", t, x) for i, (t, x) in enumerate(PASSAGES)), "utf-8")
    return path


@pytest.fixture
def full_under(monkeypatch):
    """A fault-injecting disk: any fsync of a file whose path holds one of the armed fragments
    reports ENOSPC (a stream's fsync names no file, as the kernel's does not)."""
    armed: list[str] = []
    real_fsync = os.fsync

    def fsync(descriptor):
        target = os.readlink(f"/proc/self/fd/{descriptor}")
        if any(fragment in target for fragment in armed):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(descriptor)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd")
    monkeypatch.setattr(os, "fsync", fsync)
    return armed


def only_error_line(output: str) -> str:
    assert "Traceback" not in output, output
    return output.strip().splitlines()[-1]


def test_the_twin_reports_its_own_full_disk_as_a_disk_error_naming_the_path(tmp_path, full_under):
    run_dir = tmp_path / "run"
    full_under.append(f"{os.sep}twin{os.sep}runs{os.sep}")  # the twin's run.json and checkpoints
    code, output = run_cli(*TRAIN, "--max-steps", "1", "--run-dir", run_dir)
    assert code == 1, output
    line = only_error_line(output)
    assert "No space left on device" in line and str(run_dir / "twin" / "runs") in line, line
    assert "internal_error" not in line and "Retry later" not in line, line


def test_index_build_on_a_full_disk_is_one_line_naming_the_index(tmp_path, full_under):
    corpus, out = write_corpus(tmp_path / "corpus.jsonl"), tmp_path / "index"
    full_under.append(".building")  # the hidden staging directory the index is built in
    code, output = run_cli("index", "build", corpus, "--out", out, "--quiet")
    assert code == 1, output
    assert only_error_line(output) == f"Error: cannot write {out}: No space left on device"
    assert not out.exists()  # no half-built index under its name


def test_a_short_write_without_an_errno_still_names_the_index(tmp_path, monkeypatch):
    real_fsync = os.fsync

    def short_write(descriptor):  # numpy's tofile says this, with no errno, when the disk fills mid-array
        if ".building" in os.readlink(f"/proc/self/fd/{descriptor}"):
            raise OSError("58509 requested and 31712 written")
        return real_fsync(descriptor)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd")
    monkeypatch.setattr(os, "fsync", short_write)
    corpus, out = write_corpus(tmp_path / "corpus.jsonl"), tmp_path / "index"
    code, output = run_cli("index", "build", corpus, "--out", out, "--quiet")
    assert code == 1, output
    line = only_error_line(output)
    assert line.startswith(f"Error: cannot write {out}: ") and "31712" in line, line


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def test_an_index_directory_and_its_files_follow_the_umask(tmp_path, umask_022):
    corpus, out = write_corpus(tmp_path / "corpus.jsonl"), tmp_path / "index"
    code, output = run_cli("index", "build", corpus, "--out", out, "--quiet")
    assert code == 0, output
    found = modes(out)
    assert {path: mode for path, mode in found.items() if (out / path).is_dir() and mode != 0o755} == {}
    assert {path: mode for path, mode in found.items() if (out / path).is_file() and mode != 0o644} == {}


def test_the_twins_run_json_and_checkpoints_follow_the_umask(tmp_path, umask_022):
    run_dir = tmp_path / "run"
    code, output = run_cli(*TRAIN, "--max-steps", "1", "--save-every", "1", "--run-dir", run_dir)
    assert code == 0, output
    twin_runs = run_dir / "twin" / "runs"
    written = [p for p in twin_runs.rglob("*") if p.is_file()]
    assert any(p.name == "run.json" for p in written) and any(p.suffix == ".npz" for p in written)
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in written
            if stat.S_IMODE(p.stat().st_mode) != 0o644} == {}


# --- an eval output given through a symbolic link ------------------------------------------------

EVAL = ["eval", "--offline", "--offline-policy", "scripted", "--quiet", "--limit", "2", "--backend", "wikipedia"]


def test_an_eval_output_named_through_a_link_shares_the_lock_of_the_file_it_points_to(tmp_path):
    from searchr1.commands.eval import output_lock_path
    from searchr1.basics.fileio import FileInUseError, exclusive_lock

    real, link = tmp_path / "a.jsonl", tmp_path / "link.jsonl"
    link.symlink_to(real.name)
    with exclusive_lock(output_lock_path(real), "eval output"):
        with pytest.raises(FileInUseError):
            with exclusive_lock(output_lock_path(link), "eval output"):
                pass
        code, output = run_cli(*EVAL, "--output", link)
    assert code == 1 and "in use by another process" in output, output
    assert not real.exists()


def test_an_eval_written_through_a_link_leaves_the_link_and_fills_its_target(tmp_path):
    elsewhere = tmp_path / "results"
    elsewhere.mkdir()
    real, link = elsewhere / "a.jsonl", tmp_path / "link.jsonl"
    link.symlink_to(real)
    code, output = run_cli(*EVAL, "--output", link)
    assert code == 0, output
    code, output = run_cli(*EVAL, "--output", link)  # a resume rewrites the file whole
    assert code == 0, output
    assert link.is_symlink() and Path(os.readlink(link)) == real
    assert real.is_file() and real.read_text("utf-8").count("\n") >= 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.jsonl", "results"]


def test_record_on_a_full_disk_names_the_cassette(tmp_path, full_under, monkeypatch):
    import httpx

    import searchr1.commands.record as record_module

    def retriever(request):
        hit = {"document": {"id": "1", "contents": '"Le Petit Prince"\nA novella.'}, "score": 1.0}
        return httpx.Response(200, json={"result": [[hit]]})

    real_factory = record_module.create_search_backend
    monkeypatch.setattr(record_module, "create_search_backend", lambda name, **kw: real_factory(
        name, transport=httpx.MockTransport(retriever), **kw))
    target = tmp_path / "out.yaml"
    full_under.append(".recording")  # the temporary file the cassette is written through
    code, output = run_cli("record", "--backend", "retriever", "--retriever-url", "http://127.0.0.1:9/retrieve",
                           "--query", "The Little Prince author", "--cassette", target)
    assert code == 1, output
    assert only_error_line(output) == f"Error: cannot write {target}: No space left on device; nothing was written"
    assert not target.exists()


def test_eval_onto_a_full_disk_is_one_line_naming_the_output(tmp_path, monkeypatch):
    """A full disk lets eval create its files but not put a byte in them: the first write is the
    pid in the output's lock, which names no file unless the writer names it."""

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    monkeypatch.setattr(os, "write", full)
    output = tmp_path / "results" / "eval.jsonl"
    code, text = run_cli(*EVAL, "--output", output)
    assert code == 1, text
    assert only_error_line(text) == f"Error: cannot write eval output {output}: No space left on device"
    assert not output.exists()
