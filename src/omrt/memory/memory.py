"""`Memory`: one object for every piece of memory omrt allocates or is handed (after seed 003's
tensor memory).

It knows its origin and releases by it: memory omrt allocated is unmapped (and unlocked) at
`close()`, memory it imported releases only the wrapper. It can be allocated with flags (locked,
huge pages, shared through a memfd, pre-faulted), imported without a copy from an fd, a buffer,
DLPack or a raw address, viewed as numpy arrays, and synced around device access: on a dma-buf fd
the DMA_BUF_IOCTL_SYNC bracket of seed 001, on a shared file mapping msync, on plain CPU memory
nothing. While a session or model uses it, `close()` is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import os
import threading
import weakref
from typing import Any, Sequence

import numpy as np

from ..errors import AllocationError, BindError
from . import system
from .alignment import ALIGN, align

DIRECTIONS = ("to_device", "from_device", "both")
_READ_WRITE = {"from_device": system.DMA_BUF_SYNC_READ, "to_device": system.DMA_BUF_SYNC_WRITE,
               "both": system.DMA_BUF_SYNC_READ | system.DMA_BUF_SYNC_WRITE}


def byte_view(buffer: Any, error: type[Exception], not_a_buffer: str, scattered: str) -> memoryview:
    """The bytes of an object with the buffer protocol, in place; `error` with the message
    `not_a_buffer` when it has none, `scattered` when its bytes are not contiguous."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise error(not_a_buffer) from None
    if not view.c_contiguous:
        raise error(scattered)
    return view.cast("B")


