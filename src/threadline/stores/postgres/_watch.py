"""How PostgreSQL stores tell each other of appends: NOTIFY after each commit,
one LISTEN connection per event loop that watches.

A NOTIFY names the session by an md5, so any session id fits the payload.
Appenders skip it while no store listens (they look again every ``_QUIET``
seconds); watchers also read on a timer, so a lost notification only delays.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

import psycopg
from psycopg import sql

from threadline.stores._watch import Wakeups
from threadline.stores.postgres._pool import LoopPool
from threadline.stores.postgres._wire import Connection, Statement

__all__ = ["NOTIFY", "Notifier", "payload"]

log = logging.getLogger("threadline.session")

# After an append has committed, in a transaction of its own that need not
# wait for its WAL flush (losing a notification in a crash is harmless:
# watchers also poll), so the notify lock is held for microseconds. It also
# says whether any store's LISTEN connection (named by its application_name)
# is still there.
NOTIFY = ("SELECT set_config('synchronous_commit', 'off', true), pg_notify(%s, %s), "
          "EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = %s)")

# Longest a LISTEN connection waits before it checks whether its store closed.
_LISTEN_TICK = 1.0
# Seconds an appender that saw no listener waits before it looks again.
_QUIET = 0.25


def payload(sid: str) -> str:
    """The NOTIFY payload for session ``sid``."""
    return hashlib.md5(sid.encode()).hexdigest()


class Notifier:
    """One store's side of the notifications on its schema's channel."""

    def __init__(self, schema: str, where: str, listen_url: str | None,
                 connect_timeout: float, statement: Statement, *,
                 tenant: str | None = None) -> None:
        # A channel per tenant: a tenant's listeners hear only its own appends.
        name = schema if tenant is None else f"{schema}\x00{tenant}"
        self.channel = "threadline_" + hashlib.md5(name.encode()).hexdigest()[:16]
        self.listener_name = "threadline-listen-" + self.channel
        self.wakeups = Wakeups()
        self.closed = False
        self._where = where
        self._url = listen_url
        self._connect_timeout = connect_timeout
        self._statement = statement
        # Whether some process listens on the channel, and when that was learnt.
        self.listened = True
        self.listened_at = -1e9

    def quiet(self) -> bool:
        """Whether an append may skip its NOTIFY: nobody listened when last looked."""
        return not self.listened and time.monotonic() - self.listened_at < _QUIET

    async def notify(self, conn: psycopg.AsyncConnection[Any], sid: str) -> None:
        """Wake the watchers of ``sid`` in every process, once the append is committed."""
        if not conn.autocommit:
            # A pool's own transaction: notify inside it (its commit stays synchronous).
            await conn.execute("SELECT pg_notify(%s, %s)", (self.channel, payload(sid)))
            return
        if self.quiet():
            return
        params = (self.channel, payload(sid), self.listener_name)
        try:
            if isinstance(conn, Connection) and conn.wire is not None:
                result = await conn.wire.run(self._statement, [p.encode() for p in params])
                listened = result.get_value(0, 2) == b"t"
            else:
                cur = await conn.execute(NOTIFY, params)
                row = await cur.fetchone()
                listened = bool(row and row[2])
        except psycopg.Error as exc:  # the append is stored; watchers' reads will see it
            log.debug("%s: NOTIFY for session %r failed: %s", self._where, sid, exc)
            return
        self.listened = listened
        self.listened_at = time.monotonic()

    def listen(self, here: LoopPool) -> None:
        """Start this loop's LISTEN connection, unless it runs (or there is no URL)."""
        if self._url is not None and (here.listener is None or here.listener.done()):
            here.listener = asyncio.create_task(self._listen(self._url, here))

    async def _listen(self, url: str, here: LoopPool) -> None:
        """Hold a ``LISTEN`` connection until the store or the loop's pool closes;
        reconnect when it drops.

        It is cancelled only while idle (``here.waiting``): a connect or LISTEN
        cut by a cancel could leave its socket to the garbage collector. Busy,
        it sees the closing flags within one step.
        """
        delay = 0.05
        while not (self.closed or here.closing):
            try:
                conn = await psycopg.AsyncConnection.connect(
                    url, autocommit=True, connect_timeout=max(1, round(self._connect_timeout)),
                    application_name=self.listener_name)  # how appenders see a listener
                async with conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.listened, self.listened_at = True, time.monotonic()
                    delay = 0.05
                    # Appends made while nobody listened: every watcher reads again.
                    # (Notifications that arrive before the generator runs wait on
                    # the socket or in psycopg's backlog; none is lost.)
                    self.wakeups.ring()
                    # Bounded waits, because CPython 3.11's wait_for (inside
                    # psycopg's) can swallow the cancel; the closing flags then
                    # end the task within one tick instead of never.
                    while not (self.closed or here.closing):
                        here.waiting = True
                        try:
                            async for note in conn.notifies(timeout=_LISTEN_TICK):
                                self.wakeups.ring(note.payload)
                        finally:
                            here.waiting = False
                return
            except psycopg.Error as exc:
                log.debug("%s: LISTEN connection lost, reconnecting: %s", self._where, exc)
            here.waiting = True
            try:
                await asyncio.sleep(delay)
            finally:
                here.waiting = False
            delay = min(delay * 2, 2.0)
