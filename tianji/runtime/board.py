"""The weights board: one shared-memory copy of a large event for every subscriber on the
host, instead of one copy per subscriber link.

A publisher that shares a topic on a board (:meth:`Service.share_on_board`) writes a large
event's frames once into a slot of its board, a file in ``/dev/shm``, and sends each
subscriber on the same host (connected through its local, shared-memory listener) a small
:class:`~tianji.runtime.events.BoardPosted` reference instead. The subscriber maps the board
once and decodes the event from views of the slot: no copy, whatever the size, so 64
local subscribers have a 100-MB version about as soon as one does.

Slots are reused round-robin (``SLOTS`` of them), guarded by a sequence number per slot
(a seqlock): odd while the writer fills the slot, even and bumped once it is done. A
:class:`Lease` remembers the number a reader decoded; :meth:`Lease.valid` tells whether
the slot still holds that event. A reader that copies the data out (loads weights into
a model) checks the lease afterwards; if the slot was overwritten meanwhile (``SLOTS -
1`` newer events were published while it held one), what it copied may be torn and it
must wait for the newer event, which is on its way to it. The board is for topics whose
subscribers need only the latest event (weights), where a superseded event may be
skipped; a reference to a slot already overwritten when it arrives is dropped and
counted (``board_superseded``).

Names are ``tianji-<pid>-<starttime>-board<hex>``: the shm transport's sweep removes a
board whose creator died. The writer unlinks its board when it closes or outgrows it;
readers keep their mappings, and their views stay valid (nobody writes there again).
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from tianji.runtime.errors import BadFrame

__all__ = ["BOARD_MIN_BYTES", "SLOTS", "Board", "BoardReader", "Lease", "start_time"]

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
PAGE = 4096
ALIGN = 64
SLOTS = 3
BOARD_MIN_BYTES = 256 * 1024
"""Events smaller than this travel over the links as usual (a copy per link costs less
than a board write plus a reference)."""
MAGIC = int.from_bytes(b"TJBOARD1", "little")
_MAGIC, _SLOTS, _SLOT_BYTES = 0, 1, 2
MAX_SLOTS = PAGE // ALIGN - 1  # one 64-byte header line per slot after the first
MAX_BOARD = 1 << 36


def start_time(pid: int) -> int:
    """Process ``pid``'s start time (``/proc/<pid>/stat`` field 22), 0 if unknown; with the
    pid it names a process uniquely (a new process may reuse a pid)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError as exc:  # gone, or no /proc: unknown
        log.debug("pid %d: %r", pid, exc)
        return 0
    return int(raw.rsplit(b")", 1)[1].split()[19])


