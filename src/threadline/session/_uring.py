"""io_uring for the file store's fsync'd appends: the fdatasync without a Python thread.

A ``FileStore`` keeps every fdatasync off the event loop. Through a worker
thread that costs a Python thread waking, taking the GIL and waking the loop
back (bench/uring_hop.py). Here the loop writes the lines itself (to the page
cache: microseconds) and hands the fdatasync to the kernel. The loop watches
the ring's own descriptor, readable while completions wait in it, so no
Python thread runs at all.

The ring is driven through the three system calls and its shared memory,
with ``ctypes`` and ``mmap``: the one Python binding (``liburing``) ships
x86-64 wheels only, built for CPUs with AVX-512, and dies of SIGILL on the
others. Only the one operation the store needs is here.

Used where it works: Linux 5.5 or later, where the process may set up a ring
(seccomp profiles often refuse it). ``THREADLINE_IO_URING=0`` turns it off.
Everywhere else the store keeps its worker thread; both paths write the same
bytes under the same lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import mmap
import os
import select
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Ring", "alone", "ring_for", "wanted"]

_ENTRIES = 64  # submission slots; each is free again once submitted
# Completion slots: one per fdatasync in flight (one per busy session). Any
# beyond it wait in the kernel's overflow list until _reap flushes them.
_CQ_ENTRIES = 4096

# From <linux/io_uring.h>. The numbers are the same on every architecture.
_SYS_SETUP, _SYS_ENTER = 425, 426
_OP_NOP, _OP_FSYNC = 0, 3
_FSYNC_DATASYNC = 1
_SQE_ASYNC = 1 << 4  # IOSQE_ASYNC (Linux 5.6): the kernel's worker runs it, as it runs a sync
_PROBE_WAIT = 5.0  # seconds for the probe's no-op to be reported
_SETUP_CQSIZE = 1 << 3
_ENTER_GETEVENTS = 1 << 0
_SQ_CQ_OVERFLOW = 1 << 1
_FEAT_SINGLE_MMAP, _FEAT_NODROP = 1 << 0, 1 << 1
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
# struct io_uring_params: ten u32, then the SQ and CQ offsets (seven and
# eight u32 each, then a u64 of user_addr); 120 bytes.
_PARAMS = struct.Struct("<10I 8I Q 8I Q")
_SQE = struct.Struct("<BBHiQQIIQHHiQQ")  # 64 bytes
_CQE = struct.Struct("<QiI")  # 16 bytes
_U32 = struct.Struct("<I")


class _Shared:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rings: dict[asyncio.AbstractEventLoop, Ring] = {}
        self.unusable: str | None = None
        """Why no ring can be set up in this process, once that is known."""
        self.syscall: Any = None


_shared = _Shared()
if not sys.platform.startswith("linux"):
    _shared.unusable = "io_uring is Linux only"


def _call(number: int, *args: int | None) -> int:
    # Unused argument registers are ignored by the kernel: always pass six.
    result: int = _shared.syscall(number, *(a or 0 for a in args), *(0,) * (6 - len(args)))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"io_uring system call {number}: {os.strerror(err)}")
    return result


class Ring:
    """One io_uring whose completions are reported on the loop that made it.

    Only that loop's thread submits to it and reaps it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        if _shared.syscall is None:
            syscall = ctypes.CDLL(None, use_errno=True).syscall
            syscall.restype = ctypes.c_long
            syscall.argtypes = [ctypes.c_long] * 7
            _shared.syscall = syscall
        params = ctypes.create_string_buffer(_PARAMS.size)
        # struct io_uring_params: sq_entries, cq_entries, flags, ...
        struct.pack_into("<3I", params, 0, 0, _CQ_ENTRIES, _SETUP_CQSIZE)
        self.fd = _call(_SYS_SETUP, _ENTRIES, ctypes.addressof(params))
        self._maps: list[mmap.mmap] = []
        try:
            self._map(_PARAMS.unpack(params.raw))
        except BaseException:
            self._release()
            raise
        self._loop = loop
        self._pending: dict[int, Callable[[int], object]] = {}  # by user_data
        self._next = 0
        self.closed = False
        try:
            self._probe()
        except BaseException:
            self._release()
            raise
        # Not an eventfd: the ring's descriptor polls readable while a
        # completion waits in it (or in the kernel's overflow list), and
        # reaping it is what makes it quiet again, so no read of a counter
        # is needed on every report.
        loop.add_reader(self.fd, self._reap)

    def _map(self, p: tuple[int, ...]) -> None:
        sq_entries, cq_entries, features = p[0], p[1], p[5]
        sq_off, cq_off = p[10:19], p[19:28]
        if ~features & (_FEAT_SINGLE_MMAP | _FEAT_NODROP):
            raise OSError(errno.ENOSYS, "io_uring of this kernel is older than Linux 5.5")
        sq_size = sq_off[6] + sq_entries * 4
        cq_size = cq_off[5] + cq_entries * _CQE.size
        rings = mmap.mmap(self.fd, max(sq_size, cq_size), mmap.MAP_SHARED,
                          mmap.PROT_READ | mmap.PROT_WRITE, offset=_OFF_SQ_RING)
        self._maps.append(rings)
        self._sqes = mmap.mmap(self.fd, sq_entries * _SQE.size, mmap.MAP_SHARED,
                               mmap.PROT_READ | mmap.PROT_WRITE, offset=_OFF_SQES)
        self._maps.append(self._sqes)
        self._rings = rings
        self._sq_tail, self._sq_flags = sq_off[1], sq_off[4]
        self._sq_mask = _U32.unpack_from(rings, sq_off[2])[0]
        # Slot i of the submission array always names entry i: set once.
        for slot in range(sq_entries):
            _U32.pack_into(rings, sq_off[6] + slot * 4, slot)
        # Only this ring's loop submits, so the tail is ours to keep.
        self._tail = _U32.unpack_from(rings, self._sq_tail)[0]
        self._cq_head, self._cq_tail = cq_off[0], cq_off[1]
        self._cq_mask = _U32.unpack_from(rings, cq_off[2])[0]
        self._cqes = cq_off[5]

    def fdatasync(self, fd: int, done: Callable[[int], object]) -> None:
        """Submit an fdatasync of ``fd``; ``done`` gets 0 or ``-errno``.

        ``done`` is called straight from the loop's reader callback, not
        through a future: a future's callbacks would wait one more turn of
        the loop. It must not raise (what it raises goes to the loop's
        exception handler).
        """
        self._next = key = self._next + 1
        self._push(_OP_FSYNC, 0, fd, _FSYNC_DATASYNC, key)
        self._pending[key] = done
        if _shared.syscall(_SYS_ENTER, self.fd, 1, 0, 0, 0, 0) != 1:
            del self._pending[key]
            # Our own ring, submitted at once, takes it: this is a lost ring.
            err = ctypes.get_errno()
            raise OSError(err or errno.EIO, f"io_uring did not take the fdatasync of fd {fd}: "
                          f"{os.strerror(err or errno.EIO)}")

    def _push(self, opcode: int, flags: int, fd: int, op_flags: int, key: int) -> None:
        """Put one request in the next submission slot (submitted by the next enter)."""
        tail = self._tail
        _SQE.pack_into(self._sqes, (tail & self._sq_mask) * _SQE.size,
                       opcode, flags, 0, fd, 0, 0, 0, op_flags, key, 0, 0, 0, 0, 0)
        # The kernel reads the tail inside io_uring_enter, after these stores.
        self._tail = tail = (tail + 1) & 0xFFFFFFFF
        _U32.pack_into(self._rings, self._sq_tail, tail)

    def _probe(self) -> None:
        """Check that the descriptor wakes a poller when the kernel's worker completes.

        Every sync is awaited by polling the descriptor, so a kernel whose
        ring never polled readable would leave appends waiting for ever:
        such a ring is refused here, and the stores keep their worker thread.
        A kernel before 5.6 refuses the no-op's flag, and reports that at once.
        """
        self._push(_OP_NOP, _SQE_ASYNC, -1, 0, 0)  # user_data 0: no caller's key
        if _shared.syscall(_SYS_ENTER, self.fd, 1, 0, 0, 0, 0) != 1:
            err = ctypes.get_errno() or errno.EIO
            raise OSError(err, f"io_uring did not take a no-op: {os.strerror(err)}")
        readable, _, _ = select.select([self.fd], [], [], _PROBE_WAIT)
        if not readable:
            raise OSError(errno.ENOSYS, "the io_uring descriptor did not report a completed "
                          f"no-op within {_PROBE_WAIT:g} s")
        self._reap()

    def wait(self, fd: int) -> asyncio.Future[int]:
        """``fdatasync`` as a future, for callers that can afford the extra turn."""
        future: asyncio.Future[int] = self._loop.create_future()

        def done(result: int) -> None:
            if not future.done():
                future.set_result(result)

        self.fdatasync(fd, done)
        return future

    def _reap(self) -> None:
        rings = self._rings
        head = _U32.unpack_from(rings, self._cq_head)[0]
        while True:
            while head != (tail := _U32.unpack_from(rings, self._cq_tail)[0]):
                while head != tail:
                    user_data, res, _ = _CQE.unpack_from(
                        rings, self._cqes + (head & self._cq_mask) * _CQE.size)
                    head = (head + 1) & 0xFFFFFFFF
                    done = self._pending.pop(user_data, None)
                    if done is not None:
                        try:
                            done(res)
                        except Exception as exc:  # the rest must still be reported
                            self._loop.call_exception_handler({
                                "message": "io_uring completion callback failed",
                                "exception": exc})
                _U32.pack_into(rings, self._cq_head, head)
            # Completions that found the ring full wait in the kernel, and
            # signal nothing, until a system call moves them into the ring.
            if not _U32.unpack_from(rings, self._sq_flags)[0] & _SQ_CQ_OVERFLOW:
                return
            _call(_SYS_ENTER, self.fd, 0, 0, _ENTER_GETEVENTS, None, 0)

    def close(self) -> None:
        """Stop watching and free the ring; the kernel finishes what is in flight first."""
        if self.closed:
            return
        self.closed = True
        if not self._loop.is_closed():
            self._loop.remove_reader(self.fd)
        self._release()

    def _release(self) -> None:
        for m in self._maps:
            m.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def alone(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether no other callback is due before ``loop`` next waits for events.

    The stores start a write one turn later, so that the tasks running now
    can add theirs to it; when nothing else is due, none can, and an append
    starts at once. Asks the standard loop's own queue; any other loop is
    taken as busy, and its appends keep starting one turn later.
    """
    ready = getattr(loop, "_ready", None)
    return ready is not None and not ready


def wanted() -> bool:
    """Whether the environment allows io_uring: ``THREADLINE_IO_URING=0`` turns it off.

    A store asks once, when it is made, not on every append.
    """
    return os.environ.get("THREADLINE_IO_URING") != "0"


def ring_for(loop: asyncio.AbstractEventLoop) -> Ring | None:
    """The running loop's ring, set up on first use; None where io_uring cannot be used.

    ``THREADLINE_IO_URING=0`` is for the caller to read, with ``wanted``.
    """
    ring = _shared.rings.get(loop)
    if ring is not None or _shared.unusable is not None:
        return ring
    with _shared.lock:
        rings = _shared.rings
        for old in [old for old in rings if old.is_closed()]:
            rings.pop(old).close()
        try:
            ring = Ring(loop)
        except (OSError, RuntimeError, ValueError) as exc:
            # ENOSYS on an old kernel, EPERM under a seccomp profile: the
            # thread does the work, and nothing tries again in this process.
            _shared.unusable = f"io_uring cannot be set up: {exc}"
            return None
        rings[loop] = ring
        return ring


def _forget_parent_rings() -> None:
    # The child shares the parent's rings: a completion could reach either.
    _shared.lock = threading.Lock()
    for ring in _shared.rings.values():
        ring.closed = True
        ring._release()
    _shared.rings.clear()


os.register_at_fork(after_in_child=_forget_parent_rings)
