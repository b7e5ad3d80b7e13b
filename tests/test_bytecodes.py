"""The bytecode profile (benchmarks/bytecodes.py): case 1 counted, in every thread, the same
count each time, so the next person compares the runtime with raw pykka on any machine."""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def bytecodes(monkeypatch: pytest.MonkeyPatch) -> Any:
    """benchmarks.bytecodes, as ``python -m benchmarks.bytecodes`` finds it: from the checkout."""
    monkeypatch.syspath_prepend(str(ROOT))
    return importlib.import_module("benchmarks.bytecodes")


def _spin(rounds: int) -> int:
    total = 0
    for n in range(rounds):
        total += n
    return total


def _in_threads(rounds: int, threads: int = 1) -> None:
    workers = [threading.Thread(target=_spin, args=(rounds,)) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def _spun(counts: Any) -> int:
    return sum(count for (_, _, name), count in counts.items() if name == "_spin")


def test_work_in_threads_started_while_counting_is_counted_the_same_each_time(bytecodes: Any) -> None:
    short = _spun(bytecodes.count_bytecodes(lambda: _in_threads(1_000)))
    long = _spun(bytecodes.count_bytecodes(lambda: _in_threads(3_000)))
    again = _spun(bytecodes.count_bytecodes(lambda: _in_threads(3_000)))
    side_by_side = _spun(bytecodes.count_bytecodes(lambda: _in_threads(3_000, threads=4)))
    assert short > 0
    assert long == again  # a count, not a time: it does not move between runs
    assert 2.5 < long / short < 3.5  # the loop's body, three times as often
    assert side_by_side == 4 * long  # four threads at once: none of their counts lost


def test_counting_puts_back_the_trace_functions_it_found(bytecodes: Any) -> None:
    def debugger(frame: Any, event: str, arg: Any) -> None:
        return None

    before, before_in_threads = sys.gettrace(), threading.gettrace()
    sys.settrace(debugger)
    threading.settrace(debugger)
    try:
        bytecodes.count_bytecodes(lambda: _in_threads(10))
        assert sys.gettrace() is debugger and threading.gettrace() is debugger
    finally:
        sys.settrace(before)
        threading.settrace(before_in_threads)  # type: ignore[arg-type]


def test_the_page_compares_the_runtime_traced_and_not_with_raw_pykka_by_area(bytecodes: Any) -> None:
    counted = bytecodes.measure(requests=60, warm_up=20)
    assert list(counted) == list(bytecodes.VARIANTS)
    areas = {name: bytecodes.by_area(counts, 60) for name, counts in counted.items()}
    raw, untraced, traced, journaled = (areas[name] for name in bytecodes.VARIANTS)
    assert raw["tracing"] == 0 and untraced["tracing"] == 0 and traced["tracing"] > 0
    assert raw["kernel"] == 0 and untraced["kernel"] > 0  # raw pykka's hops run on pykka alone
    assert raw["substrate"] > untraced["substrate"]  # pykka's loop and queues
    # The journal's work, only where there is one (without, the sender's ledger is made once a run).
    assert journaled["journal"] > 100 and untraced["journal"] < 1
    assert all(variant["work"] > 0 for variant in areas.values())  # the handlers, counted in their threads
    text = bytecodes.page(counted, 60, quick=True)
    for name, variant in bytecodes.VARIANTS.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| {variant} |"))
        assert float(row.split("|")[2].replace(",", "")) == pytest.approx(sum(areas[name].values()), abs=1)
    assert text.count("| 1.00 |") == 1  # raw pykka, the baseline
