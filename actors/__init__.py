"""The actors: the generic kernel (``autoresponse.actors.kernel``) and, beside it, the
platform-neutral pipeline written on it.

- ``kernel/``: the runtime: typed actors, cells, mailboxes, the event loop, the clock,
  in-flight counting, the intake, dead letters, traces, backoff, the test kit.
- the pipeline: ``conversation`` (each chat's turns in order), ``llm/`` (the LLM client
  and its engines), ``dispatcher`` and ``extractor`` (from a reply to actions),
  ``builder`` (action output back through the LLM), ``retry`` (re-asks), ``sender``,
  ``inbound``, ``receipts``, ``prompts``, ``memory``, ``streaming``, ``routes``.
- the infrastructure they stand on: ``journal/`` (SQLite and NATS), ``limits`` (every
  limit, once), ``loopback`` (a server on 127.0.0.1), ``polling`` (poller leases),
  ``jsonbody`` (bounded JSON from outside).

>>> from autoresponse.actors.kernel import Runtime, TypedActor, handles
"""
