"""What runs into a resource limit? (for `TaskSpec.with_limits` tests)

| function | does | ends, under the limit |
|---|---|---|
| `hog(chunk_mib)` | allocates `chunk_mib` MiB at a time, keeping each | `MemoryError` (address-space limit) |
| `hoard()` | allocates until not even 16 bytes more fit, keeping it all in a module global (so raising frees nothing) | `MemoryError` (address-space limit), with no memory left to build its report |
| `hoard_locally()` | the same, keeping it in a local of its frame | `MemoryError`, whose report can be built once the frame's locals are let go |
| `spin()` | burns CPU in pure Python | SIGXCPU (CPU-time limit) |
| `open_all()` | opens `/dev/null` until it cannot, keeping each | `OSError` EMFILE (open-files limit) |
| `within(mib)` | allocates `mib` MiB once, returns `"fits"` | returns, when the limit leaves room |
| `resident_hog(chunk_mib)` | allocates and writes `chunk_mib` MiB at a time, keeping each | the OOM killer, in a memory cgroup with a limit (the pages are touched, so they count) |
| `touch(mib)` | writes `mib` MiB once and holds it for 30 s | a memory limit on the tree, when `mib` is over it |
| `children_touch(n, mib)` | starts `n` child processes that each write `mib` MiB and hold it, waits for them | a memory limit on the whole tree, when `n * mib` is over it (no single process is) |
| `write_fast(record)` | writes 16 MiB every 16 ms (1 GB/s), appending its resident MiB to `record` after each | a memory limit, late by what it writes between two looks of a watcher |
| `short_children(n, ms, hold)` | forks `n` children that each spin for `ms` milliseconds of their own CPU time, then sleep `hold` seconds; waits for them; `n` | a CPU-time limit on the whole tree, when `n * ms` is over it (no child uses a clock tick's worth) |
| `busy_children(n, seconds)` | starts `n` child processes that each spin for `seconds` of wall time, waits for them | `[their CPU seconds in all, the wall seconds]`: under `cpus=`, about `cpus * seconds` of CPU |
| `shared_pool(n, mib, seconds, own)` | writes `mib` MiB, then maps `time.sleep(seconds)` over a fork pool of `n` workers (each writes its own `mib` MiB first when `own`); `n` | a memory limit on the whole tree, when `own` and `(n + 1) * mib` is over it; not when the workers only share the parent's pages |
| `sleeping_threads(n)` | starts `n` threads that sleep 0.2 s, joins them, returns `n` | nothing under a resident-memory limit (an address-space limit refuses the threads' stacks) |
| `read_mapped(path, seconds)` | maps the file `path` read-only, reads every page of it, holds the mapping `seconds` s; the number of pages | nothing under a memory limit smaller than the file: its pages are the page cache's, which the kernel can drop (unless the file is on a tmpfs) |
| `shared_anonymous(mib, seconds)` | writes `mib` MiB of a shared anonymous mapping (shared memory, which nothing but swap can take back), holds it `seconds` s | a memory limit, when `mib` is over it |
| `rlimits()` | returns its `RLIMIT_AS` and `RLIMIT_NOFILE`, `{"as": [soft, hard], "nofile": [soft, hard]}` | nothing: what the limits were set to |
"""

from __future__ import annotations

from typing import NoReturn


def hog(chunk_mib: int = 16) -> NoReturn:
    """Allocate `chunk_mib` MiB at a time until the allocator refuses."""
    kept = []
    while True:
        kept.append(bytearray(chunk_mib * 2**20))


_hoard: list[bytearray] = []


def _fill(kept: list[bytearray]) -> None:
    """Append ever smaller pieces to `kept` until the allocator refuses even 16 bytes."""
    chunk = 16 * 2**20
    while chunk >= 16:
        try:
            while True:
                kept.append(bytearray(chunk))
        except MemoryError:
            chunk //= 4


def hoard() -> NoReturn:
    """Fill the address space, keeping it all in a module global, then raise."""
    _fill(_hoard)
    raise MemoryError


def hoard_locally() -> NoReturn:
    """Fill the address space, keeping it in a local (freed once this frame is), then raise."""
    kept: list[bytearray] = []
    _fill(kept)
    raise MemoryError


def resident_hog(chunk_mib: int = 8) -> NoReturn:
    """Allocate `chunk_mib` MiB at a time and write every page, until something kills us."""
    kept = []
    while True:
        kept.append(b"\x01" * (chunk_mib * 2**20))


