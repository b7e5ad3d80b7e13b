"""The ``autoresponse`` command: ``run`` (the daemon; ``record`` runs it and records the
session, ``replay`` plays one back offline), ``demo``, ``history``, ``journal check``,
``config show``, and the operator's ``status``, ``inject``, ``trace`` and ``deadletters``
against a running daemon.

An operator's mistake (settings that cannot be used, a journal, memory or reminder
store that cannot be read, an unreachable daemon) ends as one line on stderr,
``autoresponse: ...``, and exit code 2; a daemon that cannot start exits 1, also with
one line; a Ctrl-C before ``run`` handles signals itself, 130 with one line (``demo``
handles them too: it cancels its request, says so and exits 130).
"""

from __future__ import annotations

import signal
import sys
import threading

_interrupted_at_load = False

if threading.current_thread() is threading.main_thread():
    # What follows takes most of a second to load. A Ctrl-C meanwhile must end the command
    # as one later does (see ``main``): one line and 130, not a traceback from inside some
    # import. The handler only takes note, and the command ends once everything is loaded:
    # an exception raised wherever the signal lands was wrapped by what it landed in (a
    # pydantic schema being built), or dropped (an import lock's weakref callback). Python's
    # own handler is put back then.
    def _interrupted_while_loading(signum: int, frame: object) -> None:
        global _interrupted_at_load
        if not _interrupted_at_load:
            print("autoresponse: interrupted", file=sys.stderr)
        _interrupted_at_load = True

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored
        signal.signal(signal.SIGINT, _interrupted_while_loading)

import argparse
import datetime as dt
import http.client
import json
import logging
import os
import shlex
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console as RichConsole
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from autoresponse import __version__
from autoresponse.actors.kernel import run_on_one_core, tune_heap_for_serving
from autoresponse.actors.journal import JournalCorrupt, JournalStorageFailed, check_journal
from autoresponse.actors.memory import ConversationStore, StoreStorageFailed, StoreUnreadable
from autoresponse.actors.routes import interface, sender
from autoresponse.admin import unsafe_bind
from autoresponse.app import Application, StartError, make_engine
from autoresponse.cassette import Cassette, CassetteError, CassetteRecorder, replay
from autoresponse.config import ConfigError, Settings, describe
from autoresponse.interfaces.console import ConsoleInput
from autoresponse.interfaces.terminal import DEMO_COMMANDS
from autoresponse.logs import RedactSecrets, configure  # noqa: F401 (RedactSecrets: re-exported)
from autoresponse.notify import STOP_MARGIN_SECONDS, Notifier
from autoresponse.redaction import Redactor

if threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is _interrupted_while_loading:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if _interrupted_at_load:  # loaded: the command ends here, before it starts
        raise SystemExit(130)

log = logging.getLogger("autoresponse")

DEMO_SCRIPT = (
    "hello",
    "run df -h",
    "synth, run uname -sr",
    "run rm -rf /tmp/precious",  # refused by the allowlist; the refusal still comes back via the LLM
)
#: The demo's own data (memory, journal, reminders), apart from the daemon's: a ``demo``
#: folder in the default data dir, unless AUTORESPONSE_DATA_DIR (or data_dir) says otherwise.
DEMO_DATA_DIR = Settings.model_fields["data_dir"].default / "demo"
#: Seconds the demo waits, after a Ctrl-C, for its request to be cancelled before it stops.
DEMO_CANCEL_SECONDS = 5.0
DEMO_DEFAULTS = {"terminal": {"enabled": True, "allowed_commands": list(DEMO_COMMANDS)},
                 "admin": {"enabled": False}, "console": {"read_stdin": False},
                 "data_dir": str(DEMO_DATA_DIR)}


def _typed(argument: str) -> str:
    """A command-line argument that is text (a request, an actor's name, a JSON message), as
    its user meant it: bytes that do not decode (which Python keeps in ``sys.argv`` as lone
    surrogates, that nothing can store, send or print) each become U+FFFD."""
    try:
        raw = os.fsencode(argument)  # the bytes as given (surrogateescape)
    except UnicodeEncodeError:  # a surrogate no decoding made (``main`` called with it)
        raw = argument.encode("utf-8", "surrogatepass")
    return raw.decode(sys.getfilesystemencoding(), errors="replace")


