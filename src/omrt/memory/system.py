"""The operating system calls behind `Memory`: locking, huge pages, memfds, dma-buf syncs, and what
/proc says about a mapping. Linux first; elsewhere the calls that do not exist say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import mmap
import os
import resource
import struct

import numpy as np

from ..errors import AllocationError

HUGE_PAGE = 2 << 20
"""The size of an x86-64 (and arm64 4k-granule) transparent huge page."""

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)

DMA_BUF_SYNC_READ, DMA_BUF_SYNC_WRITE = 1, 2
DMA_BUF_SYNC_START, DMA_BUF_SYNC_END = 0, 4
DMA_BUF_IOCTL_SYNC = 0x40086200
"""_IOW('b', 0, struct dma_buf_sync { __u64 flags; }) from linux/dma-buf.h."""


def _call(name: str, *args: int) -> int:
    fn = getattr(_libc, name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t][:len(args)]
    fn.restype = ctypes.c_int
    return 0 if fn(*args) == 0 else ctypes.get_errno()


def memlock_limit() -> str:
    """RLIMIT_MEMLOCK as a person reads it: soft / hard, in KiB or unlimited."""
    def text(n: int) -> str:
        return "unlimited" if n == resource.RLIM_INFINITY else f"{n // 1024} KiB"

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return f"{text(soft)} (hard limit {text(hard)})"


def lock(address: int, nbytes: int, what: str) -> None:
    """mlock: keep these pages in RAM, or an AllocationError naming the limit and the fix."""
    err = _call("mlock", address, nbytes)
    if err:
        raise AllocationError(f"{what}: cannot lock {nbytes} bytes in RAM ({os.strerror(err)}); RLIMIT_MEMLOCK is "
                              f"{memlock_limit()}: raise it (ulimit -l, or LimitMEMLOCK= in a systemd unit), "
                              f"or allocate without lock=True")


def memfd(name: str, nbytes: int) -> int:
    """An anonymous in-memory file of `nbytes`, whose fd another process can map."""
    if not hasattr(os, "memfd_create"):
        raise AllocationError(f"{name}: shared memory needs memfd_create, which this OS lacks")
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
    except OSError as e:
        os.close(fd)
        raise AllocationError(f"{name}: cannot size a memfd to {nbytes} bytes ({e.strerror})") from None
    return fd


def fd_kind(fd: int) -> str:
    """"dmabuf", "memfd", "file" or "other": what the fd refers to (from /proc/self/fd)."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "other"
    if "dmabuf" in target:
        return "dmabuf"
    if target.startswith("/memfd:"):
        return "memfd"
    return "file" if target.startswith("/") else "other"


def dma_buf_sync(fd: int, flags: int) -> None:
    """DMA_BUF_IOCTL_SYNC on a dma-buf fd (the CPU access bracket of linux/dma-buf.h)."""
    try:
        fcntl.ioctl(fd, DMA_BUF_IOCTL_SYNC, struct.pack("<Q", flags))
    except OSError as e:
        raise AllocationError(f"dma-buf fd {fd}: DMA_BUF_IOCTL_SYNC failed ({e.strerror})") from None


def smaps_bytes(address: int, nbytes: int, *fields: str) -> int:
    """The sum of these /proc/self/smaps fields ("Rss", "AnonHugePages", ...) over the mappings
    that overlap [address, address + nbytes)."""
    total, inside = 0, False
    wanted = {f + ":" for f in fields}
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(maxsplit=1)[0]
                if "-" in head and ":" not in head:
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo < address + nbytes and address < hi
                elif inside and head in wanted:
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


def mapped_huge_bytes(address: int, nbytes: int) -> int:
    """Bytes of the mappings over [address, address + nbytes) backed by huge pages."""
    return smaps_bytes(address, nbytes, "AnonHugePages", "ShmemPmdMapped", "FilePmdMapped")


def map_count() -> int:
    """How many mappings this process has (a leak of Memory objects shows here)."""
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def cached_bytes(fd: int, offset: int = 0, nbytes: int | None = None) -> int:
    """Bytes of [offset, offset + nbytes) of a file that sit in the page cache now (mincore on a
    mapping of that range, which faults nothing in): what a budget that drops pages leaves."""
    nbytes = os.fstat(fd).st_size - offset if nbytes is None else nbytes
    if nbytes <= 0:
        return 0
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    length = offset + nbytes - start
    mapping = mmap.mmap(fd, length, access=mmap.ACCESS_READ, offset=start)
    pages = (ctypes.c_ubyte * (-(-length // mmap.PAGESIZE)))()
    try:
        array = np.frombuffer(mapping, np.uint8)
        mincore = _libc.mincore
        mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        failed = mincore(array.__array_interface__["data"][0], length, pages)
        del array
    finally:
        mapping.close()
    if failed:
        raise AllocationError(f"fd {fd}: mincore failed ({os.strerror(ctypes.get_errno())})")
    first, last = (offset - start) // mmap.PAGESIZE, (length - 1) // mmap.PAGESIZE
    return sum(pages[i] & 1 for i in range(first, last + 1)) * mmap.PAGESIZE
