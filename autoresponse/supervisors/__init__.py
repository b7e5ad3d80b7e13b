"""Supervision and the application tree: specs, the supervisor, status, the admin
endpoint, config, the tree the daemon runs, and its CLI."""

from autoresponse.supervisors.app import Application, make_engine
from autoresponse.supervisors.backoff import Backoff
from autoresponse.supervisors.config import LLMSettings, RuntimeSettings, Settings
from autoresponse.supervisors.spec import (
    BackoffPolicy,
    ChildSpec,
    Restart,
    RestartIntensity,
    Strategy,
    SupervisorSpec,
)
from autoresponse.supervisors.status import ActorStatus, Status, snapshot
from autoresponse.supervisors.supervisor import Escalation, StartChild, Supervisor

__all__ = [
    "ActorStatus",
    "Application",
    "Backoff",
    "BackoffPolicy",
    "ChildSpec",
    "Escalation",
    "LLMSettings",
    "Restart",
    "RestartIntensity",
    "RuntimeSettings",
    "Settings",
    "StartChild",
    "Status",
    "Strategy",
    "Supervisor",
    "SupervisorSpec",
    "make_engine",
    "snapshot",
]
