"""Where the benchmark cases spend their CPU: ``make profile`` (or ``python -m benchmarks.profile
[--case NAME ...] [--quick]``).

For each case it runs the very work the benchmark case runs (the functions of ``cases``) three
times, side by side, in a process of its own (bounded in time; a case that cannot run gets
its reason written instead):

1. unprofiled, for the CPU per delivery of the whole process (``time.process_time``);
2. unprofiled, with a thread sampling every thread's stack (``sys._current_frames``) every
   ~5 ms: the share of each runtime thread's samples spent waiting on a lock, a queue, a
   ``Condition`` or an SQLite commit, and where in our code that wait is;
3. under ``cProfile`` in EVERY thread (``threading.setprofile`` gives each new thread a
   profiler of its own, the main thread has one too; they are merged with ``pstats``),
   timed on each thread's own CPU clock, so a thread blocked on a lock costs nothing.

and writes ``benchmarks/results/profiles/<case>.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import linecache
import os
import pstats
import re
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "results" / "profiles"
VENV = str(REPO / ".venv")
STDLIB = sysconfig.get_paths()["stdlib"]

#: Case name -> (what the header says it is, the key of its runner below).
CASES: dict[str, str] = {
    "runtime+journal": "case 1's runtime with the SQLite journal (cases.runtime_offline, journal in a temp dir)",
    "runtime": "case 1's runtime without a journal (cases.runtime_offline)",
    "raw-pykka-same-work": "raw pykka doing the same work (cases.raw_pykka_same_work)",
    "loopback-http": "case 2's runtime side (cases._ours) against the fake LLM and fake Bot API, "
                     "each in its own process, 32 LLM calls in flight",
}

#: How long one case may take in its process, all three runs together.
CASE_TIMEOUT = {False: 300.0, True: 150.0}
SAMPLE_EVERY = 0.005


# ---------------------------------------------------------------- where a frame is


def where(filename: str) -> str:
    """A file named as a reader finds it: relative to the repo, site-packages/..., stdlib/..."""
    if "site-packages" in filename:
        return "site-packages/" + filename.split("site-packages/", 1)[1]
    if filename.startswith(STDLIB + os.sep):
        return "stdlib/" + filename[len(STDLIB) + 1:]
    if filename.startswith(str(REPO) + os.sep):
        return filename[len(str(REPO)) + 1:]
    return filename


def ours(filename: str) -> bool:
    """A file of the project itself (the rooms under the repo, benchmarks/ too), not the venv."""
    return filename.startswith(str(REPO) + os.sep) and not filename.startswith(VENV + os.sep)


def function_name(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    if filename == "~" and line == 0:  # a builtin: cProfile names it "<built-in method ...>"
        return name.replace("|", "\\|")
    return f"{where(filename)}:{line} {name}".replace("|", "\\|")


# ---------------------------------------------------------------- cProfile in every thread


def cpu_profile() -> cProfile.Profile:
    return cProfile.Profile(time.thread_time_ns, 1e-9)


def _empty() -> None:
    pass


def timer_cost() -> float:
    """Seconds the profiler adds to a function's own time per event (a call into it, or a
    return into it from a callee): the thread CPU clock is a system call here, and it is
    read at every event. Measured on an empty function; the median of five."""
    costs: list[float] = []
    for _ in range(5):
        profile = cpu_profile()
        profile.enable()
        for _ in range(20_000):
            _empty()
        profile.disable()
        raw: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        costs += [float(tt) / nc for (_, _, name), (_, nc, tt, _, _) in raw.items() if name == "_empty"]
    return sorted(costs)[len(costs) // 2]


def events(raw: dict[Any, Any]) -> Counter[Any]:
    """The profiler's events charged to each function: one per call of it and one per return
    into it from each call it made."""
    made: Counter[Any] = Counter()
    for _, (_, nc, _, _, callers) in raw.items():
        for caller, edge in callers.items():
            made[caller] += edge[1] if isinstance(edge, tuple) else edge
    return Counter({key: nc + made[key] for key, (_, nc, _, _, _) in raw.items()})


def corrected(raw: dict[Any, Any], per_event: Counter[Any], cost: float) -> dict[Any, float]:
    """Each function's own time less ``cost`` per profiler event charged to it."""
    return {key: max(0.0, tt - cost * per_event[key]) for key, (_, _, tt, _, _) in raw.items()}


@contextmanager
def profiled_everywhere() -> Iterator[list[cProfile.Profile]]:
    """A cProfile.Profile in this thread and in every thread started inside the block, each
    on its thread's own CPU clock (so waiting costs nothing); the list of them, to merge."""
    profiles: list[cProfile.Profile] = []
    active = True

    def new_profile() -> cProfile.Profile:
        profile = cpu_profile()
        profiles.append(profile)
        return profile

    def install(frame: FrameType, event: str, arg: Any) -> None:
        # The first event of a new thread: replace this hook with a profiler of its own.
        sys.setprofile(None)
        if active:
            new_profile().enable()

    main = new_profile()
    threading.setprofile(install)
    main.enable()
    try:
        yield profiles
    finally:
        main.disable()
        threading.setprofile(None)
        active = False


