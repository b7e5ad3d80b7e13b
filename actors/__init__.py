"""The runtime kernel and the platform-neutral pipeline actors.

>>> from autoresponse.actors import Runtime, TypedActor, handles
"""

from autoresponse.actors._loop import IoTask
from autoresponse.actors._mailbox import Mailbox, MailboxClosed, OverflowPolicy
from autoresponse.actors.actor import ActorGaveUp, TypedActor, handles
from autoresponse.actors.cell import Cell, restart_and_dead_letter
from autoresponse.actors.deadletters import DeadLetter, DeadLetterOffice
from autoresponse.actors.inflight import InFlight
from autoresponse.actors.intake import Intake, IntakeFull, Unstorable
from autoresponse.actors.probe import Probe, ProbeTimeout
from autoresponse.actors.runtime import Runtime

__all__ = [
    "ActorGaveUp",
    "Cell",
    "DeadLetter",
    "DeadLetterOffice",
    "InFlight",
    "IoTask",
    "Intake",
    "IntakeFull",
    "Unstorable",
    "Mailbox",
    "MailboxClosed",
    "OverflowPolicy",
    "Probe",
    "ProbeTimeout",
    "Runtime",
    "TypedActor",
    "handles",
    "restart_and_dead_letter",
]
