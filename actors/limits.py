"""The runtime's limits, each in one place.

Settings take their defaults from here; code that needs a limit imports it from
here instead of writing the number again. A platform's own limits (Telegram's
flood rules, the terminal's output cap) live in its ``interfaces/<platform>/settings.py``;
the longest message an action may carry is part of the protocol
(``messages.actions.MAX_MESSAGE_CHARS``).
"""

#: Messages one correlation (one user request) may travel before its chain is
#: ended as a loop. A "run df -h" round trip takes about eight.
MAX_HOPS = 32

#: Work items an actor's mailbox holds before its overflow policy applies.
MAILBOX_CAPACITY = 10_000

#: How long a sender waits for room in a full mailbox whose policy is BLOCK.
MAILBOX_BLOCK_SECONDS = 5.0

#: Dead letters kept for inspection (in memory, and in the journal); counts are kept for all.
DEAD_LETTERS_KEPT = 10_000
#: Requests whose failure the user was told of, remembered so that each is told once.
FAILURES_REMEMBERED = 10_000
#: Characters of an input that could not be read (a platform's update, a journal's work item)
#: kept in its dead letter.
MALFORMED_KEPT = 16_000

#: Longest LLM reply kept verbatim in an error system message (`your_reply`).
MAX_YOUR_REPLY_CHARS = 4_000
#: A re-ask quotes at most this much of the reply it rejects (its start and its end).
REASK_EXCERPT_CHARS = 600
#: Characters per token when a request's size is estimated (JSON tokenizes worse than prose).
CHARS_PER_TOKEN = 3
#: Tokens of a context window left unused, for what the estimate misses (chat templates).
CONTEXT_MARGIN_TOKENS = 96

#: Errors listed in one error system message; the rest are counted.
MAX_ERRORS_SHOWN = 10

#: Longest LLM reply the extractor reads; a longer one is rejected unread (and the
#: LLM asked again). Far above a real answer; it bounds what one reply can cost.
MAX_REPLY_CHARS = 200_000
#: Deepest nesting of brackets the extractor hands to the JSON decoder; deeper JSON
#: is rejected as such, so no decoder or check ever recurses past this.
MAX_JSON_DEPTH = 64
#: Actions one reply may hold; a reply with more is rejected whole, none carried out.
MAX_ACTIONS_PER_REPLY = 10

#: LLM HTTP: attempts per request (the first one included), and timeouts.
LLM_MAX_ATTEMPTS = 4
LLM_CONNECT_TIMEOUT_SECONDS = 10.0
LLM_READ_TIMEOUT_SECONDS = 120.0
#: Longest one LLM HTTP attempt may take, from connecting to the body's last byte
#: (a server dripping a byte at a time never trips the read timeout alone).
LLM_REQUEST_TIMEOUT_SECONDS = 120.0
#: Longest one LLM call may take over all its attempts and the waits between them.
LLM_DEADLINE_SECONDS = 300.0
#: Largest LLM response body read; a bigger answer is an error, not unbounded memory.
LLM_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
#: Longest Retry-After we honour; a server asking for more is treated as down.
LLM_MAX_RETRY_AFTER_SECONDS = 60.0
#: How long a stream is read on once its reply is complete (its finish reason came): what
#: may follow (the usage, ``[DONE]``) is worth this much; a server that keeps the stream
#: open past it loses nothing of the reply.
LLM_STREAM_END_GRACE_SECONDS = 2.0
#: LLM requests in flight at once, over all chats.
LLM_MAX_IN_FLIGHT = 64
#: Tokens a reply may use (max_tokens): a Telegram message is at most 4096 characters,
#: about 1,000 tokens, and a turn's JSON around it a little more.
LLM_MAX_TOKENS = 1_200
#: Tokens of the one shorter, unconstrained try after an enforced answer ran to its limit.
LLM_SHORT_RETRY_TOKENS = 300
#: An engine that failed this many calls in a row is skipped for a cool-down.
LLM_BREAKER_FAILURES = 5
LLM_BREAKER_COOLDOWN_SECONDS = 60.0
#: Chats whose request a server refused as too big and then took smaller, remembered (per
#: engine; past this the oldest is forgotten) so that each one's next requests start at the
#: size that fitted.
LLM_NARROWED_CHATS_REMEMBERED = 10_000
#: Longest model name kept from an LLM server's reply (its ``model`` field: the server, or a
#: proxy in front of it, decides it); a longer one is cut here, so that a metric's label,
#: the status and a span stay small. A real model's name is far shorter.
LLM_MODEL_NAME_CHARS = 100
#: Model names the usage meter counts tokens under; the tokens of any model named after
#: these are counted under "other", so that its counters (and /metrics) stop growing
#: with every new name a server reports.
LLM_MODELS_COUNTED = 32

#: What a user sends besides words (read in the LLM hop): the largest photo size sent to a
#: vision model, the largest file downloaded at all (a document, a voice note), the
#: characters of a text file inlined into the prompt, and how long reading a message's
#: files may take (its downloads and transcriptions together).
MEDIA_MAX_IMAGE_BYTES = 1_000_000
MEDIA_MAX_FILE_BYTES = 5_000_000
MEDIA_MAX_DOCUMENT_CHARS = 8_000
MEDIA_TIMEOUT_SECONDS = 30.0
#: Items of one message group (a Telegram album) read in one turn; an album holds at most 10.
MEDIA_MAX_ITEMS = 10
#: Downloads of one message group (an album) in flight at once; together, not each, they
#: take at most MEDIA_TIMEOUT.
MEDIA_CONCURRENT_DOWNLOADS = 4
#: How long a conversation gathers the messages of one group (an album) into one turn.
ALBUM_GATHER_SECONDS = 1.0

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
#: Conversation actors; a chat always lands on the same one, so its turns keep their order.
CONVERSATION_POOL_SIZE = 4

