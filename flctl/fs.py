"""Files that appear whole or not at all, and a full disk told as one line."""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from flctl.errors import ConfigError, DiskFull

# No room for the bytes: the device or the user's quota is full, or the file outgrew a size limit (the file
# system's, or the process's RLIMIT_FSIZE: EFBIG). Each one means "free space, then resume", so they are one case.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


# Called just before an atomic_path renames its file into place (see ``fenced``).
_BEFORE_REPLACE: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("before_replace",
                                                                                            default=None)


@contextlib.contextmanager
def fenced(check: Callable[[], None]) -> Iterator[None]:
    """Within the block, each ``atomic_path`` of this thread calls ``check`` after its file is written and just
    before the rename; ``check`` raising leaves ``path`` as it was. A worker's claim check (flctl.writer.Writer) sits
    there rather than before the write: a worker frozen between its check and the rename is the one stale write
    that can still land, and that window is a rename long, not a whole file's write. A block that renamed no file
    through ``atomic_path`` was not fenced at all: RuntimeError, a bug in the caller, not a failed check."""
    checked: list[bool] = []

    def counted() -> None:
        checked.append(True)
        check()

    token = _BEFORE_REPLACE.set(counted)
    try:
        yield
    finally:
        _BEFORE_REPLACE.reset(token)
    if not checked:
        raise RuntimeError("a fenced write did not go through flctl.fs.atomic_path: nothing checked it")


@contextlib.contextmanager
def undone_on_failure(folder: Path) -> Iterator[None]:
    """For a download into ``folder``: where the body raises, the folders it made (``folder`` and its parents that
    were not there, with what a partial download left in them) are removed, so a failed download leaves the cache as
    it was (an empty ~/.cache/flctl/cifar10 told nothing and was left behind)."""
    absolute = Path(folder).absolute()
    made = [p for p in (absolute, *absolute.parents) if not p.exists()]
    try:
        yield
    except BaseException:
        if made:
            shutil.rmtree(made[-1], ignore_errors=True)    # the highest made: everything below it is the download's
        raise


def make_below(path: Path, levels: int) -> None:
    """Make the folder ``path`` and the ``levels - 1`` above it where missing, and never one higher up: training
    makes its folders below the results folder, so a results folder deleted while runs train stays deleted
    (FileNotFoundError here) instead of coming back, empty, with a run's files in it."""
    for folder in reversed([path, *path.parents][:levels]):
        folder.mkdir(exist_ok=True)


@contextlib.contextmanager
def atomic_path(path: Path | str, parents: bool = True) -> Iterator[Path]:
    """A temporary path next to ``path`` to write to. When the block ends normally the file replaces ``path``
    in one rename, so readers (another worker, a report) never see a partial file; when it raises, the temporary
    file is removed and ``path`` is left as it was. The temporary name is hidden and ends in ``.tmp``, so globs
    for finished files (``epoch=*.parquet``, ``*.json``) and Parquet readers skip it; write through an open file
    where a library would append its own suffix (numpy's savez). A full disk raises ``DiskFull`` naming ``path``.
    ``parents``: make the folders it lacks; a run's files go into its folders as they are (``make_below``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        if parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        if (check := _BEFORE_REPLACE.get()) is not None:
            check()
        os.replace(tmp, path)
    except OSError as exc:
        if is_full(exc) and not isinstance(exc, DiskFull):
            raise DiskFull(exc.errno, os.strerror(exc.errno or 0), str(path)) from exc
        raise
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path | str, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def check_writable(path: Path, flag: str = "--out") -> None:
    """ConfigError now, before any work, where ``path`` cannot become a file: it is a directory, lies under a file,
    or its nearest existing folder refuses a file (probed with an empty file that is removed at once)."""
    if path.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a directory; give a file name")
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} lies under {str(folder)!r}, which is a file")
    if (why := refuses_files(folder)) is not None:
        raise ConfigError(f"{flag} {str(path)!r}: cannot write in {str(folder)!r} ({why})")


def refuses_files(folder: Path) -> str | None:
    """Why ``folder`` takes no file (read-only, immutable, its permissions), or None: an empty file is made and
    removed at once, since os.access says yes to root whatever the folder is."""
    probe = folder / f".write-test-{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return str(exc.strerror or exc)
    return None
