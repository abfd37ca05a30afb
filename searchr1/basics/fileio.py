"""Writing files so that a crash never leaves half of one. Every module that persists something
goes through here (``searchr1.basics.jsonl`` reads what it wrote)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from searchr1.core.errors import UserError


def _fsync_directory(directory: Path) -> None:
    """Make a rename durable (best effort: not every platform can open a directory)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


# What a full, read-only or forbidden disk raises: expected on a real machine, so a command says
# it in one line (the path and the cause) instead of a traceback.
WRITE_FAILURES = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EPERM, errno.EFBIG})


class FileInUseError(UserError, RuntimeError):
    """Another process holds the lock of a run directory or an output file."""


def is_write_failure(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in WRITE_FAILURES


def write_failure_line(error: OSError) -> str:
    """``cannot write PATH: No space left on device`` (the path the error names, when it does)."""
    where = f" {error.filename}" if error.filename else ""
    return f"cannot write{where}: {error.strerror or error}"


def naming(error: OSError, path: str | os.PathLike[str]) -> OSError:
    """``error`` naming ``path`` when it names no file (a failed write or fsync on a stream
    does not), so a command's one line says which file a full disk stopped."""
    return _naming(error, path)


def _naming(error: OSError, path: str | os.PathLike[str], *, instead_of: tuple[str, ...] = ()) -> OSError:
    """The same error, naming ``path`` (a failed write or fsync on a stream names no file; a
    temporary file's name means nothing to the reader)."""
    if error.errno is None or (error.filename and str(error.filename) not in instead_of):
        return error
    return type(error)(error.errno, error.strerror, str(path))


def _umask() -> int:
    """The process umask, read without changing it where the system says it (Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode(target: Path) -> int:
    """The mode a replaced file keeps (an existing file's own), or what ``open`` would give a
    new one under the umask: ``mkstemp`` makes 0600 files whatever the umask says."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def new_directory_mode() -> int:
    """The mode ``mkdir`` gives a new directory under the umask (``mkdtemp`` makes 0700 ones)."""
    return 0o777 & ~_umask()


def staging_directory(prefix: str, folder: str | os.PathLike[str]) -> Path:
    """A new hidden directory in ``folder`` to build into and rename into place, with the mode
    the umask gives (not ``mkdtemp``'s 0700, which the renamed result would keep)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=folder))
    os.chmod(path, new_directory_mode())
    return path


def follow_umask(path: str | os.PathLike[str]) -> None:
    """Give a file made by ``mkstemp`` (0600) the mode ``open`` would have given it."""
    os.chmod(path, 0o666 & ~_umask())


def check_writable(path: str | os.PathLike[str], what: str, error: type[Exception]) -> None:
    """Raise ``error`` naming ``path`` when a file could not be created or replaced there (its
    nearest existing folder is not a writable directory, or it is itself not writable), so a
    command refuses before doing any work rather than failing at the end."""
    target = Path(path)
    if target.is_dir():
        raise error(f"{what} {target} is a directory")
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise error(f"cannot write {what} {target}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise error(f"cannot write {what} {target}: {folder} is not writable")
    if target.exists() and not os.access(target, os.W_OK):
        raise error(f"cannot write {what} {target}: the file is not writable")
    if folder == target.parent:  # a read-only mount passes os.access for root; a real create does not
        try:
            descriptor, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=folder)
        except OSError as problem:
            raise error(f"cannot write {what} {target}: {problem.strerror or problem}") from None
        os.close(descriptor)
        os.unlink(name)


def _names_file(path: str | os.PathLike[str], descriptor: int) -> bool:
    """Whether ``path`` still names the file open as ``descriptor`` (not removed, not replaced)."""
    try:
        named, held = os.stat(path), os.fstat(descriptor)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _locked_descriptor(path: str | os.PathLike[str], what: str, wait: bool) -> int:
    """A descriptor of the file ``path`` names, holding its exclusive ``flock``."""
    while True:
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as error:
            raise _naming(error, path) from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip()
            os.close(descriptor)
            raise FileInUseError(f"{what} is in use by another process (pid {holder or 'unknown'}); "
                                 "wait for it to finish, or stop it first") from None
        except BaseException:
            os.close(descriptor)
            raise
        if _names_file(path, descriptor):
            return descriptor
        os.close(descriptor)  # its holder removed it after we opened it: lock the file the path names now


@contextmanager
def exclusive_lock(path: str | os.PathLike[str], what: str, *, wait: bool = False) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing, removed again when the block
    ends) for the block. The kernel drops it when the process ends, however it ends, so a killed
    run never leaves a stale lock, only its file, which the next holder removes. A second holder
    is refused at once with :class:`FileInUseError` naming ``what`` and the holder's pid (written
    into the file), or with ``wait`` waits for the first to finish.

    Removing the file keeps the lock sound: the holder removes it while it still holds the lock,
    and a process that opened the file before that finds, once it holds the lock, that ``path``
    no longer names it, and starts over on the file ``path`` names then."""
    descriptor = _locked_descriptor(path, what, wait)
    try:
        try:  # on a full disk this is the command's first write: it names the file, as every write does
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)
        except OSError as error:
            raise _naming(error, path) from None
        yield
    finally:
        try:
            if _names_file(path, descriptor):
                os.unlink(path)
        except OSError:
            pass  # best effort: a lock file left behind is harmless
        os.close(descriptor)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of a file's bytes, read in blocks (a large file is never held whole)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def removing_new_directories(path: str | os.PathLike[str]) -> Iterator[None]:
    """For the block, remember which of ``path`` and its parents do not exist yet; if the
    block raises (Ctrl-C included), remove those of them that are empty now, innermost first,
    and re-raise: a failed download or build leaves no folder behind that it made, and never
    removes one that was there before or that holds anything."""
    missing = []
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    try:
        yield
    except BaseException:
        for directory in missing:
            if directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
        raise


def cut_torn_tail(path: str | os.PathLike[str]) -> bytes:
    """Make an append-only file end on a newline: a last line without one is a write that a
    crash or a full disk cut short; it is cut off (and returned) so the next append starts a
    line of its own instead of gluing a record onto it."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return b""
    if size == 0:
        return b""
    with open(path, "rb+") as stream:
        data = stream.read()
        if data.endswith(b"\n"):
            return b""
        keep = data.rfind(b"\n") + 1
        stream.truncate(keep)
        stream.flush()
        os.fsync(stream.fileno())
    return data[keep:]


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, the temporary file is
    fsynced and renamed over ``path``; when it fails, it is removed and ``path`` is untouched.
    A symbolic link at ``path`` stays a link: the file it points to is the one replaced."""
    target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as error:
        raise _naming(error, target, instead_of=(str(error.filename),)) from None
    os.close(descriptor)
    temporary = Path(name)
    try:
        yield temporary
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        os.chmod(temporary, new_file_mode(target))
        os.replace(temporary, target)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise _naming(error, target, instead_of=(name, str(temporary))) from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)


