"""What case 1 does, counted instead of timed: Python bytecodes executed per delivery, in every
thread, for raw pykka doing the same work and for the runtime (``make profile``, or
``python -m benchmarks.bytecodes [--quick]``).

CPU time on a shared VM moves by a fifth between runs, and by four times between machines;
a count of the bytecodes each function executes barely moves (runs agree within about 2%:
only how often a thread found its queue empty and slept differs), so it says what the
runtime adds to the same work on any machine with the same Python and packages.
It does not say what a bytecode costs: one may be an attribute read, another a call into C
(a lock, pydantic's validator, SQLite), and waits and wakes cost nothing here. It writes
``benchmarks/results/profiles/bytecodes.md``: the totals, the totals by area (``AREAS``:
tracing, the substrate both sides run on, the driver, the kernel, the journal; the rest is
the handlers' work), and the functions that execute the most::

    >>> from benchmarks.bytecodes import count_bytecodes
    >>> counts = count_bytecodes(lambda: sum(range(3)))
    >>> sum(counts.values()) > 0
    True
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from benchmarks.profile import OUT, REPO, where

#: A function, as counted: its file as a reader finds it, its first line, its name.
Function = tuple[str, int, str]

#: The variants counted, in order: each one's key in the results file (the names case 1's
#: runs have), and what the page calls it. The first is the baseline.
VARIANTS: dict[str, str] = {
    "raw pykka, same work": "raw pykka doing the same work (cases.raw_pykka_same_work)",
    "runtime, no trace": "the runtime with `runtime.trace = false` (cases.runtime_offline, trace=False)",
    "runtime": "the runtime as a daemon runs by default, every hop traced (cases.runtime_offline)",
    "runtime + journal": "the same with the SQLite journal a daemon always has",
}

#: Areas, by where a function's file is (the first that matches; the rest is the work):
#: its key in the results file, what the page calls it, the files.
AREAS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("tracing", "tracing (actors/kernel/trace.py)", ("actors/kernel/trace.py",)),
    # What both sides run alike is the substrate: the event loop thread raw pykka borrows
    # from the kernel, and the futures the journal's commits resolve.
    ("substrate", "the substrate: pykka, the standard library's threads, queues and futures, the event loop's thread",
     ("site-packages/pykka/", "stdlib/threading.py", "stdlib/queue.py", "stdlib/_weakrefset.py",
      "stdlib/concurrent/", "actors/kernel/_loop.py")),
    # Both sides set up a run alike: their threads placed on one core, the collector tuned.
    ("driver", "the benchmark's driver and each run's setup (benchmarks/; threads placed, the collector tuned)",
     ("benchmarks/", "actors/kernel/cores.py", "actors/kernel/heap.py")),
    # The envelope is the kernel's, as pykka's own is pykka's.
    ("kernel", "the kernel (actors/kernel/, the rest; messages/envelope.py)",
     ("actors/kernel/", "messages/envelope.py")),
    ("journal", "the journal (actors/journal/; a sender's ledger is the sender's work)", ("actors/journal/",)),
)
THE_WORK = "work"
WORK_LABEL = "the work: the actors' handlers, and the messages, prompts, extraction, pydantic and json they use"
LABELS = {key: label for key, label, _ in AREAS} | {THE_WORK: WORK_LABEL}
#: The work, wherever its file is: the benchmark's own actors' handlers (raw pykka's hops, the
#: null sender), and the send ledger a sender keeps (in the journal's module; without a journal
#: it asks nothing of one).
HANDLERS = frozenset({("benchmarks/cases.py", "on_receive"), ("benchmarks/cases.py", "_complete"),
                      ("benchmarks/harness.py", "on_message"), ("actors/journal/journal.py", "_key"),
                      ("actors/journal/journal.py", "already_sent"), ("actors/journal/journal.py", "confirm")})

#: The functions listed, by the most any variant executes.
TOP = 30
#: How long the threads a count started may take to end once its work has returned.
THREADS_END_SECONDS = 10.0
#: Deliveries a variant, in a full run and in a quick one.
REQUESTS = {False: 2_000, True: 500}


def count_bytecodes(work: Callable[[], Any]) -> Counter[Function]:
    """The bytecodes ``work`` executes, by function, in this thread and in every thread
    started while it runs (``threading.settrace``), those waited for to end once it returns
    (up to ``THREADS_END_SECONDS``; what one does later is not counted). Threads started
    before it are not counted, so ``work`` must start the ones it uses (each case's run
    starts its own)."""
    this_thread = threading.local()
    counters: list[Counter[Any]] = []  # one a thread, merged at the end: no increment lost
    counters_lock = threading.Lock()
    over = False  # set once counting ends: a thread still running counts no more

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        counts = getattr(this_thread, "counts", None)
        if counts is None:
            counts = this_thread.counts = Counter()
            with counters_lock:
                counters.append(counts)
        code = frame.f_code
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False

        def counting(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode" and not over:
                counts[code] += 1
            return counting
        return counting

    running = set(threading.enumerate())
    before, before_in_threads = sys.gettrace(), threading.gettrace()  # a debugger's, say: put back after
    threading.settrace(on_call)
    sys.settrace(on_call)
    try:
        work()
    finally:
        sys.settrace(before)
        threading.settrace(before_in_threads)  # type: ignore[arg-type]  # None removes it, as for sys.settrace
        # An actor's thread ends a moment after its stop is answered: its last steps are the run's.
        until = time.monotonic() + THREADS_END_SECONDS
        for thread in set(threading.enumerate()) - running:
            thread.join(max(0.0, until - time.monotonic()))
        over = True
    with counters_lock:
        copies = [counter.copy() for counter in counters]  # a copy is one step: no thread can change it midway
    merged: Counter[Function] = Counter()
    for counter in copies:
        for code, count in counter.items():
            merged[(where(code.co_filename), code.co_firstlineno, code.co_name)] += count
    return merged


def area(function: Function) -> str:
    """The key of the area ``function`` is in (``AREAS``, or ``THE_WORK``)."""
    filename = function[0]
    if (filename, function[2]) in HANDLERS:
        return THE_WORK
    for key, _, prefixes in AREAS:
        if any(filename.startswith(prefix) for prefix in prefixes):
            return key
    return THE_WORK


def by_area(counts: Counter[Function], requests: int) -> dict[str, float]:
    """Bytecodes a delivery in each area, every area named."""
    areas = dict.fromkeys(LABELS, 0.0)
    for function, count in counts.items():
        areas[area(function)] += count / requests
    return areas


@contextmanager
def _runners() -> Iterator[dict[str, Callable[[int], Any]]]:
    """Case 1's variants, each on one core as case 1 runs them (and a daemon)."""
    from benchmarks import cases
    from benchmarks.harness import on_one_core

    with tempfile.TemporaryDirectory() as tmp:
        def journaled(n: int) -> Any:
            # A journal of its own each run, removed after the count (not ``cases._journaled``,
            # whose removal of its directory would be counted as the run's work).
            return cases.runtime_offline(n, Path(tempfile.mkdtemp(dir=tmp)))

        yield {name: on_one_core(run) for name, run in {
            "raw pykka, same work": cases.raw_pykka_same_work,
            "runtime, no trace": cases.runtime_untraced,
            "runtime": cases.runtime_offline,
            "runtime + journal": journaled,
        }.items()}


