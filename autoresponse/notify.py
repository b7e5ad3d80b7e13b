"""systemd's readiness protocol (``sd_notify``), without a dependency.

Under ``Type=notify`` systemd sets ``NOTIFY_SOCKET`` and waits for ``READY=1``
before it counts the service as started (and starts what comes after it).
``autoresponse run`` sends it once the whole tree is up, the journal's unfinished
work resumed and the admin endpoint listening; ``STOPPING=1`` when a stop begins;
``STATUS=...`` lines, which ``systemctl status`` shows, along the way.

>>> notifier = Notifier.from_environment()        # doctest: +SKIP
>>> notifier.ready("serving: 23 actors")          # doctest: +SKIP

Without ``NOTIFY_SOCKET`` every call does nothing. A notification that cannot be
sent is logged and otherwise ignored: systemd's own timeouts deal with a service
that never reports, and the daemon must not fail over its supervisor's mailbox.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("autoresponse.notify")

#: What a stop may take beyond the drain (stopping the actors and threads, closing the
#: journal); the systemd unit's TimeoutStopSec leaves the same margin.
STOP_MARGIN_SECONDS = 20.0


class Notifier:
    """Sends ``KEY=value`` lines, one datagram per call, to the socket systemd named."""

    def __init__(self, address: str | None) -> None:
        #: The socket's path; an abstract socket's name starts with a NUL byte (``@`` in the
        #: variable). None: nobody listens, nothing is sent.
        if address and address.startswith("@"):
            address = "\0" + address[1:]
        self.address = address or None

    @classmethod
    def from_environment(cls) -> Notifier:
        return cls(os.environ.get("NOTIFY_SOCKET"))

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` (e.g. ``"READY=1"``, ``"STATUS=..."``); True if they were sent."""
        if self.address is None:
            return False
        try:
            message = "\n".join(f.replace("\n", " ") for f in fields).encode()
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.settimeout(1.0)
                sock.sendto(message, self.address)
        except (OSError, ValueError) as exc:  # ValueError: a path with a NUL byte, text that is not UTF-8
            log.warning("cannot notify the service manager at %s (%s): %s",
                        self.address.replace("\0", "@"), ", ".join(fields), exc)
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}")

    def stopping(self, status: str, *, within: float | None = None) -> bool:
        """A stop began. ``within``: seconds it may take, to extend systemd's stop timeout
        when that is shorter (``EXTEND_TIMEOUT_USEC``, systemd 236 and later)."""
        extend = [f"EXTEND_TIMEOUT_USEC={int(within * 1_000_000)}"] if within else []
        return self.notify("STOPPING=1", f"STATUS={status}", *extend)

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")
