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
waiter of the batch; a connection lost at the commit is first asked about
on a new one (the server may have committed and its answer been lost), and
a batch found stored is answered as written; one not found (or that the database
cannot say of) is written once more, and meets its own rows if it committed after
all. The writes go through the driver with statements compiled once (batch_writer.py).

A caller that is alone by construction may ask for its reservation to be
written at once, on its own thread (``commit_async(..., at_once=True)``):
slurmctld calls the Slurm filter one submission at a time, with its job
write lock held, so there is never a batch to join, and the hand-over to
this thread and back was the largest part of the call after the service had
sat idle (0.46 ms of a 1.37 ms call, the write itself 0.30 ms). Only on
SQLite, through a connection kept for it that never waits on a lock: the
write is local, a few tenths of a millisecond, and when another writer holds
the database (this thread's batch, a release, the sweep) it goes to the
queue instead, as it would have. On Postgres a commit is a round trip to the
server and stays on this thread, off the event loop (service/event_loop.py).
The Kubernetes bind asks the same of ``commit`` from its worker thread
(kube-scheduler waits on each bind; binds in flight together find the lock
or the queue busy and join the batch as before). There Postgres is written
at once too, on the kept connection: the round trip blocks only that worker
thread, and the hand-over to this thread and back is saved.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from service.allocations import pools
from service.allocations.batch_writer import BatchWriter
from service.db import is_transient, retry_transient
from service.edge import revoked_meanwhile

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
    shares: Sequence[tuple[str, str, int]] = ()  # (node, device, thousandths) of GPU shares
    # node -> the seq of the snapshot the reservation was chosen on, named by its holds
    # (a node left out: its holds name none, and no snapshot check guards them)
    seqs: Mapping[str, int] = field(default_factory=dict)
    # node -> that snapshot's reported_at; its holds name it with the node uncordoned
    # (a node left out: no check of the node's row or cordon guards them)
    reported: Mapping[str, datetime] = field(default_factory=dict)
    error: BaseException | None = None
    # Written at once, its connection lost at the commit and the database not able to
    # say whether it landed: the queue's write may meet its own rows.
    unsure: bool = False
    # How the caller's token was let in (None: no token check let it in). A reservation
    # may wait here for other batches after its choice was made; its token revoked
    # meanwhile, it is refused just before its rows are written.
    admission: revoked_meanwhile.Admission | None = None


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
        self.writer = BatchWriter(engine, own_pool=True)
        self.max_batch = max_batch
        self._on_batch = on_batch
        self._on_retry = on_retry
        self._queue: queue.SimpleQueue[_Reservation | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.batches = 0  # commits made, and reservations in them: visible to tests
        self.committed = 0
        self.at_once = 0  # of those, written at once on the caller's thread
        # On the event loop a write at once needs SQLite (local, no round trip).
        self._sqlite = engine.dialect.name == "sqlite"
        self._at_once_lock = threading.Lock()
        self._busy = 0  # reservations queued or being written by this thread
        self._busy_lock = threading.Lock()

    def commit(
        self,
        row: Mapping[str, object],
        holds: Sequence[tuple[str, str, str]],
        nodes: Sequence[str],
        audit: Mapping[str, object] | None = None,
        *,
        at_once: bool = False,
        shares: Sequence[tuple[str, str, int]] = (),
        seqs: Mapping[str, int] | None = None,
        reported: Mapping[str, datetime] | None = None,
    ) -> None:
        """Insert the allocation, its holds, its shares and its audit row durably; raises
        what a lone commit would. ``at_once``: written on the calling (worker) thread when
        the database is free, on SQLite or Postgres (the Kubernetes bind). ``seqs`` and
        ``reported``: the node snapshots chosen on; a node whose stored snapshot differs,
        or that is cordoned, fails the commit (IntegrityError, as a GPU held already)."""
        reservation = _new_reservation(row, holds, nodes, audit, shares, seqs, reported)
        if at_once and self._write_at_once(reservation, on_loop=False):
            return
        done = threading.Event()
        reservation.finished = done.set
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
        *,
        at_once: bool = False,
        shares: Sequence[tuple[str, str, int]] = (),
        seqs: Mapping[str, int] | None = None,
        reported: Mapping[str, datetime] | None = None,
    ) -> None:
        """``commit`` for the event loop: awaits the batch instead of blocking a thread.
        ``at_once``: the caller has no batch to share (the Slurm filter); on SQLite, with
        the database free, the reservation is written here, now (see the module's text)."""
        reservation = _new_reservation(row, holds, nodes, audit, shares, seqs, reported)
        if at_once and self._write_at_once(reservation, on_loop=True):
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def finished() -> None:
            loop.call_soon_threadsafe(_settle, future, reservation)

        reservation.finished = finished
        self._submit(reservation)
        await future

    def _submit(self, reservation: _Reservation) -> None:
        self._ensure_started()
        with self._busy_lock:
            self._busy += 1
        self._queue.put(reservation)

    def _write_at_once(self, reservation: _Reservation, on_loop: bool) -> bool:
        """Write one reservation on the calling thread: True when written (its error
        raised as ``commit`` raises it), False when it must go to the queue instead (on
        the event loop and not SQLite, a batch queued or in progress, the database held
        by another writer, the kept connection lost, or a deadlock: the queue's retries
        take it)."""
        allowed = self._sqlite or not on_loop  # a worker thread may wait on Postgres
        if not allowed or self._busy or not self._at_once_lock.acquire(blocking=False):
            return False
        try:
            refused = revoked_meanwhile.refusal_of(reservation.admission)
            if refused is not None:
                raise refused
            try:
                self.writer.write_now(*self._rows(reservation))
            except DBAPIError as exc:
                if exc.connection_invalidated and self._landed([reservation]):
                    pass  # committed, its answer lost with the connection
                elif _locked(exc) or exc.connection_invalidated or is_transient(exc):
                    # Wait in the queue: another writer, a new connection, or a deadlock
                    # or serialization failure, which the queue's write runs again.
                    reservation.unsure = exc.connection_invalidated
                    return False
                else:
                    raise
            if self._on_batch is not None:
                self._on_batch(1)
            self.batches += 1
            self.committed += 1
            self.at_once += 1
            return True
        finally:
            self._at_once_lock.release()

    def _landed(self, batch: Sequence[_Reservation]) -> bool:
        """After a connection lost at the commit: whether the batch committed all the same
        (the server's answer was what was lost). Written again, it would meet its own
        rows: a second reservation for the one already made (a request without a key),
        or a 503 while the database holds its GPUs and memory shows them free. False
        when the database cannot say (the error stands)."""
        try:
            return self.writer.landed([str(r.row["id"]) for r in batch])
        except DBAPIError:
            log.warning("after a lost connection, whether the reservations committed is unknown")
            return False

    def stop(self) -> None:
        with self._start_lock:
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join()
                self._thread = None
        with self._at_once_lock:
            self.writer.close()

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

    def _rows(
        self, *batch: _Reservation
    ) -> tuple[
        list[Mapping[str, object]],
        list[dict[str, object]],
        list[str],
        list[Mapping[str, object]],
        list[dict[str, object]],
    ]:
        """The batch's allocation rows, holds, nodes, audit rows and shares, in the writing
        order (holds and shares by device: two batches take their rows in one order)."""
        rows = sorted((r.row for r in batch), key=_row_order)
        holds = sorted(
            (
                hold
                for r in batch
                for hold in pools.with_parents(
                    (
                        {
                            "node": node,
                            "device": device,
                            "kind": kind,
                            "allocation_id": r.row["id"],
                            "live": True,
                            "node_seq": r.seqs.get(node),
                            **_node_state(r, node),
                        }
                        for node, device, kind in r.holds
                    ),
                    str(r.row["placement"]),
                )
            ),
            key=lambda h: (h["node"], h["device"]),
        )
        nodes = [n for r in batch for n in r.nodes]
        audits = [r.audit for r in batch if r.audit is not None]
        shares = sorted(
            (
                {
                    "node": node,
                    "device": device,
                    "allocation_id": r.row["id"],
                    "milli": milli,
                    "node_seq": r.seqs.get(node),
                    **_node_state(r, node),
                }
                for r in batch
                for node, device, milli in r.shares
            ),
            key=lambda h: (h["node"], h["device"], h["allocation_id"]),
        )
        return rows, holds, nodes, audits, shares

    def _insert(self, batch: Sequence[_Reservation]) -> None:
        rows, holds, nodes, audits, shares = self._rows(*batch)
        retry_transient(
            lambda: self.writer.write(rows, holds, nodes, audits, shares), retried=self._on_retry
        )

    def _insert_checked(self, batch: Sequence[_Reservation]) -> None:
        """``_insert``, and where its outcome may have been a commit after all (a connection
        lost at the commit, or a reservation written before with its outcome unknown
        meeting rows: its own), the database asked whether the batch is stored."""
        try:
            self._insert(batch)
        except OperationalError as exc:
            if not exc.connection_invalidated:
                raise
            if not self._landed(batch):
                self._insert_again(batch)
        except IntegrityError:
            if not (any(r.unsure for r in batch) and self._landed(batch)):
                raise

    def _insert_again(self, batch: Sequence[_Reservation]) -> None:
        """A batch whose connection was lost at the commit and that the database did not
        show stored (it could not say, or the commit was still on its way): written once
        more, on a new connection, as a write at once of unknown outcome goes to the
        queue. Committed after all, the write meets its own rows and the batch is made;
        else this write makes it. Refused as not landed, a keyless caller's retry would
        reserve a second time while the first, committed, held its GPUs for its TTL."""
        for reservation in batch:
            reservation.unsure = True
        try:
            self._insert(batch)
        except IntegrityError:
            if not self._landed(batch):
                raise

    def _write(self, queued: list[_Reservation]) -> None:
        batch = [r for r in queued if not _refused(r)]
        try:
            if not batch:
                return
            try:
                self._insert_checked(batch)
            except OperationalError:
                raise  # the database does not answer: every waiter hears it, below
            except Exception:
                if len(batch) == 1:
                    raise
                # Someone in the batch lost a race or carries a value the database
                # refuses: find out who, commit the rest.
                for reservation in batch:
                    if _refused(reservation):  # revoked while the batch was tried
                        continue
                    try:
                        self._insert_checked([reservation])
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
            with self._busy_lock:
                self._busy -= len(queued)
            for reservation in queued:
                reservation.finished()


def _refused(reservation: _Reservation) -> bool:
    """Whether the reservation's token was revoked since its request was let in: then its
    error is the refusal (401), and none of its rows is written."""
    refused = revoked_meanwhile.refusal_of(reservation.admission)
    if refused is not None:
        reservation.error = refused
    return refused is not None


def _node_state(reservation: _Reservation, node: str) -> dict[str, object]:
    """What a hold names of its node's row: the snapshot's reported_at chosen on and the
    node uncordoned (a reservation is only ever chosen on an uncordoned node), so another
    snapshot row or a cordon committed since fails the commit. Neither where the
    reservation names no snapshot of the node: nothing is checked."""
    at = reservation.reported.get(node)
    return {"node_reported_at": at, "node_cordoned": None if at is None else False}


def _row_order(row: Mapping[str, object]) -> tuple[bool, str, str]:
    """Rows with an idempotency key first, by key: two batches that race on keys take
    them in one order."""
    key = row.get("idempotency_key")
    return (key is None, str(key or ""), str(row["id"]))


def _nothing() -> None:
    """A reservation written at once has nobody to wake."""


def _locked(exc: DBAPIError) -> bool:
    """SQLite's 'database is locked' (SQLITE_BUSY): another connection is writing."""
    orig = exc.orig
    return isinstance(orig, sqlite3.OperationalError) and (
        getattr(orig, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY or "locked" in str(orig)
    )


def _settle(future: asyncio.Future[None], reservation: _Reservation) -> None:
    if future.cancelled():
        return
    if reservation.error is not None:
        future.set_exception(reservation.error)
    else:
        future.set_result(None)


def _new_reservation(
    row: Mapping[str, object],
    holds: Sequence[tuple[str, str, str]],
    nodes: Sequence[str],
    audit: Mapping[str, object] | None,
    shares: Sequence[tuple[str, str, int]],
    seqs: Mapping[str, int] | None,
    reported: Mapping[str, datetime] | None,
) -> _Reservation:
    """A reservation to write, carrying the token check's admission of its request so
    the write can refuse one whose token was revoked meanwhile (revoked_meanwhile)."""
    return _Reservation(
        row,
        holds,
        nodes,
        audit,
        _nothing,
        shares,
        seqs or {},
        reported or {},
        admission=revoked_meanwhile.current(),
    )