def _seconds(argument: str) -> float:
    """A ``--timeout``: a number of seconds above 0 (0 or less would wait for nothing, and
    report every request unanswered), and finite."""
    try:
        seconds = float(argument)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{argument!r} is not a number of seconds") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0, not {argument}")
    return seconds


def _plain(docstring: str | None) -> str:
    """A docstring as ``--help`` shows it: without reST's literal marks."""
    return (docstring or "").replace("``", "")


def _logging(level: str, settings: Settings) -> None:
    """Text or JSON lines on stderr (``AUTORESPONSE_LOG__FORMAT``), every secret redacted."""
    configure(level, format=settings.log.format, secrets=settings.secrets())
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
    """The shell command that moves a store's file (the journal, the memory, the reminders)
    out of the way, keeping it, with its WAL files: a new file must not pick up the old
    one's write-ahead log."""
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


def _unreadable(exc: Exception, path: Path, what: str, check: str | None = None) -> str:
    """The one line for a store's file that cannot be read (``exc`` says which and why):
    how to check it, where there is a command for that, and how to move it aside."""
    how = f"Check it with `{check}`; to" if check else "To"
    return f"{exc}. {how} start with an empty {what}, move it aside: {_move_aside(path)}"


def _one_core(setting: int | str) -> int | None:
    """The daemon's threads, all it starts from now on, on one core (see actors.kernel.cores);
    a core it may not use is a ConfigError, before anything starts."""
    if setting == "off":
        return None
    try:
        return run_on_one_core(None if setting == "auto" else int(setting))
    except ValueError as exc:
        raise ConfigError(f"runtime.cpu_core (AUTORESPONSE_RUNTIME__CPU_CORE) is {setting}: {exc}") from None


def _start(args: argparse.Namespace, settings: Settings,
           recorder: CassetteRecorder | None = None) -> Application:
    """Start the application; a journal, memory or reminder store that cannot be read is a
    ConfigError that says how to move it aside (and how to check the journal). None of them
    is ever replaced silently."""
    try:
        if recorder is None:
            return Application(settings).start()
        app = Application(settings, engine=recorder.engine(make_engine(settings.llm)))
        recorder.attach(app.runtime)
        return app.start()
    except JournalCorrupt as exc:
        raise ConfigError(_unreadable(exc, settings.journal_path, "journal",
                                      check=_journal_check_command(args))) from None
    except StoreUnreadable as exc:
        raise ConfigError(_unreadable(exc, exc.path, exc.what)) from None


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT, then drain, stop everything, exit 0.

    If the root supervisor gives up, stop the same way and exit 1.
    """
    settings = _settings(args)
    _logging(settings.log_level, settings)
    notifier = Notifier.from_environment()  # systemd's Type=notify; nothing without NOTIFY_SOCKET
    stopping = threading.Event()
    running: list[Application] = []

    def on_signal(*_: object) -> None:
        if stopping.is_set() and running:  # a second signal: stop now; what is left resumes
            log.info("stopping now: what is under way stays open and resumes on the next start")
            running[0].runtime.hurry()
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    core = _one_core(settings.runtime.cpu_core)
    recorder = CassetteRecorder(args.cassette, settings) if getattr(args, "cassette", None) else None
    try:
        app = _start(args, settings, recorder)
        running.append(app)
    except (StartError, ValueError) as exc:
        log.error("cannot start: %s", exc)
        notifier.status("cannot start; see the log")
        return 1
    finally:
        if recorder is not None and not running:
            recorder.close()
    if recorder is not None:
        log.info("recording the session to %s", recorder.path)
    frozen = tune_heap_for_serving()  # shorter and fewer collections: see actors.kernel.heap
    log.debug("%d objects built at start set aside from the garbage collector", frozen)
    if core is not None:
        log.info("running on core %d (runtime.cpu_core = \"off\" spreads the threads over every core)", core)
    log.info("autoresponse is running; SIGTERM or SIGINT stops it")
    # Only now: the whole tree is up, the journal's unfinished work resumed, the admin endpoint listens.
    notifier.ready(f"serving: {len(app.runtime.cells)} actors, platforms {','.join(app.mounts) or 'none'}"
                   + (f", admin endpoint at {app.admin.url}" if app.admin else ""))
    while not stopping.wait(0.2) and not app.failed.is_set():
        pass
    notifier.stopping("stopping: the root supervisor gave up" if app.failed.is_set()
                      else f"stopping: draining in-flight work (up to {settings.runtime.drain_seconds:g}s)",
                      within=settings.runtime.drain_seconds + STOP_MARGIN_SECONDS)
    log.info("stopping: draining in-flight work (a second signal stops at once)")
    app.stop()
    if recorder is not None:
        recorder.close()
    for signum in (signal.SIGTERM, signal.SIGINT):  # one more signal now must not turn exit 0 into a kill
        signal.signal(signum, signal.SIG_IGN)
    leftover = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if leftover:
        log.warning("threads still alive after stop: %s", ", ".join(leftover))
    log.info("stopped")
    return 1 if app.failed.is_set() else 0


class AdminError(Exception):
    """The admin endpoint could not be reached, or refused."""


#: What the admin commands open their requests with: straight to the daemon, never through
#: ``http_proxy``. The endpoint is the daemon's own (on 127.0.0.1 by default): a proxy has
#: no business between them, and would be handed the admin token with every request.
_ADMIN_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _admin_base(given: str) -> str:
    """The endpoint's address as given (``--url``, or the settings'), ``http://`` when it
    names no scheme (``127.0.0.1:8787``)."""
    return given if "://" in given else f"http://{given}"


def _admin(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    settings = Settings.load(args.config)
    url = _admin_base(args.url or settings.admin.url).rstrip("/") + path
    token = args.token or (settings.admin.token.get_secret_value() if settings.admin.token else None)
    try:
        request = urllib.request.Request(url, method=method,
                                         data=None if body is None else json.dumps(body).encode())
        request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with _ADMIN_OPENER.open(request, timeout=10) as response:
            answer = response.read()
    except urllib.error.HTTPError as exc:
        detail = " ".join(exc.read().decode(errors="replace").split())  # one line, whoever answered
        raise AdminError(f"{method} {url}: HTTP {exc.code}: {detail[:500]}") from None
    # ValueError: a URL that urllib or http.client refuses (an unclosed "[", a space in it);
    # HTTPException: no HTTP answer.
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        raise AdminError(f"cannot reach the admin endpoint at {url}: {exc}") from None
    try:
        return json.loads(answer)
    except ValueError:  # not JSON, or not UTF-8
        raise AdminError(f"{method} {url}: the answer is not JSON; is this the admin endpoint?") from None


@contextmanager
def _reading(what: str) -> Iterator[None]:
    """Around what reads an answer's fields: an answer without them (another server's, or
    another version's) is one AdminError line, not a traceback."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as exc:
        raise AdminError(f"the answer to {what} is not what the admin endpoint sends "
                         f"({type(exc).__name__}: {exc}); is this the admin endpoint?") from None


