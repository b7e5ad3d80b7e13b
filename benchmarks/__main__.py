"""First cut: requests per second through the whole loop, in process, offline engine.

Two workloads, side by side in one run:
* chat: "hello" → LLM → reply (one LLM turn, no executor);
* command: "run echo N" → LLM → terminal → LLM (delivery) → reply.

The full harness (raw-pykka baseline, loopback HTTP, latency-bound, scale,
journal) is the benchmark issue's work.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import time

from autoresponse.actors.routes import interface, sender
from autoresponse.interfaces.console import Console, ConsoleInput
from autoresponse.supervisors import Application, Settings
from autoresponse.supervisors.cli import DEMO_DEFAULTS


def measure(text: str, count: int) -> tuple[float, float]:
    """(requests per second, seconds) for ``count`` requests of ``text``, all in flight at once."""
    settings = Settings.load(defaults=DEMO_DEFAULTS)
    app = Application(settings, console=Console(io.StringIO()), read_stdin=False).start()
    try:
        with app.runtime.probe(sender("console")) as replies:
            started = time.perf_counter()
            for n in range(count):
                app.runtime.send(interface("console"), ConsoleInput(text=text.format(n=n)))
            if not app.runtime.wait_idle(timeout=300):
                raise SystemExit("the benchmark did not finish within 300 s")
            elapsed = time.perf_counter() - started
            if len(replies.envelopes) != count:
                raise SystemExit(f"{count - len(replies.envelopes)} requests got no reply")
    finally:
        app.stop()
    return count / elapsed, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chat", type=int, default=5000, help="chat requests")
    parser.add_argument("--command", type=int, default=500, help="command requests")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"{'workload':<10} {'requests':>9} {'seconds':>8} {'req/s':>9}")
    for name, text, count in (("chat", "hello {n}", args.chat),
                              ("command", "run echo {n}", args.command)):
        rate, elapsed = measure(text, count)
        print(f"{name:<10} {count:>9} {elapsed:>8.2f} {rate:>9.0f}")


if __name__ == "__main__":
    main()
