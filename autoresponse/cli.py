"""The ``autoresponse`` command: ``run`` (the daemon), ``demo``, ``journal check``,
and the operator's ``status``, ``inject`` and ``deadletters`` against a running daemon.

An operator's mistake (settings that cannot be used, a journal that cannot be
read, an unreachable daemon) ends as one line on stderr, ``autoresponse: ...``,
and exit code 2; a daemon that cannot start exits 1, also with one line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import shlex
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console as RichConsole
from rich.table import Table
from rich.tree import Tree

from autoresponse.actors.journal import JournalCorrupt, check_journal
from autoresponse.actors.memory import ConversationStore
from autoresponse.actors.routes import interface, sender
from autoresponse.admin import unsafe_bind
from autoresponse.app import Application, StartError
from autoresponse.config import ConfigError, Settings
from autoresponse.interfaces.console import ConsoleInput
from autoresponse.interfaces.terminal import DEMO_COMMANDS
from autoresponse.redaction import Redactor

log = logging.getLogger("autoresponse")

DEMO_SCRIPT = (
    "hello",
    "run df -h",
    "synth, run uname -sr",
    "run rm -rf /tmp/precious",  # refused by the allowlist; the refusal still comes back via the LLM
)
DEMO_DEFAULTS = {"terminal": {"enabled": True, "allowed_commands": list(DEMO_COMMANDS)},
                 "admin": {"enabled": False}, "console": {"read_stdin": False}}


class RedactSecrets(logging.Filter):
    """Replaces every configured secret (bot token, API key, admin token, URL credentials)
    in log lines.

    Libraries log what they like (httpx logs each request URL, and a Telegram URL
    holds the bot token), so the redaction happens at the handler, for all of them.
    """

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.redact = Redactor(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.redact.secrets:
            text = record.getMessage()
            redacted = self.redact(text)
            if redacted != text:
                record.msg, record.args = redacted, None
        return True


def _logging(level: str, settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(RedactSecrets(settings.secrets()))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))


def _settings(args: argparse.Namespace, defaults: dict[str, Any] | None = None) -> Settings:
    """The settings for a command that starts the application: loaded, and the data
    directory checked, before anything starts (ConfigError otherwise)."""
    settings = Settings.load(args.config, defaults=defaults)
    settings.check_data_dir()
    # Refused here, before any platform starts (and, say, polls Telegram), not halfway up.
    problem = unsafe_bind(settings.admin) if settings.admin.enabled else None
    if problem is not None:
        raise ConfigError(problem)
    return settings


def _move_aside(path: Path) -> str:
    """The shell command that moves a journal out of the way, keeping it, with its WAL
    files: a new journal must not pick up the old one's write-ahead log."""
    aside = path.with_name(path.name + ".corrupt")
    n = 1
    while aside.exists():  # never overwrite a journal kept aside before
        n += 1
        aside = path.with_name(f"{path.name}.corrupt{n}")
    moves = [(path, aside)] + [(Path(f"{path}{s}"), Path(f"{aside}{s}")) for s in ("-wal", "-shm")
                               if Path(f"{path}{s}").exists()]
    return " && ".join(f"mv {shlex.quote(str(a))} {shlex.quote(str(b))}" for a, b in moves)


def _journal_check_command(args: argparse.Namespace) -> str:
    config = f" --config {shlex.quote(args.config)}" if args.config else ""
    return f"autoresponse journal check{config}"


