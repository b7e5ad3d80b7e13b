"""The terminal executor actor: runs `terminal` actions, hands the result to the builder."""

from __future__ import annotations

from autoresponse.actors.kernel import TypedActor, handles
from autoresponse.actors.routes import BUILDER
from autoresponse.interfaces.terminal.command import CommandRefused, parse_command, run_command
from autoresponse.interfaces.terminal.settings import TerminalSettings
from autoresponse.messages import ActionRequest, ActionResult, Envelope


class TerminalExecutor(TypedActor):
    """Every outcome, refusals and failures included, goes back through the LLM."""

    def __init__(self, settings: TerminalSettings) -> None:
        super().__init__()
        self.settings = settings
        self.io_limit = settings.max_concurrent

    @handles
    def on_action(self, request: ActionRequest, env: Envelope) -> None:
        command = request.action.payload.command
        try:
            if not self.settings.enabled:
                raise CommandRefused("the terminal executor is off")
            argv = parse_command(command, self.settings.allowed_commands,
                                 self.settings.arguments)
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
        self._deliver(env.body, result, env)

    def _deliver(self, request: ActionRequest, result: ActionResult, env: Envelope) -> None:
        self.send(BUILDER, request.output(result), cause=env)
