"""The delivery journal: accepted work and confirmed sends survive kill -9.

>>> from pathlib import Path
>>> from tempfile import TemporaryDirectory
>>> from autoresponse.messages import Envelope, OriginalContext, UserRequest
>>> context = OriginalContext(chat_id=1, interface_name="console")
>>> request = UserRequest(text="df -h", context=context)
>>> folder = TemporaryDirectory()
>>> journal = SqliteJournal(Path(folder.name) / "journal.sqlite3")
>>> accepted = journal.accept(Envelope.new(request, correlation_id="corr"), actor="llm")
>>> accepted.result()  # committed before the caller acknowledges
True
>>> journal.was_sent("corr:delivery:0#0")
False
>>> journal.close(); folder.cleanup()
"""

from autoresponse.actors.journal.journal import (
    DeliveryJournal,
    JournalCorrupt,
    JournalFailing,
    JournalInUse,
    JournalStorageFailed,
    LedgerUnavailable,
    JournalItem,
    SendLedger,
    SqliteJournal,
    check_journal,
)

__all__ = ["DeliveryJournal", "JournalCorrupt", "JournalFailing", "JournalInUse", "JournalItem", "JournalStorageFailed", "LedgerUnavailable", "SendLedger", "SqliteJournal",
           "check_journal"]
