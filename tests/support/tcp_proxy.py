"""A TCP proxy in front of PostgreSQL, for tests that watch or break the wire."""

from __future__ import annotations

import asyncio
from typing import Self
from urllib.parse import urlsplit, urlunsplit


class TcpProxy:
    """Forwards connections from a local port to the PostgreSQL server of ``url``.

    It counts the connections made through it (``made``) and those still open
    (``open``). A subclass's ``cut`` may end a connection on a reply from the
    server, as a network failure would.
    """

    def __init__(self, url: str) -> None:
        self._parts = urlsplit(url)
        self.target_port = self._parts.port or 5432
        self.port = 0
        self.made = 0
        self.open = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            # Connections still open are the store's; they end with it.

    @property
    def url(self) -> str:
        """The server's URL (without a password) through this proxy."""
        parts = self._parts
        return urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{self.port}"))

    def cut(self, reply: bytes) -> bool:
        """Whether to drop this reply and cut its connection."""
        return False

    async def closed(self) -> bool:
        """Whether every connection made through the proxy has ended (waiting up to 5 s)."""
        for _ in range(500):
            if self.open == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.made += 1
        self.open += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

            async def pump(
                src: asyncio.StreamReader, dst: asyncio.StreamWriter, reply: bool
            ) -> None:
                try:
                    while data := await src.read(1 << 16):
                        if reply and self.cut(data):
                            writer.transport.abort()
                            up_writer.transport.abort()
                            return
                        dst.write(data)
                        await dst.drain()
                except (ConnectionError, OSError):
                    pass
                finally:
                    dst.close()

            await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True))
        except asyncio.CancelledError:  # the test's loop ended with the connection open
            pass
        finally:
            self.open -= 1
