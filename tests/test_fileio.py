"""Crash-safe writes and JSON Lines reading."""

from __future__ import annotations

import pytest

from searchr1.fileio import append_json_line, iter_json_lines, replacing, write_text_atomically


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
