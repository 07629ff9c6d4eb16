"""Power-loss testing for local stores: record what a store writes under one
directory, then rebuild and check every state a power cut could have left.

``PowerLoss`` runs workload processes under an LD_PRELOAD shim
(``_powerloss_shim.c``, compiled on first use) that writes each file operation
under the directory to a trace, with its data; the workload calls
``mark_acknowledged`` after each call its store acknowledged. A
``PowerLossTrace`` rebuilds, for a cut in the trace, the file states a power
cut at that moment could leave, under a model of what a file system keeps
(docs/power-loss.md), writes each into a directory of its own and runs a check
there.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NamedTuple, cast

from threadline.errors import ConfigError

__all__ = ["CrashState", "PowerLoss", "PowerLossReport", "PowerLossTrace", "inject_fault",
           "mark_acknowledged"]

Model = Literal["reordering", "ordered"]

_HEADER = struct.Struct("<IiqqQQIIQ")
_OPEN, _WRITE, _TRUNC, _SYNC, _RENAME, _LINK, _UNLINK, _CLOSE, _MARK, _KILL, _UNSUPPORTED = \
    range(1, 12)
_RENAME_EXCHANGE = 2
_ENV_DIR = "THREADLINE_POWERLOSS_DIR"
_ENV_TRACE = "THREADLINE_POWERLOSS_TRACE"
_ENV_FAIL = "THREADLINE_POWERLOSS_FAIL_SYNC"
_ENV_KILL = "THREADLINE_POWERLOSS_KILL_SYNC"
_SECTOR = 512
_ENUMERABLE = 12  # pending operations of one file whose subsets are all listed
_CACHE_BYTES = 64 << 20  # per file: contents after a number of its operations


# -- the recorder ---------------------------------------------------------------


@functools.cache
def _shim() -> Path:
    """The compiled shim, built once per source version into the user's cache."""
    if sys.platform != "linux":
        raise ConfigError(f"power-loss recording needs Linux (it preloads a shim into the "
                          f"C library's file calls); this is {sys.platform}")
    source = resources.files("threadline.testing").joinpath("_powerloss_shim.c").read_bytes()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "threadline"
    lib = cache / f"powerloss-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    wanted = os.environ.get("CC")
    cc = shutil.which(wanted) if wanted else shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ConfigError("power-loss recording compiles a small C library on first use, and "
                          "no C compiler was found (cc or gcc on PATH, or set CC)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        src, out = Path(tmp) / "shim.c", Path(tmp) / "shim.so"
        src.write_bytes(source)
        built = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(src),
                                "-ldl", "-lpthread"], capture_output=True, text=True, check=False)
        if built.returncode:
            raise ConfigError(f"compiling the power-loss shim with {cc} failed: "
                              f"{built.stderr.strip() or f'exit status {built.returncode}'}")
        os.replace(out, lib)  # atomic: processes building at once each get a whole file
    return lib


class _Start(NamedTuple):
    """The watched directory when recording began, taken as durable."""

    files: dict[str, tuple[int, int, bytes]]  # relative path -> (dev, ino, content)
    dirs: dict[str, tuple[int, int]]


def _snapshot(root: Path) -> _Start:
    files: dict[str, tuple[int, int, bytes]] = {}
    dirs: dict[str, tuple[int, int]] = {}
    for here, subdirs, names in os.walk(root):
        rel = os.path.relpath(here, root)
        rel = "" if rel == "." else rel
        st = os.stat(here)
        dirs[rel] = (st.st_dev, st.st_ino)
        for name in names:
            path = os.path.join(here, name)
            st = os.lstat(path)
            if name.endswith("-shm") or not os.path.isfile(path) or os.path.islink(path):
                continue
            files[os.path.join(rel, name) if rel else name] = (
                st.st_dev, st.st_ino, Path(path).read_bytes())
        subdirs.sort()
    return _Start(files, dirs)


