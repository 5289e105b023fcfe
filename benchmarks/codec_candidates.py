"""The codec candidates side by side (issue 19; not part of CI).

    python benchmarks/codec_candidates.py [--before c0a0f97] [--count 20000]

Encodes and decodes the events of ``tianji bench transport``'s codec rows (a heartbeat
and a 100-byte ``ArraysPublished``, :mod:`tianji.bench.codec_cost`) with:

* ``msgpack + checks`` - the codec as it was at ``--before`` (msgpack-python, the field
  checks compiled from the annotations in Python, the dataclass built with ``cls(**body)``),
  loaded from git;
* ``msgspec typed`` - the codec now (:mod:`tianji.runtime.codec`): the header decoded as
  ``(version, type, Raw)``, the body by a msgspec decoder typed with the event class;
* ``msgspec untyped + checks`` - msgspec's untyped decode with the Python field checks
  (what replacing msgpack alone would give);
* ``msgspec typed, no encode check`` - the codec now without its encode-side field check
  (what that check, kept on purpose, costs).

Events are msgspec Structs since e9338f4 (frozen dataclasses before), so the old codec's
``cls(**body)`` builds a Struct here too: run this script at 4f67924 for the dataclass figures.

Both codecs produce the same bytes (checked). Best of 5 rounds, microseconds per event.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from tianji.bench.codec_cost import sample_events
from tianji.runtime import codec as now
from tianji.runtime.events import event_info

ROOT = Path(__file__).resolve().parents[1]


def load_old(commit: str) -> Any:
    """tianji/runtime/codec.py as of ``commit``, as a module (same event registry)."""
    source = subprocess.run(
        ["git", "show", f"{commit}:tianji/runtime/codec.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_codec.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_codec", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best(fn: Callable[[], object], count: int, rounds: int = 5) -> float:
    """Microseconds per call, best of ``rounds``."""
    out = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(count):
            fn()
        out = min(out, time.perf_counter() - start)
    return out / count * 1e6


def untyped_decoder(old: Any) -> Callable[[list[Any]], object]:
    """msgspec's untyped decode, then the old codec's checks and dataclass build."""
    header = msgspec.msgpack.Decoder(tuple[int, str, dict[str, Any]])

    def decode(frames: list[Any]) -> object:
        _, name, body = header.decode(frames[0])
        info = event_info(name)
        assert info is not None
        return old._build(info, body)

    return decode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="c0a0f97", help="commit of the msgpack codec")
    p.add_argument("--count", type=int, default=20_000)
    args = p.parse_args()
    old_mod = load_old(args.before)
    old, new, unchecked = old_mod.Codec(), now.Codec(), now.Codec()
    print(f"python {sys.version.split()[0]}, msgspec {msgspec.__version__}")
    print(f"{'event':<24}{'candidate':<34}{'encode us':>10}{'decode us':>10}{'total us':>10}")
    for name, ev in sample_events().items():
        frames = new.encode(ev)
        assert bytes(frames[0]) == bytes(old.encode(ev)[0]), "the wire changed"
        untyped = untyped_decoder(old_mod)
        kind = unchecked._kind(ev)
        unchecked._kinds[type(ev)] = kind._replace(check=lambda _ev: None)
        rows = [
            ("msgpack + checks", partial(old.encode, ev), partial(old.decode, frames)),
            ("msgspec typed", partial(new.encode, ev), partial(new.decode, frames)),
        ]
        if len(frames) == 1:  # (the untyped variant has no array extension hook)
            rows.append(
                ("msgspec untyped + checks", partial(new.encode, ev), partial(untyped, frames))
            )
        rows.append(("msgspec typed, no encode check", partial(unchecked.encode, ev), rows[1][2]))
        for label, enc, dec in rows:
            e, d = best(enc, args.count), best(dec, args.count)
            print(f"{name:<24}{label:<34}{e:>10.2f}{d:>10.2f}{e + d:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
