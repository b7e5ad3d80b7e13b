"""The process on one CPU core, for a daemon.

Under the GIL one thread runs Python at a time, so a second core adds little to what
the process gets done; what it adds is hand-offs between cores. Every delivery wakes
several threads in turn (its actors, the event loop, the journal's writer), and each
one woken on the other core waits for that core to wake and runs on cold caches. On
one core the same hand-off is a switch between threads that share warm caches. On a
2-core VM (interleaved runs), case 1 of the benchmarks without the journal did 1.1 to 1.7
times the deliveries a second on one core, and with the journal at a steady 1,578/s its
p99 was 6.5 to 23 ms against 10.7 to 59 ms on both cores.

The other cores stay free for what really runs beside the interpreter: a local model,
the commands the bot runs (started with every core, see ``starting_children``), other daemons.

>>> import subprocess
>>> core = run_on_one_core()   # as the daemon starts; every thread it starts inherits it
>>> with starting_children():  # a command started here may use every core
...     subprocess.run(["true"]).returncode
0
>>> run_on_all_cores()         # back as it was
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("autoresponse.runtime")

#: How long the cores' load is sampled to choose the least busy one.
CORE_SAMPLE_SECONDS = 0.05

#: The cores the process could run on before ``run_on_one_core``; None when it is not pinned.
_all_cores: frozenset[int] | None = None
#: The one core it runs on since (None: not pinned).
_core: int | None = None
#: Threads inside ``starting_children``, and how many windows each has open.
_starting: dict[int, int] = {}
_starting_lock = threading.Lock()


def supported() -> bool:
    """Whether this platform lets a process choose its cores (Linux does; macOS does not)."""
    return hasattr(os, "sched_setaffinity") and Path("/proc/self/task").is_dir()


def run_on_one_core(core: int | None = None) -> int | None:
    """Every thread of the process, and every one it starts from now on, on ``core``
    (None: the least busy of the cores it may use); the core, or None where the
    platform or a sandbox does not let it (nothing changes then, but a warning).
    ValueError for a core it may not use."""
    global _all_cores, _core
    if not supported():
        return None
    allowed = frozenset(os.sched_getaffinity(0)) if _all_cores is None else _all_cores
    if core is None:
        core = _least_busy(sorted(allowed))
    elif core not in allowed:
        raise ValueError(f"core {core} is not one this process may run on "
                         f"(it may use {', '.join(map(str, sorted(allowed)))})")
    try:
        _pin_every_thread(frozenset({core}))
    except OSError as exc:  # a sandbox that forbids it: the process runs on, as it was
        log.warning("cannot run on one core (%s); the threads stay on every core", exc)
        try:
            _pin_every_thread(allowed)
        except OSError:
            pass
        return None
    _all_cores, _core = allowed, core
    return core


def run_on_all_cores() -> None:
    """Undo ``run_on_one_core``: every thread may run on the cores it could before."""
    global _all_cores, _core
    if _all_cores is not None:
        _pin_every_thread(_all_cores)
        _all_cores = _core = None


def pinned_core() -> int | None:
    """The one core the process runs on, or None when it is not pinned."""
    return _core


@contextmanager
def starting_children() -> Iterator[None]:
    """While it lasts, the calling thread may use every core the process could, so a
    child process started in it inherits them all, not the daemon's one core (a command
    the bot runs). Windows may overlap on one thread (the event loop starting several
    commands at once): the thread is back on its one core when the last one ends."""
    if _all_cores is None:
        yield
        return
    tid = threading.get_native_id()
    with _starting_lock:
        _starting[tid] = _starting.get(tid, 0) + 1
        if _starting[tid] == 1:
            _set_thread(tid, _all_cores)
    try:
        yield
    finally:
        with _starting_lock:
            _starting[tid] -= 1
            if not _starting[tid]:
                del _starting[tid]
                if _core is not None:
                    _set_thread(tid, frozenset({_core}))


def _set_thread(tid: int, cores: frozenset[int]) -> None:
    try:
        os.sched_setaffinity(tid, cores)
    except OSError:  # a sandbox that will not: the child runs where the daemon does
        pass


def _pin_every_thread(cores: frozenset[int]) -> None:
    """Each thread listed now; twice over, for a thread started while the first pass ran
    (it inherits its creator's cores, pinned or not)."""
    done: set[int] = set()
    for _ in range(2):
        for tid in {int(name) for name in os.listdir("/proc/self/task")} - done:
            try:
                os.sched_setaffinity(tid, cores)
            except ProcessLookupError:
                pass  # it ended meanwhile
            done.add(tid)


def _busy_ticks() -> dict[int, int]:
    """Each core's busy clock ticks since boot (all but idle and iowait), from /proc/stat."""
    ticks: dict[int, int] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            values = [int(v) for v in fields]
            ticks[int(name[3:])] = sum(values) - values[3] - (values[4] if len(values) > 4 else 0)
    return ticks


def _least_busy(cores: list[int]) -> int:
    """The core of ``cores`` the rest of the machine used least just now; among cores
    as idle, one chosen by the process id, so daemons started together spread out."""
    try:
        before = _busy_ticks()
        time.sleep(CORE_SAMPLE_SECONDS)
        after = _busy_ticks()
    except (OSError, ValueError, IndexError):
        return cores[os.getpid() % len(cores)]
    load = {c: after.get(c, 0) - before.get(c, 0) for c in cores}
    idlest = min(load.values())
    candidates = [c for c in cores if load[c] <= idlest + 1]  # a tick is 10 ms: within one is a tie
    return candidates[os.getpid() % len(candidates)]
