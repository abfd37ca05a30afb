"""Extract a downloaded checkpoint archive without trusting it.

Every member is checked before anything is written; an archive with any refused member is not
extracted at all, and each refusal is one line naming the member:

* a name that is absolute, empty, or has a ``..`` part (it would land outside the folder);
* a symbolic or hard link whose target is absolute or leaves the folder;
* anything that is not a regular file, a folder or such a link (devices, FIFOs);
* a member larger than ``max_member_bytes``, members adding up to more than
  ``max_total_bytes``, or more than ``max_members`` members.

Sizes are the members' declared (uncompressed) sizes, which is exactly what ``tarfile`` writes,
so a compressed "bomb" is refused by what it would expand to. The extraction itself then runs
with the standard library's ``data`` filter as a second guard.
"""

from __future__ import annotations

import posixpath
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

GIB = 1024 ** 3


class ArchiveError(ValueError):
    """The file is not an archive this command can read."""


@dataclass(frozen=True)
class ExtractLimits:
    max_member_bytes: int = 64 * GIB
    max_total_bytes: int = 128 * GIB
    max_members: int = 10_000


@dataclass(frozen=True)
class Member:
    name: str
    size: int
    kind: str  # "file", "dir" or "link"


def _escapes(name: str) -> bool:
    path = PurePosixPath(name)
    return name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or ".." in path.parts


def _shown(name: str) -> str:
    text = name.encode("unicode_escape").decode("ascii")
    return text if len(text) <= 120 else text[:117] + "..."


def refusals(members: list[tarfile.TarInfo], limits: ExtractLimits) -> list[str]:
    """One line per refused member (empty: safe to extract)."""
    lines: list[str] = []
    if len(members) > limits.max_members:
        lines.append(f"{len(members)} members; at most {limits.max_members} are extracted")
    total = 0
    for info in members:
        name = info.name
        if not name.strip() or posixpath.normpath(name) in (".", "") or _escapes(name):
            lines.append(f"member {_shown(name)}: its path leaves the output folder (absolute or with ..)")
            continue
        if info.issym() or info.islnk():
            target = info.linkname
            base = posixpath.dirname(name) if info.issym() else ""  # a hard link names a member
            resolved = posixpath.normpath(posixpath.join(base, target)) if target else ""
            if not target or target.startswith("/") or resolved == ".." or resolved.startswith("../"):
                lines.append(f"member {_shown(name)}: a {'symbolic' if info.issym() else 'hard'} link to "
                             f"{_shown(target)}, outside the output folder")
            continue
        if not (info.isfile() or info.isdir()):
            lines.append(f"member {_shown(name)}: not a regular file or folder (a device or FIFO)")
            continue
        if info.size > limits.max_member_bytes:
            lines.append(f"member {_shown(name)}: {info.size} bytes, over the cap of {limits.max_member_bytes}")
            continue  # refused already: not counted again in the total
        total += info.size
    if total > limits.max_total_bytes:
        lines.append(f"the members add up to {total} bytes, over the cap of {limits.max_total_bytes}")
    return lines


def open_archive(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, mode="r:*")
    except (tarfile.TarError, EOFError, OSError) as error:
        raise ArchiveError(f"{path} is not a readable tar archive ({error})") from None


def list_members(path: Path) -> list[Member]:
    with open_archive(path) as archive:
        return [Member(i.name, i.size, "dir" if i.isdir() else "link" if (i.issym() or i.islnk()) else "file")
                for i in archive.getmembers()]


def safe_extract(path: Path, destination: Path, limits: ExtractLimits = ExtractLimits()) -> list[str]:
    """Extract ``path`` into ``destination`` (a folder this call creates) when every member
    passes; return the refusals. Nothing is left behind when there are any, or when the
    extraction fails part way."""
    if destination.exists():
        raise ArchiveError(f"{destination} already exists; extraction needs a new folder")
    with open_archive(path) as archive:
        try:
            members = archive.getmembers()
        except (tarfile.TarError, EOFError) as error:
            raise ArchiveError(f"{path} is not a readable tar archive ({error})") from None
        problems = refusals(members, limits)
        if problems:
            return problems
        destination.mkdir(parents=True)
        try:
            archive.extractall(destination, members=members, filter="data")
        except (tarfile.TarError, OSError) as error:
            shutil.rmtree(destination, ignore_errors=True)
            return [f"extraction stopped, nothing kept: {error}"]
    return []
