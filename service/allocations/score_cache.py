"""What /score made of each engine task, kept while the engine hands the same task back.

The engine answers a node with the same ``TaskPlacement`` object while the
node is unchanged (decide.verdict_rows), so a scheduler scoring pod after
pod against the same nodes gets the same objects again and again. Kept here
per task: its typed row, reused while its rank and score stay (for gRPC and
the adapters: a frozen dataclass costs about a microsecond to build, as
much as the engine's own work for the node), and its /score row already
encoded around the rank (for REST), so a /score of 500 nodes is a join of
500 remembered byte strings.

One cache per service state (``ServiceState.score_cache``), so two states in
one process (tests, a second app) never share entries. Entries are keyed by
the task's identity: each holds the task itself, which keeps its id from
being reused while the entry lives, and is checked with ``is`` on the way
out. Identity, not equality: hashing a task's fields would cost about what
encoding it does.
"""

from __future__ import annotations

from placement import TaskPlacement
from service.allocations.encoding import fit_row_parts
from service.allocations.results import NodeScore, TaskPlan
from service.allocations.views import task_plan

LIMIT = 200_000  # entries per map; all are dropped at once past it (tasks of gone shapes)
RowParts = tuple[TaskPlacement, float, bytes, bytes]  # task, its score, before/after the rank


class ScoreCache:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        # task -> (task, its plan, the last typed row made of it)
        self._typed: dict[int, tuple[TaskPlacement, TaskPlan, NodeScore]] = {}
        # Read directly by scoring.score_json, once per fitting node per call.
        self.rows: dict[int, RowParts] = {}

    def fit(self, rank: int, score: float, task: TaskPlacement) -> NodeScore:
        """A fitting node's typed row; its plan is made once per task, the row again
        only when the rank or score moved."""
        hit = self._typed.get(id(task))
        if hit is not None and hit[0] is task:
            row = hit[2]
            if row.rank == rank and row.score == score:
                return row
            plan = hit[1]
        else:
            if len(self._typed) >= self.limit:
                self._typed.clear()
            plan = task_plan(task)
        row = NodeScore(task.node, True, rank, score, None, task.reason, True, plan)
        self._typed[id(task)] = (task, plan, row)
        return row

    def row(self, task: TaskPlacement, score: float) -> RowParts:
        """The task's /score row encoded around its rank (see ``rows`` for the fast path)."""
        before, after = fit_row_parts(task.node, score, task_plan(task))
        if len(self.rows) >= self.limit:
            self.rows.clear()
        parts = self.rows[id(task)] = (task, score, before, after)
        return parts