def _label(node: dict[str, Any], now: float) -> str:
    colour = {"running": "green", "restarting": "yellow", "stopped": "red"}[node["state"]]
    failing = node.get("failing")
    state = f"[{colour}]{node['state']}[/]" + (" [bold red]failing[/]" if failing else "")
    text = (f"[bold]{escape(node['name'])}[/] [dim]{node['kind']}[/] {state}"
            f"  restarts {node['restarts']}  mailbox {node['mailbox']}  processed {node['processed']}")
    if failing:
        text += f"  [red]{escape(_failing_since(failing, now))}: {escape(failing['reason'])}[/]"
    failure = node.get("last_failure")
    if failure:
        text += f"  [red]last failure: {escape(failure['type'])}: {escape(failure['message'])}[/]"
    return text


def _failing_since(failing: dict[str, Any], now: float) -> str:
    """``since 12:00:03 (25s ago)``, in the daemon's time."""
    when = dt.datetime.fromtimestamp(failing["since"]).strftime("%H:%M:%S")
    return f"since {when} ({max(0, round(now - failing['since']))}s ago)"


def status(args: argparse.Namespace) -> int:
    data = _admin(args, "GET", "/status")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    with _reading("GET /status"):
        view = _status_tree(data)
    RichConsole().print(view)
    return 0


