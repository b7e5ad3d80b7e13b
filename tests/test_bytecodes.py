"""The bytecode profile (benchmarks/bytecodes.py): case 1 counted, in every thread, the same
count each time, so the next person compares the runtime with raw pykka on any machine."""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def bytecodes(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """benchmarks.bytecodes, as ``python -m benchmarks.bytecodes`` finds it: from the checkout."""
    monkeypatch.syspath_prepend(str(ROOT))
    return importlib.import_module("benchmarks.bytecodes")


def _spin(rounds: int) -> int:
    total = 0
    for n in range(rounds):
        total += n
    return total


def _in_a_thread(rounds: int) -> None:
    worker = threading.Thread(target=_spin, args=(rounds,))
    worker.start()
    worker.join()


def _spun(counts: Any) -> int:
    return sum(count for (filename, _, name), count in counts.items() if name == "_spin")


def test_work_in_a_thread_started_while_counting_is_counted_the_same_each_time(bytecodes: Any) -> None:
    short = _spun(bytecodes.count_bytecodes(lambda: _in_a_thread(1_000)))
    long = _spun(bytecodes.count_bytecodes(lambda: _in_a_thread(3_000)))
    again = _spun(bytecodes.count_bytecodes(lambda: _in_a_thread(3_000)))
    assert short > 0
    assert long == again  # a count, not a time: it does not move between runs
    assert 2.5 < long / short < 3.5  # the loop's body, three times as often


def test_the_page_compares_the_runtime_traced_and_not_with_raw_pykka_by_area(bytecodes: Any) -> None:
    counted = bytecodes.measure(requests=60, warm_up=20)
    assert list(counted) == list(bytecodes.VARIANTS)
    areas = {name: bytecodes.by_area(counts, 60) for name, counts in counted.items()}
    assert areas["raw pykka, same work"]["tracing"] == 0 and areas["runtime, no trace"]["tracing"] == 0
    assert areas["runtime"]["tracing"] > 0
    assert areas["raw pykka, same work"]["substrate"] > areas["runtime"]["substrate"]  # pykka's loop and queues
    assert areas["runtime + journal"]["journal"] > areas["runtime"]["journal"]
    text = bytecodes.page(counted, 60, quick=True)
    for name, variant in bytecodes.VARIANTS.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| {variant} |"))
        assert float(row.split("|")[2].replace(",", "")) == pytest.approx(sum(areas[name].values()), abs=1)
    assert "| raw pykka doing the same work (cases.raw_pykka_same_work) | " in text
    assert text.count("| 1.00 |") == 1  # raw pykka, the baseline
