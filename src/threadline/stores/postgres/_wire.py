"""The append sent through psycopg's libpq binding instead of its ``execute``.

The store knows its append's parameter types, so it encodes them in binary
itself and sends the statement with libpq's calls (``psycopg.pq``), prepared
per connection as psycopg prepares its own; the reply is awaited on the
event loop. Its errors are psycopg's classes for the server's SQLSTATE, so
the store maps them as it maps psycopg's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import struct
from collections.abc import Sequence
from typing import Any, Literal

import psycopg
from psycopg import pq

from threadline.stores._rows import Row

__all__ = ["VALUES_MAX", "Connection", "Statement", "Wire", "settle", "statements",
           "values"]

log = logging.getLogger("threadline.session")

VALUES_MAX = 8
"""Appends of up to this many entries list them in a VALUES statement (and go on the wire).

For a few entries the server runs that faster than the same rows as
``unnest``'s arrays; for many, the arrays win."""


class Connection(psycopg.AsyncConnection[Any]):
    """A connection the store made, with its append's wire once it has one."""

    wire: Wire | None = None


class Statement:
    """A statement as the wire sends it: ``$n`` placeholders, its parameters'
    types given, all of them sent in binary."""

    __slots__ = ("formats", "name", "query", "types")

    def __init__(self, name: str, query: str, types: list[int]) -> None:
        placeholders = iter(range(1, len(types) + 1))
        self.query = re.sub("%s", lambda _: f"${next(placeholders)}", query).encode()
        self.name = name.encode()
        self.types = types
        self.formats = [1] * len(types)


_TEXT_OID, _INT2_OID, _BYTEA_OID, _INT8_OID = 25, 21, 17, 20


def statements(q: dict[str, str], schema: str) -> dict[str | int, Statement]:
    """The wire's statements for a store's queries ``q``: the append of each
    size up to ``VALUES_MAX`` by its size, and ``"notify"``."""
    prefix = f"threadline_{hashlib.md5(schema.encode()).hexdigest()[:16]}_"
    row = [_INT2_OID, _BYTEA_OID, _BYTEA_OID, _INT8_OID, _BYTEA_OID]
    out: dict[str | int, Statement] = {
        n: Statement(f"{prefix}append{n}", q[f"append{n}"],
                     [_INT8_OID, _TEXT_OID, _TEXT_OID, *row * n])
        for n in range(1, VALUES_MAX + 1)}
    out["notify"] = Statement(f"{prefix}notify", q["notify"], [_TEXT_OID] * 3)
    return out


_int2 = struct.Struct("!h").pack
_int8 = struct.Struct("!q").pack


def values(tenant: bytes, sid: bytes, rows: Sequence[Row],
           newest: int | None) -> list[bytes | None]:
    """The append's parameters in binary: the newest entry time (the session's last
    activity), the tenant, the session id, then each row's columns."""
    out: list[bytes | None] = [None if newest is None else _int8(newest), tenant, sid]
    for kind, key, parent, ts, data in rows:
        out += (_int2(kind), key, parent, None if ts is None else _int8(ts), data)
    return out


_ACTIVE = pq.TransactionStatus.ACTIVE
_IDLE = pq.TransactionStatus.IDLE
_DONE = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
_SYNC = pq.ExecStatus.PIPELINE_SYNC
_ABORTED = pq.ExecStatus.PIPELINE_ABORTED

_Wait = Literal["read", "write"]


