"""Group commit: concurrent reservations share one transaction.

Under load most of a /place request's cost was its own transaction: begin,
two inserts, a notification and a commit, each a round trip through the
driver, and one WAL flush per request in Postgres. Reservations that arrive
while a commit is running wait for it, then go together: one multi-row
insert into ``allocations``, one into ``gpu_holds``, one into ``audit_log``, one notification naming
every node touched, one commit. A quiet service commits each reservation at
once (a batch of one), so latency is not traded for throughput.

The guarantees are the single-request ones. The holds' primary key still
refuses a GPU held twice; when it does, or when one reservation carries a
value the database refuses, the whole batch rolls back and each of its
reservations is committed again on its own, so only the one at fault sees
its error (and the lost race retries on fresh state) while the others
succeed. A deadlock or serialization failure (two replicas' batches) is
retried here, whole, and nobody hears of it; rows and holds are written in
one order (by key, by node and device) so that two batches rarely wait on
each other at all. Only a database that does not answer reaches every
waiter of the batch. The writes go through the driver with statements
compiled once (batch_writer.py).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from service.allocations.batch_writer import BatchWriter
from service.db import retry_transient

log = logging.getLogger("topoplace.group_commit")
MAX_BATCH = 64


@dataclass
class _Reservation:
    row: Mapping[str, object]
    holds: Sequence[tuple[str, str, str]]
    nodes: Sequence[str]
    audit: Mapping[str, object] | None  # the placement decision's audit row
    # Called once on the committer's thread when the outcome is known.
    finished: Callable[[], None]
    error: BaseException | None = None


class GroupCommitter:
    """One thread writes reservations in batches; callers block until theirs is durable."""

    def __init__(
        self,
        engine: Engine,
        max_batch: int = MAX_BATCH,
        *,
        on_batch: Callable[[int], None] | None = None,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        """``on_batch``: told the size of each batch taken from the queue; ``on_retry``: of
        each transaction run again (both feed /metrics)."""
        self.writer = BatchWriter(engine)
        self.max_batch = max_batch
        self._on_batch = on_batch
        self._on_retry = on_retry
        self._queue: queue.SimpleQueue[_Reservation | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.batches = 0  # commits made, and reservations in them: visible to tests
        self.committed = 0

    def commit(
        self,
        row: Mapping[str, object],
        holds: Sequence[tuple[str, str, str]],
        nodes: Sequence[str],
        audit: Mapping[str, object] | None = None,
    ) -> None:
        """Insert the allocation, its holds and its audit row durably; raises what a lone
        commit would."""
        done = threading.Event()
        reservation = _Reservation(row, holds, nodes, audit, done.set)
        self._submit(reservation)
        done.wait()
        if reservation.error is not None:
            raise reservation.error

    async def commit_async(
        self,
        row: Mapping[str, object],
        holds: Sequence[tuple[str, str, str]],
        nodes: Sequence[str],
        audit: Mapping[str, object] | None = None,
    ) -> None:
        """``commit`` for the event loop: awaits the batch instead of blocking a thread."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def finished() -> None:
            loop.call_soon_threadsafe(_settle, future, reservation)

        reservation = _Reservation(row, holds, nodes, audit, finished)
        self._submit(reservation)
        await future

    def _submit(self, reservation: _Reservation) -> None:
        self._ensure_started()
        self._queue.put(reservation)

    def stop(self) -> None:
        with self._start_lock:
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join()
                self._thread = None

    def _ensure_started(self) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="topoplace-group-commit", daemon=True
                    )
                    self._thread.start()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stopping = False
            while len(batch) < self.max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                    break
                batch.append(more)
            if self._on_batch is not None:
                self._on_batch(len(batch))
            self._write(batch)
            if stopping:
                return

    def _insert(self, batch: Sequence[_Reservation]) -> None:
        rows = sorted((r.row for r in batch), key=_row_order)
        holds = sorted(
            (
                {
                    "node": node,
                    "device": device,
                    "kind": kind,
                    "allocation_id": r.row["id"],
                    "live": True,
                }
                for r in batch
                for node, device, kind in r.holds
            ),
            key=lambda h: (h["node"], h["device"]),
        )
        nodes = [n for r in batch for n in r.nodes]
        audits = [r.audit for r in batch if r.audit is not None]
        retry_transient(
            lambda: self.writer.write(rows, holds, nodes, audits), retried=self._on_retry
        )

    def _write(self, batch: list[_Reservation]) -> None:
        try:
            try:
                self._insert(batch)
            except OperationalError:
                raise  # the database does not answer: every waiter hears it, below
            except Exception:
                if len(batch) == 1:
                    raise
                # Someone in the batch lost a race or carries a value the database
                # refuses: find out who, commit the rest.
                for reservation in batch:
                    try:
                        self._insert([reservation])
                    except Exception as exc:
                        reservation.error = exc
                    else:
                        self.committed += 1
                self.batches += 1
                return
            self.batches += 1
            self.committed += len(batch)
        except Exception as exc:  # the database is down, or worse: every waiter hears it
            for reservation in batch:
                reservation.error = exc
        finally:
            for reservation in batch:
                reservation.finished()


def _row_order(row: Mapping[str, object]) -> tuple[bool, str, str]:
    """Rows with an idempotency key first, by key: two batches that race on keys take
    them in one order."""
    key = row.get("idempotency_key")
    return (key is None, str(key or ""), str(row["id"]))


def _settle(future: asyncio.Future[None], reservation: _Reservation) -> None:
    if future.cancelled():
        return
    if reservation.error is not None:
        future.set_exception(reservation.error)
    else:
        future.set_result(None)
