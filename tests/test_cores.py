"""A daemon's threads on one CPU core, and the commands it runs on every core.

Real processes: a daemon started by ``autoresponse run``, its threads read from /proc, and
a command it runs reporting its own cores to the (fake) LLM that reads its output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Daemon

from autoresponse.testing.fake_llm import FakeLLMServer

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2 or not Path("/proc/self/task").is_dir(),
    reason="needs Linux and at least two cores to tell one core from all")

ALL_CORES = sorted(os.sched_getaffinity(0))


def cores_of_threads(pid: int) -> dict[str, set[int]]:
    """Each thread of ``pid``: its name, and the cores it may run on."""
    found: dict[str, set[int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            found[f"{name}/{task.name}"] = os.sched_getaffinity(int(task.name))
        except (FileNotFoundError, ProcessLookupError):
            pass  # the thread ended meanwhile
    return found


def cores_list(cores: list[int]) -> str:
    """As the kernel writes Cpus_allowed_list: ``0-1``, or ``3``."""
    return f"{cores[0]}-{cores[-1]}" if len(cores) > 1 and cores == list(range(cores[0], cores[-1] + 1)) \
        else ",".join(map(str, cores))


def daemon(tmp_path: Path, llm_url: str, **env: str) -> Daemon:
    return Daemon(tmp_path, AUTORESPONSE_LLM__BASE_URL=llm_url, AUTORESPONSE_TERMINAL__ENABLED="true",
                  AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS='["grep"]', **env)


def test_a_daemon_runs_on_one_core_and_the_commands_it_runs_on_every_core(
    tmp_path: Path, fake_llm: FakeLLMServer
) -> None:
    core = ALL_CORES[-1]
    with daemon(tmp_path, fake_llm.base_url, AUTORESPONSE_RUNTIME__CPU_CORE=str(core)) as d:
        assert d.proc is not None
        threads = cores_of_threads(d.proc.pid)
        assert len(threads) > 5  # its actors, the event loop, the journal's writer...
        assert {name: cores for name, cores in threads.items() if cores != {core}} == {}
        assert d.status()["cpu_core"] == core
        assert f"on core {core}" in d.cli("status").stdout
        done = d.cli("inject", "interface.console", '{"text": "run grep Cpus_allowed_list /proc/self/status"}')
        assert done.returncode == 0, done.stderr
        until = time.monotonic() + 30
        seen = ""
        while "Cpus_allowed_list" not in seen:  # the command's output, sent back to the LLM
            assert time.monotonic() < until, "the command's output never reached the LLM"
            time.sleep(0.1)
            seen = "".join(json.dumps(r.body) for r in fake_llm.requests if "Cpus_allowed_list:" in json.dumps(r.body))
        # The output as the LLM got it: a JSON string inside the request's JSON (each tab escaped twice).
        assert re.search(r"Cpus_allowed_list:(\\\\)+t" + re.escape(cores_list(ALL_CORES)) + r"(\\\\)+n", seen), seen
        assert d.stop() == 0
    assert f"running on core {core}" in d.log()


def test_off_leaves_the_threads_on_every_core_and_a_core_it_may_not_use_stops_the_start(
    tmp_path: Path, fake_llm: FakeLLMServer
) -> None:
    with daemon(tmp_path, fake_llm.base_url, AUTORESPONSE_RUNTIME__CPU_CORE="off") as d:
        assert d.proc is not None
        assert set(map(frozenset, cores_of_threads(d.proc.pid).values())) == {frozenset(ALL_CORES)}
        assert d.status()["cpu_core"] is None
        assert d.stop() == 0
    (tmp_path / "other").mkdir()
    refused = daemon(tmp_path / "other", fake_llm.base_url, AUTORESPONSE_RUNTIME__CPU_CORE=str(max(ALL_CORES) + 1))
    with pytest.raises(AssertionError):
        refused.start()
    assert refused.wait(30) == 2
    beyond = max(ALL_CORES) + 1
    [line] = [line for line in refused.log().splitlines() if line.strip()]  # one line, as every setting's mistake
    assert line == (f"autoresponse: runtime.cpu_core (AUTORESPONSE_RUNTIME__CPU_CORE) is {beyond}: core {beyond} "
                    f"is not one this process may run on (it may use {', '.join(map(str, ALL_CORES))})")


def test_auto_chooses_a_core_the_process_may_use_and_all_cores_come_back() -> None:
    # In a process of its own: the test process keeps every core.
    script = """
import json, os, threading
from autoresponse.actors.kernel import pinned_core, run_on_all_cores, run_on_one_core
before = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)
before.start()  # a thread already running is moved too
core = run_on_one_core()
after = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)
after.start()  # and one started after it inherits its one core
pinned = {t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
status = pinned_core()
run_on_all_cores()
print(json.dumps({"core": core, "status": status, "pinned": pinned, "then": pinned_core(),
                  "back": sorted(os.sched_getaffinity(before.native_id))}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["core"] in ALL_CORES and seen["status"] == seen["core"]
    assert set(map(tuple, seen["pinned"].values())) == {(seen["core"],)}
    assert seen["then"] is None and seen["back"] == ALL_CORES


def test_a_sandbox_that_forbids_choosing_cores_leaves_the_process_as_it_was(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from autoresponse.actors.kernel import cores

    def forbidden(pid: int, mask: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(cores.os, "sched_setaffinity", forbidden)
    assert cores.run_on_one_core() is None
    assert cores.pinned_core() is None
    assert "cannot run on one core ([Errno 1] Operation not permitted)" in caplog.text
    assert os.sched_getaffinity(0) == set(ALL_CORES)


def test_commands_started_together_each_get_every_core_and_the_loop_its_one_core_back() -> None:
    script = """
import asyncio, json, os, threading
from autoresponse.actors.kernel import run_on_one_core
from autoresponse.interfaces.terminal.command import run_command
core = run_on_one_core()

async def main():
    argv = ["grep", "Cpus_allowed_list", "/proc/self/status"]
    results = await asyncio.gather(*(run_command(argv, label="grep", timeout=20, output_cap=1000)
                                     for _ in range(6)))
    return [r.output for r in results], sorted(os.sched_getaffinity(threading.get_native_id()))

outputs, after = asyncio.run(main())
print(json.dumps({"core": core, "outputs": outputs, "after": after}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["outputs"] == [f"Cpus_allowed_list:\t{cores_list(ALL_CORES)}\n"] * 6
    assert seen["after"] == [seen["core"]]
