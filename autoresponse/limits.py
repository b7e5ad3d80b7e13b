"""Every limit of the runtime, each in one place.

Settings take their defaults from here; code that needs a limit imports it from
here instead of writing the number again.
"""

#: Messages one correlation (one user request) may travel before its chain is
#: ended as a loop. A "run df -h" round trip takes about eight.
MAX_HOPS = 32

#: Work items an actor's mailbox holds before its overflow policy applies.
MAILBOX_CAPACITY = 10_000

#: How long a sender waits for room in a full mailbox whose policy is BLOCK.
MAILBOX_BLOCK_SECONDS = 5.0

#: Dead letters kept in memory for inspection; counts are kept for all of them.
DEAD_LETTERS_KEPT = 10_000

#: Longest text a message action may carry. Senders split it further to fit
#: their platform; anything longer is an invalid payload the LLM is asked to fix.
MAX_MESSAGE_CHARS = 32_000

#: Longest command line the LLM may ask the terminal executor to run.
MAX_COMMAND_CHARS = 1_000

#: Longest LLM reply kept verbatim in an error system message (`your_reply`).
MAX_YOUR_REPLY_CHARS = 4_000

#: Errors listed in one error system message; the rest are counted.
MAX_ERRORS_SHOWN = 10

#: Bytes of command output kept; the rest is cut with a note.
COMMAND_OUTPUT_CAP = 16_000

#: Seconds a command may run before its whole process group is killed.
COMMAND_TIMEOUT_SECONDS = 20.0

#: LLM HTTP: attempts per request (the first one included), and timeouts.
LLM_MAX_ATTEMPTS = 4
LLM_CONNECT_TIMEOUT_SECONDS = 10.0
LLM_READ_TIMEOUT_SECONDS = 120.0
#: Longest Retry-After we honour; a server asking for more is treated as down.
LLM_MAX_RETRY_AFTER_SECONDS = 60.0
#: LLM requests in flight at once, over all chats.
LLM_MAX_IN_FLIGHT = 64

#: Seconds `stop()` waits for in-flight work to finish before stopping actors.
DRAIN_SECONDS = 10.0

#: Times a message is handed to an actor that crashes on it before it is
#: dead-lettered (the first attempt included).
MESSAGE_ATTEMPTS = 3

#: Restart intensity: a supervisor restarting more than this many children
#: within the period gives up and fails to its parent.
MAX_RESTARTS = 20
RESTART_PERIOD_SECONDS = 10.0

#: Backoff between restarts of one child.
RESTART_BACKOFF_MIN_SECONDS = 0.01
RESTART_BACKOFF_MAX_SECONDS = 5.0
RESTART_BACKOFF_JITTER = 0.2
RESTART_BACKOFF_RESET_SECONDS = 30.0

#: Re-asks of the LLM after it answered with invalid actions (per work item).
RETRY_MAX_ATTEMPTS = 2
RETRY_BACKOFF_MIN_SECONDS = 0.5
RETRY_BACKOFF_MAX_SECONDS = 8.0
#: Retry actors in the pool; a correlation always lands on the same one.
RETRY_POOL_SIZE = 4

#: Telegram: longest message, in UTF-16 code units as Telegram counts them.
TELEGRAM_MESSAGE_UTF16 = 4096
#: Telegram's flood limits: one message a second per chat, 30 a second overall,
#: 20 a minute per group.
TELEGRAM_CHAT_INTERVAL_SECONDS = 1.0
TELEGRAM_GLOBAL_PER_SECOND = 30
TELEGRAM_GROUP_PER_MINUTE = 20
#: Attempts per chunk on TimedOut/NetworkError, and waits on RetryAfter per chunk.
TELEGRAM_SEND_ATTEMPTS = 3
TELEGRAM_MAX_RETRY_AFTERS = 5
#: Seconds a getUpdates long poll waits for updates.
TELEGRAM_POLL_TIMEOUT_SECONDS = 10

#: Events: how often due reminders are looked for, and how long a reminder
#: handed to the LLM may stay unconfirmed before it is tried again.
EVENTS_CHECK_SECONDS = 5.0
EVENTS_UNCONFIRMED_SECONDS = 300.0

#: Seconds a supervisor waits for one child's setup before starting the next.
START_SECONDS = 30.0

#: Finished work items stay in the journal this long before compaction.
JOURNAL_RETENTION_SECONDS = 24 * 3600.0

#: Telegram sends in flight at once (Telegram takes 30 a second overall anyway);
#: more only grows the HTTP connection pool, which costs CPU per request.
TELEGRAM_MAX_CONCURRENT_SENDS = 32
