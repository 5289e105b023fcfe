"""The books before and after issue 32, on the same inflated ``samples_produced``.

Runs the accounting of commit 708d2b5 (taken with ``git show``) on that commit's own test
fixture with actor-0's ``samples_produced`` set to 5,000, 50,000 and 5,000,000, then the
current books (``tianji.rl.books``) on a simulated run (``tests/test_books.py``'s ``Run``)
with the same values::

    python benchmarks/books_before_after.py > docs/results/books-issue32-before-after.txt
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "708d2b5"


def _old_accounting():  # type: ignore[no-untyped-def]
    source = subprocess.run(
        ["git", "show", f"{BEFORE}:tianji/services/balancer.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_balancer.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_balancer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.accounting


def main() -> None:
    from tianji.rl.books import accounting
    from tianji.runtime.events import Heartbeat

    sys.path.insert(0, str(ROOT / "tests"))
    from test_books import Run, replace
    from test_controller_balancer import hb

    def fixture_for(
        produced: int = 5000, inserted: int = 9000, evicted: int = 976, buffered: int = 1024
    ) -> dict[str, Heartbeat]:
        """tests/test_controller_balancer.py's fixture at 708d2b5, with its buffer's counts
        (and actor-0's samples_produced) as given."""
        buffer = {
            "samples_inserted": inserted,
            "samples_sent": 6000,
            "dropped/stale": 1000,
            "dropped/evicted": evicted,
        }
        return {
            "actor-0": hb("actor-0", "actor", {"samples_produced": produced}),
            "actor-1": hb("actor-1", "actor", {"samples_produced": 5000, "dropped/unsent": 512}),
            "buffer-0": hb("buffer-0", "buffer", buffer, buffered_samples=buffered),
            "learner-0": hb(
                "learner-0",
                "learner",
                {"samples_received": 5000, "samples_consumed": 4000, "dropped/stale": 1000},
            ),
        }

    old = _old_accounting()
    for produced in (5_000, 50_000, 5_000_000):
        fixture = fixture_for(produced)
        b = old(fixture, on_policy=True)
        print(
            f"before ({BEFORE}): samples_produced={produced:,}: balanced={b['balanced']} "
            f"in_flight={b['in_flight']}"
        )
    # the same fixture with losses nobody counted: a fragment the link lost (the buffer
    # inserted 256 fewer), a buffer that keeps 256 more than it received
    lost = fixture_for(inserted=8744, evicted=720)
    b = old(lost, on_policy=True)
    print(
        f"before ({BEFORE}): a fragment lost on its link, uncounted: balanced={b['balanced']} "
        f"in_flight={b['in_flight']}"
    )
    kept = fixture_for(buffered=1280)
    b = old(kept, on_policy=True)
    print(
        f"before ({BEFORE}): a buffer holding 256 more than it received: "
        f"balanced={b['balanced']} in_flight={b['in_flight']}"
    )
    for produced in (5_000, 50_000, 5_000_000):
        run = Run()
        run.step(4)
        beats = run.heartbeats()
        beats["actor-0"] = replace(beats["actor-0"], samples_produced=produced)
        b = accounting(beats, on_policy=True)
        print(
            f"after: samples_produced={produced:,}: balanced={b['balanced']} "
            f"in_flight={b['in_flight']} errors={b['errors']}"
        )

    run = Run()
    run.step(2)
    run.actors[0].fragment()
    run.actors[0].delivered()  # the link took it and lost it
    run.step(2)
    b = accounting(run.heartbeats(), on_policy=True)
    print(
        f"after: a fragment lost on its link: balanced={b['balanced']} "
        f"in_flight={b['in_flight']} dropped={b['dropped']}"
    )


if __name__ == "__main__":
    main()
