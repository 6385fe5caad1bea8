"""Atomic files: every file and folder the framework writes appears complete or not at all.

``atomic_write(path)`` opens a unique temporary file beside ``path`` exclusively (so nothing
planted under a predictable name, a symlink included, is followed), and on success flushes it,
fsyncs it, renames it onto ``path`` and fsyncs the folder; on failure it removes the temporary
and leaves whatever was at ``path`` as it was. A crash at any moment therefore leaves the previous
file or the new one, never a mix, and a concurrent reader (another rank, another run) never sees
a half-written file. ``atomic_directory(path)`` does the same for a folder of files.
"""
import errno
import os
import shutil
import uuid
from collections.abc import Iterator
import contextlib
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def atomic_write(path, mode: str = "wb", size_hint: int | None = None) -> Iterator[IO]:
    """A file object for writing (``mode`` "wb", or "w": UTF-8 text) whose contents replace ``path``
    on success. A full disk is an OSError(ENOSPC) that says so, whatever the writer made of it
    (torch.save reports it as a RuntimeError), with ``size_hint`` (bytes) as the size needed."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write writes whole files: mode 'wb' or 'w', not {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        with open(tmp, mode.replace("w", "x"), encoding=None if "b" in mode else "utf-8") as raw:
            f = _WatchedFile(raw)
            try:
                yield f
                f.flush()
                os.fsync(raw.fileno())
            except Exception as error:
                if f.disk_full or getattr(error, "errno", None) == errno.ENOSPC:
                    # Closing flushes what is still buffered: ENOSPC again, which would replace this message.
                    with contextlib.suppress(OSError):
                        raw.close()
                    raise _disk_full(path, f.written, size_hint) from error
                raise
        publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class _WatchedFile:
    """The file as writers see it, noting how much was written and whether the disk filled."""

    def __init__(self, raw: IO):
        self._raw, self.written, self.disk_full = raw, 0, False

    def write(self, data) -> int:
        try:
            n = self._raw.write(data)
        except OSError as error:
            self.disk_full = self.disk_full or error.errno == errno.ENOSPC
            raise
        self.written += len(data)
        return n

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._raw.flush()
        except OSError as error:
            self.disk_full = self.disk_full or error.errno == errno.ENOSPC
            raise

    def __getattr__(self, name):  # fileno, tell, ... of the real file
        return getattr(self._raw, name)


def _disk_full(path: Path, written: int, size_hint: int | None) -> OSError:
    free = shutil.disk_usage(path.parent).free
    needed = f"about {size_hint:,} bytes are needed" if size_hint else f"{written:,} bytes were written when it filled"
    return OSError(errno.ENOSPC, f"disk full writing {path}: {needed}, {free:,} bytes are free there; what was at "
                                 f"{path.name} before is intact. Free space on that disk or write elsewhere")


@contextmanager
def atomic_directory(path) -> Iterator[Path]:
    """A new empty folder to fill; on success it replaces ``path`` (a file, a link or a folder, or
    nothing), on failure it is removed."""
    path = Path(os.path.abspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    tmp.mkdir()
    try:
        yield tmp
        for file in tmp.rglob("*"):
            if file.is_file():
                with open(file, "rb") as f:
                    os.fsync(f.fileno())
        if path.exists() or path.is_symlink():
            old = tmp.with_name(tmp.name + ".old")
            os.replace(path, old)
            publish(tmp, path)
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()
        else:
            publish(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # only left on failure


def publish(done, path) -> None:
    """Rename the complete (already fsynced) ``done`` onto ``path`` and make the rename durable:
    atomic on POSIX, readers see the old or the new file, never a mix."""
    os.replace(done, path)
    folder = os.open(Path(path).parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