class Wire:
    """One store connection's statements, sent and answered through libpq.

    ``send`` and ``step`` never wait; ``run`` awaits the socket between
    steps, with a reader (or writer) on the event loop only while it waits,
    so psycopg's own operations on the connection never meet it.
    """

    __slots__ = ("conn", "encoding", "last", "next", "pgconn", "prepared", "result", "runs",
                 "sent")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        self.encoding = conn.info.encoding
        self.prepared: set[bytes] = set()
        self.runs: dict[bytes, int] = {}
        """How often each statement ran unprepared."""
        self.result: pq.abc.PGresult | None = None
        self.next: tuple[Statement, list[bytes | None]] | None = None
        """The statement to send once its preparation succeeds."""
        self.sent: tuple[Statement, list[bytes | None]] | None = None
        """The statement sent prepared, until its reply."""
        self.last: pq.abc.PGresult | None = None

    async def run(self, statement: Statement, params: list[bytes | None]) -> pq.abc.PGresult:
        """Send ``statement`` with ``params``; its result, or its error raised."""
        self.send(statement, params)
        try:
            await self._reply()
        except asyncio.CancelledError:
            await self._cancel()
            raise
        result, self.last = self.last, None
        assert result is not None
        return result

    async def run_after(self, first: Statement, first_params: list[bytes | None],
                        statement: Statement, params: list[bytes | None]) -> pq.abc.PGresult:
        """``first``, then ``statement``: one pipeline ended by one Sync.

        That is one round trip and one implicit transaction, so a
        transaction-local ``set_config`` in ``first`` holds for ``statement``
        and ends with it, also behind PgBouncer's transaction pooling, which
        hands the server connection back only at the Sync. Each is prepared
        as ``send`` would (``first`` at its first run: it is one short
        statement), in the same pipeline. ``statement``'s result, or the
        first error raised.
        """
        for _ in range(4):
            plan: list[tuple[bool, Statement, list[bytes | None]]] = []
            for stmt, args, at in ((first, first_params, 0), (statement, params, None)):
                name = stmt.name
                if name not in self.prepared:
                    threshold, runs = self.conn.prepare_threshold, self.runs.get(name, 0)
                    if threshold is not None and runs >= (threshold if at is None else at):
                        plan.append((True, stmt, args))  # prepare it, then run it
                    else:
                        self.runs[name] = runs + 1
                plan.append((False, stmt, args))
            try:
                results = await self._pipeline(plan)
            except asyncio.CancelledError:
                await self._abandon()
                raise
            except psycopg.Error:
                await self.conn.close()  # cut mid-pipeline: not fit for the pool
                raise
            # One result per message sent, in order (PIPELINE_ABORTED after an error).
            failed = next(((step, r) for step, r in zip(plan, results, strict=True)
                           if r.status not in _DONE and r.status != _ABORTED), None)
            if failed is None:
                self.prepared.update(stmt.name for prep, stmt, _ in plan if prep)
                return results[-1]
            (prep, stmt, _), result = failed
            exc = _error(result, self.encoding)
            if isinstance(exc, psycopg.errors.InvalidSqlStatementName) and not prep:
                # Gone from the server (DISCARD ALL): nothing ran; prepare it again.
                self.prepared.discard(stmt.name)
                self.runs[stmt.name] = self.conn.prepare_threshold or 0
                continue
            if isinstance(exc, psycopg.errors.DuplicatePreparedStatement) and prep:
                self.prepared.add(stmt.name)  # prepared by a pipeline that was cancelled
                continue
            raise exc
        raise psycopg.InternalError(f"statement {statement.name.decode()} could not be "
                                    f"prepared")

    async def _pipeline(self, plan: list[tuple[bool, Statement, list[bytes | None]]]
                        ) -> list[pq.abc.PGresult]:
        pgconn = self.pgconn
        pgconn.enter_pipeline_mode()
        for prepare, stmt, args in plan:
            if prepare:
                pgconn.send_prepare(stmt.name, stmt.query, stmt.types)
            elif stmt.name in self.prepared or any(p and s is stmt for p, s, _ in plan):
                pgconn.send_query_prepared(stmt.name, args, stmt.formats)
            else:
                pgconn.send_query_params(stmt.query, args, stmt.types, stmt.formats)
        pgconn.pipeline_sync()
        return await self._collect()

    async def _collect(self) -> list[pq.abc.PGresult]:
        """Read a pipeline's results up to its Sync, then leave pipeline mode."""
        pgconn, out = self.pgconn, []
        loop = asyncio.get_running_loop()
        while True:
            if pgconn.flush():
                waiter = loop.create_future()
                loop.add_writer(pgconn.socket, settle, waiter)
                try:
                    await waiter
                finally:
                    loop.remove_writer(pgconn.socket)
                continue
            if pgconn.is_busy():
                waiter = loop.create_future()
                fd = pgconn.socket
                loop.add_reader(fd, settle, waiter)
                try:
                    await waiter
                finally:
                    loop.remove_reader(fd)
                pgconn.consume_input()
                continue
            got = pgconn.get_result()
            if got is None:
                continue  # the end of one statement's results
            if got.status == _SYNC:
                break
            out.append(got)
        pgconn.exit_pipeline_mode()
        return out

    async def _abandon(self) -> None:
        """A pipeline cancelled while waiting: cancel it on the server and read it
        to its end, so the connection goes back to the pool idle; else close it."""
        try:
            await self.conn.cancel_safe(timeout=5.0)
            async with asyncio.timeout(5.0):
                await self._collect()
            if self.pgconn.transaction_status == _IDLE:
                return
            problem = "its reply did not end the pipeline"
        except BaseException as exc:
            if not isinstance(exc, Exception):
                await self.conn.close()
                raise
            problem = type(exc).__name__
        log.warning("cancelling an append failed (%s): closing its connection", problem)
        await self.conn.close()

    def send(self, statement: Statement, params: list[bytes | None]) -> None:
        """Send ``statement``; ``step`` then tells when its result is in."""
        name, pgconn = statement.name, self.pgconn
        try:
            if name in self.prepared:
                pgconn.send_query_prepared(name, params, statement.formats)
                self.sent = (statement, params)
                return
            # As psycopg does: prepared (one more round trip, once) after
            # ``prepare_threshold`` runs on this connection; never with None.
            threshold, runs = self.conn.prepare_threshold, self.runs.get(name, 0)
            if threshold is None or runs < threshold:
                self.runs[name] = runs + 1
                pgconn.send_query_params(statement.query, params, statement.types,
                                         statement.formats)
                return
            pgconn.send_prepare(name, statement.query, statement.types)
            self.next = (statement, params)
        except psycopg.Error:
            self.failed()
            raise

    async def _reply(self) -> None:
        """Step until ``last`` holds the reply, awaiting the socket in between."""
        loop = asyncio.get_running_loop()
        while (wait := self.step()) is not None:
            fd = self.pgconn.socket
            waiter = loop.create_future()
            if wait == "write":  # rare: the socket's buffer is full
                loop.add_writer(fd, settle, waiter)
                try:
                    await waiter
                finally:
                    loop.remove_writer(fd)
                continue
            loop.add_reader(fd, settle, waiter)
            try:
                await waiter
            finally:
                loop.remove_reader(fd)  # before libpq may close the socket
            try:
                self.pgconn.consume_input()
            except psycopg.Error:
                self.failed()
                raise

    def step(self) -> _Wait | None:
        """What to wait for before the next step, or None once ``last`` is set.

        Raises the statement's error (psycopg's class for its SQLSTATE).
        """
        pgconn = self.pgconn
        try:
            while True:
                if pgconn.flush():
                    return "write"
                if pgconn.is_busy():
                    return "read"
                got = pgconn.get_result()
                if got is not None:
                    if self.result is None or self.result.status in _DONE:
                        self.result = got  # the first error wins
                    continue
                result, self.result = self.result, None  # the reply has ended
                if result is None:
                    raise psycopg.InternalError("got no result from the query")
                sent, self.sent = self.sent, None
                if result.status not in _DONE:
                    error = _error(result, self.encoding)
                    if (isinstance(error, psycopg.errors.InvalidSqlStatementName)
                            and sent is not None):
                        # The statement is gone from the server (DEALLOCATE,
                        # DISCARD ALL): nothing ran, so prepare it and send again.
                        self.prepared.discard(sent[0].name)
                        pgconn.send_prepare(sent[0].name, sent[0].query, sent[0].types)
                        self.next = sent
                        continue
                    if not (isinstance(error, psycopg.errors.DuplicatePreparedStatement)
                            and self.next is not None):
                        self.next = None
                        raise error
                    # Prepared already, by a preparation whose append was
                    # cancelled (``_cancel``): use it.
                if self.next is None:
                    self.last = result
                    return None
                statement, params = self.next  # prepared: now the statement itself
                self.next = None
                self.prepared.add(statement.name)
                pgconn.send_query_prepared(statement.name, params, statement.formats)
        except psycopg.Error:
            self.failed()
            raise

    def failed(self) -> None:
        self.result = self.next = self.sent = None

    async def _cancel(self) -> None:
        """Cancel the statement in flight and read its reply (as psycopg does), so
        the connection goes back to the pool idle; else close the connection."""
        self.next = None  # a statement cancelled while being prepared is never sent
        if self.pgconn.transaction_status != _ACTIVE:
            return
        try:
            await self.conn.cancel_safe(timeout=5.0)
            async with asyncio.timeout(5.0):
                # QueryCanceled, or whatever the statement came to first:
                # either way its reply is read and the connection is idle.
                with contextlib.suppress(psycopg.DatabaseError):
                    await self._reply()
            self.last = None
            if self.pgconn.transaction_status == _IDLE:
                return
            problem = "its reply did not end the statement"
        except BaseException as exc:
            if not isinstance(exc, Exception):
                await self.conn.close()
                raise
            problem = type(exc).__name__
        log.warning("cancelling an append failed (%s): closing its connection", problem)
        await self.conn.close()


def _error(result: pq.abc.PGresult, encoding: str) -> psycopg.Error:
    """psycopg's exception for a failed result: its class for the SQLSTATE, or
    else for the SQLSTATE's class (``08xxx`` as ``08000``), with the server's message."""
    state = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode("ascii", "replace")
    message = (result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)
               or result.error_message).decode(encoding, "replace").strip()
    for code in (state, state[:2] + "000"):
        with contextlib.suppress(KeyError):
            return psycopg.errors.lookup(code)(message)
    return psycopg.DatabaseError(message)


def settle(fut: asyncio.Future[None]) -> None:
    """Set ``fut``'s result unless it is done (a callback's way of waking a waiter)."""
    if not fut.done():
        fut.set_result(None)
