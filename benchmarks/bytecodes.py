"""What case 1 does, counted instead of timed: Python bytecodes executed per delivery, in every
thread, for raw pykka doing the same work and for the runtime (``make profile``, or
``python -m benchmarks.bytecodes [--quick]``).

CPU time on a shared VM moves by a fifth between runs, and by four times between machines;
a count of the bytecodes each function executes does neither (runs agree within about 2%:
only how often a thread found its queue empty and slept differs), so it says what the
runtime adds to the same work wherever it runs.
It does not say what a bytecode costs: one may be an attribute read, another a call into C
(a lock, pydantic's validator, SQLite), and waits and wakes cost nothing here. It writes
``benchmarks/results/profiles/bytecodes.md``: the totals, the totals by area (the kernel,
its tracing, pykka and the standard library's threads and queues, the journal, the work
itself, the benchmark's driver), and the functions that execute the most::

    >>> from benchmarks.bytecodes import count_bytecodes
    >>> counts = count_bytecodes(lambda: sum(range(3)))
    >>> sum(counts.values()) > 0
    True
"""

from __future__ import annotations

import argparse
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
    # The envelope is the kernel's, as pykka's own is pykka's.
    ("kernel", "the kernel (actors/kernel/, the rest; messages/envelope.py)",
     ("actors/kernel/", "messages/envelope.py")),
    ("substrate", "pykka, and the standard library's threads and queues (raw pykka's substrate)",
     ("site-packages/pykka/", "stdlib/threading.py", "stdlib/queue.py", "stdlib/_weakrefset.py")),
    ("journal", "the journal (actors/journal/)", ("actors/journal/",)),
    ("driver", "the benchmark's driver (benchmarks/)", ("benchmarks/",)),
)
THE_WORK = "work"
WORK_LABEL = "the work: the actors' handlers, messages, prompts, extraction, pydantic, json"
LABELS = {key: label for key, label, _ in AREAS} | {THE_WORK: WORK_LABEL}
#: The benchmark's own actors' handlers (raw pykka's hops, the null sender): the work, not the driver.
HANDLERS = frozenset({("benchmarks/cases.py", "on_receive"), ("benchmarks/cases.py", "_complete"),
                      ("benchmarks/harness.py", "on_message")})

#: The functions listed, by the most any variant executes.
TOP = 30


def count_bytecodes(work: Callable[[], Any]) -> Counter[Function]:
    """The bytecodes ``work`` executes, by function, in this thread and in every thread
    started while it runs (``threading.settrace``): threads started before it are not
    counted, so ``work`` must start the ones it uses (each case's run starts its own)."""
    mine = threading.local()
    counters: list[Counter[Any]] = []  # one a thread, merged at the end: no increment lost
    made = threading.Lock()

    def entered(frame: FrameType, event: str, arg: Any) -> Any:
        counts = getattr(mine, "counts", None)
        if counts is None:
            counts = mine.counts = Counter()
            with made:
                counters.append(counts)
        code = frame.f_code
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False

        def counting(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[code] += 1
            return counting
        return counting

    before, before_in_threads = sys.gettrace(), threading.gettrace()  # a debugger's, say: put back after
    threading.settrace(entered)
    sys.settrace(entered)
    try:
        work()
    finally:
        sys.settrace(before)
        threading.settrace(before_in_threads)  # type: ignore[arg-type]  # None removes it, as for sys.settrace
    merged: Counter[Function] = Counter()
    for counter in counters:
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
    from benchmarks import cases

    with tempfile.TemporaryDirectory() as tmp:
        def journaled(n: int) -> Any:
            journal_dir = Path(tmp) / f"journal-{time.monotonic_ns()}"
            journal_dir.mkdir()
            return cases.runtime_offline(n, journal_dir)

        yield {
            "raw pykka, same work": cases.raw_pykka_same_work,
            "runtime, no trace": lambda n: cases.runtime_offline(n, trace=False),
            "runtime": cases.runtime_offline,
            "runtime + journal": journaled,
        }


def measure(requests: int, warm_up: int) -> dict[str, Counter[Function]]:
    """Each variant's count for ``requests`` deliveries, after a warm-up run of ``warm_up``
    (imports and first uses, not counted)."""
    counted: dict[str, Counter[Function]] = {}
    with _runners() as runners:
        for name, run in runners.items():
            run(warm_up)
            counted[name] = count_bytecodes(lambda run=run: run(requests))  # type: ignore[misc]
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
        "hand-edited. A count does not move with the machine's load or speed (runs agree within about "
        "2%); it does not weigh what a bytecode does (a call into C, a lock, SQLite), nor waits.",
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


def figures(requests: int, quick: bool, warm_up: int = 300) -> dict[str, Any]:
    """Count every variant, write the page, and return what the results file keeps: each
    variant's bytecodes a delivery, in all and by area (``python -m benchmarks --case bytecodes``)."""
    counted = measure(requests, warm_up)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bytecodes.md").write_text(page(counted, requests, quick))
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
    figures(500 if args.quick else 2_000, args.quick)
    print(f"bytecodes: wrote {(OUT / 'bytecodes.md').relative_to(REPO)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