def write_bytes_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    with replacing(path) as temporary:
        temporary.write_bytes(data)


def write_text_atomically(path: str | os.PathLike[str], text: str) -> None:
    write_bytes_atomically(path, text.encode("utf-8"))


def write_json_atomically(path: str | os.PathLike[str], payload: object, *, sort_keys: bool = True) -> None:
    write_text_atomically(path, json.dumps(payload, indent=2, sort_keys=sort_keys, ensure_ascii=False) + "\n")


def json_line(record: object) -> str:
    return json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n"


def append_text(path: str | os.PathLike[str], text: str) -> None:
    """Append and fsync before returning: once this returns, the text survives a crash. A write
    that fails (a full disk) is taken back, so the file still ends where its last whole record
    does, and the error names ``path``."""
    data = text.encode("utf-8")
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as error:
        raise _naming(error, path) from None
    try:
        start = os.fstat(descriptor).st_size
        try:
            written = 0
            while written < len(data):
                written += os.write(descriptor, data[written:])
            os.fsync(descriptor)
        except OSError as error:
            try:
                os.ftruncate(descriptor, start)
            except OSError:
                pass  # cut_torn_tail mends it on the next resume
            raise _naming(error, path) from None
    finally:
        os.close(descriptor)


def append_json_line(path: str | os.PathLike[str], record: object) -> None:
    append_text(path, json_line(record))
