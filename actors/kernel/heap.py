"""The garbage collector, set for a daemon: its startup heap aside, its young garbage
collected less often.

A daemon makes most of its objects once, as it starts: modules, pydantic's schemas, the
actor tree, the platforms' clients. Every full (generation 2) collection walked all of them
again: 26 to 62 ms here with the runtime serving 2,600 deliveries a second, and that pause
was the p99 latency of the whole pipeline (28 ms). Frozen, they are still freed when nothing
refers to them; the collector only stops walking them, and a full pause took 5 to 20 ms.

Then each delivery leaves a few hundred short-lived objects (envelopes, messages, dicts),
and at CPython's default the youngest generation was collected every 700 of them: several
times a delivery. Every 10,000 instead, the runtime with its journal spent 164 to 189 µs
of CPU a delivery where it spent 228 to 241 (the same machine, interleaved), for at most
10,000 young objects more in memory.

>>> frozen = tune_heap_for_serving()  # once the process has started what it serves
>>> frozen > 0
True
"""

from __future__ import annotations

import gc

#: Allocations (less deallocations) of container objects between two collections of the
#: youngest generation; CPython's default is 700. The older generations keep theirs.
YOUNG_COLLECTION_THRESHOLD = 10_000


def tune_heap_for_serving() -> int:
    """Collect what is garbage already, move every object left to the collector's
    permanent generation (``gc.freeze``), and collect the youngest generation every
    ``YOUNG_COLLECTION_THRESHOLD`` allocations; how many objects are frozen now."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, oldest)
    return gc.get_freeze_count()
