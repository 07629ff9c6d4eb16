"""Session file format benchmark: version 3 (compact) against version 2, same run.

    .venv/bin/python bench/format.py            # full run
    .venv/bin/python bench/format.py --quick    # smaller, for a smoke test

Prints a table and writes bench/results/format.json. The workload is
bench/peers.py's: messages alternating user / assistant, each one text part
of 400 characters of base64 of random bytes (so nothing flatters the bytes).

- bytes: a session of N messages appended one call each through
  ``FileStore.append_entries``, file size over the raw payload (the texts'
  UTF-8 bytes), in a file created at version 3 and one marked version 2.
- encode: ``encode_entry`` per entry against a bare ``msgspec`` encode of the
  same entry (the floor), interleaved; also the careful check every entry
  went through before (``_check_carefully``). Median of paired ratios.
- open: ``FileStore.load_entries`` of 100,000 such entries, one line each,
  against reading the same file and decoding it with ``Decoder.decode_lines``
  into its wire types with the garbage collector paused (the floor), for a
  version 3 and a version 2 file of the same entries, interleaved. Also the
  Python memory the loaded entries keep (tracemalloc), over the file size
  and over the payload.
- time variants: the design choice behind version 3's explicit timestamp.
  Decoding lines and building the entries, per entry, for the kept form
  (``[id, parent, timestamp, body]``) and for one that derives the timestamp
  from the UUIDv7 (``[id, parent, microseconds after the id's millisecond,
  body]``, 25 bytes shorter), against msgspec decoding the same entries'
  version 2 lines into the entry types (the floor). Interleaved, median of
  paired ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

from threadline.ai import AssistantMessage, TextPart, UserMessage
from threadline.session import FileStore, MessageEntry, SessionRecord
from threadline.session._codec import (
    _Batch,
    _check_carefully,
    _Compact,
    _WireEntry,
    encode_entry,
    encode_init,
    frame,
)

RESULTS = Path(__file__).parent / "results" / "format.json"
PAYLOAD_CHARS = 400


def workload(n: int, seed: int = 7) -> list[MessageEntry]:
    rng = random.Random(seed)
    out: list[MessageEntry] = []
    parent: str | None = None
    for i in range(n):
        text = base64.b64encode(rng.randbytes(PAYLOAD_CHARS * 3 // 4)).decode()
        message = (UserMessage.of(text) if i % 2 == 0
                   else AssistantMessage(content=(TextPart(text=text),)))
        entry = MessageEntry(parent_id=parent, message=message)
        parent = entry.id
        out.append(entry)
    return out


def payload(entries: list[MessageEntry]) -> int:
    return sum(len(e.message.text.encode()) for e in entries)


def _mark_version(path: Path, version: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"version":3', b'"version":%d' % version, 1))


def bench_bytes(root: Path, n: int) -> dict[str, Any]:
    entries = workload(n)
    out: dict[str, Any] = {"entries": n, "payload_bytes": payload(entries)}
    for version in (3, 2):
        store = FileStore(root / f"bytes-v{version}", durability="flush")
        asyncio.run(store.create_session(SessionRecord(id="s")))
        if version != 3:
            _mark_version(store.path_for("s"), version)

        async def fill(store: FileStore = store) -> None:
            for entry in entries:
                await store.append_entries("s", [entry])
            assert list(await store.load_entries("s")) == entries

        asyncio.run(fill())
        size = store.path_for("s").stat().st_size
        out[f"v{version}_bytes"] = size
        out[f"v{version}_ratio"] = size / out["payload_bytes"]
        out[f"v{version}_framing_per_entry"] = (size - out["payload_bytes"]) / n
    return out


def bench_encode(n: int, rounds: int) -> dict[str, Any]:
    entries = workload(n, seed=3)
    raw = msgspec.json.Encoder().encode

    def per_entry(fn: Any) -> float:
        t0 = time.perf_counter()
        for entry in entries:
            fn(entry)
        return (time.perf_counter() - t0) / n * 1e6

    samples: dict[str, list[float]] = {"floor": [], "encode_entry": [], "careful": []}
    for _ in range(rounds):  # interleaved, so every variant sees the same machine
        samples["floor"].append(per_entry(raw))
        samples["encode_entry"].append(per_entry(encode_entry))
        samples["careful"].append(per_entry(lambda e: _check_carefully(e, None)))
    ratios = {k: statistics.median(a / b for a, b in zip(v, samples["floor"], strict=True))
              for k, v in samples.items() if k != "floor"}
    return {
        "entries": n, "rounds": rounds,
        "floor_us": statistics.median(samples["floor"]),
        "encode_entry_us": statistics.median(samples["encode_entry"]),
        "careful_us": statistics.median(samples["careful"]),
        "encode_entry_ratio": ratios["encode_entry"],
        "careful_ratio": ratios["careful"],
    }


def _write_file(path: Path, entries: list[MessageEntry], version: int) -> None:
    init = encode_init(SessionRecord(id=path.stem)).replace(b'"version":3',
                                                            b'"version":%d' % version)
    body = b"".join(frame([encode_entry(e)], version=version) for e in entries)
    path.write_bytes(init + b"\n" + body)


def bench_open(root: Path, n: int, repeats: int) -> dict[str, Any]:
    entries = workload(n, seed=5)
    store = FileStore(root / "open", durability="flush")
    store.path_for("x").parent.mkdir(parents=True, exist_ok=True)
    decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_WireEntry | _Batch | _Compact)
    out: dict[str, Any] = {"entries": n, "payload_mb": payload(entries) / 1e6}
    for version in (3, 2):
        _write_file(store.path_for(f"v{version}"), entries, version)

    def floor(path: Path) -> int:
        gc.disable()
        try:
            with open(path, "rb") as f:
                data = f.read()
            return len(decoder.decode_lines(memoryview(data)[data.index(b"\n") + 1:]))
        finally:
            gc.enable()

    async def timed(version: int) -> tuple[float, float]:
        path = store.path_for(f"v{version}")
        gc.collect()
        t0 = time.perf_counter()
        assert floor(path) == n
        floor_t = time.perf_counter() - t0
        gc.collect()
        t0 = time.perf_counter()
        assert len(await store.load_entries(f"v{version}")) == n
        return time.perf_counter() - t0, floor_t

    async def run() -> dict[int, list[tuple[float, float]]]:
        got: dict[int, list[tuple[float, float]]] = {3: [], 2: []}
        for _ in range(repeats):
            for version in (3, 2):
                got[version].append(await timed(version))
        return got

    got = asyncio.run(run())
    for version, pairs in got.items():
        size = store.path_for(f"v{version}").stat().st_size
        gc.collect()
        tracemalloc.start()
        log = asyncio.run(store.load_entries(f"v{version}"))
        retained, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert list(log) == entries
        del log
        out[f"v{version}"] = {
            "file_mb": size / 1e6,
            "store_ms": statistics.median(s for s, _ in pairs) * 1e3,
            "floor_ms": statistics.median(f for _, f in pairs) * 1e3,
            "ratio": statistics.median(s / f for s, f in pairs),
            "retained_mb": retained / 1e6,
            "peak_mb": peak / 1e6,
            "retained_to_file": retained / size,
            "retained_to_payload": retained / 1e6 / out["payload_mb"],
            "peak_to_file": peak / size,
        }
    return out


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _derived_line(entry: MessageEntry) -> bytes:
    ms = int(entry.id[:8] + entry.id[9:13], 16)
    delta = (entry.timestamp - _EPOCH) // timedelta(microseconds=1) - ms * 1000
    message = entry.message
    body = message.text if type(message) is UserMessage else [message.text]
    return msgspec.json.encode([entry.id, entry.parent_id, delta, body]) + b"\n"


def _build(items: list[Any], derived: bool) -> list[MessageEntry]:
    out: list[MessageEntry] = []
    for entry_id, parent_id, stored, body in items:
        timestamp = stored
        if derived:  # the cheapest way found: positional timedelta arguments
            seconds, us = divmod(int(entry_id[:8] + entry_id[9:13], 16) * 1000 + stored,
                                 1_000_000)
            timestamp = _EPOCH + timedelta(0, seconds, us)
        message = (UserMessage(content=(TextPart(text=body),)) if type(body) is str
                   else AssistantMessage(content=(TextPart(text=body[0]),)))
        out.append(MessageEntry(id=entry_id, parent_id=parent_id, timestamp=timestamp,
                                message=message))
    return out


def bench_time_variants(n: int, rounds: int) -> dict[str, Any]:
    entries = workload(n, seed=9)
    kept = b"".join(frame([encode_entry(e)], version=3) for e in entries)
    derived = b"".join(_derived_line(e) for e in entries)
    v2 = b"".join(frame([encode_entry(e)], version=2) for e in entries)
    kept_dec = msgspec.json.Decoder(tuple[str, str | None, datetime, Any])
    derived_dec = msgspec.json.Decoder(tuple[str, str | None, int, Any])
    floor_dec: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_WireEntry)

    def timed(fn: Any) -> float:
        gc.disable()
        try:
            t0 = time.perf_counter()
            assert len(fn()) == n
            return time.perf_counter() - t0
        finally:
            gc.enable()

    got: dict[str, list[float]] = {"floor": [], "kept": [], "derived": []}
    for _ in range(rounds):
        got["floor"].append(timed(lambda: floor_dec.decode_lines(v2)))
        got["kept"].append(timed(lambda: _build(kept_dec.decode_lines(kept), False)))
        got["derived"].append(timed(lambda: _build(derived_dec.decode_lines(derived), True)))
    assert _build(derived_dec.decode_lines(derived), True) == entries
    assert _build(kept_dec.decode_lines(kept), False) == entries
    return {
        "entries": n,
        "floor_us": statistics.median(got["floor"]) / n * 1e6,
        **{f"{k}_us": statistics.median(got[k]) / n * 1e6 for k in ("kept", "derived")},
        **{f"{k}_ratio": statistics.median(a / b for a, b in zip(got[k], got["floor"],
                                                                 strict=True))
           for k in ("kept", "derived")},
        "kept_framing_per_entry": (len(kept) - payload(entries)) / n,
        "derived_framing_per_entry": (len(derived) - payload(entries)) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", help="directory for the files (default: a temp dir)")
    args = parser.parse_args()
    n_bytes, n_encode, rounds, n_open, repeats = (
        (200, 2_000, 5, 10_000, 3) if args.quick else (800, 10_000, 15, 100_000, 5))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        sized = bench_bytes(root, n_bytes)
        encoded = bench_encode(n_encode, rounds)
        opened = bench_open(root, n_open, repeats)
        variants = bench_time_variants(n_encode * 2, rounds)
    load = os.getloadavg()
    machine = {"python": sys.version.split()[0], "platform": platform.platform(),
               "cpu_count": os.cpu_count(), "msgspec": msgspec.__version__,
               "load_average": load}
    print(f"Format benchmark ({machine['platform']}, Python {machine['python']}, "
          f"load average {load[0]:.2f})\n")
    print(f"bytes, {sized['entries']} messages of {PAYLOAD_CHARS} chars: "
          f"v3 {sized['v3_ratio']:.3f}x payload ({sized['v3_framing_per_entry']:.0f} B framing "
          f"per entry), v2 {sized['v2_ratio']:.3f}x ({sized['v2_framing_per_entry']:.0f} B)")
    e = encoded
    print(f"encode_entry: {e['encode_entry_us']:.2f} us/entry, {e['encode_entry_ratio']:.2f}x "
          f"the bare msgspec encode ({e['floor_us']:.2f} us); the careful check "
          f"{e['careful_us']:.2f} us, {e['careful_ratio']:.2f}x")
    print(f"\nopen {opened['entries']:,} entries {'file MB':>8} {'store ms':>9} {'floor ms':>9} "
          f"{'ratio':>6} {'retained/file':>14} {'retained/payload':>17} {'peak/file':>10}")
    for version in (3, 2):
        o = opened[f"v{version}"]
        print(f"  version {version}{'':13} {o['file_mb']:8.1f} {o['store_ms']:9.0f} "
              f"{o['floor_ms']:9.0f} {o['ratio']:6.2f} {o['retained_to_file']:14.2f} "
              f"{o['retained_to_payload']:17.2f} {o['peak_to_file']:10.2f}")
    v = variants
    print(f"\ntime element, decode + build {v['entries']:,} entries, per entry "
          f"(floor: msgspec decoding their v2 lines, {v['floor_us']:.2f} us):")
    print(f"  explicit timestamp (kept)  {v['kept_us']:6.2f} us  {v['kept_ratio']:5.2f}x  "
          f"{v['kept_framing_per_entry']:.0f} B framing")
    print(f"  derived from the UUIDv7    {v['derived_us']:6.2f} us  {v['derived_ratio']:5.2f}x  "
          f"{v['derived_framing_per_entry']:.0f} B framing")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": machine, "bytes": sized, "encode": encoded,
                                   "open": opened, "time_variants": variants}, indent=2)
                       + "\n")


if __name__ == "__main__":
    main()