def _status_tree(data: dict[str, Any]) -> Tree:
    """GET /status's answer as a tree: the counts, what fails, the actors, the cluster, the LLM."""
    now = data["time"]
    core = data.get("cpu_core")
    view = Tree(f"autoresponse  in flight {data['in_flight']}  dead letters {data['dead_letters_total']}"
                + "".join(f"  {k}={v}" for k, v in sorted(data["dead_letters"].items()))
                + (f"  on core {core}" if core is not None else "")
                + ("" if data.get("traced", True) else "  untraced"))
    for name, failing in (data.get("failing") or {}).items():  # what fails comes first, in red
        view.add(f"[bold red]{escape(name)} is failing {escape(_failing_since(failing, now))}: "
                 f"{escape(failing['reason'])}[/]")

    def add(branch: Tree, node: dict[str, Any]) -> None:
        child = branch.add(_label(node, now))
        for grandchild in node["children"]:
            add(child, grandchild)

    for root in data["tree"]:
        add(view, root)
    cluster = data.get("cluster")
    if cluster:
        view.add(_cluster_label(cluster))
    llm = (data.get("reports") or {}).get("llm")
    if llm:
        for line in _llm_labels(llm):
            view.add(line)
    return view


def _llm_labels(llm: dict[str, Any]) -> list[str]:
    """The LLM lines of ``status``: each engine's protocol, window and circuit; tokens used."""
    rows = []
    for engine in llm.get("engines", ()):
        window = engine.get("context_tokens")
        budget = engine.get("request_budget_tokens")
        fit = f"  context {window}" + (f" (requests fit in {budget}, last {engine.get('last_request_tokens')})"
                                       if budget else "") if window else ""
        colour = "red" if engine.get("circuit") == "open" else "green"
        rows.append(f"llm {engine['name']}  speaks {engine.get('protocol')}{fit}  "
                    f"[{colour}]circuit {engine.get('circuit')}[/]")
        if engine.get("problem"):  # the server keeps it from working as configured
            rows.append(f"[red]llm {engine['name']}: {escape(engine['problem'])}[/]")
    usage = llm.get("usage") or {}
    if usage.get("tokens_total"):
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(usage.get("tokens_by_kind", {}).items()))
        rows.append(f"llm tokens {usage['tokens_total']} ({kinds})")
    return rows


def _cluster_label(cluster: dict[str, Any]) -> str:
    """The NATS cluster line of ``status``: this node, the leases and the work stream."""
    if "error" in cluster:
        return f"[red]cluster: {escape(cluster['error'])}[/]"
    leases = ", ".join(f"{name} held by {holder}" for name, holder in sorted(cluster["leases"].items()))
    return (f"cluster  node {cluster['node']}  pending {cluster['pending']}  in progress "
            f"{cluster['in_progress']}  redelivered {cluster['redelivered']}  leases: {leases or 'none'}")


def inject(args: argparse.Namespace) -> int:
    try:
        body = json.loads(args.json)
    except json.JSONDecodeError as exc:
        print(f"autoresponse: the message is not JSON: {exc}", file=sys.stderr)
        return 2
    except RecursionError:  # lists or objects nested past what Python's parser takes
        print("autoresponse: the message nests lists or objects too deeply to be read as JSON",
              file=sys.stderr)
        return 2
    query = f"?{urllib.parse.urlencode({'type': args.type})}" if args.type else ""
    path = f"/inject/{urllib.parse.quote(args.actor, safe='')}{query}"
    print(json.dumps(_admin(args, "POST", path, body)))
    return 0


def trace(args: argparse.Namespace) -> int:
    """``trace ID``: every hop of one request, in causal order (not time order: each after
    the message that caused it, so "at ms" can step back where the request branches).

    Each row is one message: when it was queued (from the request's start), how long it
    waited in the mailbox, how long its handler took, and how it ended. The time between
    a message's handling and the queueing of what it caused is I/O (an LLM call, a command).
    """
    data = _admin(args, "GET", f"/trace/{urllib.parse.quote(args.id, safe='')}")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    with _reading(f"GET /trace/{args.id}"):
        view = _trace_table(data)
    RichConsole().print(view)
    return 0


def _trace_table(data: dict[str, Any]) -> Table:
    """GET /trace's answer as a table, one row a hop, in the order the answer has them."""
    hops = data["hops"]
    start = min(h["queued"] for h in hops)
    end = max((h["ended"] or h["queued"]) for h in hops)
    view = Table(title=f"trace {data['correlation_id']}: {len(hops)} hops in {1000 * (end - start):.1f} ms")
    for column in ("at ms", "actor", "message", "waited ms", "took ms", "attempt", "outcome"):
        figure = "ms" in column or column == "attempt"
        # Where the table is too narrow, names fold onto a second line, whole: truncated,
        # "conversations" and "conversations.3" both read "conversati…".
        view.add_column(column, justify="right" if figure else "left", overflow="ellipsis" if figure else "fold")

    def ms(a: float | None, b: float | None) -> str:
        return "" if a is None or b is None else f"{1000 * (b - a):.1f}"

    for hop in hops:
        outcome = hop["outcome"] or "under way"
        style = "" if outcome == "handled" else "red" if outcome != "under way" else "yellow"
        # What the daemon reports is text, never markup: a reason may hold "[/tmp/x]".
        view.add_row(ms(start, hop["queued"]), escape(hop["actor"]), escape(hop["type"]),
                     ms(hop["queued"], hop["started"]), ms(hop["started"], hop["ended"]), str(hop["attempt"]),
                     f"[{style}]{escape(outcome)}[/]" if style else escape(outcome))
    return view