class Memory:
    """A piece of memory: allocated by omrt (`allocate`) or imported (`from_fd`, `from_buffer`,
    `from_dlpack`, `from_address`). Use `view` for numpy arrays over it, bind it to sessions, and
    `close()` it (or use it as a context manager) when done."""

    def __init__(self, array: np.ndarray, origin: str, *, mapping: mmap.mmap | None = None,
                 fd: int | None = None, owner: Any = None, kind: str = "plain", fd_offset: int = 0) -> None:
        self._array: np.ndarray | None = array
        self.origin = origin
        """"allocated", "fd", "buffer", "dlpack" or "address"."""
        self.kind = kind
        """What backs it: "plain", "memfd", "file", "dmabuf" or "other" (an fd of another kind)."""
        self.nbytes = array.nbytes
        self.writable = bool(array.flags.writeable)
        self.address = array.__array_interface__["data"][0]
        self.locked = False
        self.syncs = 0
        """DMA_BUF_IOCTL_SYNC and msync calls made on it."""
        self._mapping = mapping
        self._fd = fd
        self.fd_offset = fd_offset
        """Where in `fd` its first byte lies (from_fd's offset; 0 for memory omrt allocated)."""
        self._owner = owner
        self._holders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.run_lock = threading.Lock()
        """Taken by a session for each run that uses this memory as its arena."""
        self._closer = weakref.finalize(self, _release, mapping, fd)

    # ------------------------------------------------------------------ making memory

    @classmethod
    def allocate(cls, nbytes: int, *, prefault: bool = False, lock: bool = False, huge_pages: bool = False,
                 shared: bool = False, name: str = "omrt") -> "Memory":
        """`nbytes` of zero-filled, page-aligned memory.

        prefault: touch every page now, so the first run does not fault them in. lock: mlock it
        (an AllocationError names RLIMIT_MEMLOCK when that is too low). huge_pages: try transparent
        huge pages (2 MiB aligned, madvise); `huge_page_bytes` tells what the kernel gave.
        shared: back it by a memfd, whose `fd` another process can map.
        """
        if nbytes <= 0:
            raise AllocationError(f"cannot allocate {nbytes} bytes: ask for at least one")
        step = system.HUGE_PAGE if huge_pages else mmap.PAGESIZE
        size = align(nbytes, step)
        fd = system.memfd(name, size) if shared else None
        spare = step if huge_pages and not shared else 0  # room to start on a huge page boundary
        mapping = _map(fd, size + spare, writable=True, what=name)
        array = np.frombuffer(mapping, np.uint8)
        start = (-array.__array_interface__["data"][0]) % step if spare else 0
        if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
            mapping.madvise(mmap.MADV_HUGEPAGE, start, size)
        array = array[start:start + nbytes]
        if prefault or huge_pages:
            array[::mmap.PAGESIZE] = 0
        memory = cls(array, "allocated", mapping=mapping, fd=fd, kind="memfd" if shared else "plain")
        if lock:
            system.lock(memory.address, nbytes, f"Memory.allocate({nbytes}, lock=True)")
            memory.locked = True  # unmapping unlocks
        return memory

    @classmethod
    def from_fd(cls, fd: int, size: int | None = None, offset: int = 0, writable: bool = True) -> "Memory":
        """Map `size` bytes of an fd (memfd, POSIX shm, a regular file, a dma-buf or V4L2 buffer)
        from `offset`, without a copy; omrt keeps a duplicate of the fd, so the caller may close
        theirs."""
        total = _fd_size(fd)
        size = total - offset if size is None else size
        if offset < 0 or size <= 0 or offset + size > total:
            raise AllocationError(f"fd {fd}: cannot map {size} bytes at offset {offset}: it holds {total} bytes; "
                                  f"pass a size and offset inside it")
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        mapping = _map(fd, size + offset - start, writable=writable, what=f"fd {fd}", offset=start)
        array = np.frombuffer(mapping, np.uint8, size, offset - start)
        if not writable:
            array.flags.writeable = False
        return cls(array, "fd", mapping=mapping, fd=os.dup(fd), kind=system.fd_kind(fd), fd_offset=offset)

    @classmethod
    def from_buffer(cls, buffer: Any, writable: bool | None = None) -> "Memory":
        """Memory over any object with the buffer protocol (bytearray, mmap, numpy,
        SharedMemory.buf, ...), without a copy; writable=None follows the buffer."""
        view = byte_view(buffer, AllocationError, f"a {type(buffer).__name__} has no buffer protocol; pass bytes, "
                         f"a bytearray, an mmap or a numpy array",
                         "the buffer is not contiguous: omrt maps memory in place, it cannot gather it")
        if writable and view.readonly:
            raise AllocationError(f"the {type(buffer).__name__} is read-only, and writable=True was asked")
        array = np.frombuffer(view, np.uint8) if view.nbytes else np.empty(0, np.uint8)
        if writable is False:
            array.flags.writeable = False
        return cls(array, "buffer", owner=buffer)

    @classmethod
    def from_dlpack(cls, tensor: Any) -> "Memory":
        """Memory over a DLPack tensor's bytes (a CPU tensor, contiguous), without a copy."""
        array = np.from_dlpack(tensor)
        if not array.flags.c_contiguous:
            raise AllocationError("the DLPack tensor is not contiguous: omrt maps memory in place")
        return cls(array.reshape(-1).view(np.uint8), "dlpack", owner=tensor)

    @classmethod
    def from_address(cls, address: int, nbytes: int, owner: Any, writable: bool = True) -> "Memory":
        """Memory at a raw address that `owner` keeps alive (the Memory holds `owner`)."""
        if not address or nbytes <= 0:
            raise AllocationError(f"address {address:#x} with {nbytes} bytes is not memory: pass a non-null "
                                  f"address and a positive size")
        raw = (ctypes.c_ubyte * nbytes).from_address(address)
        raw._omrt_owner = owner  # every view's base chain reaches `raw`: the owner lives as long as they do
        array = np.ctypeslib.as_array(raw)
        if not writable:
            array.flags.writeable = False
        return cls(array, "address", owner=owner)

    # ------------------------------------------------------------------ using it

    @property
    def fd(self) -> int | None:
        """The fd behind it (a memfd for shared memory, a duplicate of an imported fd)."""
        return self._fd

    @property
    def closed(self) -> bool:
        return self._array is None

    @property
    def huge_page_bytes(self) -> int:
        """Bytes the kernel backs with huge pages now in the mappings it lies in (/proc/self/smaps
        counts per mapping, not per byte range), at most its own size."""
        return min(system.mapped_huge_bytes(self.address, self.nbytes), self.nbytes)

    def as_array(self) -> np.ndarray:
        """All of it, as a uint8 array."""
        return self._live()

    def view(self, dtype: Any, shape: Sequence[int], offset: int = 0) -> np.ndarray:
        """A numpy view of `shape` and `dtype` from byte `offset`, checked against its size and
        the dtype's alignment."""
        array = self._live()
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if offset < 0 or offset + nbytes > self.nbytes:
            raise BindError(f"{self!r}: a {dtype} view of shape {tuple(shape)} at offset {offset} needs {nbytes} "
                            f"bytes from there; it holds {self.nbytes}: allocate more or pass a smaller offset")
        if (self.address + offset) % dtype.alignment:
            raise BindError(f"{self!r}: offset {offset} is not aligned to {dtype.alignment} bytes for {dtype}")
        return array[offset:offset + nbytes].view(dtype).reshape(tuple(shape))

    def sync(self, direction: str = "both") -> int:
        """Make CPU and device views agree: "from_device" before the CPU reads what a device wrote,
        "to_device" after the CPU wrote what a device reads. A dma-buf gets its sync bracket, a
        shared file mapping msync (to_device), plain memory nothing. Returns the calls made."""
        if direction not in DIRECTIONS:
            raise BindError(f"sync direction {direction!r}: choose one of {DIRECTIONS}")
        return self.begin(direction) + self.end(direction)

    def begin(self, direction: str) -> int:
        """Open the CPU access bracket (DMA_BUF_SYNC_START on a dma-buf); returns the calls made."""
        if self.kind != "dmabuf":
            return 0
        system.dma_buf_sync(self._fd, system.DMA_BUF_SYNC_START | _READ_WRITE[direction])
        self.syncs += 1
        return 1

    def end(self, direction: str) -> int:
        """Close the CPU access bracket (DMA_BUF_SYNC_END; msync of a file mapping written to)."""
        if self.kind == "dmabuf":
            system.dma_buf_sync(self._fd, system.DMA_BUF_SYNC_END | _READ_WRITE[direction])
        elif self.kind == "file" and direction != "from_device" and self.writable:
            self._mapping.flush()
        else:
            return 0
        self.syncs += 1
        return 1

    # ------------------------------------------------------------------ who uses it

    def region(self, nbytes: int, holder: Any, role: str, error: type[Exception] = BindError) -> np.ndarray:
        """Its first `nbytes` bytes as a writable, ALIGN-aligned view that omrt writes as `role`
        (an arena, a model's weights), held by `holder`; `error` names what it lacks otherwise."""
        problem = ("is read-only" if not self.writable else
                   f"holds {self.nbytes} bytes" if self.nbytes < nbytes else
                   f"does not start on a {ALIGN}-byte boundary" if self.address % ALIGN else None)
        if problem is not None:
            raise error(f"{self!r} {problem}: {role} needs {nbytes} writable bytes from a {ALIGN}-byte "
                        f"boundary; allocate them with omrt.Memory.allocate({nbytes})")
        view = self.view(np.uint8, (nbytes,))
        self.hold(holder, role)
        return view

    def hold(self, holder: Any, role: str) -> None:
        """Record that `holder` (a session or model) uses this memory as `role`; one holder may
        use it in several roles (an arena and a bound input), each released on its own."""
        self._live()
        self._holders.setdefault(holder, []).append(role)

    def release(self, holder: Any, role: str) -> None:
        """`holder` no longer uses this memory as `role` (its other roles stay)."""
        roles = self._holders.get(holder)
        if roles and role in roles:
            roles.remove(role)
            if not roles:
                del self._holders[holder]

    def close(self) -> None:
        """Release it by origin: unmap (and unlock) what omrt mapped, drop the reference to what
        it imported. Refused while a session or model uses it, or numpy views of it are alive."""
        if self.closed:
            return
        users = [role for roles in self._holders.values() for role in roles]
        if users:
            raise BindError(f"{self!r} is in use ({', '.join(users)}); unbind it (or close the session or "
                            f"model) first")
        array, self._array = self._array, None
        del array
        if self._mapping is not None:
            try:
                self._mapping.close()
            except BufferError:
                self._array = self._recover()
                raise BindError(f"{self!r}: numpy views of it are still alive; drop them before closing "
                                f"it") from None
        self._closer()
        self._owner = None

    def _recover(self) -> np.ndarray:
        """The array over the mapping again, after a close that views prevented."""
        base = np.frombuffer(self._mapping, np.uint8)
        start = self.address - base.__array_interface__["data"][0]
        return base[start:start + self.nbytes]

    def _live(self) -> np.ndarray:
        if self._array is None:
            raise BindError(f"{self!r} is closed")
        return self._array

    def __enter__(self) -> "Memory":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("locked" if self.locked else self.kind)
        return f"<omrt.Memory {self.origin} {self.nbytes} bytes, {state}>"


def _map(fd: int | None, size: int, writable: bool, what: str, offset: int = 0) -> mmap.mmap:
    """An mmap of an fd (shared), or anonymous memory (private) when fd is None."""
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    try:
        if fd is None:
            return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=prot)
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot, offset=offset)
    except (OSError, ValueError) as e:
        raise AllocationError(f"{what}: cannot map {size} bytes{' writable' if writable else ''} "
                              f"({getattr(e, 'strerror', None) or e}); an fd must be mmap-able and opened for "
                              f"{'reading and writing' if writable else 'reading'}") from None


def _fd_size(fd: int) -> int:
    try:
        size = os.fstat(fd).st_size
        return size or os.lseek(fd, 0, os.SEEK_END)  # a dma-buf may report 0 to fstat
    except OSError as e:
        raise AllocationError(f"fd {fd} cannot be used as memory ({e.strerror}); pass an open fd") from None


def _release(mapping: mmap.mmap | None, fd: int | None) -> None:
    """Unmap (which unlocks) and close what a Memory owns, at close() or when it is collected (a
    mapping that arrays still use is unmapped when the last of them goes)."""
    if mapping is not None:
        with contextlib.suppress(BufferError):
            mapping.close()
    if fd is not None:
        os.close(fd)
