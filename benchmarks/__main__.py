"""Delivery-throughput benchmarks: ``make bench`` (or ``python -m benchmarks [--quick]``).

Runs every case (see ``cases``), shows a progress bar, prints a table, saves the
figures to ``benchmarks/results/latest.json``, draws a plot per case next to it,
and rewrites the manual's benchmark table (``docs/benchmarks.md``) from the JSON
(``report``). ``--quick`` saves to ``benchmarks/results/quick.json`` instead, and
touches neither the figures of full runs, nor their plots and pages, nor the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from benchmarks import bytecodes, cases, local_model, plots, reask, report

RESULTS = Path(__file__).parent / "results"


def machine() -> str:
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.machine()}, {os.cpu_count()} cores, {model}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"short runs, for a first look: saved to {report.QUICK_RESULTS.name}, never to the table")
    parser.add_argument("--case", action="append", default=[], metavar="NAME",
                        help="run only this case (repeatable; e.g. local-model); its figures are merged into "
                             "the results file, and the manual's table is left as it is")
    parser.add_argument("--list", action="store_true", help="name the cases and exit")
    args = parser.parse_args()
    quick = args.quick
    steps: list[tuple[str, str, Callable[[], Any]]] = [
        ("in_process", "1 and 5: in process, raw pykka, journal",
         lambda: cases.in_process(1 if quick else 3, seconds=0.5 if quick else 2.0)),
        ("bytecodes", "1, counted: bytecodes a delivery",
         lambda: bytecodes.figures(bytecodes.REQUESTS[quick], quick)),
        ("loopback_http", "2: loopback HTTP",
         lambda: cases.loopback_http(32, 1 if quick else 3, seconds=0.5 if quick else 2.0)),
        ("latency_bound", "3: bound by LLM latency",
         lambda: cases.latency_bound([1, 4, 16, 64] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256],
                                     latency=0.5, max_in_flight=64)),
        ("scale", "4: scale, on the real daemon",
         lambda: cases.daemon_scale(1_000 if quick else 10_000)),
        ("soak", "6: soak",
         lambda: cases.soak(20_000 if quick else 200_000, every=2_000 if quick else 20_000)),
        ("reask_rate", "8: re-asks per reply, text and tools",
         lambda: reask.reask_rate(100 if quick else 500)),
        ("cluster", "7: several daemons on NATS JetStream",
         lambda: cases.cluster([1, 2, 3], latency=0.5, in_flight=12,
                               updates_per_worker=100 if quick else 400)),
        ("local_model", "9: a real model on llama.cpp's server, against aiohttp straight to it",
         lambda: local_model.local_model(rounds=1 if quick else 3)),
    ]
    if args.list:
        for key, title, _ in steps:
            print(f"{key.replace('_', '-'):15} {title}")
        return
    chosen = {name.replace("-", "_") for name in args.case}
    unknown = chosen - {key for key, _, _ in steps}
    if unknown:
        parser.error(f"no case {', '.join(sorted(unknown))} (--list names them)")
    if chosen:
        steps = [step for step in steps if step[0] in chosen]
    console = Console()
    console.print(f"machine: {machine()}")
    started = time.time()
    figures: dict[str, Any] = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "quick": quick}
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), TimeElapsedColumn())
    # Redrawn between cases only: a bar refreshed by its own thread took the GIL from the
    # cases ten times a second, and its CPU counted in theirs (case 1 read 30% higher).
    with Progress(*columns, console=console, auto_refresh=False) as progress:
        task = progress.add_task("benchmarks", total=len(steps))
        for key, title, run in steps:
            progress.update(task, description=f"case {title}", refresh=True)
            figures[key] = run()
            progress.advance(task)
            progress.refresh()
    figures["seconds"] = round(time.time() - started, 1)

    RESULTS.mkdir(exist_ok=True)
    saved = report.QUICK_RESULTS if quick else report.RESULTS
    if chosen:  # a case or two: into the last full run's figures, each with its own date
        for key, _, _ in steps:
            figures[key] = {**figures[key], "date": figures["date"], "machine": figures["machine"], "quick": quick}
        earlier = json.loads(saved.read_text()) if saved.exists() else {}
        figures = {**earlier, **{key: figures[key] for key, _, _ in steps}}
        figures.setdefault("machine", machine())
        figures.setdefault("date", time.strftime("%Y-%m-%d %H:%M"))
        figures.setdefault("seconds", 0.0)
    saved.write_text(json.dumps(figures, indent=2))
    drawn = [] if quick else plots.draw(figures, RESULTS)  # a full run's plots stay its own
    console.print(report.table(figures))
    console.print(f"saved {saved}" + (f" and {len(drawn)} plots" if drawn else ""))
    if not quick and not chosen:
        report.update_readme(figures)
        console.print(f"the benchmark table of {report.README.name} regenerated from the results")


if __name__ == "__main__":
    main()
