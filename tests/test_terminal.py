"""The terminal executor: off by default, allowlisted, no shell, bounded in time and output."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Gate, ask, console_text, system_messages, wait_for

from autoresponse import Application
from autoresponse.testing.fake_llm import FakeLLMServer
from autoresponse.actors.kernel._loop import EventLoopKind, new_event_loop
from autoresponse.actors.routes import BUILDER, executor
from autoresponse.interfaces.terminal import (
    DEFAULT_ARGUMENT_RULES,
    DEMO_COMMANDS,
    ArgumentRule,
    CommandRefused,
    TerminalAction,
    TerminalExecutor,
    TerminalSettings,
    parse_command,
    run_command,
)
from autoresponse.messages import ActionOutput, ActionRequest, ActionResult, OriginalContext

MakeApp = Callable[..., Application]
CTX = OriginalContext(chat_id="console", message_id=1, interface_name="console")


def delivered_outputs(fake_llm: FakeLLMServer) -> list[dict]:
    """The action outputs the LLM was shown in delivery turns."""
    return [o for m in system_messages(fake_llm, "output") for o in m["outputs"]]


def refusals(fake_llm: FakeLLMServer) -> list[str]:
    """What the LLM heard, in the re-ask of the turn that chose a command, as refused."""
    return [e for m in system_messages(fake_llm, "error") for e in m["errors"]]


def test_the_terminal_is_off_by_default() -> None:
    assert TerminalSettings().enabled is False


def executor_result(settings: TerminalSettings, command: str) -> ActionResult:
    """What the executor alone hands the builder for ``command``."""
    from autoresponse.actors.kernel.testkit import Recorder, running

    with running((BUILDER, Recorder), (executor("terminal"), TerminalExecutor, settings)) as rt:
        with rt.probe(BUILDER) as builder:
            action = TerminalAction(type="terminal", payload={"command": command})
            rt.send(executor("terminal"), ActionRequest(action=action, context=CTX))
            [result] = builder.expect(ActionOutput, timeout=10).body.results
    return result


def test_a_disabled_executor_refuses_and_says_so() -> None:
    result = executor_result(TerminalSettings(allowed_commands=["echo"]), "echo hi")
    assert result.ok is False
    assert result.output == "refused: the terminal executor is off"


def test_without_the_terminal_the_llm_is_not_offered_it(make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    app = make_app(base_url=fake_llm.base_url, terminal=False)
    ask(app, "run df -h")
    assert [t["function"]["name"] for t in fake_llm.requests[0].body["tools"]] == ["message_console"]
    system = fake_llm.requests[0].messages[0]["content"]
    assert "terminal" not in system
    assert not app.runtime.has(executor("terminal"))


def test_only_allowlisted_programs_run(make_app: MakeApp, fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    victim = tmp_path / "precious"
    victim.write_text("keep me")
    app = make_app(base_url=fake_llm.base_url, allowed=["echo"])
    with app.runtime.probe(executor("terminal")) as ran:
        ask(app, f"run rm -f {victim}")
        assert ran.envelopes == []  # refused before it went out
    assert victim.exists()
    assert refusals(fake_llm) == ["terminal: 'rm' is not on the allowlist (allowed: echo)"]
    assert delivered_outputs(fake_llm) == []
    assert "I did not run `rm -f" in console_text(app) and "not on the allowlist" in console_text(app)


def test_the_executor_refuses_an_off_allowlist_command_that_reaches_it() -> None:
    """The dispatcher's check is a courtesy to the LLM; the executor checks for itself
    (a request resumed from the journal after the allowlist was narrowed reaches it)."""
    result = executor_result(TerminalSettings(enabled=True, allowed_commands=["echo"]), "rm -rf /")
    assert result.ok is False
    assert result.output == "refused: 'rm' is not on the allowlist (allowed: echo)"


@pytest.mark.parametrize("joiner", ["; ", " && ", " | ", " || ", " > "])
def test_there_is_no_shell(make_app: MakeApp, fake_llm: FakeLLMServer, tmp_path: Path, joiner: str) -> None:
    victim = tmp_path / "x"
    victim.write_text("keep me")
    app = make_app(base_url=fake_llm.base_url, allowed=["df", "rm"])
    ask(app, f"run df -h{joiner}rm -rf {victim}")
    assert victim.read_text() == "keep me"
    [refused] = refusals(fake_llm)
    assert "commands run without a shell" in refused


def test_quoted_operators_are_just_text() -> None:
    assert parse_command("echo 'a;b' \"c|d\"", ["echo"]) == ["echo", "a;b", "c|d"]
    result = asyncio.run(run_command(["echo", "a;b"], label="echo", timeout=5, output_cap=100))
    assert result.output == "a;b\n"


@pytest.mark.parametrize(
    ("command", "reason"),
    [("/bin/echo hi", "by name, not by path"), ("echo 'unclosed", "cannot parse"), ("", "empty"),
     ("nosuchprogram-xyz", "not on the allowlist")],
)
def test_refusals_say_why(command: str, reason: str) -> None:
    with pytest.raises(CommandRefused, match=reason):
        parse_command(command, ["echo"])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_a_timeout_kills_the_whole_process_group() -> None:
    script = "sleep 60 & echo $!; wait"
    started = time.monotonic()
    result = asyncio.run(run_command(["sh", "-c", script], label="sh", timeout=0.5, output_cap=1000))
    assert time.monotonic() - started < 30  # it did not wait for the sleeps
    grandchild = int(re.search(r"^(\d+)$", result.output, re.M).group(1))  # type: ignore[union-attr]
    until = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < until:
        time.sleep(0.05)
    assert not _alive(grandchild), "the background child outlived the timeout"
    assert result.ok is False
    assert "timed out after 0.5s: the process group was killed" in result.output


def _group(pgid: int) -> list[int]:
    """The processes of group ``pgid`` still alive (zombies do not count)."""
    members = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            state, _parent, group = stat.rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state not in ("Z", "X"):
            members.append(int(entry))
    return members


def _left_in_group(pgid: int) -> list[int]:
    """What of group ``pgid`` is still alive a few seconds on (a SIGKILL takes a moment);
    killed then, so that a failing run leaves nothing behind."""
    until = time.monotonic() + 5
    while (left := _group(pgid)) and time.monotonic() < until:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    return left


@pytest.mark.parametrize("helper", ["sleep 60 &", "sleep 60 >/dev/null 2>&1 &"],
                         ids=["holding-its-output", "apart"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_command_is_done_when_its_own_process_exits_and_its_helper_goes_with_it(
        helper: str, loop: EventLoopKind) -> None:
    """A script that starts a helper with ``&`` and exits at once: the user gets its exit
    code and output, not a timeout (even while the helper holds its output open), and the
    helper does not outlive it."""
    script = f"{helper} echo $$; exit 3"  # $$: the script's pid, its process group's id
    with asyncio.Runner(loop_factory=lambda: new_event_loop(loop)) as runner:
        result = runner.run(asyncio.wait_for(
            run_command(["sh", "-c", script], label="script", timeout=3, output_cap=1000), 30))
    pgid = int(result.output.split()[0])
    left = _left_in_group(pgid)
    assert result.output == f"{pgid}\n"  # no "[timed out ...]"
    assert result.exit_code == 3 and not result.ok
    assert left == [], "the helper outlived the command"


def test_a_command_cancelled_once_its_own_process_exited_leaves_no_helper(tmp_path: Path) -> None:
    """A user's /cancel (or a shutdown) of a command whose own process is gone while a
    helper of it runs on, holding its output open: the helper is killed too."""
    gate = Gate(tmp_path / "gate")  # the script's own process ends when the test opens it

    async def cancelled_when_its_helper_runs() -> int:
        task = asyncio.create_task(run_command(["sh", "-c", f"sleep 61.7 & {gate.command}"],
                                               label="script", timeout=30, output_cap=1000))
        while not (helpers := _processes("sleep", "61.7")):
            await asyncio.sleep(0.01)
        pgid = os.getpgid(helpers[0])
        gate.open()
        await asyncio.wait([task], timeout=2)  # its own process exits at once; then the cancel
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return pgid

    pgid = asyncio.run(asyncio.wait_for(cancelled_when_its_helper_runs(), 30))
    assert _left_in_group(pgid) == [], "the helper outlived the cancel"


def _processes(*argv: str, parent: int | None = None) -> list[int]:
    """The pids running exactly ``argv`` (children of ``parent``, if given)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[:-1]
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if cmdline == [a.encode() for a in argv] and parent in (None, ppid):
            found.append(int(entry))
    return found


