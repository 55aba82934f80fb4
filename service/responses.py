"""JSON responses encoded with orjson.

/score returns hundreds of nodes (about 1 kB each); the standard library
encoder spends more time on that than the engine spends deciding. orjson
encodes the same plain data about ten times faster, byte-compatible JSON.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse


class FastJSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