def deadletters(args: argparse.Namespace) -> int:
    if args.action == "replay":
        print(json.dumps(_admin(args, "POST", f"/deadletters/{args.id}/replay", {})))
        return 0
    data = _admin(args, "GET", f"/deadletters?limit={args.limit}")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    table = Table("id", "time", "actor", "reason", "detail", "correlation")
    with _reading("GET /deadletters"):
        for letter in data["letters"]:
            when = dt.datetime.fromtimestamp(letter["time"]).strftime("%H:%M:%S")
            detail = letter["detail"] or letter["error"] or ""
            table.add_row(str(letter["id"]), when, escape(letter["actor"] or "-"), escape(letter["reason"]),
                          escape(detail[:80]), escape(letter["envelope"]["correlation_id"]))
    RichConsole().print(table)
    return 0


def _fresh(settings: Settings) -> tuple[Settings, tempfile.TemporaryDirectory[str] | None]:
    """``demo --fresh``: the demo's own data dir is emptied (its memory, journal and
    reminders); a data dir given by AUTORESPONSE_DATA_DIR or data_dir is never touched: the
    demo runs on an empty one of its own instead, removed when it ends."""
    if settings.data_path == DEMO_DATA_DIR.expanduser():
        shutil.rmtree(settings.data_path, ignore_errors=True)
        settings.check_data_dir()
        return settings, None
    scratch = tempfile.TemporaryDirectory(prefix="autoresponse-demo-")
    return settings.model_copy(update={"data_dir": Path(scratch.name)}), scratch


def demo(args: argparse.Namespace) -> int:
    """A console conversation on the offline engine (or the configured LLM), with a memory
    of its own (``DEMO_DATA_DIR``); ``--fresh`` starts it empty.

    A Ctrl-C (or SIGTERM) cancels the request under way, as ``/cancel`` would, and ends the
    demo with 128 + the signal (130 for Ctrl-C); a second one stops at once, without waiting
    for what is under way. Never a KeyboardInterrupt: one raised inside the stop left the
    actors' threads running, and the process waiting for them for good.
    """
    settings = _settings(args, DEMO_DEFAULTS)
    _logging("WARNING" if settings.log_level.upper() == "INFO" else settings.log_level, settings)
    texts = args.texts or list(DEMO_SCRIPT)
    interrupts = _Interrupts()
    with interrupts.handling():
        settings, scratch = _fresh(settings) if args.fresh else (settings, None)
        try:
            answered = _converse(args, settings, texts, interrupts)
        finally:
            if scratch is not None:
                scratch.cleanup()
    if interrupts.asked:
        interrupts.tell("autoresponse: interrupted")  # unless it said more already
    leftover = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if leftover:
        log.warning("threads still alive after stop: %s", ", ".join(leftover))
    return 128 + interrupts.signum if interrupts.asked else answered


class _Interrupts:
    """SIGINT and SIGTERM while the demo runs (``handling``): the first asks the demo to
    cancel its request and stop, a second to stop at once (``hurry``, once there is an
    application to hurry). The handler only sets flags (no lock: the main thread it
    interrupts may hold one), and the main thread acts on them between its waits."""

    def __init__(self) -> None:
        #: The first signal's number (0: none yet).
        self.signum = 0
        self.again = False
        self._hurry: Callable[[], None] | None = None
        self._told = False

    @property
    def asked(self) -> bool:
        return self.signum != 0

    def __call__(self, signum: int, frame: object) -> None:
        if not self.signum:
            self.signum = signum
            return
        self.again = True
        if self._hurry is not None:
            self._hurry()  # Runtime.hurry sets an event nothing waits on: no lock held meanwhile

    def tell(self, line: str) -> None:
        """Say what the first signal did, in one line on stderr (said once)."""
        if not self._told:
            print(line, file=sys.stderr)
            self._told = True

    def hurry_with(self, hurry: Callable[[], None]) -> None:
        """Call ``hurry`` on a second signal (now, if there was one already)."""
        self._hurry = hurry
        if self.again:
            hurry()

    @contextmanager
    def handling(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():  # main() called from a thread
            yield
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is not signal.SIG_IGN:  # ignored (a background job's): it stays so
                signal.signal(signum, self)
        try:
            yield
        finally:
            # As ``run``'s: the command ends, and one more signal must not make its exit a kill
            # (as Python finalizes, it puts SIGINT back to the default).
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)


