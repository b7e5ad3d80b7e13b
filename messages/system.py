"""What the runtime tells the LLM: action outputs, due events and errors.

A system message is a prompt, never an action: text that carries one is never
executed, even when the LLM echoes it back.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoresponse.messages.context import OriginalContext


class ActionResult(BaseModel):
    """The outcome of one executed action.

    >>> ActionResult(action_type="terminal", command="true", output="", exit_code=0).ok
    True
    """

    model_config = ConfigDict(frozen=True)

    action_type: str
    command: str | None = None
    output: str
    ok: bool = True
    exit_code: int | None = None
    truncated: bool = False

    @model_validator(mode="after")
    def _exit_code_decides(self) -> ActionResult:
        if self.exit_code is not None and self.exit_code != 0 and self.ok:
            object.__setattr__(self, "ok", False)
        return self


class Batch(BaseModel):
    """The actions of one LLM reply that run together; their outputs come back in one
    delivery turn. ``commands`` describes each, to say which are still running."""

    model_config = ConfigDict(frozen=True)

    key: str
    index: int
    commands: tuple[str, ...]


class ActionOutput(BaseModel):
    """One or more action results to deliver to one chat in one LLM turn."""

    model_config = ConfigDict(frozen=True)

    original_context: OriginalContext
    results: tuple[ActionResult, ...] = Field(min_length=1)
    #: The batch the action was part of, when its reply held several.
    batch: Batch | None = None


class DueEvent(BaseModel):
    """A reminder that fell due."""

    model_config = ConfigDict(frozen=True)

    description: str
    due: str
    late_seconds: float = 0.0


class Position(BaseModel):
    """What became of one action of a rejected reply, by its place in that reply: a
    re-ask shows the list, and its answer may only replace the rejected places."""

    model_config = ConfigDict(frozen=True)

    index: int
    #: The action's type as the LLM wrote it ("" when it had none).
    type: str = ""
    #: Carried out (a message delivered, a command run) or rejected, with why.
    done: bool
    error: str = ""
    #: A short excerpt of what it said or ran, to name it in the re-ask.
    excerpt: str = ""
    #: The native tool call it came from, if any (answered by a ``tool`` turn).
    tool_call_id: str | None = None
    #: What may take a rejected place: a message, a command, or either (its type was
    #: no registered action, so what it meant is unknown).
    kind: Literal["message", "command", "any"] = "any"


class SystemMessage(BaseModel):
    """A message from the runtime to the LLM.

    ``type`` is "output" (action results to format for the user), "event" (a
    reminder fell due) or "error" (the LLM's reply was rejected). Every one
    carries ``full_json_instructions`` for the actions allowed in its turn.
    """

    model_config = ConfigDict(frozen=True)

    type: Literal["output", "event", "error"]
    original_context: OriginalContext
    full_json_instructions: str
    outputs: tuple[ActionResult, ...] = ()
    event: DueEvent | None = None
    errors: tuple[str, ...] = ()
    your_reply: str | None = None
    error_retry_policy: str | None = None
    #: In an error message: what became of each action of the rejected reply.
    positions: tuple[Position, ...] = ()

    @model_validator(mode="after")
    def _fields_match_type(self) -> SystemMessage:
        if self.type == "output" and not self.outputs:
            raise ValueError("an output system message needs at least one output")
        if self.type == "event" and self.event is None:
            raise ValueError("an event system message needs its event")
        if self.type == "error" and not (self.errors and self.error_retry_policy):
            raise ValueError("an error system message needs errors and error_retry_policy")
        return self
