"""A plot per benchmark case, next to the results file (matplotlib, when installed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def draw(f: dict[str, Any], into: Path) -> list[Path]:
    """Every plot the results allow; the paths written (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    drawn = []
    for name, case, plot in (("in_process", "in_process", _in_process),
                             ("steady_load", "in_process", _steady_load),
                             ("loopback_http", "loopback_http", _loopback),
                             ("latency_bound", "latency_bound", _latency),
                             ("soak", "soak", _soak), ("cluster", "cluster", _cluster)):
        if case in f and (plot is not _steady_load or f[case].get("journaled_ladder")):
            fig, ax = plt.subplots(figsize=(7, 4.5))
            plot(ax, f[case])
            ax.grid(True, which="both", alpha=0.3)
            fig.tight_layout()
            path = into / f"{name}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            drawn.append(path)
    return drawn


def _bars(ax: Any, names: list[str], values: list[float], ylabel: str, title: str) -> None:
    ax.bar(names, values)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=10)


def _in_process(ax: Any, c: dict[str, Any]) -> None:
    runs = c["runs"]
    _bars(ax, list(runs), [r["per_second"] for r in runs.values()], "deliveries per second",
          "Case 1 and 5: in process, median of the runs")


def _steady_load(ax: Any, c: dict[str, Any]) -> None:
    ladder = c["journaled_ladder"]
    rates = [rung["per_second"] for rung in ladder]
    ax.plot(rates, [rung["p99_ms"] for rung in ladder], "o-", label="p99, ms")
    ax.plot(rates, [rung["p50_ms"] for rung in ladder], "s-", label="p50, ms")
    ax.axhline(c["p99_target_ms"], linestyle="--", color="gray", label="target for p99")
    ax.set_xlabel("deliveries offered per second, steady")
    ax.set_ylabel("ms from request to reply")
    busy = ax.twinx()
    busy.plot(rates, [100 * rung["core_busy"] for rung in ladder], ":", color="black", label="core busy, %")
    busy.set_ylabel("its one core busy, %")
    busy.set_ylim(0, 100)
    ax.set_title("Case 1 with the journal, at steady loads up to half the burst's peak")
    ax.legend(loc="upper left")
    busy.legend(loc="center left")


def _loopback(ax: Any, c: dict[str, Any]) -> None:
    runs = c["runs"]
    _bars(ax, list(runs), [r["per_second"] for r in runs.values()], "deliveries per second",
          f"Case 2: loopback HTTP, {c['concurrency']} in flight")


def _latency(ax: Any, c: dict[str, Any]) -> None:
    points = c["points"]
    chats = [p["chats"] for p in points]
    ax.plot(chats, [p["per_second"] for p in points], "o-", label="autoresponse")
    ax.plot(chats, [p["target"] for p in points], "--", label="target: 0.9 × min(chats, in flight) / latency")
    ax.plot(chats, [p["one_at_a_time"] for p in points], ":", label="one at a time")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("chats in parallel")
    ax.set_ylabel("deliveries per second")
    ax.set_title(f"Case 3: LLM latency {c['latency_s']} s, {c['max_in_flight']} calls in flight")
    ax.legend()


def _soak(ax: Any, c: dict[str, Any]) -> None:
    samples = c["samples"]
    done = [s["deliveries"] for s in samples]
    ax.plot(done, [s["rss_kib"] / 1024 for s in samples], "o-", label="RSS, MiB")
    ax.plot(done, [s["journal_kib"] / 1024 for s in samples], "s-", label="journal, MiB")
    ax.set_xlabel("deliveries")
    ax.set_title(f"Case 6: soak, journal retention {c['retention_s']:g} s")
    ax.legend()


def _cluster(ax: Any, c: dict[str, Any]) -> None:
    points = c["points"]
    workers = [p["workers"] for p in points]
    ax.plot(workers, [p["per_second"] for p in points], "o-", label="daemons on NATS JetStream")
    ax.plot(workers, [p["target"] for p in points], "--", label="target: 0.9 × daemons × in flight / latency")
    ax.axhline(c["sqlite"]["per_second"], linestyle=":", color="gray", label="one daemon on SQLite")
    ax.set_xticks(workers)
    ax.set_xlabel("daemons")
    ax.set_ylabel("deliveries per second")
    ax.set_title(f"Case 7: several daemons, LLM {c['latency_s']} s, {c['in_flight_per_worker']} in flight each")
    ax.legend()