def _converse(args: argparse.Namespace, settings: Settings, texts: list[str], interrupts: _Interrupts) -> int:
    """Each text in turn at the console; 0 when every one got its reply. A signal
    (``interrupts``) cancels the request under way and skips the rest."""
    try:
        app = _start(args, settings)
    except (StartError, ValueError) as exc:
        print(f"autoresponse: cannot start: {exc}", file=sys.stderr)
        return 1
    interrupts.hurry_with(app.runtime.hurry)
    unanswered = 0
    try:
        with app.runtime.probe(sender("console")) as replies:
            for text in texts:
                if interrupts.asked:
                    break
                envelope = app.runtime.send(interface("console"), ConsoleInput(text=text))
                if envelope is None:
                    unanswered += 1
                    continue
                correlation = envelope.correlation_id
                finished = _wait_idle(app, correlation, args.timeout, lambda: interrupts.asked)
                if not finished and interrupts.asked:
                    again = "Ctrl-C again" if interrupts.signum == signal.SIGINT else "a second signal"
                    interrupts.tell(f"autoresponse: interrupted: cancelling the request ({again} stops at once)")
                    app.runtime.send(interface("console"), ConsoleInput(text="/cancel"))
                    # Until it is cancelled: a stop begun before the console took the /cancel
                    # would wait out the drain for the request instead.
                    _wait_idle(app, correlation, DEMO_CANCEL_SECONDS, lambda: interrupts.again)
                    break
                # A notice is the answer to a command (/forget, /cancel), but not to a request
                # that failed: that one has a dead letter, and its notice only says so.
                failed = app.runtime.dead_letters.letters(correlation)
                answered = [e for e in replies.envelopes
                            if e.correlation_id == correlation and not (e.body.notice and failed)]
                if not answered:
                    unanswered += 1
                    why = [f"{d.reason}: {d.detail}" for d in failed]
                    if not finished:
                        why.append(f"no answer within {args.timeout:g}s")
                    print(f"no reply to {text!r}: {'; '.join(why) or 'unknown'}", file=sys.stderr)
    finally:
        app.stop()  # a signal meanwhile hurries it (see _Interrupts), never interrupts it
    return 1 if unanswered else 0


def _wait_idle(app: Application, correlation: str, timeout: float, stop: Callable[[], bool]) -> bool:
    """Wait up to ``timeout`` seconds for ``correlation`` to finish; False at once when
    ``stop()`` says so (a signal: ``wait_idle`` itself cannot be woken by one)."""
    until = time.monotonic() + timeout
    while not stop():
        left = until - time.monotonic()
        if app.runtime.wait_idle(correlation, timeout=max(0.0, min(left, 0.1))):
            return True
        if left <= 0:
            return False
    return False


