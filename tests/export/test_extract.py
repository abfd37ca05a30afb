"""Safe extraction of downloaded archives, on hand-made files."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.export.extract import ExtractLimits, safe_extract
from searchr1.twin.archive import tar_bytes


def hostile_tar(path: Path, *members: tuple[str, str, object]) -> Path:
    """Members as (kind, name, data or link target)."""
    with tarfile.open(path, "w") as archive:
        for kind, name, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = payload if isinstance(payload, bytes) else b"x"
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            elif kind == "huge":  # zeros: tiny once compressed, over the cap once extracted
                info.size = int(payload)  # type: ignore[call-overload]
                archive.addfile(info, io.BytesIO(bytes(info.size)))
            elif kind in ("sym", "hard"):
                info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                info.linkname = str(payload)
                archive.addfile(info)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
                archive.addfile(info)
    return path


@pytest.mark.parametrize("member, says", [
    (("file", "/etc/passwd-owned", b"x"), "leaves the output folder"),
    (("file", "../outside.txt", b"x"), "leaves the output folder"),
    (("file", "inner/../../outside.txt", b"x"), "leaves the output folder"),
    (("sym", "link", "/etc/passwd"), "symbolic link to /etc/passwd, outside"),
    (("sym", "inner/link", "../../up"), "outside the output folder"),
    (("hard", "hard", "../elsewhere"), "hard link"),
    (("fifo", "pipe", None), "not a regular file"),
    (("huge", "big.bin", 10_000), "over the cap of 1000"),
])
def test_a_hostile_member_is_refused_in_one_line_and_nothing_is_written(tmp_path, member, says):
    archive = hostile_tar(tmp_path / "a.tar", ("file", "adapter_config.json", b"{}"), member)
    out = tmp_path / "out"
    refused = safe_extract(archive, out, ExtractLimits(max_member_bytes=1000, max_total_bytes=100_000))
    assert len(refused) == 1 and says in refused[0] and "\n" not in refused[0]
    assert not out.exists() or not any(out.iterdir())
    assert not (tmp_path / "outside.txt").exists()


def test_many_members_adding_up_past_the_cap_are_refused(tmp_path):
    archive = hostile_tar(tmp_path / "a.tar", *[("file", f"f{i}", b"y" * 400) for i in range(4)])
    refused = safe_extract(archive, tmp_path / "out", ExtractLimits(max_member_bytes=1000, max_total_bytes=1000))
    assert refused == ["the members add up to 1600 bytes, over the cap of 1000"]


def test_links_inside_the_folder_and_plain_files_extract(tmp_path):
    archive = hostile_tar(tmp_path / "a.tar", ("file", "d/a.txt", b"hello"), ("sym", "d/b.txt", "a.txt"))
    assert safe_extract(archive, tmp_path / "out") == []
    assert (tmp_path / "out" / "d" / "b.txt").read_bytes() == b"hello"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="ab./", min_size=1, max_size=12), min_size=1, max_size=4))
def test_no_member_name_writes_outside_the_folder(tmp_path_factory, names):
    """Invariant: whatever the member names, every file extraction writes lies inside the output
    folder, and an archive that is refused writes nothing."""
    root = tmp_path_factory.mktemp("x")
    archive = hostile_tar(root / "a.tar", *[("file", name, b"z") for name in names])
    out = root / "out"
    before = {p for p in root.rglob("*")}
    try:
        refused = safe_extract(archive, out)
    except Exception:  # noqa: BLE001 - names tarfile itself cannot write are fine as errors
        refused = ["error"]
    written = {p for p in root.rglob("*")} - before
    assert all(p == out or out in p.parents for p in written)
    if refused:
        assert not any(p.is_file() for p in written)


# --- the twin's archive -----------------------------------------------------------------------


def test_the_twin_archive_is_deterministic_plain_files():
    data = tar_bytes({"a": b"1", "b": b"22"})
    assert data == tar_bytes({"a": b"1", "b": b"22"})
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        assert [(m.name, m.size, m.isfile()) for m in archive.getmembers()] == [("a", 1, True), ("b", 2, True)]
