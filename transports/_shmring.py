"""Shared-memory ring segments for the ``shm`` transport: layout, lifecycle, record format.

A segment is one file in ``/dev/shm`` (tmpfs), mapped by both ends of a link: a header
page of 64-bit counters, then a data area of ``size`` bytes used as a single-producer
single-consumer ring. The file is unlinked right after its creator maps it, before any
``await`` and before the peer has seen it: the peer receives the open descriptor over
the link's Unix socket (``SCM_RIGHTS``), so a named file exists only for the few
microseconds of :meth:`Ring.create`. A process killed inside that window leaves the file
behind; :func:`sweep_stale_segments` (run by every ``listen`` and ``connect``) removes
files whose creator is dead. Names are ``tianji-<pid>-<starttime>-<random>``: the
process start time tells a dead creator from a new process that reuses its pid.

Header (u64 slots, each group on its own 64-byte cache line)::

    0 MAGIC 1 VERSION 2 DATA_SIZE 3 CREATOR          constant
    8 TAIL 9 MSGS_W 10 BYTES_W 11 GOODBYE            written by the producer
    16 HEAD 17 MSGS_R 18 BYTES_R                     written by the consumer
    24 SLEEPING                                      consumer asleep: ring the doorbell
    32 WAIT_HEAD 33 WAIT_MSGS                        producer asleep until HEAD/MSGS_R reach these

Records start at 64-byte aligned ring offsets and never wrap (a WRAP record fills the
rest of the ring instead). Each begins with ``<u32 kind, u32 nframes, u64 size, u64
payload>`` (``size``: the record's bytes, a multiple of 64):

* MSG: a whole message: ``nframes`` u64 lengths, then each frame at the next 64-byte
  aligned offset (so ``np.frombuffer`` views of the ring are aligned).
* BEGIN: a message larger than half the ring: its u64 lengths; the bytes follow in CHUNKs.
* CHUNK: ``payload`` bytes of the current large message, from offset 64.
* WRAP: skip to the start of the ring.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
import stat
import struct
from pathlib import Path

from tianji.runtime.errors import BadFrame

__all__ = ["Ring", "sweep_stale_segments"]

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
PREFIX = "tianji-"
PAGE = 4096
HEADER_BYTES = PAGE
MIN_RING = 1 << 20  # a BEGIN record (up to 16384 lengths) must fit in half of it
MAX_ATTACH = 1 << 30  # largest ring a peer may hand us

RING_MAGIC = int.from_bytes(b"TJSHMRNG", "little")
RING_VERSION = 1
MAGIC, VERSION, DATA_SIZE, CREATOR = 0, 1, 2, 3
TAIL, MSGS_W, BYTES_W, GOODBYE = 8, 9, 10, 11
HEAD, MSGS_R, BYTES_R = 16, 17, 18
SLEEPING = 24
WAIT_HEAD, WAIT_MSGS = 32, 33

KIND_MSG, KIND_BEGIN, KIND_CHUNK, KIND_WRAP = 1, 2, 3, 4
RECORD = struct.Struct("<IIQQ")
RECORD_BYTES = RECORD.size  # 24
CHUNK_DATA = 64  # where a CHUNK's bytes start

_tables: dict[int, struct.Struct] = {}


def table(nframes: int) -> struct.Struct:
    """The (cached) struct of ``nframes`` u64 frame lengths."""
    s = _tables.get(nframes)
    if s is None:
        s = struct.Struct(f"<{nframes}Q")
        if nframes <= 64:
            _tables[nframes] = s
    return s


_headers: dict[int, struct.Struct] = {}


def header(nframes: int) -> struct.Struct:
    """The (cached) struct of a record header followed by ``nframes`` u64 lengths."""
    s = _headers.get(nframes)
    if s is None:
        s = struct.Struct(f"<IIQQ{nframes}Q")
        if nframes <= 64:
            _headers[nframes] = s
    return s


def ring_size(queue_bytes: int, max_ring: int) -> int:
    """Data bytes of a ring serving ``queue_bytes``: page multiple in [MIN_RING, max_ring]."""
    size = (queue_bytes + PAGE - 1) & -PAGE
    return max(MIN_RING, min(size, max(max_ring, MIN_RING)))


class Ring:
    """One mapped segment: ``hdr`` (u64 counters) and ``data`` (the ring bytes)."""

    __slots__ = ("_view", "data", "hdr", "mm", "size")

    def __init__(self, mm: mmap.mmap, size: int) -> None:
        self.mm = mm
        self.size = size
        self._view = memoryview(mm)
        self.hdr = self._view[:HEADER_BYTES].cast("Q")
        self.data = self._view[HEADER_BYTES : HEADER_BYTES + size]

    @classmethod
    def create(cls, size: int) -> tuple[Ring, int]:
        """Create, map and unlink a segment of ``size`` data bytes.

        Returns:
            The ring and an open descriptor of it (for the peer; the caller closes it).
        """
        path = os.path.join(SHM_DIR, f"{PREFIX}{os.getpid()}-{_own_start_time()}-"
                            f"{secrets.token_hex(6)}")  # fmt: skip
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(path, flags, 0o600)
        try:
            try:
                # Reserve the pages now: a full tmpfs (a container's 64 MiB /dev/shm) must
                # fail here with ENOSPC, not later with SIGBUS on a write into the ring.
                os.posix_fallocate(fd, 0, HEADER_BYTES + size)
                mm = mmap.mmap(fd, HEADER_BYTES + size)
            finally:
                os.unlink(path)  # the mapping and fd keep it; no name outlives this call
        except BaseException:
            os.close(fd)
            raise
        ring = cls(mm, size)
        hdr = ring.hdr
        hdr[MAGIC], hdr[VERSION], hdr[DATA_SIZE], hdr[CREATOR] = (
            RING_MAGIC, RING_VERSION, size, os.getpid())  # fmt: skip
        hdr[SLEEPING] = 1  # the consumer has not started: the first data rings the doorbell
        return ring, fd

    @classmethod
    def attach(cls, fd: int, size: int) -> Ring:
        """Map the peer's segment ``fd`` announced with ``size`` data bytes.

        Raises:
            BadFrame: if the descriptor is not a ring of that size.
        """
        if size < MIN_RING or size > MAX_ATTACH or size % PAGE:
            raise BadFrame("bad_handshake", f"ring size {size} not in [{MIN_RING}, {MAX_ATTACH}]")
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != HEADER_BYTES + size:
            raise BadFrame("bad_handshake", f"descriptor is not a ring of {size} bytes")
        ring = cls(mmap.mmap(fd, HEADER_BYTES + size), size)
        hdr = ring.hdr
        if hdr[MAGIC] != RING_MAGIC or hdr[VERSION] != RING_VERSION or hdr[DATA_SIZE] != size:
            ring.close()
            raise BadFrame("bad_handshake", "segment header has a wrong magic, version or size")
        return ring

    def close(self) -> None:
        """Unmap, unless a lease still views the ring (then the mapping goes with it)."""
        for view in (self.hdr, self.data, self._view):
            view.release()
        try:
            self.mm.close()
        except BufferError as exc:  # a lease still views it: the mapping goes with that
            log.debug("ring mapping kept while leased: %r", exc)


def sweep_stale_segments(directory: str = SHM_DIR) -> list[str]:
    """Remove ring files whose creating process is gone (killed during ``Ring.create``).

    Returns:
        The names removed.
    """
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError as exc:  # no shm directory here: nothing to sweep
        log.debug("%s: %r", directory, exc)
        return removed
    for name in names:
        if not name.startswith(PREFIX):
            continue
        parts = name[len(PREFIX) :].split("-")
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        started = int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None
        if _alive(int(parts[0]), started):
            continue
        try:
            os.unlink(os.path.join(directory, name))
        except (FileNotFoundError, PermissionError) as exc:  # swept by another, or not ours
            log.debug("%s: %r", name, exc)
            continue
        removed.append(name)
    if removed:
        log.info("removed %d stale shm segment(s): %s", len(removed), ", ".join(removed))
    return removed


def _proc_stat(pid: int) -> list[bytes] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError as exc:  # gone
        log.debug("pid %d: %r", pid, exc)
        return None
    return raw.rsplit(b")", 1)[1].split()  # fields 3.. (state, ppid, ...): comm may hold spaces


def _alive(pid: int, started: int | None) -> bool:
    fields = _proc_stat(pid)
    if fields is None:
        return not Path("/proc/self").exists()  # no procfs: cannot tell, keep the file
    if fields[0] in (b"Z", b"X"):  # zombie: dead, only not reaped yet
        return False
    return started is None or int(fields[19]) == started  # field 22: start time


_start_time: tuple[int, int] | None = None


def _own_start_time() -> int:
    global _start_time
    pid = os.getpid()
    if _start_time is None or _start_time[0] != pid:  # recomputed after fork
        fields = _proc_stat(pid)
        _start_time = (pid, int(fields[19]) if fields is not None else 0)
    return _start_time[1]