def replay_command(args: argparse.Namespace) -> int:
    """``replay FILE``: run a recorded session again, offline; 0 when the sends match."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cassette = Cassette.load(args.cassette)
    except (OSError, UnicodeDecodeError, CassetteError) as exc:
        print(f"autoresponse: cannot read the cassette: {exc}", file=sys.stderr)
        return 2
    result = replay(cassette, timeout=args.timeout)
    if result.matches:
        print(f"{len(cassette.inbound)} requests replayed; all {len(result.got)} sends match the recording")
        skipped = len(cassette.sends) - len(cassette.replayable_sends)
        if skipped:
            print(f"({skipped} sends made by interfaces on their own, e.g. refusals, are not replayed)")
        return 0
    for correlation in result.unfinished:
        print(f"request {correlation} did not finish within {args.timeout:g}s")
    if result.diff:
        print("the sends differ from the recording:")
        print("\n".join(result.diff))
    return 1


def history(args: argparse.Namespace) -> int:
    """``history CHAT``: what a chat's memory holds, oldest first (read from the data dir).

    CHAT is a chat key (``telegram:42:``, as ``history`` without one lists them) or a chat id.
    ``--json`` prints JSON either way: the entries, or the chats, each with its count.
    """
    settings = Settings.load(args.config, defaults=DEMO_DEFAULTS if args.demo else None)
    if settings.journal.backend == "nats":
        return _shared_history(args, settings)
    path = settings.data_path / "memory.sqlite3"
    if not path.exists():
        print("[]" if args.json else f"no conversation memory at {path}")  # no chat, no entries
        return 0
    try:  # unreadable at the open, or damaged past its first page (read by _show_history)
        store = ConversationStore(path, max_tokens=settings.memory.max_tokens,
                                  retention_seconds=settings.memory.retention_seconds)
        try:
            return _show_history(args, store, str(path))
        finally:
            store.close()
    except StoreUnreadable as exc:
        raise ConfigError(_unreadable(exc, exc.path, exc.what)) from None
    except StoreStorageFailed as exc:  # the disk's failure, not the file's: nothing to move aside
        print(f"autoresponse: {exc}", file=sys.stderr)
        return 1


def _shared_history(args: argparse.Namespace, settings: Settings) -> int:
    """``history`` of a cluster: the memory lives in the NATS server's buckets."""
    from autoresponse.actors.journal.jetstream import JetStreamJournal, JournalUnavailable
    from autoresponse.actors.journal.shared_memory import SharedConversationStore

    try:
        journal = JetStreamJournal(settings.nats.url, node="history-cli")
    except JournalUnavailable as exc:
        print(f"autoresponse: {exc}", file=sys.stderr)
        return 1
    try:
        return _show_history(args, SharedConversationStore(journal, max_tokens=settings.memory.max_tokens),
                             Redactor(settings.secrets())(settings.nats.url))  # its credentials are secrets
    finally:
        journal.close()


def _show_history(args: argparse.Namespace, store: ConversationStore | Any, where: str) -> int:
    """Print the chats with memory, or one chat's entries (``store``: either kind, at ``where``)."""
    known = store.chats_with_memory()
    if args.chat is None and args.json:
        print(json.dumps([{"chat": chat, "entries": count} for chat, count in known], indent=2,
                         ensure_ascii=False))
        return 0
    if args.chat is None:
        if not known:
            print(f"no chat has memory at {where}")
        for chat, count in known:
            print(f"{chat}  ({count} entries)")
        return 0
    chats = [c for c, _ in known if c == args.chat or c.split(":")[1] == args.chat]
    if not chats:
        print(f"autoresponse: no memory of chat {args.chat!r}; `autoresponse history` lists the chats",
              file=sys.stderr)
        return 1
    entries = [e for chat in chats for e in store.history(chat)]
    if args.json:
        print(json.dumps([e.model_dump() for e in entries], indent=2, ensure_ascii=False))
        return 0
    table = Table("time", "chat", "who", "kind", "text")
    for e in entries:
        when = dt.datetime.fromtimestamp(e.time).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(when, escape(e.chat), e.role, e.kind,
                      escape(e.content if len(e.content) < 300 else e.content[:297] + "..."))
    RichConsole().print(table)
    return 0


def journal(args: argparse.Namespace) -> int:
    """``journal check``: SQLite's integrity check of the configured journal, read only.

    Exit 0 when it is fine (or there is none yet), 1 with the problems otherwise.
    """
    settings = Settings.load(args.config)
    path = settings.journal_path
    if not path.exists():
        print(f"no journal at {path}")
        return 0
    if path.is_dir():
        settings.check_data_dir()  # the ConfigError ``run`` gives: it is a directory
    try:
        problems = check_journal(path)
    except JournalStorageFailed as exc:  # not corrupt: no advice to move it aside
        print(exc)
        return 1
    if not problems:
        print(f"ok: {path}")
        return 0
    for problem in problems:
        print(f"{path}: {problem}")
    print(f"to start with an empty journal, stop the daemon and move it aside: {_move_aside(path)}")
    return 1


