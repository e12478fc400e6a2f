"""Files that appear whole or not at all."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """A temporary path next to ``path`` to write to. When the block ends normally the file replaces ``path``
    in one rename, so readers (another worker, a report) never see a partial file; when it raises, the temporary
    file is removed and ``path`` is left as it was. The temporary name is hidden and ends in ``.tmp``, so globs
    for finished files (``epoch=*.parquet``, ``*.json``) and Parquet readers skip it; write through an open file
    where a library would append its own suffix (numpy's savez)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path | str, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
