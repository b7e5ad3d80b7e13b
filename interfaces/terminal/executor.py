"""The terminal executor actor: runs `terminal` actions, hands the result to the builder.

A user's ``/cancel`` reaches it as ``CancelWork``, ahead of its queue: the commands of
that request are cancelled, which kills each one's process group (``run_command``), and
a command of it still queued never starts.
"""

from __future__ import annotations

import logging

from autoresponse.actors.cancellation import abort_io, is_cancelled
from autoresponse.actors.kernel import TypedActor, handles
from autoresponse.actors.routes import BUILDER
from autoresponse.interfaces.terminal.command import CommandRefused, parse_command, run_command
from autoresponse.interfaces.terminal.settings import TerminalSettings
from autoresponse.messages import ActionRequest, ActionResult, Envelope
from autoresponse.messages.approval import CancelWork

log = logging.getLogger("autoresponse.terminal")


def command_argv(settings: TerminalSettings, command: str) -> list[str]:
    """The argv ``command`` runs as under ``settings``; raises ``CommandRefused`` (the
    executor is off, the program is off the allowlist, an argument is refused). The
    dispatcher asks it before a command goes out, and the executor again before it runs."""
    if not settings.enabled:
        raise CommandRefused("the terminal executor is off")
    return parse_command(command, settings.allowed_commands, settings.arguments)


class TerminalExecutor(TypedActor):
    """Every outcome, refusals and failures included, goes back through the LLM."""

    def __init__(self, settings: TerminalSettings) -> None:
        super().__init__()
        self.settings = settings
        self.io_limit = settings.max_concurrent

    @handles
    def on_action(self, request: ActionRequest, env: Envelope) -> None:
        if is_cancelled(self.runtime, env.correlation_id):
            return  # its user cancelled the request before it ran
        command = request.action.payload.command
        try:
            argv = command_argv(self.settings, command)
        except CommandRefused as exc:
            refused = ActionResult(action_type="terminal", command=command,
                                   output=f"refused: {exc}", ok=False)
            self._deliver(request, refused, env)
            return
        self.run_io(
            run_command(argv, label=command, timeout=self.settings.timeout,
                        output_cap=self.settings.output_cap),
            cause=env,
        )

    @handles
    def on_result(self, result: ActionResult, env: Envelope) -> None:
        if is_cancelled(self.runtime, env.correlation_id):
            return  # it ended as its user cancelled it: nobody waits for its output
        self._deliver(env.body, result, env)

    @handles
    def on_cancel(self, cancel: CancelWork, env: Envelope) -> None:
        killed = abort_io(self, cancel.correlations)
        if killed:
            log.info("killed %d command(s) of a cancelled request in %s", killed, cancel.chat)

    def _deliver(self, request: ActionRequest, result: ActionResult, env: Envelope) -> None:
        self.send(BUILDER, request.output(result), cause=env)