def merged(profiles: list[cProfile.Profile]) -> pstats.Stats | None:
    stats: pstats.Stats | None = None
    for profile in profiles:
        profile.create_stats()
        if not getattr(profile, "stats", None):
            continue
        if stats is None:
            stats = pstats.Stats(profile)
        else:
            stats.add(profile)
    return stats


# ---------------------------------------------------------------- sampling lock waits


_WAITS_IN = {"threading.py", "queue.py"}
_LOCK_LINE = re.compile(r"\.acquire\(|with\s+[\w.\[\]]*(lock|_cond|condition|mutex)\w*\s*[:,]", re.I)


def classify(frame: FrameType) -> str:
    """What the innermost Python frame of a thread is doing, as far as a sample can tell."""
    code = frame.f_code
    base = os.path.basename(code.co_filename)
    if base in _WAITS_IN:
        return f"{base[:-3]}.{code.co_name}"
    if base == "selectors.py" and code.co_name == "select":
        return "idle: selector"
    line = linecache.getline(code.co_filename, frame.f_lineno)
    if ".commit(" in line:
        return "sqlite commit"
    if _LOCK_LINE.search(line):
        return "lock acquire"
    return "running"


def nearest_ours(frame: FrameType | None) -> str:
    """The innermost frame in the project's code; else the innermost in site-packages."""
    library = None
    while frame is not None:
        filename = frame.f_code.co_filename
        named = f"{where(filename)}:{frame.f_lineno} {frame.f_code.co_name}"
        if ours(filename):
            return named
        if library is None and "site-packages" in filename:
            library = named
        frame = frame.f_back
    return library or "(no frame of ours)"


def thread_group(name: str) -> str:
    """pykka names a thread 'Class (urn:uuid:...)', the runtime 'name-3': one row per kind."""
    name = re.sub(r"\s*\(urn:[^)]*\)", "", name)
    return re.sub(r"[-_ ]\d+$", "", name)


@dataclass
class Samples:
    per_thread: Counter[str] = field(default_factory=Counter)
    kinds: Counter[tuple[str, str]] = field(default_factory=Counter)
    waits: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    rounds: int = 0


