"""The power-loss recorder and its model (``threadline.testing.PowerLoss``).

The recorder must see every write a store makes, through every C library
call Python and SQLite use, or the crash states it builds prove nothing: a
script that writes in all those ways must come back byte for byte from the
trace. The model must give exactly the states docs/power-loss.md describes,
and a check must catch an acknowledgement made before its sync.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from threadline.errors import ConfigError
from threadline.testing import CrashState, PowerLoss, _powerloss, mark_acknowledged

EVERY_CALL = r"""
import os, sys
root = sys.argv[1]
at = lambda name: os.path.join(root, name)
fd = os.open(at("a"), os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"hello world\n")
os.pwrite(fd, b"HELLO", 0)
os.writev(fd, [b"one ", b"two\n"])
os.writev(fd, [b"%d," % n for n in range(os.sysconf("SC_IOV_MAX"))])  # as many as allowed
os.pwritev(fd, [b"x", b"y"], 3)
copy = os.dup(fd)
os.write(copy, b"through a copy\n")
os.close(copy)
os.ftruncate(fd, 3000)
os.fsync(fd)
os.close(fd)
with open(at("b"), "w") as f:  # buffered, through open64
    f.write("buffered line\n" * 500)
os.truncate(at("b"), 100)
os.rename(at("b"), at("c"))
os.link(at("c"), at("d"))
os.replace(at("a"), at("d"))
os.unlink(at("c"))
dirfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
fd = os.open("e", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600, dir_fd=dirfd)
os.write(fd, b"appended\n")
os.lseek(fd, 0, os.SEEK_SET)
os.write(fd, b"appended again\n")  # O_APPEND: at the end, whatever the position
os.pwrite(fd, b"pwritten\n", 0)  # Linux appends this too
os.close(fd)
fd = os.open(at("d"), os.O_WRONLY | os.O_TRUNC)
os.write(fd, b"short")
os.fdatasync(fd)
os.close(fd)
os.fsync(dirfd)
os.close(dirfd)
with open(at("f"), "ab") as f:
    f.write(b"x" * 100_000)
os.rename(at("f"), at("g"))
"""


def run(recorder: PowerLoss, script: str, **faults: int) -> tuple[int, str, str]:
    done = recorder.run([sys.executable, "-c", script, str(recorder.directory)], **faults)
    return done.returncode, done.stdout, done.stderr


def test_powerloss_recorder_sees_every_write_call(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "before").write_bytes(b"there at the start")
    recorder = PowerLoss(tmp_path / "store")
    rc, _, err = run(recorder, EVERY_CALL)
    assert rc == 0, err
    on_disk = {p.name: p.read_bytes() for p in recorder.directory.iterdir()}
    assert recorder.trace().final().files == on_disk
    assert set(on_disk) == {"before", "d", "e", "g"}


SUBSETS = r"""
import os, sys
from threadline.testing import mark_acknowledged
root = sys.argv[1]
fd = os.open(os.path.join(root, "f"), os.O_WRONLY | os.O_CREAT, 0o644)
os.fsync(fd)
dirfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
os.fsync(dirfd)
mark_acknowledged("created")
os.write(fd, b"ab")
os.pwrite(fd, b"c", 5)
"""


def test_powerloss_models_give_exactly_their_states(tmp_path: Path) -> None:
    recorder = PowerLoss(tmp_path / "store")
    rc, _, err = run(recorder, SUBSETS)
    assert rc == 0, err
    trace = recorder.trace()
    end = len(trace)
    # Any subset of the two writes, in order, the last kept one torn (2 bytes: after 1).
    states = trace.crash_states(end)
    assert sorted(s.files["f"] for s in states) == sorted(
        [b"", b"a", b"ab", b"\0\0\0\0\0c", b"ab\0\0\0c"])
    assert {s.acknowledged for s in states} == {("created",)}
    # A prefix of the writes, the last torn.
    ordered = trace.crash_states(end, model="ordered")
    assert sorted(s.files["f"] for s in ordered) == sorted([b"", b"a", b"ab", b"ab\0\0\0c"])
    # Before the directory's sync, the file may be missing.
    assert {tuple(s.files) for s in trace.crash_states(1)} == {(), ("f",)}


SYNC_THEN_MARK = r"""
import os, sys
from threadline.testing import mark_acknowledged
root = sys.argv[1]
mark_first = sys.argv[2] == "early"
dirfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
fd = os.open(os.path.join(root, "f"), os.O_WRONLY | os.O_CREAT, 0o644)
if sys.argv[3] == "dirsync":
    os.fsync(dirfd)