#: A daemon in small: runs one long command, on the event loop named by its argument.
_DAEMON = """
import asyncio, sys
from autoresponse.actors.kernel._loop import new_event_loop
from autoresponse.interfaces.terminal.command import run_command
with asyncio.Runner(loop_factory=lambda: new_event_loop(sys.argv[1])) as runner:
    runner.run(run_command(["sleep", "300"], label="sleep", timeout=600, output_cap=100))
"""


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_command_dies_with_a_daemon_killed_with_kill_9(loop: EventLoopKind) -> None:
    """Else a restarted daemon resumes the request and runs the command again, beside it."""
    daemon = subprocess.Popen([sys.executable, "-c", _DAEMON, loop])
    try:
        [command] = wait_for(lambda: _processes("sleep", "300", parent=daemon.pid), timeout=30)
    finally:
        daemon.kill()
        daemon.wait()
    until = time.monotonic() + 10
    while _alive(command) and time.monotonic() < until:
        time.sleep(0.05)
    orphaned = _alive(command)
    if orphaned:
        os.kill(command, signal.SIGKILL)
    assert not orphaned, "the command outlived its daemon"


def test_the_checked_argv_is_what_runs() -> None:
    """Whatever starts the command, its words reach the program as they were checked."""
    result = asyncio.run(run_command(["echo", "--", "--pdeathsig", "KILL"], label="echo",
                                     timeout=5, output_cap=100))
    assert result.output == "-- --pdeathsig KILL\n"


