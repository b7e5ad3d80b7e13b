"""The benchmark table, from the results file: for the terminal, and for the manual.

``python -m benchmarks.report`` rewrites the table of the manual's benchmarks page,
``docs/benchmarks.md`` (between its ``bench:start`` and ``bench:end`` markers), from
``benchmarks/results/latest.json``;
``make bench`` does it after every full run. Nothing in it is typed by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

#: The page that holds the table (the README links to it; it is the manual's benchmarks page).
README = Path(__file__).parent.parent / "docs" / "benchmarks.md"
RESULTS = Path(__file__).parent / "results" / "latest.json"
#: Where ``--quick`` saves its figures: a first look, never the manual's table.
QUICK_RESULTS = RESULTS.with_name("quick.json")
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def _floor(case: dict[str, Any]) -> str:
    """Bare pykka doing the same work at the same rate: the latency the machine allows."""
    raw = case.get("raw_same_work_offered_load")
    if raw is None:
        return ""
    return (f"; raw pykka doing the same work at the same rate, no journal: p50 {raw['p50_ms']} ms, "
            f"p99 {raw['p99_ms']} ms{_windows(raw)}")


def _windows(load: dict[str, Any]) -> str:
    """The p99 of each window, where several were measured (the median is shown)."""
    windows = load.get("p99_ms_windows")
    return f", the median of {len(windows)} windows: {' / '.join(map(str, windows))}" if windows else ""


def _warmed(load: dict[str, Any]) -> str:
    """What a window offered before the deliveries it counts (every window of the run)."""
    warm = load.get("warm_up_s")
    return f" (each window after {warm:g} s of it uncounted)" if warm else ""


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def rows(f: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(case, figure, target and verdict) for every case in the results."""
    out: list[tuple[str, str, str]] = []
    if "in_process" in f:
        c = f["in_process"]
        runs = c["runs"]
        ratio, cpu = c["runtime_vs_same_work"], c["cpu_us_per_delivery"]
        same_core, every = runs["raw pykka, same work, one core"], runs["runtime, every core"]
        out.append(("1. in process, offline engine: the runtime as a daemon runs by default (every hop of every "
                    "request traced) against raw pykka doing the same work (tracing none), both on one core",
                    f"{runs['runtime']['per_second']:,.0f} vs {same_core['per_second']:,.0f} deliveries/s: "
                    f"**{ratio:.2f}** (raw pykka left on every core: "
                    f"{runs['raw pykka, same work']['per_second']:,.0f}/s, "
                    f"{c['runtime_vs_same_work_every_core']:.2f})",
                    f"≥ 1.0: {_verdict(ratio >= 1.0)}"))
        untraced = c.get("untraced_vs_same_work",
                         runs["runtime, no trace"]["per_second"] / same_core["per_second"])
        out.append(("1. the same with `runtime.trace = false` (a daemon setting): no hop recorded, "
                    "as raw pykka records none",
                    f"{runs['runtime, no trace']['per_second']:,.0f} vs {same_core['per_second']:,.0f} deliveries/s: "
                    f"**{untraced:.2f}**",
                    f"≥ 1.0: {_verdict(untraced >= 1.0)}"))
        out.append(("1. what one core buys: the runtime left on every core",
                    f"{every['per_second']:,.0f}/s, {every['cpu_us_per_delivery']:.0f} µs of CPU per delivery: "
                    f"one core does **{c['one_core_vs_every_core']:.2f}×** its deliveries/s",
                    "(reported)"))
        out.append(("1. the same, against raw pykka passing tuples (the substrate's floor)",
                    f"{runs['raw pykka, tuples']['per_second']:,.0f}/s: **{c['runtime_vs_tuples']:.2f}**",
                    "(reported)"))
        journaled = c.get("journaled_cpu_us_per_delivery", runs["runtime + journal"]["cpu_us_per_delivery"])
        out.append(("1. CPU per delivery, whole process, with the journal a daemon always has",
                    f"**{journaled:.0f} µs** ({cpu:.0f} µs without it; raw pykka, same work: "
                    f"{same_core['cpu_us_per_delivery']:.0f} µs)",
                    f"≤ 200 µs: {_verdict(journaled <= 200)}"))
        load = c["offered_load"]
        with_journal = c.get("journaled_offered_load")
        target = c.get("p99_target_ms", 5.0)
        if with_journal is not None:
            out.append(("1. latency at a steady half of the peak, with the journal",
                        f"{with_journal['per_second']:,.0f}/s offered{_warmed(with_journal)}: "
                        f"p50 {with_journal['p50_ms']} ms, "
                        f"**p99 {with_journal['p99_ms']} ms**{_windows(with_journal)} (without it, at "
                        f"{load['per_second']:,.0f}/s: p99 {load['p99_ms']} ms{_windows(load)}){_floor(c)}",
                        f"p99 ≤ {target:g} ms: {_verdict(with_journal['p99_ms'] <= target)}"))
        else:
            out.append(("1. latency at a steady half of the peak (journal off)",
                        f"{load['per_second']:,.0f}/s offered: p50 {load['p50_ms']} ms, p99 {load['p99_ms']} ms",
                        "(reported)"))
        ladder = c.get("journaled_ladder")
        if ladder:
            within = c["journaled_rate_within_p99_target"]
            held = ("not even at a tenth of it" if within is None else
                    f"**up to {within:,.0f}/s**, {within / runs['runtime + journal']['per_second']:.0%} of it")
            out.append((f"1. with the journal, how far a steady load keeps p99 within {target:g} ms "
                        "(loads as shares of the burst's peak)",
                        f"{held}; at " + "; ".join(
                            f"{rung['of_peak']:.0%}: p99 {rung['p99_ms']} ms, {rung['cpu_us_per_delivery']:,.0f} µs"
                            f" a delivery, the core {rung['core_busy']:.0%} busy" for rung in ladder)
                        + f" (in the burst: {journaled:.0f} µs a delivery)",
                        "(reported)"))
        machine = c.get("machine_costs")
        if machine:
            out.append(("1. what this machine charges, on one core, whatever the code",
                        f"a round trip between two threads: {machine['round_trip_us']} µs of CPU; a wake from an "
                        f"idle core adds {machine['wake_from_idle_us']} µs; a slice of a delivery's work takes "
                        f"{machine['work_us']} µs back to back and **{machine['work_after_idle_us']} µs** after the "
                        f"core was idle for {machine['idle_ms']:g} ms ({machine['work_after_idle_us'] / machine['work_us']:.1f}×)",
                        "(reported)"))
        out.append(("5. case 1 with the journal on",
                    f"{runs['runtime + journal']['per_second']:,.0f}/s: **{c['journal_vs_none']:.2f}** of the figure without it",
                    "(reported)"))
        if "trace_cost" in c:
            cost = c["trace_cost"]
            out.append(("1. what tracing every hop of every request costs (on by default)",
                        f"{runs['runtime']['per_second']:,.0f} traced vs {runs['runtime, no trace']['per_second']:,.0f}/s "
                        f"untraced: **{cost:.1%}**",
                        f"≤ 10%: {_verdict(cost <= 0.10)}"))
    if "bytecodes" in f:
        c = f["bytecodes"]
        per, areas = c["per_delivery"], c["by_area"]
        raw, untraced = areas["raw pykka, same work"], areas["runtime, no trace"]
        kernel = (untraced["kernel"] + untraced["substrate"]) - (raw["kernel"] + raw["substrate"])
        base = per["raw pykka, same work"]
        out.append(("1. counted, not timed: Python bytecodes a delivery, every thread (a count the machine's "
                    "load and speed barely move)",
                    f"raw pykka doing the same work {base:,}; the runtime untraced "
                    f"{per['runtime, no trace']:,} (**{per['runtime, no trace'] / base:.2f}×**: its kernel "
                    f"{kernel:+,} over pykka's, the work of its handlers {untraced['work'] - raw['work']:+,} over "
                    f"the baseline's), traced {per['runtime']:,} (**{per['runtime'] / base:.2f}×**), with the "
                    f"journal {per['runtime + journal']:,}",
                    "(reported)"))
    if "loopback_http" in f:
        c = f["loopback_http"]
        runs = c["runs"]
        ratio = c["runtime_vs_ceiling"]
        out.append(("2. loopback HTTP: LLM client + Telegram sender (PTB on aiohttp), against plain aiohttp",
                    f"{runs['runtime']['per_second']:,.0f} vs {runs['plain aiohttp ceiling']['per_second']:,.0f}/s: "
                    f"**{ratio:.2f}** of the ceiling; a hand-written client on PTB's defaults: "
                    f"{runs['asyncio + PTB defaults']['per_second']:,.0f}/s",
                    f"≥ 0.5 (stretch 0.8): {_verdict(ratio >= 0.5)}"))
        out.append(("2. client CPU per delivery",
                    " / ".join(f"{name}: {r['client_cpu_ms_per_delivery']:.2f} ms" for name, r in runs.items()),
                    "(reported)"))
    if "latency_bound" in f:
        c = f["latency_bound"]
        points = c["points"]
        met = all(p["met"] for p in points)
        ordered = all(p["order_kept"] for p in points)
        figures = ", ".join(f"{p['per_second']:g}" for p in points)
        chats = ", ".join(str(p["chats"]) for p in points)
        out.append((f"3. LLM latency {c['latency_s']} s, {c['max_in_flight']} calls in flight, each chat in turn",
                    f"{figures}/s at {chats} chats; per-chat order {'kept' if ordered else 'NOT kept'}",
                    f"0.9 × min(chats, {c['max_in_flight']}) / latency: {_verdict(met)} at every level"
                    if met else f"0.9 × min(chats, {c['max_in_flight']}) / latency: **missed** at "
                    + ", ".join(f"{p['chats']} chats ({p['per_second']:g} < {p['target']:g})"
                                for p in points if not p["met"])))
    if "scale" in f:
        c = f["scale"]
        out.append((f"4. a real daemon, {c['chats']:,} Telegram chats each served once, then idle",
                    f"{c['threads']} threads, {c['kib_per_idle_chat']:.2f} KiB per idle chat",
                    f"≤ 64 threads, ≤ 4 KiB: {_verdict(c['threads_met'] and c['memory_met'])}"))
    if "soak" in f:
        c = f["soak"]
        first, last = c["samples"][0], c["samples"][-1]

        def spread(key: str) -> str:
            low, high = (g(s[key] for s in c["samples"]) for g in (min, max))
            return f"{(low - first[key]) / first[key]:+.0%} to {(high - first[key]) / first[key]:+.0%}"

        warm = c.get("warm_up")
        rate = c.get("offered_per_second")
        out.append((f"6. soak: {c['deliveries']:,} deliveries"
                    + (f" at a steady {rate:,.0f}/s ({rate / c['peak_per_second']:.0%} of the measured peak, "
                       f"{c['peak_per_second']:,.0f}/s)"
                       if rate else "")
                    + f", journal retention {c['retention_s']:g} s"
                    + (f", compaction every {c['compact_every_s']:g} s" if "compact_every_s" in c else "")
                    + (f", after a warm-up of {warm['seconds']:g} s ({warm['deliveries']:,} deliveries, "
                       f"{warm['seconds'] / c['retention_s']:.0f} × the retention)" if warm else ""),
                    f"RSS {first['rss_kib'] / 1024:.0f} → {last['rss_kib'] / 1024:.0f} MiB ({spread('rss_kib')}), "
                    f"journal {first['journal_kib'] / 1024:.1f} → {last['journal_kib'] / 1024:.1f} MiB "
                    f"({spread('journal_kib')}) over {last['deliveries']:,}"
                    + (f"; of which the write-ahead log {first['wal_kib'] / 1024:.1f} → {last['wal_kib'] / 1024:.1f} "
                       f"MiB ({spread('wal_kib')}), not bound to the retention; the database holds the window, "
                       f"rate × (retention + compaction interval) = {c['window_deliveries']:,} deliveries"
                       if "wal_kib" in first else ""),
                    f"within ±10% of the first sample: {_verdict(c['rss_flat'] and c['journal_flat'])}"))
    if "cluster" in f:
        c = f["cluster"]
        single = c["sqlite"]
        for p in c["points"]:
            out.append((f"7. {p['workers']} daemon{'s' if p['workers'] > 1 else ''} on NATS JetStream, LLM "
                        f"{c['latency_s']} s, {c['in_flight_per_worker']} calls in flight each",
                        f"**{p['per_second']:g}/s**; CPU per delivery: daemons {p['daemon_cpu_ms_per_delivery']:.1f} ms, "
                        f"nats-server {p['nats_cpu_ms_per_delivery']:.1f} ms",
                        f"≥ 0.9 × {p['workers']} × {c['in_flight_per_worker']} / {c['latency_s']} s = "
                        f"{p['target']:g}/s: {_verdict(p['met'])}"))
        out.append(("7. one daemon on SQLite, the same load",
                    f"{single['per_second']:g}/s, {single['daemon_cpu_ms_per_delivery']:.1f} ms CPU per delivery; "
                    f"the JetStream round trips cost **{c['round_trip_cpu_ms']:.1f} ms** of CPU per delivery more "
                    f"(daemon and server, on {c['cores']} cores)",
                    "(reported)"))
    if "reask_rate" in f:
        c = f["reask_rate"]
        out.append((f"8. LLM calls per delivered reply, a stand-in that errs on {c['mistakes']:.0%} of turns",
                    " / ".join(f"{mode}: **{c[mode]['calls_per_reply']:.2f}** ({c[mode]['calls']} calls, "
                               f"{c[mode]['replies']} replies, {c[mode]['dead_letters']} dead letters)"
                               for mode in ("text", "tools")),
                    f"≤ 1 + {c['mistakes']:g} (one re-ask per mistake): "
                    + _verdict(all(c[m]["calls_per_reply"] <= 1 + c["mistakes"] * 1.3 for m in ("text", "tools")))))
    if "local_model" in f:
        c = f["local_model"]
        if "skipped" in c:
            out.append(("9. a real model on llama.cpp's server", c["skipped"], "(not run)"))
        else:
            out.append((f"9. a real model ({c['model']}) on llama.cpp's server, {c['questions']} chats at once, "
                        f"against aiohttp sending the same requests straight to it",
                        f"{c['answered']}/{c['asked']} answered, {c['per_second']:.3f} replies/s "
                        f"({c['seconds_per_reply_p50']:.1f} s a reply, {c.get('http_calls_per_reply', 0):.2f} "
                        f"requests); the model wrote {c['tokens_per_second']:.1f} tokens/s through the runtime, "
                        f"{c['baseline_tokens_per_second']:.1f} straight; the runtime's share of a reply's time: "
                        f"**{c['runtime_share_overall']:.2%}** (p50 {c['runtime_share_p50']:.2%}, "
                        f"max {c['runtime_share_max']:.2%})",
                        f"< 5%: {_verdict(c['met'])}"))
            if "chat_prompt" in c:
                sizes = c["chat_prompt"]
                out.append(("9. one chat turn's prompt (Telegram, terminal and reminder actions), tokens "
                            "as llama-server counts them",
                            " / ".join(f"{mode}: **{sizes[mode]['prompt_tokens']}**"
                                       + (f" + {sizes[mode]['schema_chars_beside']:,} characters of schema "
                                          "beside it" if sizes[mode]["schema_chars_beside"] else "")
                                       for mode in ("text", "json_schema", "tools")),
                            "(reported; this model's template drops tools)"
                            if c.get("supports_tools") is False else "(reported)"))
    return out


