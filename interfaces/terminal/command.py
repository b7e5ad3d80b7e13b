"""Running one allowlisted program: no shell, a timeout, an output cap, a scrubbed env.

A command runs in a process group of its own, and the whole group is killed once the
command is done: its own process exited, it timed out, or it was cancelled (a user's
``/cancel``, the daemon's stop). A helper it left running with ``&`` goes with it.

It dies with the daemon too, even a ``kill -9``: it starts through util-linux's
``setpriv --pdeathsig KILL --`` (exec'd, no Python code in the child), so the kernel kills
it when the daemon does. That signal reaches the command's own process only, not helpers
it started, nor a set-user-ID program. Where ``setpriv`` is missing or has no
``--pdeathsig`` (util-linux before 2.33), commands start without it: they run as before,
and a daemon killed with ``-9`` leaves them running.

>>> parse_command("df -h", allowed=["df"])
['df', '-h']
>>> parse_command("df -h; rm -rf /", allowed=["df", "rm"])
Traceback (most recent call last):
...
autoresponse.interfaces.terminal.command.CommandRefused: shell operator ';' is not supported: commands run without a shell
>>> parse_command("date -uf/etc/shadow", allowed=["date"])
Traceback (most recent call last):
...
autoresponse.interfaces.terminal.command.CommandRefused: 'date -f' is refused: it reads or writes files or changes the machine
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Collection, Mapping

from autoresponse.actors.kernel import starting_children
from autoresponse.interfaces.terminal.settings import (
    DEFAULT_ARGUMENT_RULES,
    OUTPUT_GRACE_SECONDS,
    ArgumentRule,
)
from autoresponse.messages import ActionResult

log = logging.getLogger("autoresponse.terminal")

#: Where allowlisted programs are looked up; the user's PATH is not trusted.
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_OPERATOR_CHARS = frozenset("();<>|&")
#: Seconds a killed command is waited for, to reap it (SIGKILL is not refused).
REAP_SECONDS = 5.0


class CommandRefused(Exception):
    """The command may not run; the message says why, for the user."""


def parse_command(command: str, allowed: Collection[str],
                  rules: Mapping[str, ArgumentRule] = DEFAULT_ARGUMENT_RULES) -> list[str]:
    """Split ``command`` like a shell would, without giving it any shell powers,
    and check its arguments against the program's rule in ``rules``."""
    if "\0" in command:  # no argv can hold it: refuse here rather than fail in exec
        raise CommandRefused("the command contains a NUL character")
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        argv = list(lexer)
    except ValueError as exc:
        raise CommandRefused(f"cannot parse the command: {exc}") from None
    if not argv:
        raise CommandRefused("the command is empty")
    for token in argv:
        if token and set(token) <= _OPERATOR_CHARS:
            raise CommandRefused(
                f"shell operator {token!r} is not supported: commands run without a shell"
            )
    program = argv[0]
    if "/" in program:
        raise CommandRefused(f"give the program by name, not by path: {program!r}")
    if program not in allowed:
        listed = ", ".join(sorted(allowed)) or "none"
        raise CommandRefused(f"{program!r} is not on the allowlist (allowed: {listed})")
    if shutil.which(program, path=SAFE_PATH) is None:
        raise CommandRefused(f"{program!r} is allowed but not installed here")
    if (rule := rules.get(program)) is not None:
        check_arguments(program, argv[1:], rule)
    return argv


def check_arguments(program: str, args: list[str], rule: ArgumentRule) -> None:
    """Raise ``CommandRefused`` unless ``rule`` allows ``args``.

    Programs parse options like GNU getopt, so the checks lean to refusing:
    options are looked for in every word, even after ``--``, since that ``--``
    may be the value of the option before it (``prog -d -- -f FILE``); and
    every abbreviation of a refused long option is refused (``--f`` runs
    ``--file`` when no other option starts with f), as we do not know the
    program's other options to tell which abbreviations are ambiguous.

    >>> check_arguments("hostname", ["--", "name"], ArgumentRule(max_args=0))
    Traceback (most recent call last):
    ...
    autoresponse.interfaces.terminal.command.CommandRefused: 'hostname' is allowed only without arguments
    """
    if rule.max_args is not None and len(args) > rule.max_args:
        if rule.max_args == 0:
            raise CommandRefused(f"{program!r} is allowed only without arguments")
        raise CommandRefused(f"{program!r} is allowed at most {rule.max_args} arguments")
    for word in args:
        if (option := _refused_option(word, rule)) is not None:
            raise CommandRefused(f"'{program} {option}' is refused: "
                                 "it reads or writes files or changes the machine")
    if rule.operands is None:
        return
    for operand in _operands(args):
        if not rule.operands:
            raise CommandRefused(f"'{program} {operand}' is refused: {program!r} takes no operands")
        if not any(re.fullmatch(pattern, operand) for pattern in rule.operands):
            listed = " or ".join(f"'{pattern}'" for pattern in rule.operands)
            raise CommandRefused(
                f"'{program} {operand}' is refused: {program!r} takes only operands matching "
                f"{listed} (an option's value must be attached, as in --option=VALUE)"
            )


