"""The ``autoresponse`` command: ``run`` (the daemon) and ``demo``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from autoresponse.actors.routes import interface, sender
from autoresponse.interfaces.console import ConsoleInput
from autoresponse.interfaces.terminal import DEMO_COMMANDS
from autoresponse.supervisors.app import Application
from autoresponse.supervisors.config import Settings

log = logging.getLogger("autoresponse")

DEMO_SCRIPT = (
    "hello",
    "run df -h",
    "synth, run uname -sr",
    "run rm -rf /tmp/precious",  # refused by the allowlist; the refusal still comes back via the LLM
)
DEMO_DEFAULTS = {"terminal": {"enabled": True, "allowed_commands": list(DEMO_COMMANDS)}}


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT, then drain, stop everything, exit 0."""
    settings = Settings.load(args.config)
    _logging(settings.log_level)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    app = Application(settings).start()
    log.info("autoresponse is running; SIGTERM or SIGINT stops it")
    while not stopping.wait(0.5):
        pass
    log.info("stopping: draining in-flight work")
    app.stop()
    leftover = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if leftover:
        log.warning("threads still alive after stop: %s", ", ".join(leftover))
    log.info("stopped")
    return 0


def demo(args: argparse.Namespace) -> int:
    """A console conversation on the offline engine (or the configured LLM)."""
    settings = Settings.load(args.config, defaults=DEMO_DEFAULTS)
    _logging("WARNING" if settings.log_level.upper() == "INFO" else settings.log_level)
    texts = args.texts or list(DEMO_SCRIPT)
    app = Application(settings, read_stdin=False).start()
    unanswered = 0
    try:
        with app.runtime.probe(sender("console")) as replies:
            for text in texts:
                envelope = app.runtime.send(interface("console"), ConsoleInput(text=text))
                if envelope is None:
                    unanswered += 1
                    continue
                correlation = envelope.correlation_id
                finished = app.runtime.wait_idle(correlation, timeout=args.timeout)
                answered = [e for e in replies.envelopes
                            if e.correlation_id == correlation and not e.body.notice]
                if not answered:
                    unanswered += 1
                    why = [f"{d.reason}: {d.detail}" for d in app.runtime.dead_letters.letters(correlation)]
                    if not finished:
                        why.append(f"no answer within {args.timeout:g}s")
                    print(f"no reply to {text!r}: {'; '.join(why) or 'unknown'}", file=sys.stderr)
    finally:
        app.stop()
    return 1 if unanswered else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="autoresponse", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    p_run = commands.add_parser("run", help="run the daemon until SIGTERM or SIGINT")
    p_run.add_argument("--config", help="a TOML settings file")
    p_run.set_defaults(func=run)

    p_demo = commands.add_parser("demo", help="a console conversation, offline by default")
    p_demo.add_argument("texts", nargs="*", help='requests, e.g. "run uptime" (default: a script)')
    p_demo.add_argument("--config", help="a TOML settings file")
    p_demo.add_argument("--timeout", type=float, default=60.0, help="seconds to wait per request")
    p_demo.set_defaults(func=demo)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except FileNotFoundError as exc:
        print(f"autoresponse: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