def config_show(args: argparse.Namespace) -> int:
    """``config show``: every effective setting, its value and where it came from; secrets
    (SecretStr values, URL credentials) are never shown."""
    if args.demo:
        shown = describe(args.config, defaults=DEMO_DEFAULTS, defaults_source="autoresponse demo's defaults")
    else:
        shown = describe(args.config)
    if args.json:
        print(json.dumps({s.key: {"value": s.value, "source": s.source} for s in shown}, indent=2,
                         ensure_ascii=False))
        return 0
    width = max(len(s.key) for s in shown)
    for s in shown:
        print(f"{s.key:<{width}} = {json.dumps(s.value, ensure_ascii=False)}  # {s.source}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="autoresponse", description=_plain(__doc__))
    parser.add_argument("--version", action="version", version=f"autoresponse {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    p_run = commands.add_parser("run", help="run the daemon until SIGTERM or SIGINT",
                                description=_plain(run.__doc__))
    p_run.add_argument("--config", help="a TOML settings file")
    p_run.set_defaults(func=run)

    p_record = commands.add_parser("record", help="run the daemon, recording the session to a cassette",
                                   description="Serve as `run` does, and record the session to a cassette "
                                               "(JSON lines) that `replay` runs again offline.")
    p_record.add_argument("cassette", help="the JSONL file to write (replaced)")
    p_record.add_argument("--config", help="a TOML settings file")
    p_record.set_defaults(func=run)
    p_replay = commands.add_parser("replay", help="replay a recorded session offline and compare the sends",
                                   description=_plain(replay_command.__doc__))
    p_replay.add_argument("cassette", help="a JSONL file written by `autoresponse record`")
    p_replay.add_argument("--timeout", type=_seconds, default=60.0, help="seconds to wait per request")
    p_replay.set_defaults(func=replay_command)
    p_demo = commands.add_parser("demo", help="a console conversation, offline by default")
    p_demo.add_argument("texts", nargs="*", type=_typed,
                        help='requests, e.g. "run uptime" (default: a script)')
    p_demo.add_argument("--config", help="a TOML settings file")
    p_demo.add_argument("--timeout", type=_seconds, default=60.0, help="seconds to wait per request")
    p_demo.add_argument("--fresh", action="store_true",
                        help="start with an empty memory (forget what earlier demos said)")
    p_demo.set_defaults(func=demo)

    p_history = commands.add_parser("history", help="show a chat's conversation memory")
    p_history.add_argument("chat", nargs="?", type=_typed,
                           help="a chat key or chat id (default: list the chats)")
    p_history.add_argument("--json", action="store_true",
                           help="print the entries as JSON (without a chat: the chats and their counts)")
    p_history.add_argument("--config", help="a TOML settings file")
    p_history.add_argument("--demo", action="store_true", help="the memory of `autoresponse demo`, not the daemon's")
    p_history.set_defaults(func=history)

    p_journal = commands.add_parser("journal", help="check the delivery journal")
    p_journal.add_argument("action", choices=["check"], help="check: SQLite's integrity check, read only")
    p_journal.add_argument("--config", help="a TOML settings file")
    p_journal.set_defaults(func=journal)

    p_config = commands.add_parser("config", help="show the effective settings and where each came from")
    p_config.add_argument("action", choices=["show"], help="show: every setting, its value and its source")
    p_config.add_argument("--config", help="a TOML settings file")
    p_config.add_argument("--json", action="store_true", help="print them as JSON")
    p_config.add_argument("--demo", action="store_true", help="the settings `autoresponse demo` would use")
    p_config.set_defaults(func=config_show)

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
    p_inject.add_argument("actor", type=_typed, help='e.g. "interface.console"')
    p_inject.add_argument("json", type=_typed, help='e.g. \'{"text": "run date"}\'')
    p_inject.add_argument("--type", type=_typed, help="the message class, when several fit")
    p_inject.set_defaults(func=inject)

    p_trace = admin_client("trace", "show every hop of one request, in causal order")
    p_trace.add_argument("id", type=_typed,
                         help="the request's correlation id (see deadletters, status, or the page)")
    p_trace.add_argument("--json", action="store_true", help="print the raw JSON")
    p_trace.set_defaults(func=trace)

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
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader gone (``| head``) is caught below
        return code
    except BrokenPipeError:  # the reader went away: what it did not read is not wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit fails no more
        return 141  # as a shell reports a writer its reader left (128 + SIGPIPE)
    except (FileNotFoundError, ConfigError, AdminError) as exc:
        print(f"autoresponse: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a Ctrl-C before the command handles signals itself (``run``, ``demo``)
        print("autoresponse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
