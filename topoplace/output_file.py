"""Files the commands write (`export -o`, `sim --out`, `sim --write-mix`): whole or not at all."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, renamed over it only
    once written: a write that fails midway (disk full, a file size limit) or a command
    killed while writing leaves the file as it was, never a truncated one. OSError as the
    write raised it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