def test_output_is_capped_with_a_note() -> None:
    result = asyncio.run(run_command(["seq", "1", "100000"], label="seq", timeout=10, output_cap=1000))
    kept, note = result.output[:1000], result.output[1000:]
    assert kept.startswith("1\n2\n3\n")
    assert result.truncated
    everything = len("".join(f"{n}\n" for n in range(1, 100_001)))
    assert note == f"\n[output cut: {everything - 1000} more bytes not shown]"  # all of it read
    assert result.ok and result.exit_code == 0  # cutting the output is not a failure of the command


def test_a_verbose_command_runs_to_its_end_past_the_cap_and_its_exit_code_counts(tmp_path: Path) -> None:
    """Past the cap its output is read and dropped, never left to fill the pipe nor cut short
    by a kill: `tar -v` or `make` finishes its work, and fails by its own exit code."""
    done = tmp_path / "done"
    script = f"seq 1 20000; sleep 0.2; touch {done}; exit 3"
    result = asyncio.run(run_command(["sh", "-c", script], label="verbose", timeout=10, output_cap=1000))
    assert done.exists() and result.exit_code == 3 and not result.ok and result.truncated


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_endless_output_ends_at_the_timeout_on_either_event_loop(loop: EventLoopKind) -> None:
    """``yes`` never ends: its timeout kills it, and the call returns (on asyncio's own loop,
    the wait after the kill used to wait for the pipe for ever)."""
    with asyncio.Runner(loop_factory=lambda: new_event_loop(loop)) as runner:
        result = runner.run(asyncio.wait_for(
            run_command(["yes"], label="yes", timeout=1, output_cap=1000), 30))
    assert result.output.startswith("y\n" * 500 + "\n[output cut: ")
    assert result.output.endswith("more bytes not shown]\n[timed out after 1s: the process group was killed]")
    assert not result.ok and result.truncated


