"""Crash-safe writes and JSON Lines reading."""

from __future__ import annotations

import pytest

import hashlib
import os

from searchr1.basics.fileio import append_json_line, file_sha256, removing_new_directories, replacing, write_text_atomically
from searchr1.basics.jsonl import iter_json_lines


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    write_text_atomically(target, "old")
    with pytest.raises(RuntimeError):
        with replacing(target) as temporary:
            temporary.write_text("half")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_appended_lines_read_back_with_their_numbers(tmp_path):
    path = tmp_path / "log.jsonl"
    append_json_line(path, {"a": 1})
    path.open("a").write("\n")
    append_json_line(path, {"b": 2})
    assert list(iter_json_lines(path)) == [(1, {"a": 1}), (3, {"b": 2})]


def test_a_bad_line_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"ok": 1}\n{"torn": \n')

    class Custom(ValueError):
        pass

    with pytest.raises(Custom, match=r"bad\.jsonl:2: invalid JSON"):
        list(iter_json_lines(path, error=Custom))


@pytest.mark.parametrize("line, says", [
    ('{"id": "abc', "(Unterminated string starting at column 8)"),
    ('{"a": 1 "b": 2}', "(Expecting ',' delimiter at column 9)"),
    ('{"a": 1\n{"next": "line"}', "(Expecting ',' delimiter at the end of the line)"),  # not line 2's start
])
def test_a_json_error_reads_as_a_sentence_and_points_into_its_own_line(tmp_path, line, says):
    path = tmp_path / "bad.jsonl"
    path.write_text(line)
    with pytest.raises(ValueError) as raised:
        list(iter_json_lines(path))
    assert str(raised.value) == f"{path}:1: invalid JSON {says}"


def test_a_failed_append_is_taken_back_so_the_file_still_ends_on_its_last_whole_record(tmp_path, monkeypatch):
    import errno
    import os

    path = tmp_path / "log.jsonl"
    append_json_line(path, {"a": 1})
    real_write = os.write

    def half_then_full(descriptor, data):  # the disk fills half way through the record
        real_write(descriptor, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError) as raised:
        append_json_line(path, {"b": 2})
    monkeypatch.undo()
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert path.read_text() == '{"a": 1}\n'


def test_the_file_hash_is_the_sha256_of_the_whole_content_across_read_blocks(tmp_path):
    path = tmp_path / "data.bin"
    content = bytes(range(256)) * 5000  # more than one read block
    path.write_bytes(content)
    assert file_sha256(path) == hashlib.sha256(content).hexdigest()


def test_a_failed_block_removes_only_the_empty_directories_it_made(tmp_path):
    (tmp_path / "kept").mkdir()
    target = tmp_path / "kept" / "a" / "b" / "c"
    with pytest.raises(KeyboardInterrupt):
        with removing_new_directories(target):
            target.mkdir(parents=True)
            raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["kept"]

    with pytest.raises(ValueError):
        with removing_new_directories(target):
            target.mkdir(parents=True)
            (tmp_path / "kept" / "a" / "note.txt").write_text("left by someone", "utf-8")
            raise ValueError("download failed")
    assert (tmp_path / "kept" / "a" / "note.txt").is_file() and not (tmp_path / "kept" / "a" / "b").exists()


def test_a_block_that_succeeds_keeps_what_it_made(tmp_path):
    target = tmp_path / "new" / "dir"
    with removing_new_directories(target):
        target.mkdir(parents=True)
    assert target.is_dir()


def test_a_lock_that_cannot_write_its_pid_names_the_lock_file(tmp_path, monkeypatch):
    import errno
    import os

    from searchr1.basics.fileio import exclusive_lock

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    path = tmp_path / ".out.lock"
    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError) as raised:
        with exclusive_lock(path, "the output"):
            pass
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)


def test_a_lock_file_is_removed_when_its_holder_is_done_and_refuses_a_second_holder_meanwhile(tmp_path):
    from searchr1.basics.fileio import FileInUseError, exclusive_lock

    path = tmp_path / ".run.lock"
    with exclusive_lock(path, "the run"):
        assert path.read_text() == f"{os.getpid()}\n"
        with pytest.raises(FileInUseError, match=rf"the run is in use by another process \(pid {os.getpid()}\)"):
            with exclusive_lock(path, "the run"):
                pass
        assert path.is_file()  # the refused attempt leaves the holder's file alone
    assert not path.exists()
    with pytest.raises(RuntimeError):
        with exclusive_lock(path, "the run"):
            raise RuntimeError("the command failed")
    assert not path.exists()


def test_a_process_that_opened_a_lock_file_before_its_holder_removed_it_locks_the_new_one(tmp_path, monkeypatch):
    """The race that removing lock files opens: B opens the file, A finishes (removing it), B
    gets the flock of a file no path names, while C locks a new one. B must notice and start
    over, or B and C would both hold "the" lock."""
    import searchr1.basics.fileio as fileio

    path = tmp_path / ".run.lock"
    path.write_text("1\n")
    stale = os.open(path, os.O_RDWR)
    path.unlink()  # what the earlier holder does as it finishes
    real_open, opened = os.open, []

    def open_stale_first(*args, **kwargs):
        opened.append(args[0])
        return os.dup(stale) if len(opened) == 1 else real_open(*args, **kwargs)

    monkeypatch.setattr(fileio.os, "open", open_stale_first)
    with fileio.exclusive_lock(path, "the run"):
        monkeypatch.undo()
        assert len(opened) == 2  # the removed file was given up, the path's own file locked
        assert os.fstat(stale).st_nlink == 0 and path.read_text() == f"{os.getpid()}\n"
        with pytest.raises(fileio.FileInUseError):
            with fileio.exclusive_lock(path, "the run"):
                pass
    os.close(stale)
    assert not path.exists()
