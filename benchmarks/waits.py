"""What a delivery waits on: case 1's pipeline at a steady half of its peak, each
delivery's time split by where it went, from the runtime's own traces.

``python -m benchmarks.waits`` writes ``benchmarks/results/waits.md``:
for each hop, its wait in the mailbox (queued → its thread took it) and its handling;
between hops, the LLM call's round trip through the event loop; with the journal, the
group commit before a request is handed to the LLM client. Beside it, bare pykka doing
the same work at the same rate (case 1's baseline): the wake-ups this machine allows.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from autoresponse.actors.journal import SqliteJournal
from autoresponse.actors.kernel import run_on_one_core
from autoresponse.actors.llm import OfflineEngine
from autoresponse.actors.routes import LLM
from benchmarks import cases
from benchmarks.__main__ import machine
from benchmarks.harness import Tally, pace, pipeline, request

RESULTS = Path(__file__).parent / "results"

#: Each stage of a delivery: its name, and how to read it off the hops of one trace
#: (keyed by actor and message type) and the time it was accepted.
_STAGES: list[tuple[str, Any]] = [
    ("journal: accepted → handed to the LLM client (the group commit)",
     lambda h, t0: h["llm UserRequest"]["queued"] - t0),
    ("LLM client: the request waits in its mailbox", lambda h, t0: _waited(h["llm UserRequest"])),
    ("LLM client: handles the request (prompt, hand-off to the loop)", lambda h, t0: _ran(h["llm UserRequest"])),
    ("event loop: the engine's answer, until the LLM client's thread takes it",
     lambda h, t0: h["llm LLMReply"]["queued"] - h["llm UserRequest"]["ended"]),
    ("LLM client: the reply waits, then is handled",
     lambda h, t0: h["llm LLMReply"]["ended"] - h["llm LLMReply"]["queued"]),
    ("dispatcher: the reply waits in its mailbox", lambda h, t0: _waited(h["dispatcher LLMReply"])),
    ("dispatcher: handles it (extraction, checks, the message)", lambda h, t0: _ran(h["dispatcher LLMReply"])),
    ("sender: the message waits in its mailbox", lambda h, t0: _waited(h["sender.console OutboundMessage"])),
    ("sender: handles it", lambda h, t0: _ran(h["sender.console OutboundMessage"])),
    ("the whole delivery: accepted → the sender is done",
     lambda h, t0: h["sender.console OutboundMessage"]["ended"] - t0),
]


def _waited(hop: dict[str, Any]) -> float:
    return hop["started"] - hop["queued"]


def _ran(hop: dict[str, Any]) -> float:
    return hop["ended"] - hop["started"]


def _percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)
    return at(0.5), at(0.99)


def stages(rate: float, seconds: float, journal: SqliteJournal | None) -> dict[str, tuple[float, float]]:
    """Run the pipeline at ``rate`` for ``seconds``; p50 and p99 (ms) of each stage."""
    count = int(rate * seconds)
    tally = Tally(expected=count)
    runtime = pipeline(OfflineEngine(), tally, journal)
    accepted: dict[str, float] = {}
    try:
        started = time.perf_counter()
        for n in range(count):
            pace(started + n / rate)
            correlation = f"waits-{n}"
            accepted[correlation] = time.time()  # the traces' clock
            if journal is not None:
                runtime.accept(LLM, request(n, 1), correlation_id=correlation)
            else:
                runtime.send(LLM, request(n, 1), correlation_id=correlation)
        if not tally.done.wait(60):
            raise SystemExit(f"only {tally.count} of {count} answered")
        assert runtime.tracer is not None
        measured: dict[str, list[float]] = {name: [] for name, _ in _STAGES}
        for correlation in runtime.tracer.correlations():  # the newest ones kept (limits.TRACES_KEPT)
            hops = {f"{h['actor']} {h['type']}": h for h in runtime.tracer.trace(correlation)}
            if correlation not in accepted or len(hops) < 4:
                continue
            for name, read in _STAGES:
                if journal is None and name.startswith("journal"):
                    continue
                measured[name].append(read(hops, accepted[correlation]))
        return {name: _percentiles(values) for name, values in measured.items() if values}
    finally:
        runtime.stop(drain=5)


def raw_floor(rate: float, seconds: float) -> tuple[float, float]:
    run = cases.raw_pykka_same_work(int(rate * seconds), rate)
    return round(run.percentile(0.5) * 1000, 2), round(run.percentile(0.99) * 1000, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each run offers load")
    args = parser.parse_args()
    run_on_one_core()  # as a daemon runs, and case 1
    with tempfile.TemporaryDirectory() as tmp:
        journal = SqliteJournal(Path(tmp) / "journal.sqlite3")
        try:
            peak = cases._journaled(cases.sized(cases._journaled, seconds=2.0)).rate  # noqa: SLF001
            rate = round(peak * 0.5)
            with_journal = stages(rate, args.seconds, journal)
        finally:
            journal.close()
    without = stages(rate, args.seconds, None)
    floor = raw_floor(rate, args.seconds)
    lines = [
        "# What a delivery waits on",
        "",
        "Case 1's pipeline (offline engine, a sender that sends nothing; every thread on one core, "
        "as a daemon runs) offered a steady half of its peak with the journal, each delivery's time split by where it went, from the runtime's own "
        "traces (the last deliveries of the run, as many as the runtime keeps). Written by "
        "`python -m benchmarks.waits`; not hand-edited.",
        "",
        f"- machine: {machine()}",
        f"- date: {datetime.now():%Y-%m-%d %H:%M}; load average before the runs: {os.getloadavg()[0]:.2f}",
        f"- offered: {rate:,}/s for {args.seconds:g} s, with the journal and without it (half the journaled "
        f"peak just measured, {peak:,.0f}/s)",
        f"- raw pykka doing the same work at the same rate, no journal: p50 {floor[0]} ms, p99 {floor[1]} ms",
        "",
        "| stage | with the journal: p50 ms | p99 ms | without it: p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, _ in _STAGES:
        a = with_journal.get(name, ("–", "–"))
        b = without.get(name, ("–", "–"))
        lines.append(f"| {name} | {a[0]} | {a[1]} | {b[0]} | {b[1]} |")
    lines += ["", "A wait in a mailbox is the time its thread takes to wake and take the GIL from the "
              "others; the stages' p99s do not add up to the whole one's (they fall on different deliveries)."]
    (RESULTS / "waits.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