def measure(requests: int, warm_up: int) -> dict[str, Counter[Function]]:
    """Each variant's count for ``requests`` deliveries, after a warm-up run of ``warm_up``
    (imports and first uses, not counted)."""
    counted: dict[str, Counter[Function]] = {}
    with _runners() as runners:
        for name, run in runners.items():
            run(warm_up)
            counted[name] = count_bytecodes(functools.partial(run, requests))
    return counted


def page(counted: dict[str, Counter[Function]], requests: int, quick: bool) -> str:
    from benchmarks.__main__ import machine

    names = list(counted)
    per = {name: {f: c / requests for f, c in counts.items()} for name, counts in counted.items()}
    total = {name: sum(values.values()) for name, values in per.items()}
    areas = {name: by_area(counts, requests) for name, counts in counted.items()}
    base = total[names[0]]
    lines = [
        "# Profile: bytecodes a delivery",
        "",
        "Case 1's work counted instead of timed: the Python bytecodes each function executes, in every "
        "thread, per delivery. Written by `make profile` (`python -m benchmarks.bytecodes`); not "
        "hand-edited. The machine's load and speed barely move a count (runs agree within about 2%; "
        "Python's and the packages' versions do); it does not weigh what a bytecode does (a call into C, "
        "a lock, SQLite), nor waits. Each variant runs on one core, as case 1 does.",
        "",
        f"- machine: {machine()}",
        f"- date: {time.strftime('%Y-%m-%d %H:%M')}{' (--quick)' if quick else ''}",
        f"- requests: {requests:,} a variant, each after a warm-up run not counted",
        "",
        "| variant | bytecodes a delivery | × raw pykka |",
        "|---|---:|---:|",
    ]
    lines += [f"| {VARIANTS[name]} | {total[name]:,.0f} | {total[name] / base:.2f} |" for name in names]
    lines += ["", "## By area", "", "| area | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines += [f"| {label} | " + " | ".join(f"{areas[name][key]:,.0f}" for name in names) + " |"
              for key, label in LABELS.items()]
    lines += ["", f"## The {TOP} functions that execute the most (bytecodes a delivery)", "",
              "| function | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    functions = sorted({f for values in per.values() for f in values},
                       key=lambda f: max(per[name].get(f, 0.0) for name in names), reverse=True)
    for function in functions[:TOP]:
        label = f"`{function[0]}:{function[1]} {function[2]}`".replace("|", "\\|")
        lines.append(f"| {label} | " + " | ".join(f"{per[name].get(function, 0.0):,.0f}" for name in names) + " |")
    return "\n".join(lines) + "\n"


def page_path(quick: bool) -> Path:
    """Where the page goes: a quick count beside the full one's, never over it (the
    manual cites the full one)."""
    return OUT / ("bytecodes-quick.md" if quick else "bytecodes.md")


def figures(requests: int, quick: bool, warm_up: int = 300) -> dict[str, Any]:
    """Count every variant, write the page, and return what the results file keeps: each
    variant's bytecodes a delivery, in all and by area (``python -m benchmarks --case bytecodes``)."""
    counted = measure(requests, warm_up)
    OUT.mkdir(parents=True, exist_ok=True)
    page_path(quick).write_text(page(counted, requests, quick))
    return {
        "requests": requests,
        "per_delivery": {name: round(sum(counts.values()) / requests) for name, counts in counted.items()},
        "by_area": {name: {key: round(n) for key, n in by_area(counts, requests).items()}
                    for name, counts in counted.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    args = parser.parse_args()
    figures(REQUESTS[args.quick], args.quick)
    print(f"bytecodes: wrote {page_path(args.quick).relative_to(REPO)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
