"""Running one allowlisted program: no shell, a timeout, an output cap, a scrubbed env.

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
import os
import re
import shlex
import shutil
import signal
from collections.abc import Collection, Mapping

from autoresponse.actors.kernel import starting_children
from autoresponse.interfaces.terminal.settings import DEFAULT_ARGUMENT_RULES, ArgumentRule
from autoresponse.messages import ActionResult

#: Where allowlisted programs are looked up; the user's PATH is not trusted.
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_OPERATOR_CHARS = frozenset("();<>|&")
_READ_CHUNK = 65_536
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
    """Run ``argv`` in a new process group; stdout and stderr together, capped."""
    with starting_children():  # with every core, not the daemon's one
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=_scrubbed_env(),
            start_new_session=True,  # its own process group, so a timeout kills every descendant
        )
    kept = bytearray()
    dropped = 0  # bytes past the cap: read (a full pipe would stall the command), not kept

    async def finish() -> None:
        nonlocal dropped
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(_READ_CHUNK):
            room = max(0, output_cap - len(kept))
            kept.extend(chunk[:room])
            dropped += len(chunk) - min(room, len(chunk))
        await proc.wait()

    timed_out = False
    try:
        await asyncio.wait_for(finish(), timeout)
    except asyncio.TimeoutError:
        timed_out = True
    finally:
        # Timed out, or cancelled (a user's /cancel, a shutdown): leave nothing behind.
        await _stop(proc)
    output = kept.decode("utf-8", errors="replace")
    if dropped:
        output += f"\n[output cut: {dropped} more bytes not shown]"
    if timed_out:
        output += f"\n[timed out after {timeout:g}s: the process group was killed]"
        return ActionResult(action_type="terminal", command=label, output=output, ok=False,
                            truncated=bool(dropped))
    return ActionResult(action_type="terminal", command=label, output=output,
                        exit_code=proc.returncode, truncated=bool(dropped))


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Kill ``proc``'s process group (if it still runs) and reap it, within REAP_SECONDS.

    Our end of its output is closed first: asyncio's own loop finishes ``wait()`` only once
    that pipe is closed too, which a read left paused (its buffer full) never sees."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    transport = getattr(proc, "_transport", None)  # asyncio's and uvloop's: no public way to it
    pipe = transport.get_pipe_transport(1) if transport is not None else None
    if pipe is not None:
        pipe.close()
    # Reaped, so that no zombie keeps its process group alive; a cancel leaves the reaping on.
    with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
        await asyncio.wait_for(asyncio.shield(proc.wait()), REAP_SECONDS)