class PowerLoss:
    """Records the file operations of processes under ``directory`` into one trace.

    The directory's files when the recorder is made count as durable. Each
    process started with ``run`` (or with ``env()`` in its environment) adds
    to the same trace, in the order the operations took effect, so a writer
    that dies and a process that retries after it share one history.
    ``trace`` is where it is kept (default: ``<directory>.powerloss`` beside
    the directory; it must be outside it).
    """

    def __init__(self, directory: str | os.PathLike[str],
                 trace: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(os.path.realpath(directory))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.trace_path = Path(os.path.realpath(
            trace if trace is not None else f"{self.directory}.powerloss"))
        if self.trace_path.is_relative_to(self.directory):
            raise ConfigError(f"the power-loss trace {self.trace_path} must be outside the "
                              f"directory it records ({self.directory})")
        self.trace_path.write_bytes(b"")
        self._lib = _shim()
        self._start = _snapshot(self.directory)

    def env(self, *, fail_sync: int | None = None,
            kill_before_sync: int | None = None) -> dict[str, str]:
        """Environment variables that make a process record into this trace.

        ``fail_sync=N`` fails the process's Nth ``fsync``/``fdatasync`` of a
        watched file or directory with EIO, without syncing;
        ``kill_before_sync=N`` kills it with SIGKILL just before its Nth.
        """
        preload = " ".join(p for p in (str(self._lib), os.environ.get("LD_PRELOAD")) if p)
        env = {"LD_PRELOAD": preload, _ENV_DIR: str(self.directory),
               _ENV_TRACE: str(self.trace_path)}
        for name, nth in ((_ENV_FAIL, fail_sync), (_ENV_KILL, kill_before_sync)):
            if nth is not None:
                env[name] = str(_positive(nth))
        return env

    def run(self, args: Sequence[str], *, fail_sync: int | None = None,
            kill_before_sync: int | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """Run ``args`` recording into this trace; its output is captured, its exit not checked."""
        full = {**os.environ, **(env or {}),
                **self.env(fail_sync=fail_sync, kill_before_sync=kill_before_sync)}
        return subprocess.run(list(args), env=full, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def trace(self) -> PowerLossTrace:
        """The trace recorded so far."""
        return PowerLossTrace(self.trace_path.read_bytes(), self.directory, self._start)


def _positive(nth: int) -> int:
    if nth < 1:
        raise ConfigError(f"a sync is counted from 1, got {nth}")
    return nth


def _shim_call(name: str, *argtypes: Any) -> Callable[..., int]:
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except AttributeError:
        raise ConfigError("this process is not recording for PowerLoss: start it with "
                          "PowerLoss.run, or with PowerLoss.env() in its environment") from None
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return cast(Callable[..., int], fn)


def mark_acknowledged(what: str) -> None:
    """In a recorded process: note in the trace that ``what`` was acknowledged, now.

    Call it right after the store call returned; every crash state cut
    after this point lists ``what`` in ``CrashState.acknowledged``.
    """
    if "\0" in what:
        raise ValueError("an acknowledgement cannot hold a NUL character")
    mark = _shim_call("threadline_powerloss_mark", ctypes.c_char_p)
    if mark(what.encode("utf-8")) != 0:
        raise ConfigError(f"the power-loss shim is loaded but not recording: set {_ENV_DIR} "
                          f"and {_ENV_TRACE} (PowerLoss.env)")


def inject_fault(*, fail_sync: int | None = None, kill_before_sync: int | None = None) -> None:
    """In a recorded process: fail (EIO), or SIGKILL the process before, its Nth sync from now.

    Counts every ``fsync``/``fdatasync`` of a watched file or directory made
    after this call, by any thread.
    """
    arm = _shim_call("threadline_powerloss_arm", ctypes.c_int, ctypes.c_long)
    for what, nth in ((1, fail_sync), (2, kill_before_sync)):
        if nth is not None and arm(what, _positive(nth)) != 0:
            raise ConfigError("the power-loss shim is loaded but not recording")


# -- the trace and its model ------------------------------------------------------


class _File:
    """One file (inode) the trace wrote: its data operations and its syncs."""

    __slots__ = ("at", "base", "cache", "cached", "index", "name", "ops", "syncs", "torn")

    def __init__(self, index: int, name: str, base: bytes) -> None:
        self.index = index
        self.name = name
        self.base = base
        self.at: list[int] = []  # trace index of each data operation
        self.ops: list[tuple[int, bytes | None]] = []  # (offset, data) or (length, None)
        self.syncs: list[int] = []  # trace indices of the syncs that succeeded
        self.cache: dict[int, bytes] = {0: base}
        self.cached = 0
        self.torn: dict[tuple[int, int, int], list[int]] = {}

    def tears(self, k: int, extra: int, seed: int) -> list[int]:
        """Where write ``k`` may be torn: bytes kept, 1 to its length - 1."""
        found = self.torn.get((k, extra, seed))
        if found is None:
            data = self.ops[k][1]
            found = []
            if data is not None and len(data) > 1:
                size = len(data)
                rng = random.Random(hash((seed, self.index, k)))
                found = sorted({1, size - 1, *range(_SECTOR, size, _SECTOR),
                                *(rng.randrange(1, size) for _ in range(extra))})
            self.torn[(k, extra, seed)] = found
        return found

    def content(self, count: int, extra: tuple[int, ...] = (), tear: int | None = None) -> bytes:
        """The file after its first ``count`` operations, then ``extra`` (the last torn)."""
        base = max(k for k in self.cache if k <= count)
        buf = bytearray(self.cache[base])
        for k in range(base, count):
            _apply(buf, *self.ops[k])
        if count not in self.cache:
            if self.cached > _CACHE_BYTES:
                self.cache, self.cached = {0: self.base}, 0
            self.cache[count] = bytes(buf)
            self.cached += len(buf)
        for n, k in enumerate(extra):
            off, data = self.ops[k]
            if tear is not None and n == len(extra) - 1 and data is not None:
                data = data[:tear]
            _apply(buf, off, data)
        return bytes(buf)


def _apply(buf: bytearray, off: int, data: bytes | None) -> None:
    if data is None:  # a truncation to ``off`` bytes
        if off < len(buf):
            del buf[off:]
        else:
            buf.extend(bytes(off - len(buf)))
        return
    if off > len(buf):
        buf.extend(bytes(off - len(buf)))
    buf[off:off + len(data)] = data


class _Dir:
    """One directory: its entries at the start, and the trace's changes to them."""

    __slots__ = ("at", "base", "ops", "syncs")

    def __init__(self, base: dict[str, int]) -> None:
        self.base = base
        self.at: list[int] = []
        self.ops: list[tuple[str | None, str | None, int]] = []  # (name removed, name set, file)
        self.syncs: list[int] = []

    def entries(self, count: int) -> dict[str, int]:
        names = dict(self.base)
        for removed, added, file in self.ops[:count]:
            if removed is not None:
                names.pop(removed, None)
            if added is not None:
                names[added] = file
        return names


# A state is chosen by: per directory, how many entry changes it keeps; per
# file, (operations applied in full, further operations kept, bytes kept of
# the last of those if torn).
_FileChoice = tuple[int, tuple[int, ...], int | None]
_Spec = tuple[tuple[int, ...], tuple[_FileChoice, ...]]


@dataclass(frozen=True)
class CrashState:
    """What a power cut after the first ``cut`` operations of a trace could leave."""

    cut: int
    """Operations of the trace made before the power cut."""
    files: Mapping[str, bytes]
    """Each file's content, by path relative to the recorded directory."""
    directories: tuple[str, ...]
    """The directories (relative; ``""`` is the recorded one)."""
    acknowledged: tuple[str, ...]
    """What ``mark_acknowledged`` noted before the cut, in order."""
    description: str
    """What this state kept and lost of the operations not yet synced."""

    def write_to(self, directory: str | os.PathLike[str]) -> Path:
        """Create the state's directories and files under ``directory``."""
        root = Path(directory)
        for rel in self.directories:
            (root / rel).mkdir(parents=True, exist_ok=True)
        for rel, data in self.files.items():
            (root / rel).write_bytes(data)
        return root


@dataclass(frozen=True)
class PowerLossReport:
    """How many crash states ``PowerLossTrace.check`` built and checked."""

    cuts: int
    """Cut points examined: just before each sync that succeeded, and the end."""
    generated: int
    """States built at those cuts, repeats included."""
    checked: int
    """Distinct states checked (a state several cuts can leave, once)."""

    def __str__(self) -> str:
        return (f"{self.checked} distinct crash states checked ({self.generated} built at "
                f"{self.cuts} cut points)")


class _Record(NamedTuple):
    """One record of the shim's trace."""

    kind: int
    pid: int
    a: int
    b: int
    dev: int
    ino: int
    p1: bytes
    p2: bytes
    data: bytes

    @property
    def key(self) -> tuple[int, int]:
        return self.dev, self.ino


def _records(data: bytes, where: Path) -> Iterator[_Record]:
    pos = 0
    while pos < len(data):
        if pos + _HEADER.size > len(data):
            raise _partial(where)
        kind, pid, a, b, dev, ino, len1, len2, len3 = _HEADER.unpack_from(data, pos)
        pos += _HEADER.size
        end = pos + len1 + len2 + len3
        if end > len(data):
            raise _partial(where)
        yield _Record(kind, pid, a, b, dev, ino, data[pos:pos + len1],
                      data[pos + len1:pos + len1 + len2], data[pos + len1 + len2:end])
        pos = end


def _partial(where: Path) -> ConfigError:
    return ConfigError(f"the power-loss trace of {where} ends in half a record: a process "
                       f"was killed from outside while it recorded an operation, so the "
                       f"trace misses what that operation did")


class _Op(NamedTuple):
    kind: int
    pid: int
    what: str  # for descriptions


class PowerLossTrace:
    """A recorded history of file operations, and the crash states it allows.

    Models (docs/power-loss.md): ``"reordering"`` (the default) keeps of each
    file everything up to its last successful ``fsync``/``fdatasync`` plus
    any subset of the writes and truncations made since, applied in order,
    the last one kept possibly torn at any byte; of each directory, its
    entries as of its last ``fsync`` plus a prefix, in order, of the
    creations, links, renames and unlinks made in it since. ``"ordered"``
    keeps a prefix of all operations, in order, the last write possibly
    torn, never cut before an operation a successful sync covered.
    """

    def __init__(self, data: bytes, directory: Path, start: _Start) -> None:
        self.directory = directory
        self._ops: list[_Op] = []
        self._files: list[_File] = []
        self._dirs: dict[str, _Dir] = {}
        self._marks: list[int] = []
        self._mark_text: list[str] = []
        self._syncs: list[int] = []  # every successful sync, for the ordered model
        self._replay(data, start)

    def __len__(self) -> int:
        return len(self._ops)

    # -- reading the trace --------------------------------------------------------

    def _rel(self, path: bytes) -> str | None:
        text = os.fsdecode(path)
        root = str(self.directory)
        if text == root:
            return ""
        return text[len(root) + 1:] if text.startswith(root + "/") else None

    def _dir(self, rel: str) -> _Dir:
        return self._dirs.setdefault(rel, _Dir({}))

    def _replay(self, data: bytes, start: _Start) -> None:
        self._inodes: dict[tuple[int, int], int] = {}  # (dev, ino) -> file, as of now
        self._dir_inodes: dict[tuple[int, int], str] = {v: k for k, v in start.dirs.items()}
        self._names: dict[str, int] = {}  # every name as of now, in trace order
        for rel in start.dirs:
            self._dir(rel)
        for rel, (dev, ino, content) in start.files.items():
            n = len(self._files)
            self._files.append(_File(n, rel, content))
            self._inodes[(dev, ino)] = self._names[rel] = n
            self._dir(os.path.dirname(rel)).base[os.path.basename(rel)] = n
        handlers: dict[int, Callable[[_Record], None]] = {
            _OPEN: self._open, _WRITE: self._write, _TRUNC: self._write, _SYNC: self._sync,
            _RENAME: self._namespace, _LINK: self._namespace, _UNLINK: self._namespace,
            _MARK: self._mark, _KILL: self._kill, _UNSUPPORTED: self._unsupported}
        for record in _records(data, self.directory):
            handler = handlers.get(record.kind)
            if handler is not None:
                handler(record)
        del self._inodes, self._dir_inodes, self._names

    def _open(self, r: _Record) -> None:
        rel = self._rel(r.p1)
        if rel is None:
            return
        if r.b & 2:  # a directory, opened to be synced
            self._dir_inodes[r.key] = rel
            self._dir(rel)
            return
        if r.a:  # created
            n = len(self._files)
            self._files.append(_File(n, rel, b""))
            self._inodes[r.key] = self._names[rel] = n
            self._entry(rel, None, os.path.basename(rel), n)
            self._ops.append(_Op(r.kind, r.pid, f"create {rel}"))
        if r.b & 1:  # an existing file truncated by O_TRUNC
            self._data(self._known(r, "truncated"), 0, None)
            self._ops.append(_Op(_TRUNC, r.pid, f"truncate {rel} to 0 (O_TRUNC)"))

    def _write(self, r: _Record) -> None:
        n = self._known(r, "written")
        name = self._files[n].name
        if r.kind == _WRITE:
            self._data(n, r.a, r.data)
            self._ops.append(_Op(r.kind, r.pid, f"write {len(r.data)} bytes at {r.a} of {name}"))
        else:
            self._data(n, r.a, None)
            self._ops.append(_Op(r.kind, r.pid, f"truncate {name} to {r.a}"))

    def _sync(self, r: _Record) -> None:
        call = "fdatasync" if r.a else "fsync"
        target: _File | _Dir
        if r.key in self._dir_inodes:
            name = self._dir_inodes[r.key]
            target, name = self._dir(name), name or "."
        else:
            target = self._files[self._known(r, "synced")]
            name = target.name
        if r.b == 0:
            target.syncs.append(len(self._ops))
            self._syncs.append(len(self._ops))
            self._ops.append(_Op(r.kind, r.pid, f"{call} {name}"))
        else:
            self._ops.append(_Op(r.kind, r.pid, f"{call} {name} failed ({os.strerror(r.b)})"))

    def _mark(self, r: _Record) -> None:
        text = r.p1.decode("utf-8")
        self._marks.append(len(self._ops))
        self._mark_text.append(text)
        self._ops.append(_Op(r.kind, r.pid, f"acknowledged {text}"))

    def _kill(self, r: _Record) -> None:
        self._ops.append(_Op(r.kind, r.pid, f"process killed before its sync number {r.a}"))

    def _unsupported(self, r: _Record) -> None:
        raise ConfigError(f"{self.directory}: the trace holds an operation the power-loss "
                          f"model cannot follow: {r.p1.decode()} {os.fsdecode(r.p2)} "
                          f"(process {r.pid})")

    def _known(self, r: _Record, what: str) -> int:
        if r.key not in self._inodes:
            raise ConfigError(f"{self.directory}: the trace has a file {what} that it never "
                              f"saw created or present at the start (inode {r.ino})")
        return self._inodes[r.key]

    def _data(self, n: int, off: int, data: bytes | None) -> None:
        f = self._files[n]
        f.at.append(len(self._ops))
        f.ops.append((off, data))

    def _entry(self, rel: str, removed: str | None, added: str | None, n: int) -> None:
        d = self._dir(os.path.dirname(rel))
        d.at.append(len(self._ops))
        d.ops.append((removed, added, n))

    def _namespace(self, r: _Record) -> None:
        old, new = self._rel(r.p1), self._rel(r.p2)
        names = self._names
        if r.kind == _UNLINK:
            if old is not None:
                names.pop(old, None)
                self._entry(old, os.path.basename(old), None, -1)
                self._ops.append(_Op(r.kind, r.pid, f"unlink {old}"))
            return
        verb = "rename" if r.kind == _RENAME else "link"
        if old is None or old not in names or (r.kind == _RENAME and r.a & _RENAME_EXCHANGE):
            raise ConfigError(f"{self.directory}: the trace has a {verb} of "
                              f"{os.fsdecode(r.p1)} to {os.fsdecode(r.p2)}, which the "
                              f"power-loss model cannot follow (a file from outside, or an "
                              f"exchange)")
        n = names.pop(old) if r.kind == _RENAME else names[old]
        if new is not None:
            self._files[n].name = new  # the name a reader knows it by (not a temporary one)
        if new is None:  # moved out: gone from here
            self._entry(old, os.path.basename(old), None, -1)
        elif r.kind == _RENAME and os.path.dirname(old) == os.path.dirname(new):
            names[new] = n  # within one directory: one change, atomic
            self._entry(new, os.path.basename(old), os.path.basename(new), n)
        else:  # a link, or a rename between directories: each directory on its own
            names[new] = n
            if r.kind == _RENAME:
                self._entry(old, os.path.basename(old), None, -1)
            self._entry(new, None, os.path.basename(new), n)
        self._ops.append(_Op(r.kind, r.pid, f"{verb} {old} -> {new}"))

    # -- crash states ---------------------------------------------------------------

    def cuts(self) -> list[int]:
        """The cuts whose states include those of every other: just before each sync, and the end.

        Between two syncs, a later cut only adds operations that a crash
        state may keep or drop, and acknowledgements, so it allows every
        state an earlier one does.
        """
        return [*sorted(set(self._syncs)), len(self._ops)]

    def acknowledged(self, cut: int) -> tuple[str, ...]:
        """What ``mark_acknowledged`` noted in the first ``cut`` operations."""
        return tuple(self._mark_text[:bisect_left(self._marks, cut)])

    def final(self) -> CrashState:
        """The state with every operation kept: what a clean shutdown leaves."""
        return self._state(len(self._ops), self._ordered_spec(len(self._ops), None))

    def crash_states(self, cut: int, *, model: Model = "reordering", limit: int = 64,
                     tears: int = 2, seed: int = 0) -> list[CrashState]:
        """The distinct states a power cut after ``cut`` operations may leave.

        All of them when there are at most ``limit``; otherwise ``limit``
        drawn with a random generator seeded by ``seed`` and ``cut``. A write
        may be torn at 1 byte, one short of its end, each 512-byte boundary
        and ``tears`` more positions drawn at random.
        """
        seen: dict[_Key, CrashState] = {}
        for spec in self._specs(cut, model, limit, tears, seed):
            files = self._files_of(spec)
            seen.setdefault(_key(files), self._state(cut, spec, files))
        return list(seen.values())

    async def check(self, check: Callable[[CrashState, Path], Awaitable[None]], *,
                    model: Model = "reordering", per_cut: int = 64, tears: int = 2,
                    seed: int = 0, directory: str | os.PathLike[str] | None = None
                    ) -> PowerLossReport:
        """Run ``check`` in each distinct crash state of every cut that matters (``cuts``).

        Each state is written to a fresh directory under ``directory``
        (default: ``/dev/shm`` where it exists, whose syncs cost nothing,
        else the system's temporary directory) and removed after its check.
        A state that several cuts can leave is checked once, with the
        acknowledgements of the latest (acknowledgements only grow). The
        first check that raises ends the run with an ``AssertionError`` that
        says which operations the state lost and which write it tore.
        """
        seen: set[_Key] = set()
        generated = 0
        cuts = self.cuts()
        if directory is None and os.access("/dev/shm", os.W_OK):
            directory = "/dev/shm"
        with tempfile.TemporaryDirectory(dir=directory, prefix="powerloss-") as tmp:
            for cut in reversed(cuts):  # the latest cut that leaves a state comes first
                for spec in self._specs(cut, model, per_cut, tears, seed):
                    generated += 1
                    files = self._files_of(spec)
                    key = _key(files)
                    if key in seen:
                        continue
                    seen.add(key)
                    state = self._state(cut, spec, files)
                    where = state.write_to(Path(tmp) / f"state-{len(seen)}")
                    try:
                        await check(state, where)
                    except Exception as exc:
                        raise AssertionError(
                            f"crash state {len(seen)} ({model} model) fails its check: "
                            f"{exc}\n{state.description}") from exc
                    finally:
                        shutil.rmtree(where, ignore_errors=True)
        return PowerLossReport(len(cuts), generated, len(seen))

    def _specs(self, cut: int, model: Model, limit: int, tears: int,
               seed: int) -> Iterator[_Spec]:
        if not 0 <= cut <= len(self._ops):
            raise ValueError(f"cut {cut} is outside the trace (0 to {len(self._ops)})")
        rng = random.Random(hash((seed, cut)))
        if model == "ordered":
            yield from self._ordered_specs(cut, limit, tears, seed, rng)
        elif model == "reordering":
            yield from self._reordering_specs(cut, limit, tears, seed, rng)
        else:
            raise ConfigError(f"unknown power-loss model {model!r}: 'reordering' or 'ordered'")

    def _reordering_specs(self, cut: int, limit: int, tears: int, seed: int,
                          rng: random.Random) -> Iterator[_Spec]:
        dirs = [_durable(d.at, d.syncs, cut) for d in self._dirs.values()]
        # Only files some state can name get choices: a file unlinked before
        # its directory was synced, or never linked, is gone in every state.
        named: set[int] = set()
        for d, (lo, hi) in zip(self._dirs.values(), dirs, strict=True):
            named.update(d.entries(lo).values())
            named.update(n for _, added, n in d.ops[lo:hi] if added is not None)
        files = [_FileAxis(f, *_durable(f.at, f.syncs, cut), tears, seed if f.index in named
                           else None) for f in self._files]
        total: int | None = 1
        for lo, hi in dirs:
            total = None if total is None else total * (hi - lo + 1)
        for axis in files:
            total = None if total is None or axis.count is None else total * axis.count
        if total is not None and total <= limit:
            for dir_counts in itertools.product(*(range(lo, hi + 1) for lo, hi in dirs)):
                for choices in itertools.product(*(axis.all() for axis in files)):
                    yield tuple(dir_counts), tuple(choices)
            return
        made: set[_Spec] = set()
        for _ in range(limit * 4):
            spec = (tuple(rng.randint(lo, hi) for lo, hi in dirs),
                    tuple(axis.draw(rng) for axis in files))
            if spec not in made:
                made.add(spec)
                yield spec
                if len(made) == limit:
                    return

    def _ordered_specs(self, cut: int, limit: int, tears: int, seed: int,
                       rng: random.Random) -> Iterator[_Spec]:
        k = bisect_left(self._syncs, cut)
        frontier = self._syncs[k - 1] if k else 0
        options: list[tuple[int, int | None]] = []
        for p in range(frontier, cut + 1):
            options.append((p, None))
            torn = self._write_at(p - 1) if p > frontier else None
            if torn is not None:
                f, j = torn
                options.extend((p, t) for t in f.tears(j, tears, seed))
        if len(options) > limit:
            options = rng.sample(options, limit)
        for p, tear in options:
            yield self._ordered_spec(p, tear)

    def _write_at(self, i: int) -> tuple[_File, int] | None:
        if self._ops[i].kind != _WRITE:
            return None
        for f in self._files:
            j = bisect_left(f.at, i)
            if j < len(f.at) and f.at[j] == i:
                return f, j
        return None

    def _ordered_spec(self, p: int, tear: int | None) -> _Spec:
        dirs = tuple(bisect_left(d.at, p) for d in self._dirs.values())
        choices: list[_FileChoice] = []
        for f in self._files:
            count = bisect_left(f.at, p)
            if tear is not None and count and f.at[count - 1] == p - 1:
                choices.append((count - 1, (count - 1,), tear))
            else:
                choices.append((count, (), None))
        return dirs, tuple(choices)

    def _files_of(self, spec: _Spec) -> dict[str, bytes]:
        dir_counts, choices = spec
        out: dict[str, bytes] = {}
        for (rel, d), count in zip(self._dirs.items(), dir_counts, strict=True):
            for name, n in d.entries(count).items():
                out[f"{rel}/{name}" if rel else name] = self._files[n].content(*choices[n])
        return out

    def _state(self, cut: int, spec: _Spec, files: dict[str, bytes] | None = None) -> CrashState:
        return CrashState(cut, self._files_of(spec) if files is None else files,
                          tuple(self._dirs), self.acknowledged(cut), self._describe(cut, spec))

    def _said(self, i: int) -> str:
        return f"{self._ops[i].what} (op {i}, process {self._ops[i].pid})"

    def _describe(self, cut: int, spec: _Spec) -> str:
        lines = [f"power cut after {cut} of {len(self._ops)} operations"
                 + (f" (the last: {self._said(cut - 1)})" if cut else "")]
        dir_counts, choices = spec
        for (rel, d), count in zip(self._dirs.items(), dir_counts, strict=True):
            made = bisect_left(d.at, cut)
            if count < made:
                lost = [self._said(d.at[k]) for k in range(count, made)]
                lines.append(f"  directory {rel or '.'}: lost " + ", ".join(lost[:6])
                             + (f" and {len(lost) - 6} more" if len(lost) > 6 else ""))
        for f, (count, extra, tear) in zip(self._files, choices, strict=True):
            made = bisect_left(f.at, cut)
            kept = set(range(count)) | set(extra)
            if len(kept) == made and tear is None:
                continue
            parts = []
            for k in range(made):
                what = self._said(f.at[k])
                if k not in kept:
                    parts.append(f"lost: {what}")
                elif tear is not None and k == extra[-1]:
                    parts.append(f"torn ({tear} bytes kept): {what}")
            shown = "; ".join(parts[:6]) + (f"; and {len(parts) - 6} more" if len(parts) > 6
                                            else "")
            lines.append(f"  file {f.name}: {shown}")
        lines.append(f"  acknowledged before the cut: {len(self.acknowledged(cut))}"
                     + (f", the last: {self.acknowledged(cut)[-1]}" if self.acknowledged(cut)
                        else ""))
        return "\n".join(lines)


def _durable(at: list[int], syncs: list[int], cut: int) -> tuple[int, int]:
    """(changes made durable by a sync, changes made) before ``cut``, of one file or directory."""
    made = bisect_left(at, cut)
    k = bisect_left(syncs, cut)
    return (bisect_left(at, syncs[k - 1]) if k else 0), made


class _FileAxis:
    """The choices a state has for one file's operations not yet synced at a cut.

    ``seed`` None: no state names the file, so one choice stands for all.
    """

    def __init__(self, f: _File, durable: int, made: int, tears: int, seed: int | None) -> None:
        self.durable = durable
        self.pending = list(range(durable, made)) if seed is not None else []
        self.tears = [f.tears(k, tears, seed) for k in self.pending] if seed is not None else []
        # Subsets whose last kept operation is the kth: 2**k of them, each whole or torn.
        self.count = (1 + sum(2 ** n * (1 + len(t)) for n, t in enumerate(self.tears))
                      if len(self.pending) <= _ENUMERABLE else None)

    def all(self) -> Iterator[_FileChoice]:
        n = len(self.pending)
        for mask in range(1 << n):
            kept = tuple(self.pending[j] for j in range(n) if mask >> j & 1)
            yield self.durable, kept, None
            if kept:
                for t in self.tears[kept[-1] - self.durable]:
                    yield self.durable, kept, t

    def draw(self, rng: random.Random) -> _FileChoice:
        if not self.pending:
            return self.durable, (), None
        if rng.random() < 0.5:  # a prefix: what a device that keeps order leaves
            kept = tuple(self.pending[:rng.randint(0, len(self.pending))])
        else:
            kept = tuple(k for k in self.pending if rng.random() < 0.5)
        tear = None
        if kept and rng.random() < 0.5:
            options = self.tears[kept[-1] - self.durable]
            tear = rng.choice(options) if options else None
        return self.durable, kept, tear


_Key = frozenset[tuple[str, int, int, int]]


def _key(files: Mapping[str, bytes]) -> _Key:
    """What tells two states apart: each file's name, length and two checksums."""
    return frozenset((name, len(data), zlib.crc32(data), zlib.adler32(data))
                     for name, data in files.items())
