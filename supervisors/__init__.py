"""Supervision: child specs, the supervisor and its strategies, status snapshots,
and the platform registry that the application tree is assembled from.

>>> from autoresponse.supervisors import ChildSpec, Strategy, Supervisor, SupervisorSpec
"""

from autoresponse.actors.kernel.backoff import Backoff, BackoffPolicy
from autoresponse.supervisors.platform import (
    Mount,
    MountError,
    Platform,
    platforms,
    register_platform,
    registered,
    unregister_platform,
)
from autoresponse.supervisors.spec import (
    ChildSpec,
    Restart,
    RestartIntensity,
    Spec,
    Strategy,
    SupervisorSpec,
)
from autoresponse.supervisors.status import ActorStatus, Status, snapshot
from autoresponse.supervisors.supervisor import Escalation, StartChild, Supervisor

__all__ = [
    "ActorStatus",
    "Backoff",
    "BackoffPolicy",
    "ChildSpec",
    "Escalation",
    "Mount",
    "MountError",
    "Platform",
    "Restart",
    "RestartIntensity",
    "Spec",
    "StartChild",
    "Status",
    "Strategy",
    "Supervisor",
    "SupervisorSpec",
    "platforms",
    "register_platform",
    "registered",
    "snapshot",
    "unregister_platform",
]
