"""Private PgBouncer and PostgreSQL servers for tests and benchmarks.

``PgBouncer`` runs the real ``pgbouncer`` binary in transaction pooling mode
on a free local port, in front of a PostgreSQL server given by host and port.
``prepared_pgbouncer`` finds a binary of 1.21 or later, which can keep
protocol-level prepared statements across transaction pooling (Debian 12
ships 1.18; ``.ci/run`` builds Debian 13's, 1.24, from its source package
into ``/opt/pgbouncer-<version>``).
``PrivateCluster`` runs a throwaway PostgreSQL cluster (initdb + pg_ctl) that
a test may stop and restart; the shared server on 5432 is never touched.

Both refuse to run as root, so when the tests run as root they drop to the
``postgres`` user: PgBouncer through its own ``-u`` option, the cluster
through ``runuser``. Their files live in a directory that user can write.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")
RUN_AS = "postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes] | None, what: str,
               log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:g}s: "
                       f"{_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-2000:]
    except OSError:
        return "(no log)"


def _workdir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        shutil.chown(path, RUN_AS, RUN_AS)
    return path


PREPARED_SINCE = (1, 21)
"""The first PgBouncer that keeps prepared statements in transaction pooling."""
BUILT = "/opt/pgbouncer-*/bin/pgbouncer"
"""Where ``.ci/run`` installs the PgBouncer it builds."""


def pgbouncer_version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    first = out.split()[1]  # "PgBouncer 1.24.1"
    return tuple(int(part) for part in first.split(".")[:3])


def prepared_pgbouncer() -> str | None:
    """A ``pgbouncer`` binary of version 1.21 or later, if there is one here."""
    found = glob.glob(BUILT)
    if (installed := shutil.which("pgbouncer")) is not None:
        found.append(installed)
    newest = max(found, key=pgbouncer_version, default=None)
    return newest if newest and pgbouncer_version(newest) >= PREPARED_SINCE else None


def _as_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", RUN_AS, "--", *argv] if os.geteuid() == 0 else argv


class PgBouncer:
    """A PgBouncer child process in transaction pooling mode.

    ``url`` is what a client passes to reach database ``dbname`` through it.
    ``kill()`` ends it with SIGKILL (clients' connections die mid-flight);
    ``start()`` brings it back on the same port.
    """

    def __init__(self, *, server_host: str = "127.0.0.1", server_port: int = 5432,
                 dbname: str = "test", user: str = "postgres", pool_size: int = 20,
                 max_client_conn: int = 400, binary: str | None = None,
                 max_prepared_statements: int = 0) -> None:
        self.dir = _workdir("tl-pgbouncer-")
        self.port = free_port()
        self.dbname = dbname
        self.binary = binary
        self.url = f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"
        self.log = self.dir / "pgbouncer.log"
        (self.dir / "userlist.txt").write_text(f'"{user}" ""\n')
        # The settings threadline needs are documented in docs/scaling.md.
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"{dbname} = host={server_host} port={server_port} dbname={dbname}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            f"max_client_conn = {max_client_conn}\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.log}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n"
            "admin_users = postgres\n"
            # 1.21 on: protocol-level prepared statements survive transaction
            # pooling, PgBouncer preparing each on the server connection it uses.
            + (f"max_prepared_statements = {max_prepared_statements}\n"
               if max_prepared_statements else "")
        )
        if os.geteuid() == 0:
            for name in ("userlist.txt", "pgbouncer.ini"):
                shutil.chown(self.dir / name, RUN_AS, RUN_AS)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = self.binary or shutil.which("pgbouncer")
        if binary is None:
            raise FileNotFoundError("pgbouncer is not installed (apt-get install pgbouncer)")
        argv = [binary, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            argv[1:1] = ["-u", RUN_AS]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        _wait_port(self.port, self.proc, "pgbouncer", self.log)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateCluster:
    """A throwaway PostgreSQL cluster on a free port, with database ``test``."""

    @staticmethod
    def available() -> bool:
        as_root = os.geteuid() == 0
        return (PG_BIN / "initdb").exists() and (not as_root or shutil.which("runuser") is not None)

    def __init__(self) -> None:
        self.dir = _workdir("tl-pgcluster-")
        self.data = self.dir / "data"
        self.port = free_port()
        self.log = self.dir / "server.log"
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/test"
        self._run([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
                   "-A", "trust", "--no-sync", "-E", "UTF8"])
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                       f"unix_socket_directories = '{self.dir}'\nfsync = off\n"
                       "max_connections = 100\n")

    def _run(self, argv: list[str]) -> None:
        subprocess.run(_as_user(argv), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)

    def _ctl(self, *args: str) -> None:
        self._run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                   "-w", *args])

    def start(self) -> None:
        self._ctl("start")
        _wait_port(self.port, None, "postgres", self.log)

    def create_database(self) -> None:
        self._run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                   "-U", "postgres", "test"])

    def stop(self, mode: str = "fast") -> None:
        self._ctl("stop", "-m", mode)

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)