#: Seconds a supervisor waits for one child's setup before starting the next.
START_SECONDS = 30.0

#: Finished work items stay in the journal this long before compaction.
JOURNAL_RETENTION_SECONDS = 24 * 3600.0
#: How often a running journal forgets what its retention has passed.
JOURNAL_COMPACT_SECONDS = 600.0
#: Dead letters stay in the journal this long (and at most DEAD_LETTERS_KEPT of them).
DEAD_LETTER_RETENTION_SECONDS = 7 * 24 * 3600.0

#: Work items accepted from outside and not yet finished, at most; past this the
#: sources are told to wait (HTTP 503 with Retry-After, polling pauses, the console blocks).
MAX_OPEN_ITEMS = 1_000
#: What a source told to wait is told to wait for (HTTP Retry-After).
INTAKE_RETRY_AFTER_SECONDS = 2.0
#: Our HTTP servers (the admin endpoint, Telegram's webhook) close a connection that has
#: not sent a whole request within this, or sat idle this long between two: a client that
#: sends a byte a second holds its connection no longer (aiohttp's own default is an hour).
HTTP_IDLE_SECONDS = 30.0
#: At close, our HTTP servers give the requests under way this long to finish, then cut
#: them: one stuck request must not hold up the stop (aiohttp's own default is a minute).
HTTP_CLOSE_SECONDS = 2.0
#: Admin requests whose bodies are being read at once; past this, a request is answered
#: 503 at once: a few clients dribbling bodies cannot hold every connection.
ADMIN_MAX_BODIES_READ = 16
#: Conversation memory: the token budget of each chat's memory (about four characters a
#: token), how long it is kept, and how much of an action's output it keeps.
MEMORY_MAX_TOKENS = 2_000
MEMORY_RETENTION_SECONDS = 30 * 24 * 3600.0
MEMORY_OUTPUT_LINES = 5
MEMORY_OUTPUT_CHARS = 600

#: How long the outputs of one reply's commands are waited for, to deliver them in one
#: turn; after that what is done goes out, and the rest follows on its own.
BATCH_WAIT_SECONDS = 30.0

#: Traces: the finished correlations kept in memory, and the hops kept of each. Those still
#: in flight are all kept too, up to TRACES_IN_FLIGHT_KEPT more; past that the oldest goes,
#: finished or not (a daemon's journaled intake holds far fewer open: MAX_OPEN_ITEMS).
TRACES_KEPT = 2_000
TRACE_HOPS_KEPT = 256
TRACES_IN_FLIGHT_KEPT = 50_000

#: A streamed reply is previewed once it has this many characters, then at most once
#: per PREVIEW_SECONDS (Telegram allows about one message or edit a second per chat).
PREVIEW_MIN_CHARS = 12
PREVIEW_SECONDS = 1.0
#: How often a streamed reply's text so far is looked at, at most.
STREAM_WATCH_SECONDS = 0.1

#: Chats listed when a chat name the LLM gave is ambiguous (the re-ask stays short).
CHAT_CANDIDATES_SHOWN = 10

#: Several daemons on NATS JetStream. A work item taken by a worker is redelivered to
#: another once it has not heard from that worker for NATS_ACK_WAIT_SECONDS (a worker
#: reports progress three times per period while the item runs). A poller's lease
#: lapses NATS_LEASE_SECONDS after its holder last renewed it.
NATS_ACK_WAIT_SECONDS = 30.0
NATS_LEASE_SECONDS = 15.0
#: A message id seen again within this window is not published twice (a re-poll, a
#: second webhook call, a second poller).
NATS_DUPLICATE_WINDOW_SECONDS = 600.0
#: Work items asked for at once (never more than the intake has room for).
NATS_FETCH_BATCH = 64
#: A chat's item waiting for an earlier one of that chat is looked at again after this.
NATS_ORDER_RETRY_SECONDS = 0.2
#: Deliveries of one work item at most (a worker that takes it dies each time: stop).
NATS_MAX_DELIVERIES = 10
NATS_CONNECT_TIMEOUT_SECONDS = 5.0

#: JSON bodies from outside (the admin endpoint, Telegram's webhook) nest at most this
#: deep; what comes after the parse walks them.
JSON_BODY_MAX_DEPTH = 32

#: Seconds an action that needs approval waits for a decision, unless configured
#: (``approval_timeout``); then it expires and does not run.
APPROVAL_TIMEOUT_SECONDS = 300.0

#: Longest line of an LLM's event stream, as long as aiohttp 3.14 read one (a delta is a few
#: hundred bytes, a whole reply in one delta far less): longer, the stream is malformed.
LLM_MAX_STREAM_LINE_BYTES = 512 * 1024

#: Strangers (senders not on a platform's allowlist) are answered within bounds, per
#: stranger and platform, in a window that starts at their first message: at most one
#: refusal (``strangers = "refuse"``: it says the same every time), at most STRANGER_TURNS
#: autonomous turns (``strangers = "converse"``); past either, their messages are journaled
#: and closed unanswered, the first of them logged. Two bots answering each other, or one
#: stranger's script, stop there. Unless configured (``stranger_turns``, ``stranger_window``).
STRANGER_TURNS = 10
STRANGER_WINDOW_SECONDS = 3600.0
#: Strangers whose windows are remembered (an LRU, over all platforms); one forgotten starts afresh.
STRANGERS_REMEMBERED = 10_000
