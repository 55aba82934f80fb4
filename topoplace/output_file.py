"""Files the commands write (`export -o`, `sim --out`, `sim --write-mix`): whole or not at all."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_whole(path: Path, text: str | bytes) -> None:
    """Write ``text`` (UTF-8) or bytes to ``path`` through a temporary file beside it,
    renamed over it only once written: a write that fails midway (disk full, a file size
    limit) or a command killed while writing leaves the file as it was, never a truncated
    one. OSError as the write raised it, naming ``path`` (not the temporary file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
