"""Child specs: what a supervisor starts, and how it treats each child's exits.

>>> tree = SupervisorSpec("root", Strategy.ONE_FOR_ONE, children=(
...     ChildSpec("llm", LLMClient, args=(engine,)),
...     SupervisorSpec("retry", Strategy.SIMPLE_ONE_FOR_ONE,
...                    children=(ChildSpec("retry", RetryActor),), pool_size=4),
... ))                                                              # doctest: +SKIP
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from autoresponse.actors.kernel import OverflowPolicy, TypedActor
from autoresponse.actors.kernel.backoff import BackoffPolicy
from autoresponse.actors.limits import MAX_RESTARTS, RESTART_PERIOD_SECONDS


class Restart(enum.Enum):
    PERMANENT = "permanent"  # always restarted
    TRANSIENT = "transient"  # restarted only after an abnormal exit (a crash)
    TEMPORARY = "temporary"  # never restarted


class Strategy(enum.Enum):
    ONE_FOR_ONE = "one_for_one"  # restart the child that exited
    ONE_FOR_ALL = "one_for_all"  # restart every child
    REST_FOR_ONE = "rest_for_one"  # restart it and the children started after it
    SIMPLE_ONE_FOR_ONE = "simple_one_for_one"  # a pool of one spec, grown at run time


@dataclass(frozen=True)
class RestartIntensity:
    """At most ``max_restarts`` within ``period`` seconds; one more escalates to the parent."""

    max_restarts: int = MAX_RESTARTS
    period: float = RESTART_PERIOD_SECONDS


@dataclass(frozen=True)
class ChildSpec:
    """A worker: its stable name, how to build it, how to restart and stop it."""

    id: str
    factory: type[TypedActor]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    restart: Restart = Restart.PERMANENT
    shutdown: float = 5.0
    capacity: int | None = None
    overflow: OverflowPolicy = OverflowPolicy.HOLD


@dataclass(frozen=True)
class SupervisorSpec:
    """A supervisor and its children, started in order and stopped in reverse.

    For ``SIMPLE_ONE_FOR_ONE`` the one child spec is a template: ``pool_size``
    children named ``<template id>.<n>`` start with the supervisor, more can be
    started at run time, and messages sent to the supervisor are routed to a
    child by correlation, so the work of one request stays in order.
    """

    id: str
    strategy: Strategy
    children: tuple[ChildSpec | SupervisorSpec, ...]
    intensity: RestartIntensity = RestartIntensity()
    backoff: BackoffPolicy = BackoffPolicy()
    restart: Restart = Restart.PERMANENT
    shutdown: float = 30.0
    pool_size: int = 0
    #: For a pool: the key a message is routed by, so that messages with one key stay
    #: on one child, in order (default: the correlation: one request, one child).
    route_key: Callable[[Any, Any], str] | None = None

    def __post_init__(self) -> None:
        ids = [c.id for c in self.children]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{self.id}: child ids must be unique, got {ids}")
        if self.strategy is Strategy.SIMPLE_ONE_FOR_ONE and len(self.children) != 1:
            raise ValueError(f"{self.id}: simple_one_for_one takes exactly one child spec")


Spec = Union[ChildSpec, SupervisorSpec]  # noqa: UP007