for n in range(5):
    os.write(fd, b"record %d\n" % n)
    if mark_first:
        mark_acknowledged(str(n))
    os.fdatasync(fd)
    if not mark_first:
        mark_acknowledged(str(n))
"""


async def every_acknowledged_record_is_there(state: CrashState, where: Path) -> None:
    assert state.acknowledged == () or "f" in state.files, "the file is gone"
    lines = state.files.get("f", b"").split(b"\n")
    for n in state.acknowledged:
        assert b"record %s" % n.encode() in lines, f"record {n} is lost"


@pytest.mark.parametrize(("when", "dirsync", "lost"), [
    ("late", "dirsync", None),
    ("early", "dirsync", r"record \d is lost"),
    ("late", "none", "the file is gone"),
])
async def test_powerloss_check_catches_an_acknowledgement_before_its_sync(
        tmp_path: Path, when: str, dirsync: str, lost: str | None) -> None:
    recorder = PowerLoss(tmp_path / "store")
    done = recorder.run([sys.executable, "-c", SYNC_THEN_MARK, str(recorder.directory), when,
                         dirsync])
    assert done.returncode == 0, done.stderr
    trace = recorder.trace()
    if lost is None:
        report = await trace.check(every_acknowledged_record_is_there)
        assert report.checked >= 5 * 3  # each record lost, kept, or torn, at its cut
        return
    with pytest.raises(AssertionError, match=lost) as failed:
        await trace.check(every_acknowledged_record_is_there)
    assert "\n  " in str(failed.value) and " lost" in str(failed.value)  # what it dropped


FAULTS = r"""
import os, sys
fd = os.open(os.path.join(sys.argv[1], "f"), os.O_WRONLY | os.O_CREAT, 0o644)
os.fsync(os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY))  # sync 1
for n in range(3):
    os.write(fd, b"%d" % n)
    try:
        os.fsync(fd)
    except OSError as exc:
        print("sync", n, "failed:", exc.errno)
print("done")
"""


def test_powerloss_faults_fail_or_kill_at_the_nth_sync(tmp_path: Path) -> None:
    failing = PowerLoss(tmp_path / "failing")
    rc, out, err = run(failing, FAULTS, fail_sync=3)
    assert rc == 0, err
    assert out.split("\n")[:2] == ["sync 1 failed: 5", "done"]
    # The failed sync made nothing durable: before the next, write 1 may be lost.
    trace = failing.trace()
    contents = {s.files["f"] for s in trace.crash_states(trace.cuts()[-2])}
    assert contents == {b"0", b"01", b"0\x002", b"012"}

    killed = PowerLoss(tmp_path / "killed")
    rc, out, _ = run(killed, FAULTS, kill_before_sync=3)
    assert rc == -9 and out == ""
    assert killed.trace().final().files == {"f": b"01"}


def test_powerloss_refuses_what_it_cannot_do(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="not recording"):
        mark_acknowledged("outside a recorded process")
    with pytest.raises(ConfigError, match="outside the directory"):
        PowerLoss(tmp_path, trace=tmp_path / "trace")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _powerloss._shim.cache_clear()
    try:
        monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
        with pytest.raises(ConfigError, match="no C compiler"):
            PowerLoss(tmp_path / "a")
        monkeypatch.setenv("CC", "false")
        with pytest.raises(ConfigError, match=r"shim with .*false failed: exit status 1"):
            PowerLoss(tmp_path / "b")
    finally:
        _powerloss._shim.cache_clear()


def test_powerloss_trace_is_shared_by_processes_in_order(tmp_path: Path) -> None:
    recorder = PowerLoss(tmp_path / "store")
    script = ("import os, sys\n"
              "fd = os.open(os.path.join(sys.argv[1], 'f'), os.O_WRONLY | os.O_CREAT"
              " | os.O_APPEND, 0o644)\n"
              "for n in range(200): os.write(fd, sys.argv[2].encode() * 3)\n")
    env = {**os.environ, **recorder.env()}
    children = [subprocess.Popen([sys.executable, "-c", script, str(recorder.directory), tag],
                                 env=env) for tag in "abc"]
    assert [c.wait() for c in children] == [0, 0, 0]
    assert recorder.trace().final().files == {
        "f": (recorder.directory / "f").read_bytes()}
