"""The actor kernel: typed actors with stable names, bounded mailboxes, one event
loop, one clock, in-flight counting, the intake, dead letters and the test kit.

Everything here is generic: no platform, no LLM, no prompt. The pipeline's actors
(``autoresponse.actors.builder``, ``.dispatcher``, ``.llm``, ...) are written on top of it.

>>> from pydantic import BaseModel
>>> from autoresponse.actors.kernel import TypedActor, handles
>>> from autoresponse.actors.kernel.testkit import Recorder, running
>>> from autoresponse.messages import Envelope
>>> class Ping(BaseModel):
...     n: int
>>> class Pong(BaseModel):
...     n: int
>>> class Echo(TypedActor):
...     @handles
...     def on_ping(self, msg: Ping, env: Envelope) -> None:
...         self.send("sink", Pong(n=msg.n), cause=env)
>>> with running(("echo", Echo), ("sink", Recorder)) as runtime, runtime.probe("sink") as sink:
...     sent = runtime.send("echo", Ping(n=1))
...     sink.expect(Pong, timeout=5).body
Pong(n=1)
"""

from autoresponse.actors.kernel._loop import IoTask, new_event_loop
from autoresponse.actors.kernel._mailbox import Mailbox, MailboxClosed, OverflowPolicy
from autoresponse.actors.kernel.actor import ActorGaveUp, TypedActor, handles
from autoresponse.actors.kernel.cell import Cell, restart_and_dead_letter
from autoresponse.actors.kernel.clock import Clock, ManualClock
from autoresponse.actors.kernel.cores import pinned_core, run_on_all_cores, run_on_one_core, starting_children
from autoresponse.actors.kernel.deadletters import DeadLetter, DeadLetterOffice
from autoresponse.actors.kernel.heap import tune_heap_for_serving
from autoresponse.actors.kernel.inflight import InFlight
from autoresponse.actors.kernel.intake import Intake, IntakeFull, Unstorable
from autoresponse.actors.kernel.probe import Probe, ProbeTimeout
from autoresponse.actors.kernel.runtime import NotReplayable, Runtime

__all__ = [
    "ActorGaveUp",
    "Cell",
    "Clock",
    "DeadLetter",
    "DeadLetterOffice",
    "InFlight",
    "IoTask",
    "Intake",
    "IntakeFull",
    "Unstorable",
    "Mailbox",
    "MailboxClosed",
    "NotReplayable",
    "ManualClock",
    "OverflowPolicy",
    "Probe",
    "ProbeTimeout",
    "Runtime",
    "TypedActor",
    "handles",
    "new_event_loop",
    "pinned_core",
    "restart_and_dead_letter",
    "run_on_all_cores",
    "run_on_one_core",
    "starting_children",
    "tune_heap_for_serving",
]