def spin() -> NoReturn:
    """Burn CPU forever (pure Python: only the CPU-time limit or a kill ends it)."""
    x = 0
    while True:
        x += 1


def open_all() -> NoReturn:
    """Open `/dev/null` until no descriptor is left."""
    kept = []
    while True:
        kept.append(open("/dev/null"))  # noqa: SIM115 (kept open on purpose)


def within(mib: int) -> str:
    """Allocate `mib` MiB once; `"fits"`."""
    data = bytearray(mib * 2**20)
    return "fits" if len(data) == mib * 2**20 else "short"


def touch(mib: int) -> str:
    """Write `mib` MiB once and hold it for 30 s; "held" if nothing stopped us."""
    import time

    data = b"\x01" * (mib * 2**20)
    time.sleep(30)
    return "held" if data else "empty"


def children_touch(n: int, mib: int) -> int:
    """Start `n` children that each write `mib` MiB and hold it for 30 s; wait for them all."""
    import subprocess
    import sys

    code = f"import time; data = b'\\x01' * ({mib} * 2**20); time.sleep(30)"
    children = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
    return sum(child.wait() for child in children)


def busy_children(n: int, seconds: float) -> list[float]:
    """Start `n` children that each spin for `seconds` of wall time; their CPU time in all and
    the wall time it took."""
    import os
    import time

    began = time.monotonic()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                pass
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    times = os.times()
    return [times.children_user + times.children_system, time.monotonic() - began]


def rlimits() -> dict[str, list[int]]:
    """This process's address-space and open-files limits, each `[soft, hard]`."""
    import resource

    return {"as": list(resource.getrlimit(resource.RLIMIT_AS)), "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE))}


def _sleep_in_pool(seconds: float, own_mib: int) -> int:
    import time

    data = b"\x01" * (own_mib * 2**20)
    time.sleep(seconds)
    return 1 if len(data) >= 0 else 0


def shared_pool(n: int, mib: int, seconds: float, own: bool = False) -> int:
    """Write `mib` MiB, then run `n` workers of a fork pool (which share those pages, copy on
    write) for `seconds` each, all at once; each writes `mib` MiB of its own first when `own`."""
    import multiprocessing

    data = b"\x01" * (mib * 2**20)
    with multiprocessing.get_context("fork").Pool(n) as pool:
        done = sum(pool.starmap(_sleep_in_pool, [(seconds, mib if own else 0)] * n))
    return done if data else -1


def read_mapped(path: str, seconds: float) -> int:
    """Map the file `path` read-only, read a byte of every page, hold the mapping `seconds` s;
    the number of pages read."""
    import mmap
    import time

    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        offsets = range(0, len(mapped), mmap.PAGESIZE)
        for offset in offsets:
            mapped[offset]
        time.sleep(seconds)
    return len(offsets)


def shared_anonymous(mib: int, seconds: float) -> int:
    """Write `mib` MiB of a shared anonymous mapping and hold it `seconds` s; `mib`."""
    import mmap
    import time

    with mmap.mmap(-1, mib * 2**20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS) as mapped:
        for offset in range(0, len(mapped), mmap.PAGESIZE):
            mapped[offset] = 1
        time.sleep(seconds)
    return mib


def sleeping_threads(n: int) -> int:
    """Start `n` threads that each sleep 0.2 s, and join them: `n`."""
    import threading
    import time

    threads = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return n


def write_fast(record: str) -> NoReturn:
    """Write 16 MiB every 16 ms (about 1 GB/s), keeping it, and append this process's resident
    MiB (`/proc/self/statm`) to `record` after each."""
    import os
    import time

    kept = []
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(record, os.O_WRONLY | os.O_APPEND)
    while True:
        began = time.monotonic()
        kept.append(b"\x01" * (16 * 2**20))
        with open("/proc/self/statm", "rb") as statm:
            resident = int(statm.read().split()[1]) * page / 2**20
        os.write(fd, f"{resident:.1f}\n".encode())
        time.sleep(max(0.0, 0.016 - (time.monotonic() - began)))


def short_children(n: int, ms: float, hold: float) -> int:
    """Fork `n` children that each spin for `ms` ms of their own CPU time, then sleep `hold` s."""
    import os
    import time

    for _ in range(n):
        if os.fork() == 0:
            until = time.process_time() + ms / 1000
            while time.process_time() < until:
                pass
            time.sleep(hold)
            os._exit(0)
    for _ in range(n):
        os.wait()
    return n