def _start(args: argparse.Namespace, settings: Settings) -> Application:
    """Start the application; a journal that cannot be read is a ConfigError that says
    how to check it and how to move it aside. It is never replaced silently."""
    try:
        return Application(settings).start()
    except JournalCorrupt as exc:
        raise ConfigError(f"{exc}. Check it with `{_journal_check_command(args)}`; to start with an "
                          f"empty journal, move it aside: {_move_aside(settings.journal_path)}") from None


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT, then drain, stop everything, exit 0.

    If the root supervisor gives up, stop the same way and exit 1.
    """
    settings = _settings(args)
    _logging(settings.log_level, settings)
    stopping = threading.Event()
    running: list[Application] = []

    def on_signal(*_: object) -> None:
        if stopping.is_set() and running:  # a second signal: stop now; what is left resumes
            log.info("stopping now: what is under way stays open and resumes on the next start")
            running[0].runtime.hurry()
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    try:
        app = _start(args, settings)
        running.append(app)
    except (StartError, ValueError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    log.info("autoresponse is running; SIGTERM or SIGINT stops it")
    while not stopping.wait(0.2) and not app.failed.is_set():
        pass
    log.info("stopping: draining in-flight work (a second signal stops at once)")
    app.stop()
    for signum in (signal.SIGTERM, signal.SIGINT):  # one more signal now must not turn exit 0 into a kill
        signal.signal(signum, signal.SIG_IGN)
    leftover = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if leftover:
        log.warning("threads still alive after stop: %s", ", ".join(leftover))
    log.info("stopped")
    return 1 if app.failed.is_set() else 0


class AdminError(Exception):
    """The admin endpoint could not be reached, or refused."""


def _admin(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    settings = Settings.load(args.config)
    url = (args.url or settings.admin.url).rstrip("/") + path
    token = args.token or (settings.admin.token.get_secret_value() if settings.admin.token else None)
    request = urllib.request.Request(url, method=method,
                                     data=None if body is None else json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise AdminError(f"{method} {url}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise AdminError(f"cannot reach the admin endpoint at {url}: {exc}") from None


def _label(node: dict[str, Any]) -> str:
    colour = {"running": "green", "restarting": "yellow", "stopped": "red"}[node["state"]]
    text = (f"[bold]{node['name']}[/] [dim]{node['kind']}[/] [{colour}]{node['state']}[/]"
            f"  restarts {node['restarts']}  mailbox {node['mailbox']}  processed {node['processed']}")
    failure = node.get("last_failure")
    if failure:
        text += f"  [red]last failure: {failure['type']}: {failure['message']}[/]"
    return text


def status(args: argparse.Namespace) -> int:
    data = _admin(args, "GET", "/status")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    view = Tree(f"autoresponse  in flight {data['in_flight']}  dead letters {data['dead_letters_total']}"
                + "".join(f"  {k}={v}" for k, v in sorted(data["dead_letters"].items())))

    def add(branch: Tree, node: dict[str, Any]) -> None:
        child = branch.add(_label(node))
        for grandchild in node["children"]:
            add(child, grandchild)

    for root in data["tree"]:
        add(view, root)
    RichConsole().print(view)
    return 0


def inject(args: argparse.Namespace) -> int:
    try:
        body = json.loads(args.json)
    except json.JSONDecodeError as exc:
        print(f"autoresponse: the message is not JSON: {exc}", file=sys.stderr)
        return 2
    query = f"?type={args.type}" if args.type else ""
    print(json.dumps(_admin(args, "POST", f"/inject/{args.actor}{query}", body)))
    return 0


def deadletters(args: argparse.Namespace) -> int:
    if args.action == "replay":
        print(json.dumps(_admin(args, "POST", f"/deadletters/{args.id}/replay", {})))
        return 0
    data = _admin(args, "GET", f"/deadletters?limit={args.limit}")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    table = Table("id", "time", "actor", "reason", "detail", "correlation")
    for letter in data["letters"]:
        when = dt.datetime.fromtimestamp(letter["time"]).strftime("%H:%M:%S")
        detail = letter["detail"] or letter["error"] or ""
        table.add_row(str(letter["id"]), when, letter["actor"] or "-", letter["reason"],
                      detail[:80], letter["envelope"]["correlation_id"])
    RichConsole().print(table)
    return 0


def demo(args: argparse.Namespace) -> int:
    """A console conversation on the offline engine (or the configured LLM)."""
    settings = _settings(args, DEMO_DEFAULTS)
    _logging("WARNING" if settings.log_level.upper() == "INFO" else settings.log_level, settings)
    texts = args.texts or list(DEMO_SCRIPT)
    try:
        app = _start(args, settings)
    except (StartError, ValueError) as exc:
        print(f"autoresponse: cannot start: {exc}", file=sys.stderr)
        return 1
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


def history(args: argparse.Namespace) -> int:
    """``history CHAT``: what a chat's memory holds, oldest first (read from the data dir).

    CHAT is a chat key (``telegram:42:``, as ``history`` without one lists them) or a chat id.
    """
    settings = Settings.load(args.config)
    path = settings.data_path / "memory.sqlite3"
    if not path.exists():
        print(f"no conversation memory at {path}")
        return 0
    store = ConversationStore(path, max_tokens=settings.memory.max_tokens)
    try:
        known = store.chats_with_memory()
        if args.chat is None:
            for chat, count in known:
                print(f"{chat}  ({count} entries)")
            return 0
        chats = [c for c, _ in known if c == args.chat or c.split(":")[1] == args.chat]
        if not chats:
            print(f"autoresponse: no memory of chat {args.chat!r}; `autoresponse history` lists the chats",
                  file=sys.stderr)
            return 1
        entries = [e for chat in chats for e in store.history(chat)]
    finally:
        store.close()
    if args.json:
        print(json.dumps([e.model_dump() for e in entries], indent=2, ensure_ascii=False))
        return 0
    table = Table("time", "chat", "who", "kind", "text")
    for e in entries:
        when = dt.datetime.fromtimestamp(e.time).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(when, e.chat, e.role, e.kind, e.content if len(e.content) < 300 else e.content[:297] + "...")
    RichConsole().print(table)
    return 0


def journal(args: argparse.Namespace) -> int:
    """``journal check``: SQLite's integrity check of the configured journal, read only.

    Exit 0 when it is fine (or there is none yet), 1 with the problems otherwise.
    """
    path = Settings.load(args.config).journal_path
    if not path.exists():
        print(f"no journal at {path}")
        return 0
    problems = check_journal(path)
    if not problems:
        print(f"ok: {path}")
        return 0
    for problem in problems:
        print(f"{path}: {problem}")
    print(f"to start with an empty journal, stop the daemon and move it aside: {_move_aside(path)}")
    return 1


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

    p_history = commands.add_parser("history", help="show a chat's conversation memory")
    p_history.add_argument("chat", nargs="?", help="a chat key or chat id (default: list the chats)")
    p_history.add_argument("--json", action="store_true", help="print the entries as JSON")
    p_history.add_argument("--config", help="a TOML settings file")
    p_history.set_defaults(func=history)

    p_journal = commands.add_parser("journal", help="check the delivery journal")
    p_journal.add_argument("action", choices=["check"], help="check: SQLite's integrity check, read only")
    p_journal.add_argument("--config", help="a TOML settings file")
    p_journal.set_defaults(func=journal)

    def admin_client(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help)
        sub.add_argument("--url", help="admin endpoint (default: from the settings)")
        sub.add_argument("--token", help="admin token (default: AUTORESPONSE_ADMIN__TOKEN)")
        sub.add_argument("--config", help="a TOML settings file")
        return sub

    p_status = admin_client("status", "show the supervision tree of a running daemon")
    p_status.add_argument("--json", action="store_true", help="print the raw JSON")
    p_status.set_defaults(func=status)

    p_inject = admin_client("inject", "send a JSON message to a named actor")
    p_inject.add_argument("actor", help='e.g. "interface.console"')
    p_inject.add_argument("json", help='e.g. \'{"text": "run date"}\'')
    p_inject.add_argument("--type", help="the message class, when several fit")
    p_inject.set_defaults(func=inject)

    p_dead = admin_client("deadletters", "list or replay dead letters")
    p_dead.add_argument("action", choices=["list", "replay"])
    p_dead.add_argument("id", nargs="?", type=int, help="the dead letter to replay")
    p_dead.add_argument("--limit", type=int, default=50)
    p_dead.add_argument("--json", action="store_true")
    p_dead.set_defaults(func=deadletters)

    args = parser.parse_args(argv)
    if args.command == "deadletters" and args.action == "replay" and args.id is None:
        parser.error("deadletters replay needs the id of a dead letter")
    try:
        return args.func(args)
    except (FileNotFoundError, ConfigError, AdminError) as exc:
        print(f"autoresponse: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
