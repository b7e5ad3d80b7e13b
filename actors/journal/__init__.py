"""The delivery journal: accepted work and confirmed sends survive kill -9.

>>> journal = SqliteJournal(Path("journal.sqlite3"))              # doctest: +SKIP
>>> journal.accept(envelope, actor="llm").result()  # committed before the caller acknowledges
>>> journal.was_sent("corr:delivery:0#0")
False
"""

from autoresponse.actors.journal.journal import (
    DeliveryJournal,
    JournalCorrupt,
    JournalInUse,
    LedgerUnavailable,
    JournalItem,
    SendLedger,
    SqliteJournal,
    check_journal,
)

__all__ = ["DeliveryJournal", "JournalCorrupt", "JournalInUse", "JournalItem", "LedgerUnavailable", "SendLedger", "SqliteJournal",
           "check_journal"]
