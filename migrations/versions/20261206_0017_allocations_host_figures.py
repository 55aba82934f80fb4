"""Allocations keep their request's host figures as columns: ``cpu_milli`` and
``memory_mib`` (per task; NULL: not asked).

Every sync sums the live allocations' host use per node, the release path's
included. It read them out of the stored request JSON, every live row's text
matched with LIKE and the matches parsed; now it reads two integers. Rows
written before this revision are filled from their stored request: a figure
the request names (not null) is copied, anything else stays NULL, as a row
whose request never asked.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_FIELDS = ("cpu_milli", "memory_mib")
_BATCH = 1000  # rows per update statement


def upgrade() -> None:
    for name in _FIELDS:
        op.add_column("allocations", sa.Column(name, sa.Integer, nullable=True))
    conn = op.get_bind()
    rows = sa.table("allocations", *(sa.column(c) for c in ("id", "request", *_FIELDS)))
    # Only a text that names a field, not as null, can carry a figure (the stored text
    # is the request model's compact JSON): the rest (rows from before the fields,
    # requests that left them out) stay NULL unread. Each text read is parsed.
    named = sa.or_(
        *(
            sa.and_(
                rows.c.request.contains(f'"{name}":', autoescape=True),
                ~rows.c.request.contains(f'"{name}":null', autoescape=True),
            )
            for name in _FIELDS
        )
    )
    found = conn.execute(sa.select(rows.c.id, rows.c.request).where(named)).all()
    update = (
        sa.update(rows)
        .where(rows.c.id == sa.bindparam("row_id"))
        .values({name: sa.bindparam(name) for name in _FIELDS})
    )
    figures = [f for f in (_figures(str(i), str(text)) for i, text in found) if f is not None]
    for start in range(0, len(figures), _BATCH):
        conn.execute(update, figures[start : start + _BATCH])


def _figures(row_id: str, text: str) -> dict[str, object] | None:
    """The row's update parameters, or None when its request names no figure."""
    try:
        request = json.loads(text)
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    values = {name: request.get(name) for name in _FIELDS}
    # bool is an int to Python, never a figure to the request model.
    values = {
        n: v if isinstance(v, int) and not isinstance(v, bool) else None for n, v in values.items()
    }
    if all(v is None for v in values.values()):
        return None
    return {"row_id": row_id, **values}


def downgrade() -> None:
    for name in reversed(_FIELDS):
        op.drop_column("allocations", name)
