"""Running one allowlisted program: no shell, a timeout, an output cap, a scrubbed env.

>>> parse_command("df -h", allowed=["df"])
['df', '-h']
>>> parse_command("df -h; rm -rf /", allowed=["df", "rm"])
Traceback (most recent call last):
...
autoresponse.interfaces.terminal.command.CommandRefused: shell operator ';' is not supported: commands run without a shell
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
from collections.abc import Collection

from autoresponse.messages import ActionResult

#: Where allowlisted programs are looked up; the user's PATH is not trusted.
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_OPERATOR_CHARS = frozenset("();<>|&")
_READ_CHUNK = 65_536


class CommandRefused(Exception):
    """The command may not run; the message says why, for the user."""


def parse_command(command: str, allowed: Collection[str]) -> list[str]:
    """Split ``command`` like a shell would, without giving it any shell powers."""
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
    return argv


def _scrubbed_env() -> dict[str, str]:
    """Nothing of ours (tokens, keys) reaches the child."""
    return {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb",
            "HOME": "/nonexistent"}


async def run_command(argv: list[str], *, label: str, timeout: float, output_cap: int) -> ActionResult:
    """Run ``argv`` in a new process group; stdout and stderr together, capped."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=_scrubbed_env(),
        start_new_session=True,  # its own process group, so a timeout kills every descendant
    )
    kept = bytearray()
    dropped = 0

    async def read() -> None:
        nonlocal dropped
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(_READ_CHUNK):
            room = output_cap - len(kept)
            kept.extend(chunk[:room])
            dropped += max(0, len(chunk) - room)

    timed_out = False
    try:
        await asyncio.wait_for(asyncio.gather(read(), proc.wait()), timeout)
    except asyncio.TimeoutError:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    finally:
        if proc.returncode is None:  # cancelled from outside (shutdown): leave nothing behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    output = kept.decode("utf-8", errors="replace")
    if dropped:
        output += f"\n[output cut: {dropped} more bytes not shown]"
    if timed_out:
        output += f"\n[timed out after {timeout:g}s: the process group was killed]"
        return ActionResult(action_type="terminal", command=label, output=output, ok=False,
                            truncated=bool(dropped))
    return ActionResult(action_type="terminal", command=label, output=output,
                        exit_code=proc.returncode, truncated=bool(dropped))
