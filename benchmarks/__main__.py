"""Delivery-throughput benchmarks: ``make bench`` (or ``python -m benchmarks [--quick]``).

Prints a table, saves the figures to benchmarks/results/latest.json and a plot of
throughput against concurrency to benchmarks/results/latency_bound.png.

1. in process: the runtime (offline engine, null sender) against raw pykka with
   the same hops carrying tuples;                        target >= 0.5
3. bound by LLM latency: a fake LLM taking 0.5 s, 1..256 chats in parallel,
   against a one-at-a-time queue;   target >= 0.9 x min(chats, in flight) / latency
4. scale: 10,000 chats, each active once, then idle;  target <= 64 threads, <= 4 KiB/chat
5. the journal: case 1 with the journal on and off.

2. loopback HTTP: the LLM client and the Telegram sender against the fake LLM and
   the fake Bot API, each in its own process, next to a hand-written asyncio
   client making the same two calls with the same concurrency;  target >= 0.9
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.cases import in_process, latency_bound, loopback_http, scale_in_fresh_process

RESULTS = Path(__file__).parent / "results"


def machine() -> str:
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.machine()}, {os.cpu_count()} cores {model}, Python {platform.python_version()}"


def plot(latency: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    points = latency["points"]
    chats = [p["chats"] for p in points]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(chats, [p["per_second"] for p in points], "o-", label="autoresponse")
    ax.plot(chats, [p["target"] for p in points], "--", label="target: 0.9 × min(chats, in flight) / latency")
    ax.plot(chats, [p["one_at_a_time"] for p in points], ":", label="one at a time")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("chats in parallel")
    ax.set_ylabel("deliveries per second")
    ax.set_title(f"Deliveries/s, LLM latency {latency['latency_s']} s, "
                 f"{latency['max_in_flight']} LLM calls in flight")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller runs, for a first look")
    args = parser.parse_args()
    requests, repeats = (1_000, 1) if args.quick else (5_000, 3)
    levels = [1, 4, 16, 64] if args.quick else [1, 2, 4, 8, 16, 32, 64, 128, 256]
    chats = 2_000 if args.quick else 10_000

    console = Console()
    console.print(f"machine: {machine()}")
    started = time.time()
    with console.status("case 1 and 5: in process, raw pykka, journal"):
        inproc = in_process(requests, repeats)
    with console.status("case 2: loopback HTTP"):
        loopback = loopback_http(500 if args.quick else 2_000, concurrency=32, repeats=1 if args.quick else 3)
    with console.status("case 3: bound by LLM latency"):
        latency = latency_bound(levels, latency=0.5, max_in_flight=64)
    with console.status("case 4: scale"):
        scaled = scale_in_fresh_process(chats)

    table = Table(title="delivery throughput")
    for column in ("case", "deliveries/s", "p50 ms", "p99 ms", "ratio / target"):
        table.add_column(column, justify="right" if column != "case" else "left")
    runs = inproc["runs"]
    table.add_row("1 raw pykka, same hops", f"{runs['raw pykka']['per_second']:.0f}",
                  f"{runs['raw pykka']['p50_ms']}", f"{runs['raw pykka']['p99_ms']}", "baseline")
    ratio = inproc["runtime_vs_raw"]
    table.add_row("1 runtime, offline engine", f"{runs['runtime']['per_second']:.0f}",
                  f"{runs['runtime']['p50_ms']}", f"{runs['runtime']['p99_ms']}",
                  f"{ratio:.2f} (target 0.5: {'met' if ratio >= 0.5 else 'MISSED'})")
    table.add_row("5 runtime + journal", f"{runs['runtime + journal']['per_second']:.0f}",
                  f"{runs['runtime + journal']['p50_ms']}", f"{runs['runtime + journal']['p99_ms']}",
                  f"{inproc['journal_vs_none']:.2f} of no journal")
    table.add_row("2 asyncio baseline, HTTP", f"{loopback['baseline_per_second']:.0f}", "", "", "baseline")
    http_ratio = loopback["runtime_vs_baseline"]
    table.add_row("2 runtime, HTTP LLM + PTB", f"{loopback['runtime_per_second']:.0f}", "", "",
                  f"{http_ratio:.2f} (target 0.9: {'met' if http_ratio >= 0.9 else 'MISSED'})")
    for point in latency["points"]:
        table.add_row(f"3 {point['chats']} chats, LLM 0.5 s", f"{point['per_second']:.1f}",
                      f"{point['p50_ms']:.0f}", f"{point['p99_ms']:.0f}",
                      f"target {point['target']:.1f}: {'met' if point['met'] else 'MISSED'}"
                      + ("" if point["order_kept"] else ", ORDER NOT KEPT"))
    table.add_row(f"4 {scaled['chats']} idle chats", "", "", "",
                  f"{scaled['threads']} threads, {scaled['kib_per_idle_chat']} KiB/chat "
                  f"({'met' if scaled['threads_met'] and scaled['memory_met'] else 'MISSED'})")
    console.print(table)

    RESULTS.mkdir(exist_ok=True)
    figures = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "quick": args.quick,
               "seconds": round(time.time() - started, 1), "in_process": inproc, "loopback_http": loopback,
               "latency_bound": latency, "scale": scaled}
    (RESULTS / "latest.json").write_text(json.dumps(figures, indent=2))
    drawn = plot(latency, RESULTS / "latency_bound.png")
    console.print(f"saved {RESULTS / 'latest.json'}" + (f" and {RESULTS / 'latency_bound.png'}" if drawn else ""))


if __name__ == "__main__":
    main()
