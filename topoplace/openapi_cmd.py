"""`topoplace openapi`: write the service's OpenAPI document, or check the committed one."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

DEFAULT_OUTPUT = Path("openapi") / "openapi.json"
EXIT_OUT_OF_DATE = 1
DIFF_LINES_SHOWN = 40


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "openapi",
        help="write the service's OpenAPI document (the committed API contract)",
        description=(
            "Write the OpenAPI document of the placement service, as the code defines it,"
            f" to {DEFAULT_OUTPUT} (or --output). With --check, write nothing: exit 1 when"
            " the file differs from the code."
        ),
    )
    p.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        metavar="PATH",
        help=f"where the document lives (default {DEFAULT_OUTPUT})",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 with a diff when PATH is not what the code would write",
    )
    p.set_defaults(func=run)


def render_openapi() -> str:
    """The OpenAPI document as committed: sorted keys, 2-space indent, one trailing newline.

    The app is built but never started: the document needs no database.
    """
    from service.app import create_app
    from service.settings import Settings

    schema = create_app(Settings(database_url="sqlite://")).openapi()
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def run(args: argparse.Namespace) -> int:
    output: Path = args.output
    rendered = render_openapi()
    if args.check:
        return _check(output, rendered)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(rendered, encoding="utf-8")
    print(f"wrote {output}")
    return 0


def _check(output: Path, rendered: str) -> int:
    try:
        current = output.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = None
    if current == rendered:
        return 0
    regenerate = "run `topoplace openapi`"
    if current is None:
        print(f"{output} does not exist; {regenerate}", file=sys.stderr)
        return EXIT_OUT_OF_DATE
    diff = list(
        difflib.unified_diff(
            current.splitlines(),
            rendered.splitlines(),
            fromfile=f"{output} (committed)",
            tofile=f"{output} (from the code)",
            lineterm="",
        )
    )
    shown = diff[:DIFF_LINES_SHOWN]
    if len(diff) > len(shown):
        shown.append(f"... {len(diff) - len(shown)} more diff lines")
    print(f"{output} is out of date; {regenerate}", file=sys.stderr)
    print("\n".join(shown), file=sys.stderr)
    return EXIT_OUT_OF_DATE
