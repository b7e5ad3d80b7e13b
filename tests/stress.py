"""`make stress`: run the tests that race a stop, a kill or another daemon many times over.

These are the tests whose outcome depends on timing: a stop or drain that meets work under
way, a kill -9 mid-flight, several daemons sharing one NATS server, concurrent writers. A
single green run proves little; this runs each of them STRESS_COUNT times (20 unless told,
through pytest-repeat's --count, in one pytest session) and prints how many runs of each
passed. It exits non-zero if any run failed, or if a test named here is no longer found.

    STRESS_COUNT=3 python tests/stress.py [extra pytest arguments...]
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The tests under stress, each with all of its parameters. A node id that pytest cannot find
#: fails the run, so a rename here cannot go unnoticed.
TESTS = [
    # A stop, a drain, a shutdown in the kernel.
    "tests/test_kernel.py::test_a_blocking_mailbox_stops_waiting_but_still_takes_the_letter",
    "tests/test_kernel.py::test_a_stop_interrupts_what_is_still_queued_and_dead_letters_nothing",
    "tests/test_kernel.py::test_io_still_running_at_shutdown_ends_as_cancelled",
    "tests/test_supervision.py::test_children_stop_in_reverse_order_with_the_runtime",
    # kill -9 and SIGTERM of a real daemon.
    "tests/test_journal.py::test_nothing_is_lost_across_kill_9",
    "tests/test_journal.py::test_a_clean_stop_is_a_pause_and_loses_nothing",
    "tests/test_reddit.py::test_a_kill_9_before_the_reply_loses_neither_and_answers_neither_twice",
    "tests/test_service.py::test_the_daemon_tells_systemd_it_is_ready_only_once_the_tree_is_up_then_that_it_stops",
    "tests/test_cli.py::test_a_ctrl_c_while_the_daemon_starts_stops_it_without_a_traceback",
    "tests/test_telegram_webhook.py::test_a_stop_keeps_the_webhook_registered_and_closes_the_port",
    # Several daemons on one NATS server, kills and an outage included.
    "tests/test_cluster.py",
    # Concurrent chats through the pipeline.
    "tests/test_pipeline.py::test_replies_to_one_chat_keep_the_order_of_its_requests_while_chats_run_in_parallel",
]


class Tally:
    """Counts, per test (its repetition number taken off), the runs that passed and failed."""

    def __init__(self, count: int) -> None:
        self.repeat = re.compile(rf"-?\d+-{count}\]$") if count > 1 else None
        self.runs: dict[str, dict[str, str]] = {}  # test -> run id -> outcome

    def test_of(self, nodeid: str) -> str:
        if self.repeat is None:
            return nodeid
        base = self.repeat.sub("]", nodeid)
        return base[:-2] if base.endswith("[]") else base

    def pytest_runtest_logreport(self, report: Any) -> None:
        runs = self.runs.setdefault(self.test_of(report.nodeid), {})
        before = runs.get(report.nodeid)
        if report.failed:
            runs[report.nodeid] = "failed"
        elif report.skipped and before is None:
            runs[report.nodeid] = "skipped"
        elif report.when == "call" and report.passed and before is None:
            runs[report.nodeid] = "passed"


def main(argv: list[str]) -> int:
    count = int(os.environ.get("STRESS_COUNT") or 20)
    # Started in the background by a shell, this process inherits SIGINT ignored, and so
    # would every daemon the tests start and then interrupt with it; handled here, it is
    # back to the default in them (exec resets a handled signal, not an ignored one).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(ROOT)
    tally = Tally(count)
    # -p no:randomly: the repetitions of a test run back to back, whatever is installed.
    code = pytest.main(["-q", "-p", "no:randomly", f"--count={count}", *TESTS, *argv],
                       plugins=[tally])
    width = max((len(t) for t in tally.runs), default=0)
    print(f"\nstress: {count} run(s) of each test")
    failed = 0
    for test, runs in tally.runs.items():
        outcomes = list(runs.values())
        passed, skipped = outcomes.count("passed"), outcomes.count("skipped")
        failed += outcomes.count("failed")
        note = f"  ({skipped} skipped)" if skipped else ""
        mark = "" if outcomes.count("failed") == 0 else "  FAILED"
        print(f"{test:<{width}}  {passed}/{len(outcomes)}{note}{mark}")
    if failed or code != 0:
        print(f"stress: {failed} failed run(s); pytest exited with {int(code)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