def _refused_option(word: str, rule: ArgumentRule) -> str | None:
    """The refused option ``word`` names or holds, if any."""
    if word.startswith("--") and word != "--":
        name = word.partition("=")[0]
        return next((option for option in rule.refuse if option.startswith(name)), None)
    if word.startswith("-"):
        for letter in word[1:]:  # a bundle: -uf is -u -f
            if f"-{letter}" in rule.refuse:
                return f"-{letter}"
            if f"-{letter}" in rule.takes_value:
                return None  # the rest of the word is its value
    return None


def _operands(args: list[str]) -> list[str]:
    """The words that are not options: plain words, ``-``, and all after ``--``."""
    if "--" in args:
        end = args.index("--")
        return [w for w in args[:end] if w == "-" or not w.startswith("-")] + args[end + 1:]
    return [w for w in args if w == "-" or not w.startswith("-")]


def _scrubbed_env() -> dict[str, str]:
    """Nothing of ours (tokens, keys) reaches the child."""
    return {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb",
            "HOME": "/nonexistent"}


async def run_command(argv: list[str], *, label: str, timeout: float, output_cap: int) -> ActionResult:
    """Run ``argv`` in a new process group; stdout and stderr together, capped.

    It is done when its own process exits, or at ``timeout``; either way its group is
    killed then, and its output is what reached us by OUTPUT_GRACE_SECONDS later (a
    helper of it still holding the output does not make it a timeout)."""
    output = _Output(output_cap)
    with starting_children():  # with every core, not the daemon's one
        # Linux sends the parent-death signal when the *thread* that forked the command
        # ends. Commands start here, on the runtime's event loop thread (the executor's
        # ``run_io``): it lives as long as the runtime and ends only after every actor's
        # I/O was cancelled (each command killed in ``_end``), so only the daemon's death sends it.
        transport, _ = await asyncio.get_running_loop().subprocess_exec(
            lambda: output,
            *_dies_with_us(), *argv,  # the wrapper execs exactly the argv that was checked
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_scrubbed_env(),
            start_new_session=True,  # its own process group: one kill takes every descendant
        )
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(output.exited), timeout)
    except asyncio.TimeoutError:
        timed_out = True
    finally:
        # Done, timed out, or cancelled (a user's /cancel, a shutdown): leave nothing behind.
        await _end(transport, output)
    text = output.kept.decode("utf-8", errors="replace")
    if output.dropped:
        text += f"\n[output cut: {output.dropped} more bytes not shown]"
    if timed_out:
        text += f"\n[timed out after {timeout:g}s: the process group was killed]"
        return ActionResult(action_type="terminal", command=label, output=text, ok=False,
                            truncated=bool(output.dropped))
    return ActionResult(action_type="terminal", command=label, output=text,
                        exit_code=transport.get_returncode(), truncated=bool(output.dropped))


class _Output(asyncio.SubprocessProtocol):
    """What a command wrote, up to ``cap`` bytes; and when its own process exited, and
    when its output ended (every process holding the pipe closed it)."""

    def __init__(self, cap: int) -> None:
        loop = asyncio.get_running_loop()
        self.cap = cap
        self.kept = bytearray()
        self.dropped = 0  # bytes past the cap: read (a full pipe would stall the command), not kept
        self.exited: asyncio.Future[None] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        room = max(0, self.cap - len(self.kept))
        self.kept.extend(data[:room])
        self.dropped += len(data) - min(room, len(data))

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


async def _end(transport: asyncio.SubprocessTransport, output: _Output) -> None:
    """Kill the command's process group, reap its process (within REAP_SECONDS), and
    take the rest of its output (within OUTPUT_GRACE_SECONDS); a cancel leaves the
    waiting, never the kill."""
    try:
        # Also once its own process was reaped: the group's id is not reused while a
        # helper of it is alive, and with none left the kill finds nobody.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(transport.get_pid(), signal.SIGKILL)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(output.exited), REAP_SECONDS)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(output.ended), OUTPUT_GRACE_SECONDS)
    finally:
        transport.close()  # our end of the pipe, should anything outside its group hold it


@functools.cache
def _dies_with_us() -> tuple[str, ...]:
    """The words that start a command with the parent-death signal set: util-linux's
    ``setpriv``, found once; none where it is missing or cannot set that signal."""
    setpriv = shutil.which("setpriv", path=SAFE_PATH)
    wrapper = (setpriv, "--pdeathsig", "KILL", "--") if setpriv is not None else ()
    if wrapper and _runs(wrapper):
        return wrapper
    log.warning("setpriv --pdeathsig is not available: a command outlives a daemon killed with -9")
    return ()


def _runs(wrapper: tuple[str, ...]) -> bool:
    """``wrapper`` can start a program (an old setpriv refuses ``--pdeathsig``)."""
    try:
        probe = subprocess.run([*wrapper, "true"], env=_scrubbed_env(), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=REAP_SECONDS, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0