def test_a_non_zero_exit_is_delivered_through_the_llm(make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    app = make_app(base_url=fake_llm.base_url, allowed=["ls"])
    from autoresponse.actors.routes import sender
    from autoresponse.messages import OutboundMessage

    with app.runtime.probe(sender("console")) as out:
        ask(app, "run ls /no/such/directory")
        [reply] = out.bodies(OutboundMessage)
    [output] = delivered_outputs(fake_llm)
    assert output["ok"] is False and output["exit_code"] == 2
    assert "No such file or directory" in output["output"]
    assert "`ls /no/such/directory` failed (exit 2)" in reply.text


def test_the_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESPONSE_LLM__API_KEY", "sk-do-not-leak")
    result = asyncio.run(run_command(["env"], label="env", timeout=5, output_cap=10_000))
    assert "sk-do-not-leak" not in result.output
    assert "PATH=/usr/local/bin:/usr/bin:/bin" in result.output.splitlines()
    assert os.environ["AUTORESPONSE_LLM__API_KEY"] == "sk-do-not-leak"


# --------------------------------------------------------------- argument rules

@pytest.mark.parametrize(
    ("command", "refusal"),
    [
        # date reads files (-f echoes their lines in its errors; -r reads their metadata) ...
        ("date -f /etc/shadow",
         "'date -f' is refused: it reads or writes files or changes the machine"),
        ("date -f/etc/shadow", "'date -f' is refused"),  # value attached
        ("date -uf/etc/shadow", "'date -f' is refused"),  # bundled after another flag
        ("date -u -f /etc/shadow", "'date -f' is refused"),
        ("date +%s -f /etc/shadow", "'date -f' is refused"),  # getopt finds options after operands
        ("date --file=/etc/shadow", "'date --file' is refused"),
        # GNU getopt_long takes any unambiguous abbreviation, down to one letter.
        ("date --fil=/etc/shadow", "'date --file' is refused"),
        ("date --f=/etc/shadow", "'date --file' is refused"),
        ("date --fi /etc/shadow", "'date --file' is refused"),
        ("date --=/etc/shadow", "'date --file' is refused"),
        ("date -- -f /etc/shadow", "'date -f' is refused"),
        ("date -d -- -f /etc/shadow", "'date -f' is refused"),  # that -- is the value of -d
        ("date -r /etc/shadow", "'date -r' is refused"),
        ("date --ref=/etc/shadow", "'date --reference' is refused"),
        # ... and sets the clock.
        ("date -s 2030-01-01", "'date -s' is refused"),
        ("date -us now", "'date -s' is refused"),
        ("date --set=2030-01-01", "'date --set' is refused"),
        ("date --se=2030-01-01", "'date --set' is refused"),
        ("date 010100002030",
         "'date 010100002030' is refused: 'date' takes only operands matching '\\+.*'"),
        ("date -- 010100002030", "'date 010100002030' is refused"),
        ("date -u 0101", "'date 0101' is refused"),
        # hostname with any argument can set the host name.
        ("hostname evil", "'hostname' is allowed only without arguments"),
        ("hostname -- evil", "'hostname' is allowed only without arguments"),
        ("hostname -F /etc/shadow", "'hostname' is allowed only without arguments"),
        ("hostname -b", "'hostname' is allowed only without arguments"),
        # coreutils' uptime reads a FILE operand as its utmp file.
        ("uptime /etc/shadow", "'uptime /etc/shadow' is refused: 'uptime' takes no operands"),
        ("uptime -- /etc/shadow", "'uptime /etc/shadow' is refused"),
        # Names are exact, as on the file system: DATE is not date.
        ("DATE -f /etc/shadow", "'DATE' is not on the allowlist"),
    ],
)
def test_refused_arguments_say_why(command: str, refusal: str) -> None:
    with pytest.raises(CommandRefused) as refused:
        parse_command(command, DEMO_COMMANDS)
    assert str(refused.value).startswith(refusal)


@pytest.mark.parametrize(
    "command",
    ["date", "date +%s", "date -u +%F", "date -- +%s", "date -Iseconds", "date -R",
     "date --rfc-3339=seconds", "date -d@1700000000", "date -dfriday", "date --date=tomorrow",
     "date --debug", "hostname", "uptime", "uptime -p", "df -h /", "uname -sr", "whoami",
     "free -h", "echo -f --file --set hi"],
)
def test_harmless_arguments_still_run(command: str) -> None:
    assert parse_command(command, DEMO_COMMANDS) == command.split()


def test_an_option_value_given_apart_must_be_attached() -> None:
    # The rule does not know which options take a value, so `tomorrow` counts as an operand.
    with pytest.raises(CommandRefused, match=r"attached, as in --option=VALUE"):
        parse_command("date -d tomorrow", ["date"])


def test_the_shipped_rules_hold_for_any_allowlist_until_a_program_has_its_own() -> None:
    settings = TerminalSettings(allowed_commands=["date", "echo"],
                                arguments={"echo": {"max_args": 1}})
    assert set(settings.arguments) >= {"date", "hostname", "uptime", "echo"}
    with pytest.raises(CommandRefused, match="'date -f' is refused"):
        parse_command("date -f /etc/hostname", settings.allowed_commands, settings.arguments)
    with pytest.raises(CommandRefused, match="'echo' is allowed at most 1 arguments"):
        parse_command("echo a b", settings.allowed_commands, settings.arguments)
    # A configured rule replaces the shipped one for its program, as a whole.
    relaxed = TerminalSettings(allowed_commands=["date"], arguments={"date": {}})
    assert parse_command("date -r /etc/hostname", ["date"], relaxed.arguments)


def test_argument_rules_come_from_toml_and_the_environment(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from autoresponse.config import Settings

    config = tmp_path / "autoresponse.toml"
    config.write_text('[terminal]\nallowed_commands = ["date", "echo"]\n\n'
                      '[terminal.arguments.echo]\nrefuse = ["-e", "--help"]\nmax_args = 3\n')
    monkeypatch.setenv("AUTORESPONSE_TERMINAL__ARGUMENTS__UPTIME",
                       '{"operands": ["/var/run/utmp"]}')
    terminal = Settings.load(config).terminal
    assert terminal.arguments["echo"] == ArgumentRule(refuse=("-e", "--help"), max_args=3)
    assert terminal.arguments["uptime"] == ArgumentRule(operands=("/var/run/utmp",))
    assert terminal.arguments["date"] == DEFAULT_ARGUMENT_RULES["date"]
    with pytest.raises(CommandRefused, match="'echo -e' is refused"):
        parse_command("echo -ne 'a\\tb'", terminal.allowed_commands, terminal.arguments)


def test_the_rules_the_daemon_page_shows_are_the_shipped_ones() -> None:
    """A user who copies the manual's example keeps every rule that ships."""
    import tomllib

    page = (Path(__file__).resolve().parent.parent / "docs" / "daemon.md").read_text()
    example = tomllib.loads(page.split("```toml\n", 1)[1].split("```", 1)[0])
    shown = {name: ArgumentRule(**rule) for name, rule in example["terminal"]["arguments"].items()}
    assert shown == {name: DEFAULT_ARGUMENT_RULES[name] for name in shown}
    assert set(shown) == {"date", "hostname"}  # and the prose names the third: uptime's
    assert "`uptime FILE`" in page


@pytest.mark.parametrize(
    ("rule", "error"),
    [({"refused": ["-f"]}, "Extra inputs are not permitted"),  # a typo must not allow everything
     ({"refuse": ["file"]}, "is not an option like -f or --file"),
     ({"refuse": ["-file"]}, "is not an option like -f or --file"),
     ({"takes_value": ["--date"]}, "is not a short option like -d"),
     ({"operands": ["("]}, "missing \\)"),
     ({"max_args": -1}, "greater than or equal to 0")],
)
def test_a_bad_rule_is_a_settings_error(rule: dict, error: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=error):
        TerminalSettings(arguments={"date": rule})


def test_a_refused_argument_reads_nothing_and_the_llm_hears_why(
        make_app: MakeApp, fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("hunter2\n")
    app = make_app(base_url=fake_llm.base_url, allowed=["date"])
    ask(app, f"run date -f {secret}")
    assert refusals(fake_llm) == ["terminal: 'date -f' is refused: it reads or writes files or changes the machine"]
    assert "hunter2" not in json.dumps([r.body for r in fake_llm.requests])


def test_an_allowed_date_really_runs(make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    app = make_app(base_url=fake_llm.base_url, allowed=["date"])
    ask(app, "run date -u +%Y")
    [output] = delivered_outputs(fake_llm)
    assert output["ok"] is True and re.fullmatch(r"\d{4}\n", output["output"])


def test_a_nul_character_is_refused_not_a_crash() -> None:
    with pytest.raises(CommandRefused, match="NUL"):
        parse_command("echo a\0b", ["echo"])