def table(f: dict[str, Any]) -> Table:
    view = Table(title=f"delivery throughput ({f['machine']}, {f['date']})")
    for column in ("case", "figure", "target"):
        view.add_column(column)
    for case, figure, target in rows(f):
        view.add_row(case, figure.replace("**", ""), target.replace("**", ""))
    return view


def markdown(f: dict[str, Any]) -> str:
    lines = [f"Measured on {f['machine']}, {f['date']} (`make bench`, {f['seconds'] / 60:.0f} minutes):", "",
             "| case | figure | target |", "|---|---|---|"]
    lines += [f"| {case} | {figure} | {target} |" for case, figure, target in rows(f)]
    # A case run on its own (``--case``) since carries its own date, and machine.
    alone = [(key, c) for key, c in f.items() if isinstance(c, dict) and "date" in c
             and (c["date"], c.get("machine", f["machine"])) != (f["date"], f["machine"])]
    if alone:
        lines += ["", "Run on their own since: " + "; ".join(
            f"{key.replace('_', ' ')} on {c['date']}" + (f", {c['machine']}" if c.get("machine", f["machine"])
                                                         != f["machine"] else "")
            for key, c in alone) + "."]
    return "\n".join(lines)


def quick_cases(f: dict[str, Any]) -> list[str]:
    """The cases of ``f`` measured with ``--quick`` (the whole run's, when it was one)."""
    if f.get("quick"):
        return ["every case"]
    return [key for key, case in f.items() if isinstance(case, dict) and case.get("quick")]


def update_readme(f: dict[str, Any], readme: Path = README) -> None:
    """Rewrite the table of ``readme`` from the figures ``f``; figures of short runs
    (``--quick``) are refused, so that none can reach the manual."""
    if quick := quick_cases(f):
        raise ValueError(f"quick figures ({', '.join(quick)}) are a first look, not the manual's table: "
                         "run `make bench` for it")
    text = readme.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{markdown(f)}\n{END}{tail}")


if __name__ == "__main__":
    try:
        update_readme(json.loads(RESULTS.read_text()))
    except ValueError as error:
        raise SystemExit(f"{RESULTS}: {error}") from None
    print(f"{README} updated from {RESULTS}")