def _offsets(lengths: Sequence[int]) -> tuple[list[int], int]:
    """Each frame's offset in a slot (64-byte aligned) and the bytes the slot needs."""
    offsets, at = [], 0
    for n in lengths:
        offsets.append(at)
        at += -(-n // ALIGN) * ALIGN
    return offsets, at


class Lease:
    """A reader's claim on one slot as it was when decoded (see the module docstring)."""

    __slots__ = ("_seq", "_slot", "_words")

    def __init__(self, words: memoryview, slot: int, seq: int) -> None:
        self._words, self._slot, self._seq = words, slot, seq

    def valid(self) -> bool:
        """Whether the slot still holds the event decoded under this lease."""
        return bool(self._words[(self._slot + 1) * (ALIGN // 8)] == self._seq)


class _Segment:
    """One mapped board file: its header words and its data."""

    def __init__(self, mm: mmap.mmap) -> None:
        self.mm = mm
        self.view = memoryview(mm)
        self.words = self.view[:PAGE].cast("Q")
        self.slots = int(self.words[_SLOTS])
        self.slot_bytes = int(self.words[_SLOT_BYTES])

    def seq_index(self, slot: int) -> int:
        return (slot + 1) * (ALIGN // 8)

    def slot_view(self, slot: int) -> memoryview:
        start = PAGE + slot * self.slot_bytes
        return self.view[start : start + self.slot_bytes]

    def close(self) -> None:
        """Unmap, unless decoded events still view it (then it goes with them)."""
        self.words.release()
        self.view.release()
        try:
            self.mm.close()
        except BufferError as exc:  # decoded events still view it: it goes with them
            log.debug("board mapping kept while viewed: %r", exc)


class Board:
    """The writer's side: ``put`` frames into the next slot; ``close`` removes the file."""

    def __init__(self, slots: int = SLOTS) -> None:
        if not 2 <= slots <= MAX_SLOTS:
            raise ValueError(f"slots={slots}: 2 to {MAX_SLOTS}")
        self.slots = slots
        self.name = ""
        self._segment: _Segment | None = None
        self._next = 0
        self.writes = 0
        self.bytes_written = 0

    @staticmethod
    def available() -> bool:
        """Whether this host has a writable ``/dev/shm``."""
        return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)

    def put(self, frames: Sequence[bytes | bytearray | memoryview]) -> tuple[str, int, int]:
        """Write ``frames`` into the next slot.

        Returns:
            ``(board name, slot, sequence number)`` for the reference.
        """
        views = [memoryview(f).cast("B") for f in frames]
        offsets, needed = _offsets([v.nbytes for v in views])
        seg = self._segment
        if seg is None or needed > seg.slot_bytes:
            seg = self._grow(needed)
        slot = self._next
        self._next = (slot + 1) % self.slots
        index = seg.seq_index(slot)
        seq = int(seg.words[index]) + 1
        seg.words[index] = seq  # odd: being written
        area = seg.slot_view(slot)
        for view, at in zip(views, offsets, strict=True):
            area[at : at + view.nbytes] = view
        area.release()
        seq += 1
        seg.words[index] = seq  # even: done
        self.writes += 1
        self.bytes_written += sum(v.nbytes for v in views)
        return self.name, slot, seq

    def _grow(self, needed: int) -> _Segment:
        """A new board file with slots of at least ``needed`` bytes (a quarter more, so a
        slightly larger event does not need another one); the old file is unlinked."""
        slot_bytes = -(-int(needed * 1.25) // PAGE) * PAGE
        size = PAGE + self.slots * slot_bytes
        if size > MAX_BOARD:
            raise ValueError(f"a board of {size} bytes is larger than {MAX_BOARD}")
        self.close()
        pid = os.getpid()
        name = f"tianji-{pid}-{start_time(pid)}-board{secrets.token_hex(6)}"
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # a full /dev/shm fails here, not with SIGBUS
            # map every page now: a first write to each page of a slot would otherwise
            # fault (25k faults for a 100-MB slot) on the publish path
            populate = getattr(mmap, "MAP_POPULATE", 0)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | populate)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        words = memoryview(mm)[:PAGE].cast("Q")
        words[_SLOTS], words[_SLOT_BYTES] = self.slots, slot_bytes
        words[_MAGIC] = MAGIC  # last: a reader that sees the magic sees the rest
        words.release()
        self._segment = _Segment(mm)
        self.name = name
        self._next = 0
        return self._segment

    def close(self) -> None:
        """Remove the board file (readers keep what they mapped)."""
        if self._segment is not None:
            try:
                os.unlink(os.path.join(SHM_DIR, self.name))
            except FileNotFoundError as exc:  # swept already
                log.debug("board %s: %r", self.name, exc)
            self._segment.close()
            self._segment = None


class BoardReader:
    """The reader's side: maps boards by name (kept mapped) and resolves references."""

    def __init__(self, keep: int = 4) -> None:
        self._segments: dict[str, _Segment] = {}
        self._keep = keep

    def resolve(
        self, name: str, slot: int, seq: int, lengths: Sequence[int]
    ) -> tuple[list[memoryview], Lease] | None:
        """Views of the frames in ``slot`` of board ``name`` and the lease on them, or
        ``None`` if the slot no longer holds that event (overwritten: superseded).

        Raises:
            BadFrame: if the reference is malformed or the board cannot be read.
        """
        if not name.startswith("tianji-") or "/" in name or "\x00" in name:
            raise BadFrame("bad_board", f"board name {name!r:.80}")
        seg = self._segments.get(name)
        if seg is None:
            seg = self._attach(name)
        if not 0 <= slot < seg.slots or seq <= 0:
            raise BadFrame("bad_board", f"slot {slot} / seq {seq} of board {name}")
        offsets, needed = _offsets(lengths)
        if needed > seg.slot_bytes:
            raise BadFrame("bad_board", f"{needed} bytes > slot of {seg.slot_bytes} ({name})")
        lease = Lease(seg.words, slot, seq)
        if not lease.valid():
            return None
        area = seg.slot_view(slot)
        frames = [area[at : at + n] for at, n in zip(offsets, lengths, strict=True)]
        return frames, lease

    def _attach(self, name: str) -> _Segment:
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise BadFrame("board_gone", f"board {name} no longer exists") from None
        except OSError as exc:
            raise BadFrame("bad_board", f"cannot open board {name}: {exc}") from None
        try:
            size = os.fstat(fd).st_size
            if not PAGE < size <= MAX_BOARD:
                raise BadFrame("bad_board", f"board {name} has {size} bytes")
            mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        seg = _Segment(mm)
        if (
            seg.words[_MAGIC] != MAGIC
            or not 2 <= seg.slots <= MAX_SLOTS
            or PAGE + seg.slots * seg.slot_bytes > size
        ):
            seg.close()
            raise BadFrame("bad_board", f"{name} is not a board")
        while len(self._segments) >= self._keep:  # boards outgrown long ago
            self._segments.pop(next(iter(self._segments))).close()
        self._segments[name] = seg
        return seg

    def close(self) -> None:
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()