@contextmanager
def sampling(deadline: float) -> Iterator[Samples]:
    """Every thread's innermost frame every SAMPLE_EVERY s, until the block ends (or ``deadline``)."""
    samples, stop = Samples(), threading.Event()
    me, main = threading.get_ident(), threading.main_thread().ident
    names: dict[int, str] = {}

    def sample() -> None:
        sampler = threading.get_ident()
        while not stop.wait(SAMPLE_EVERY) and time.monotonic() < deadline:
            frames = sys._current_frames()
            if any(ident not in names for ident in frames):
                names.update({t.ident: thread_group(t.name) for t in threading.enumerate() if t.ident})
            samples.rounds += 1
            for ident, frame in frames.items():
                if ident in (sampler, me, main):
                    continue
                group = names.get(ident, f"thread {ident}")
                kind = classify(frame)
                where_ours = nearest_ours(frame) if kind != "running" else ""
                if kind == "threading.wait" and where_ours.startswith("actors/kernel/_mailbox.py:") \
                        and where_ours.endswith(" get"):
                    kind = "idle: mailbox"  # an actor waiting for its next letter
                samples.per_thread[group] += 1
                samples.kinds[group, kind] += 1
                if kind != "running" and not kind.startswith("idle"):
                    samples.waits[group, kind, where_ours] += 1

    thread = threading.Thread(target=sample, name="profile-sampler", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(5)


# ---------------------------------------------------------------- the cases


@dataclass
class Outcome:
    requests: int
    seconds: float
    cpu_us: float


Runner = Callable[[int], Outcome]


@contextmanager
def case_runner(case: str) -> Iterator[tuple[Runner, int]]:
    """The work of ``case`` for n requests, and its probe size (what servers it needs live
    for the whole block). Each run on one core, as the benchmarks run it (and a daemon)."""
    from benchmarks import cases
    from benchmarks.harness import on_one_core

    def outcome(run: Any) -> Outcome:
        return Outcome(run.requests, run.seconds, run.cpu_us)

    if case == "runtime+journal":
        def journaled(n: int) -> Outcome:
            with tempfile.TemporaryDirectory() as tmp:
                return outcome(cases.runtime_offline(n, journal_dir=Path(tmp)))
        yield on_one_core(journaled), 500
    elif case == "runtime":
        yield on_one_core(lambda n: outcome(cases.runtime_offline(n))), 500
    elif case == "raw-pykka-same-work":
        yield on_one_core(lambda n: outcome(cases.raw_pykka_same_work(n))), 500
    elif case == "loopback-http":
        llm, llm_port = cases._serve("autoresponse.testing.fake_llm")
        try:
            telegram, telegram_port = cases._serve("autoresponse.testing.fake_telegram")
        except BaseException:
            llm.kill()
            raise
        llm_url, telegram_url = f"http://127.0.0.1:{llm_port}/v1", f"http://127.0.0.1:{telegram_port}/bot"
        try:
            yield on_one_core(lambda n: outcome(cases._ours(n, 32, llm_url, telegram_url))), 200
        finally:
            for proc in (llm, telegram):
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    else:
        raise ValueError(f"no case {case}")


def profile_case(case: str, quick: bool) -> str:
    """The three runs of one case, as the markdown of its page."""
    load = os.getloadavg()[0]
    seconds = 0.6 if quick else 2.0
    deadline = time.monotonic() + CASE_TIMEOUT[quick] - 10
    with case_runner(case) as (run, probe):
        warm = run(probe)  # warm-up (imports, first-use allocations) and the rate
        requests = max(probe, min(50_000, int(warm.requests / warm.seconds * seconds)))
        cpu = time.process_time()
        plain = run(requests)
        plain_whole = time.process_time() - cpu  # startup and stop too, as the profiled run
        with sampling(deadline) as samples:
            sampled = run(requests)
        with profiled_everywhere() as profiles:
            started = time.perf_counter()
            profiled_run = run(requests)
            profiled_seconds = time.perf_counter() - started
    stats = merged(profiles)
    return page(case, quick, plain, sampled, profiled_run, profiled_seconds, len(profiles), stats, samples,
                timer_cost(), plain_whole, load)


def page(case: str, quick: bool, plain: Outcome, sampled: Outcome, profiled_run: Outcome,
         profiled_seconds: float, threads: int, stats: pstats.Stats | None, samples: Samples,
         measured_cost: float, plain_whole: float, load: float) -> str:
    from benchmarks.__main__ import machine

    lines = [
        f"# Profile: {case}",
        "",
        f"{CASES[case]}. Written by `make profile` (`python -m benchmarks.profile"
        f"{' --quick' if quick else ''} --case {case}`); not hand-edited.",
        "",
        f"- machine: {machine()}",
        f"- date: {time.strftime('%Y-%m-%d %H:%M')}{' (--quick)' if quick else ''}; load average before "
        f"the runs: {load:.2f} on {os.cpu_count()} cores (other work on the machine inflates CPU per delivery)",
        f"- requests: {plain.requests} per run",
        f"- unprofiled run: {plain.seconds:.2f} s, {plain.requests / plain.seconds:,.0f} deliveries/s, "
        f"**CPU {plain.cpu_us:.0f} µs per delivery** (whole process, `time.process_time`)",
        f"- sampled run (stacks every {SAMPLE_EVERY * 1000:.0f} ms): {sampled.seconds:.2f} s, "
        f"CPU {sampled.cpu_us:.0f} µs per delivery",
        f"- profiled run: {profiled_seconds:.2f} s (startup and stop included), CPU {profiled_run.cpu_us:.0f} µs "
        f"per delivery under the profiler, {threads} threads profiled",
        "",
    ]
    if stats is None:
        lines += ["The profiler saw nothing.", ""]
    else:
        raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
        per_event = events(raw)
        total_raw = sum(tt for _, _, tt, _, _ in raw.values())
        # One constant per event, fitted so that the corrected total is the CPU the same run
        # took unprofiled (what an empty function measures alone is too low under load).
        fitted = max(0.0, (total_raw - plain_whole) / max(1, sum(per_event.values())))
        cost = max(fitted, measured_cost)
        own = corrected(raw, per_event, cost)
        total = sum(own.values()) or 1.0
        top = sorted(own.items(), key=lambda item: item[1], reverse=True)[:15]
        lines += [
            f"## Top 15 functions by own time (all {threads} threads merged)",
            "",
            "Own time is each thread's CPU time (`time.thread_time_ns`: a thread blocked on a lock "
            "costs nothing), less the profiler's own overhead, taken as a constant per profiler event "
            "(one charged per call of a function, one per return into it from a call it made): "
            f"{measured_cost * 1e9:.0f} ns measured on an empty function, {fitted * 1e9:.0f} ns fitted so "
            f"that the corrected total equals the {plain_whole:.2f} s of CPU the same run took unprofiled "
            f"(startup and stop included); {cost * 1e9:.0f} ns used. Profiled total: {total_raw:.2f} s raw, "
            f"{total:.2f} s corrected ({1e6 * total / profiled_run.requests:.0f} µs per delivery). Functions "
            "called very often are the least certain. Cumulative seconds are raw.",
            "",
            "| rank | function | calls | own s | share of own time | cumulative s |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        for rank, (key, tt) in enumerate(top, 1):
            cc, nc, _, ct, _ = raw[key]
            calls = f"{nc}" if nc == cc else f"{nc}/{cc}"
            lines.append(f"| {rank} | `{function_name(key)}` | {calls} | {tt:.3f} | {100 * tt / total:.1f}% "
                         f"| {ct:.3f} |")
        lines.append("")
    lines += waits_section(samples)
    return "\n".join(lines) + "\n"


def waits_section(samples: Samples) -> list[str]:
    lines = [
        f"## Lock waits, sampled (wall clock, {samples.rounds} rounds of every thread's stack, unprofiled run)",
        "",
        "A sample counts as a wait when the thread's innermost Python frame is in threading.py or "
        "queue.py (Condition.wait, Event.wait, Queue.get), on a line that acquires a lock, or on an "
        "SQLite `.commit(`. A thread waiting for the GIL shows on the line it is at, so a wait on a "
        "`with lock:` line may be the GIL taken back after the lock. Share: of that thread's samples.",
        "",
    ]
    if not samples.per_thread:
        return lines + ["No samples.", ""]
    lines += ["| thread | samples | idle: mailbox empty | idle: in selector | waiting (locks, conditions, "
              "commit) | running |", "|---|---:|---:|---:|---:|---:|"]
    for group, count in samples.per_thread.most_common():
        kinds = {kind: n for (g, kind), n in samples.kinds.items() if g == group}
        mailbox, idle = kinds.get("idle: mailbox", 0), kinds.get("idle: selector", 0)
        running = kinds.get("running", 0)
        waiting = count - mailbox - idle - running
        lines.append(f"| {group} | {count} | {100 * mailbox / count:.0f}% | {100 * idle / count:.0f}% "
                     f"| {100 * waiting / count:.0f}% | {100 * running / count:.0f}% |")
    lines += ["", "Top 10 waits (not counting an actor idle on its empty mailbox or the loop idle in its "
              "selector):", "",
              "| rank | thread | waiting in | nearest frame of ours | share of the thread's samples |",
              "|---:|---|---|---|---:|"]
    waits = samples.waits.most_common(10)
    if not waits:
        lines.append("| | none seen | | | |")
    for rank, ((group, kind, frame), n) in enumerate(waits, 1):
        share = 100 * n / samples.per_thread[group]
        lines.append(f"| {rank} | {group} | {kind} | `{frame}` | {share:.1f}% |")
    return lines + [""]


def failure_page(case: str, quick: bool, reason: str) -> str:
    return (f"# Profile: {case}\n\n{CASES[case]}.\n\n- date: {time.strftime('%Y-%m-%d %H:%M')}"
            f"{' (--quick)' if quick else ''}\n\n**This case could not run:**\n\n```\n{reason.strip()}\n```\n")


# ---------------------------------------------------------------- entry points


def one(case: str, quick: bool) -> int:
    """In the case's own process: run it and write its page (or why it could not run)."""
    OUT.mkdir(parents=True, exist_ok=True)
    target = OUT / f"{case}.md"
    try:
        text = profile_case(case, quick)
    except BaseException as error:  # noqa: BLE001 -- SystemExit from a case's timeout too
        target.write_text(failure_page(case, quick, "".join(traceback.format_exception(error))[-3000:]))
        print(f"{case}: could not run ({type(error).__name__}: {error})", flush=True)
        return 1
    target.write_text(text)
    print(f"{case}: wrote {target.relative_to(REPO)}", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", default=[], metavar="NAME",
                        help=f"profile only this case (repeatable): {', '.join(CASES)}")
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process of one case
    args = parser.parse_args()
    if args.one:
        return one(args.one, args.quick)
    chosen = args.case or list(CASES)
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        parser.error(f"no case {', '.join(unknown)} (cases: {', '.join(CASES)})")
    failed = 0
    for case in chosen:
        print(f"{case}: profiling ...", flush=True)
        command = [sys.executable, "-m", "benchmarks.profile", "--one", case, *(["--quick"] if args.quick else [])]
        timeout = CASE_TIMEOUT[args.quick]
        # A session of its own: on a timeout the fake servers it started go with it.
        child = subprocess.Popen(command, cwd=REPO, start_new_session=True)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code, reason = -signal.SIGKILL, f"did not finish in {timeout:.0f} s (killed)"
        else:
            reason = f"the profiling process died with signal {-code}"
        failed += code != 0
        if code < 0:  # killed: the child could not write why
            OUT.mkdir(parents=True, exist_ok=True)
            (OUT / f"{case}.md").write_text(failure_page(case, args.quick, reason))
            print(f"{case}: {reason}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
