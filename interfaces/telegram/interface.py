"""The Telegram interface: long polling or webhooks with python-telegram-bot, embedded
in our loop.

PTB's ``Bot`` runs on the runtime's event loop, in a polling task this actor's
incarnation owns (never ``run_polling``: no thread, no signal handlers). Each
update is journaled before the next ``getUpdates`` offset acknowledges it,
then becomes a message in this actor's mailbox; authorization and addressing
are decided here.

Updates are fetched as raw JSON and parsed one by one, so one malformed update
is logged, dead-lettered with its raw form and acknowledged, and the updates
behind it flow on. An update without a usable ``update_id`` cannot be acknowledged,
so Telegram sends it again: it is dead-lettered once, and a poll that acknowledged
nothing is a failed poll, backed off like any other. Polling asks for no more
updates than the intake has room for, and waits while it has none.

In a group, an album's items come one by one, and the one that mentions the bot
may come last: the items before it are held for the album's gather window
(``ALBUM_GATHER_SECONDS``) and taken in with it, or dropped when the window closes.

With ``webhook_url`` set, the incarnation owns a webhook server instead
(``webhook.py``): Telegram posts each update, and gets its 200 once the update is
journaled, through the same ``_receive`` as a polled one.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict
from telegram import Bot, Message, MessageEntity, Update
from telegram.error import TelegramError

from autoresponse.actors.kernel import IoTask, TypedActor, handles
from autoresponse.actors.kernel.backoff import Backoff, BackoffPolicy
from autoresponse.actors.approvals import APPROVALS, FORGED
from autoresponse.actors.limits import ALBUM_GATHER_SECONDS
from autoresponse.actors.inbound import accept_input, dead_letter_malformed, take_request, turn_context
from autoresponse.actors.polling import PollHealth, polling
from autoresponse.interfaces.telegram import INTERFACE_NAME
from autoresponse.interfaces.telegram.approval import TelegramCallback, answer_callback, answer_of, parse_callback
from autoresponse.interfaces.telegram.delivery import TelegramDelivery, refusal
from autoresponse.messages.approval import ApprovalVerdict
from autoresponse.interfaces.telegram.media import attachments_of
from autoresponse.interfaces.telegram.settings import (
    TELEGRAM_MAX_UPDATES,
    TelegramSettings,
    listen_address,
)
from autoresponse.interfaces.telegram.webhook import CLOSE_SECONDS, WebhookServer
from autoresponse.messages import Attachment, Envelope, OriginalContext

log = logging.getLogger("autoresponse.telegram")

#: Wait after failed getUpdates calls: 0.5 s, doubling, at most 30 s.
POLL_BACKOFF = BackoffPolicy(min=0.5, max=30.0, jitter=0.1)
#: Albums addressed to the bot in groups, remembered so their uncaptioned items are too.
ALBUMS_REMEMBERED = 256
#: Group album items not (yet) addressed to the bot, held for their album's gather window
#: in case a later item mentions it; past this many the oldest is dropped.
ALBUM_ITEMS_HELD = 100
#: Updates without a usable update_id, remembered so that one Telegram sends again and
#: again is dead-lettered once.
UNREADABLE_REMEMBERED = 64
#: A webhook secret shorter than this is easy to guess; the daemon says so at start.
WEBHOOK_SECRET_ADVISED = 16


class TelegramText(BaseModel):
    """A text message received by the bot."""

    model_config = ConfigDict(frozen=True)

    update_id: int
    chat_id: int
    chat_type: str
    message_id: int
    thread_id: int | None = None
    user_id: int | None = None
    user_name: str | None = None
    chat_title: str | None = None
    text: str
    #: In a group: the message mentions the bot or replies to one of its messages.
    addressed: bool = False
    #: The mentions of the bot in ``text``, to cut from the request.
    mentions: tuple[str, ...] = ()
    #: A photo, voice note, file, sticker, place, contact or poll, by file id (``text`` is its caption).
    attachments: tuple[Attachment, ...] = ()
    #: The album the message is part of: its items are answered as one turn.
    media_group: str | None = None


class AlbumWindowDue(BaseModel):
    """The gather window of a group album whose held items never addressed the bot is up (a
    timer of the interface); ``first`` names the item that opened it, so a late timer
    closes no newer window of the same album."""

    model_config = ConfigDict(frozen=True)

    media_group: str
    first: str


class AlbumWindowClose(BaseModel):
    """Drop an album's held items, after whatever was already queued (sent to the
    interface's own mailbox, behind the album's items still to come)."""

    model_config = ConfigDict(frozen=True)

    media_group: str
    first: str


class _AlbumWindow(NamedTuple):
    """The gather window of an album whose items are held: the item that opened it, its timer."""

    first: str
    timer: IoTask | None


def _mentions_of_bot(message: Message, bot_username: str | None, bot_id: int | None) -> list[str]:
    """The entities of ``message`` that name exactly this bot: ``@username`` (not
    ``@username_suffix``) or a text mention of its user id."""
    found = []
    wanted = f"@{bot_username}".lower() if bot_username else None
    kinds = [MessageEntity.MENTION, MessageEntity.TEXT_MENTION]
    for entity, text in {**message.parse_entities(kinds), **message.parse_caption_entities(kinds)}.items():
        if entity.type == MessageEntity.MENTION and wanted is not None and text.lower() == wanted:
            found.append(text)
        elif entity.type == MessageEntity.TEXT_MENTION and entity.user is not None and entity.user.id == bot_id:
            found.append(text)
    return found


def _names_another_bot(command: str, bot_username: str | None) -> bool:
    """``command`` (``/cmd@name``) names a bot, and not this one."""
    _, at, name = command.partition("@")
    return bool(at) and name.lower() != (bot_username or "").lower()


def parse_update(update: Update, bot_username: str | None, bot_id: int | None, *,
                 edits: bool = False) -> TelegramText | None:
    """The message an update carries (a text, or media with its caption), or None when it
    carries none we answer (an edit, unless ``edits``; a service message; a channel post)."""
    message = update.message or (update.edited_message if edits else None)
    if message is None:
        return None
    attachments = attachments_of(message)
    if message.text is None and not attachments:
        return None
    user = message.from_user
    mentions = _mentions_of_bot(message, bot_username, bot_id)
    # A command addressed to this bot in a group (/cancel@synth_bot) is meant for it too;
    # it stays in the text, where the conversation reads the command.
    commands = message.parse_entities([MessageEntity.BOT_COMMAND])
    commanded = bool(bot_username) and any(
        text.lower().endswith(f"@{bot_username}".lower()) for text in commands.values())
    replied = (message.reply_to_message is not None and message.reply_to_message.from_user is not None
               and message.reply_to_message.from_user.id == bot_id)
    # A message that opens with another bot's command (/cancel@other_bot) is for that bot,
    # even as a reply to ours: taken, our conversation would read it as our /cancel.
    elsewhere = any(entity.offset == 0 and _names_another_bot(text, bot_username)
                    for entity, text in commands.items())
    return TelegramText(
        update_id=update.update_id,
        chat_id=message.chat.id,
        chat_type=message.chat.type,
        message_id=message.message_id,
        thread_id=message.message_thread_id if message.is_topic_message else None,
        user_id=user.id if user else None,
        user_name=(user.username or user.full_name) if user else None,
        chat_title=message.chat.title or message.chat.username,
        text=message.text if message.text is not None else message.caption or "",
        addressed=(bool(mentions) or replied or commanded) and not elsewhere,
        mentions=tuple(mentions),
        attachments=attachments,
        media_group=message.media_group_id,
    )


def text_context(text: TelegramText) -> OriginalContext:
    """Where ``text`` came from, and where its answers go."""
    return OriginalContext(
        chat_id=text.chat_id,
        message_id=text.message_id,
        interface_name=INTERFACE_NAME,
        original_command=text.text,
        thread_id=text.thread_id,
        user_id=text.user_id,
        user_name=text.user_name,
        chat_type=text.chat_type,
        chat_title=text.chat_title,
    )


def origin(settings: TelegramSettings) -> Callable[[Any], OriginalContext | None]:
    """Who sent a ``TelegramText`` (``Mount.origin``): its chat, when the bot would have
    answered it (an allowed user; in a group, a message that mentions or answers the bot).
    A stranger hears nothing (refused, ignored, or an autonomous turn); None too for a
    message that cannot be read."""
    def of(text: Any) -> OriginalContext | None:
        try:
            context = text_context(text)
            if context.is_group and text.addressed is not True:
                return None  # chatter not meant for the bot (or an album's uncaptioned item: unsure)
            return turn_context(context, allowed=text.user_id in settings.allowed_users, policy=settings)
        except Exception:  # a malformed input: nobody to tell
            return None
    return of


#: Webhook mode: how often Telegram is asked whether it can deliver to the webhook.
WEBHOOK_CHECK_SECONDS = 60.0


def webhook_health(registered: str, url: str, error_date: dt.datetime | None, error: str | None,
                   pending: int, *, heard: float) -> tuple[bool, str]:
    """How the webhook fares, from Telegram's getWebhookInfo: failing when it points elsewhere
    now, or when Telegram failed to deliver since the last call we got (its dates are whole
    seconds) and updates wait."""
    if registered != url:
        where = f"is {registered}" if registered else "is not set (deleteWebhook?)"
        return False, f"Telegram's webhook {where}, not {url}: no update reaches this daemon"
    if error_date is not None and error_date.timestamp() >= int(heard) and pending:
        return False, f"Telegram cannot deliver to the webhook: {error}"
    return True, ""


class TelegramInterface(TypedActor):
    """Polls the Bot API, or serves its webhook calls, in a task this incarnation owns; a
    crash or stop cancels it (and closes the webhook server)."""

    def __init__(self, settings: TelegramSettings, delivery: TelegramDelivery) -> None:
        super().__init__()
        self.settings = settings
        self.delivery = delivery
        self._bot: Bot = delivery.bot  # the platform initializes and shuts it down
        self._username: str | None = None
        self._webhook: WebhookServer | None = None
        self._albums_addressed: OrderedDict[str, None] = OrderedDict()
        #: Group album items not addressed to the bot (yet), held, oldest first: message id → envelope.
        self._album_items: OrderedDict[str, Envelope] = OrderedDict()
        #: The albums whose items are held: media group → its gather window.
        self._album_windows: dict[str, _AlbumWindow] = {}
        #: Updates without a usable update_id dead-lettered lately (their JSON), oldest first.
        self._unreadable: OrderedDict[str, None] = OrderedDict()

    def setup(self) -> None:
        self._username = self._bot.username
        if self.settings.webhook_url is not None:
            self._serve_webhook(self.settings.webhook_url)
            return
        self.runtime.io.run(self._bot.delete_webhook(), timeout=60)
        self.start_task(self._poll(), "getUpdates")
        log.info("polling Telegram as @%s", self._username)

    def _serve_webhook(self, url: str) -> None:
        """Listen first, then tell Telegram where to post, so no call finds nobody there."""
        secret = self.settings.webhook_secret
        assert secret is not None  # the settings refuse a webhook_url without one
        server = self._webhook = WebhookServer(listen_address(self.settings.webhook_listen), url, secret,
                                               receive=self._receive, malformed=self._malformed,
                                               monotonic=self.runtime.clock.monotonic,
                                               wall=self.runtime.clock.time)
        self.runtime.io.run(server.start(), timeout=30)  # a port in use fails this start, saying so
        self.start_task(server.serve(), "webhook")  # owned: closed when this incarnation ends
        try:
            self.runtime.io.run(self._bot.set_webhook(url=url, secret_token=secret.get_secret_value(),
                                                      allowed_updates=self.allowed_updates), timeout=60)
        except BaseException as exc:
            why = refusal("setWebhook", exc) if isinstance(exc, TelegramError) else None
            if why is not None:  # shown as failing while the restarts keep asking
                self.report_health(False, why)
            self._close_webhook()  # a failed setup gets no teardown; the next one needs the port
            raise
        self.report_health(True)
        self.start_task(self._watch_webhook(url, server), "webhook check")
        log.info("receiving Telegram webhooks on %s (for %s) as @%s", server.url, url, self._username)
        if len(secret.get_secret_value()) < WEBHOOK_SECRET_ADVISED:
            log.warning("the Telegram webhook secret has fewer than %d characters: whoever guesses "
                        "it can post updates as your allowed users", WEBHOOK_SECRET_ADVISED)

    async def _watch_webhook(self, url: str, server: WebhookServer) -> None:
        """Webhook mode: ask Telegram every WEBHOOK_CHECK_SECONDS how delivering to us goes,
        so that a dead webhook (Telegram cannot reach it, or it points elsewhere now) or a
        revoked token shows as failing; nothing else would tell, since nobody calls."""
        set_at = self.runtime.clock.time()
        while True:
            await self.runtime.clock.sleep(WEBHOOK_CHECK_SECONDS)
            try:
                info = await self._bot.get_webhook_info()
            except TelegramError as exc:
                why = refusal("getWebhookInfo", exc)
                if why is not None:
                    self.report_health(False, why)
                continue  # a network failure says nothing about the webhook
            heard = max(set_at, server.last_call or 0.0)
            self.report_health(*webhook_health(info.url, url, info.last_error_date, info.last_error_message,
                                               info.pending_update_count, heard=heard))

    def teardown(self) -> None:
        # The webhook stays registered with Telegram on purpose: another daemon behind the
        # same balancer may still serve it, and Telegram keeps what it could not deliver
        # (for a day) until one of them, or this one restarted, answers.
        self._close_webhook()

    def _close_webhook(self) -> None:
        """Free the webhook's port before a next incarnation binds it (the owned task's
        cancellation starts the close; this waits for it)."""
        if self._webhook is None:
            return
        try:
            self.runtime.io.run(self._webhook.close(), timeout=CLOSE_SECONDS + 5)
        except Exception as exc:  # the loop already gone: the server went with it
            log.warning("closing the Telegram webhook server failed: %s: %s", type(exc).__name__, exc)
        self._webhook = None

    @property
    def allowed_updates(self) -> list[str]:
        kinds = ["message", "edited_message"] if self.settings.edited_messages else ["message"]
        if self.runtime.has(APPROVALS):  # approvals' buttons, pressed
            kinds.append("callback_query")
        return kinds

    async def _poll(self) -> None:
        """Long polling that acknowledges an update (the next offset) only once it is journaled.

        PTB's Updater acknowledges as soon as it has queued updates, so a kill at the
        wrong moment would lose them; here the journal has them first.
        """
        bot, intake = self._bot, self.runtime.intake
        timeout = self.settings.poll_timeout
        offset: int | None = None
        failures = Backoff(POLL_BACKOFF, clock=self.runtime.clock.monotonic)
        health = PollHealth(self.report_health)  # a refusal shows in the status and /healthz
        # Several daemons: only the holder of the account's lease polls, from the shared offset.
        async with polling(self.runtime.journal, f"telegram-{bot.id}", report=self.report_health) as shared:
            if shared is not None and shared.position:
                offset = int(shared.position)
            while True:
                if shared is not None:
                    shared.check()  # another daemon polls now: stop (the restart waits for the lease)
                await intake.room()  # backpressure: fetch nothing while the runtime is full
                limit = max(1, min(TELEGRAM_MAX_UPDATES, intake.free()))
                try:
                    raw = await self._get_updates(offset, limit, timeout)
                except TelegramError as exc:
                    delay = failures.next_delay()
                    why = refusal("getUpdates", exc)
                    if why is not None:  # shown as failing at once: no retry will fix it
                        health.refused(why)
                    else:
                        health.failed(f"getUpdates failed: {type(exc).__name__}: {exc}")
                    log.warning("getUpdates failed (%s); retrying in %.1fs", exc, delay)
                    await self.runtime.clock.sleep(delay)
                    continue
                before = offset
                for item in raw[:TELEGRAM_MAX_UPDATES]:
                    update_id = await self._receive(item)
                    if update_id is not None:
                        offset = max(offset or 0, update_id + 1)
                if raw and offset == before:
                    # Nothing acknowledged (no usable update_id): Telegram answers the same at
                    # once, so polling on would spin; it backs off, and shows as failing.
                    delay = failures.next_delay()
                    health.failed(f"getUpdates keeps returning {len(raw)} update(s) without a usable "
                                  "update_id: they cannot be acknowledged, so Telegram sends them again")
                    log.warning("getUpdates returned %d update(s) that cannot be acknowledged; polling "
                                "again in %.1fs", len(raw), delay)
                    await self.runtime.clock.sleep(delay)
                    continue
                failures.reset()
                health.worked()
                if shared is not None and offset is not None and raw:
                    await shared.save(str(offset))

    async def _get_updates(self, offset: int | None, limit: int, timeout: float) -> list[Any]:
        """One long poll's updates, as raw JSON; an answer that cannot be read is a failed
        poll (a TelegramError), retried with the same backoff as any other."""
        try:
            # Raw JSON on purpose (PTB warns once): get_updates parses the whole batch, so
            # one malformed update would fail them all, forever.
            raw = await self._bot.do_api_request(
                "getUpdates", api_kwargs={"offset": offset, "limit": limit, "timeout": timeout,
                                          "allowed_updates": self.allowed_updates},
                read_timeout=timeout + 10)
        except (KeyError, ValueError, TypeError, RecursionError) as exc:  # PTB read an answer of another shape
            raise TelegramError(f"getUpdates answered what cannot be read ({type(exc).__name__})") from None
        if not isinstance(raw, list):
            raise TelegramError(f"getUpdates returned {type(raw).__name__}, not a list")
        return raw

    async def _receive(self, item: Any) -> int | None:
        """Journal one update as Telegram sent it (polled or posted), or dead-letter it;
        its update_id, or None when it has none (it cannot be acknowledged by id)."""
        update_id = item.get("update_id") if isinstance(item, dict) else None
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            if self._first_time_unreadable(item):  # unacknowledged, it comes back: one dead letter
                self._malformed(item, "it has no update_id")
            return None
        await self._take(item, update_id)
        return update_id

    async def _take(self, item: dict[str, Any], update_id: int) -> None:
        """Journal one update (or dead-letter it when it cannot be read)."""
        bot = self._bot
        if "callback_query" in item:
            await self._take_callback(item, update_id)
            return
        try:
            parsed = parse_update(Update.de_json(item, bot), self._username, bot.id,
                                  edits=self.settings.edited_messages)
        except Exception as exc:  # a malformed update: PTB raises KeyError, TypeError, ...
            self._malformed(item, f"{type(exc).__name__}: {exc}")
            return
        if parsed is not None:
            await accept_input(self, parsed, f"telegram-{bot.id}-{update_id}")

    def _malformed(self, item: Any, why: str) -> None:
        dead_letter_malformed(self, item, "malformed update", why)

    def _first_time_unreadable(self, item: Any) -> bool:
        """Whether ``item`` (an update without a usable update_id) was not seen lately."""
        try:
            key = json.dumps(item, sort_keys=True)
        except (TypeError, ValueError, RecursionError):  # not remembered: dead-lettered each time
            return True
        seen = key in self._unreadable
        self._unreadable[key] = None
        self._unreadable.move_to_end(key)
        while len(self._unreadable) > UNREADABLE_REMEMBERED:
            self._unreadable.popitem(last=False)
        return not seen

    @handles
    def on_text(self, text: TelegramText, env: Envelope) -> None:
        context = text_context(text)
        if context.is_group and not self._addressed(text):
            if text.media_group is not None:  # a later item of its album may mention the bot
                self._hold_album_item(text.media_group, env)
            return  # group chatter not meant for the bot
        if context.is_group and text.media_group is not None:
            self._take_held_items(text.media_group)  # the album's items before this one come first
        self._take_text(text, context, env)

    def _take_text(self, text: TelegramText, context: OriginalContext, env: Envelope) -> None:
        self.delivery.reachable(text.chat_id)  # whoever blocked us writes again: they unblocked us
        request = text.text
        for mention in text.mentions:
            request = request.replace(mention, "")
        take_request(self, request.strip() or text.text, context, env,
                     allowed=text.user_id in self.settings.allowed_users, policy=self.settings,
                     attachments=text.attachments, media_group=text.media_group)

    def _addressed(self, text: TelegramText) -> bool:
        """Meant for the bot (in a group): it mentions or answers the bot, or belongs to an
        album whose captioned item did (the others have no caption)."""
        albums = self._albums_addressed
        if text.media_group is None:
            return text.addressed
        if text.addressed:
            albums[text.media_group] = None
            while len(albums) > ALBUMS_REMEMBERED:
                albums.popitem(last=False)
        return text.media_group in albums

    def _hold_album_item(self, media_group: str, env: Envelope) -> None:
        """Hold an album's item that does not address the bot for the album's gather window."""
        if media_group not in self._album_windows:
            timer = self.schedule(ALBUM_GATHER_SECONDS, AlbumWindowDue(media_group=media_group,
                                                                       first=env.message_id), cause=env)
            self._album_windows[media_group] = _AlbumWindow(env.message_id, timer)
        self.hold(env)
        self._album_items[env.message_id] = env
        while len(self._album_items) > ALBUM_ITEMS_HELD:
            _, dropped = self._album_items.popitem(last=False)
            self.release(dropped)

    def _held_of(self, media_group: str) -> list[Envelope]:
        """Take the held items of ``media_group`` out, in the order they came; its window closes."""
        window = self._album_windows.pop(media_group, None)
        if window is not None:
            self.cancel(window.timer)
        found = [env for env in self._album_items.values() if env.body.media_group == media_group]
        for env in found:
            del self._album_items[env.message_id]
        return found

    def _take_held_items(self, media_group: str) -> None:
        """The album addresses the bot after all: its held items are taken in."""
        for env in self._held_of(media_group):
            self._take_text(env.body, text_context(env.body), env)
            self.release(env)

    @handles
    def on_album_window_due(self, due: AlbumWindowDue, env: Envelope) -> None:
        # A timer comes ahead of queued work: the album's items already queued go first.
        self.send(self.name, AlbumWindowClose(media_group=due.media_group, first=due.first), cause=env)

    @handles
    def on_album_window_close(self, close: AlbumWindowClose, env: Envelope) -> None:
        window = self._album_windows.get(close.media_group)
        if window is None or window.first != close.first:
            return  # taken in, or a newer window of the album is open
        for held in self._held_of(close.media_group):
            self.release(held)  # it was not for the bot: dropped without a word

    # ---------------------------------------------------------------- approvals' buttons

    async def _take_callback(self, item: dict[str, Any], update_id: int) -> None:
        """Journal a button press (or dead-letter it when it cannot be read)."""
        try:
            query = Update.de_json(item, self._bot).callback_query
            assert query is not None
            callback = parse_callback(query, update_id)
        except Exception as exc:  # a malformed update
            self._malformed(item, f"{type(exc).__name__}: {exc}")
            return
        await accept_input(self, callback, f"telegram-{self._bot.id}-{update_id}")

    @handles
    def on_callback(self, callback: TelegramCallback, env: Envelope) -> None:
        """A press goes to the approvals desk, which decides whether it counts."""
        if not self.runtime.has(APPROVALS):
            log.warning("refused a button press from user %s: no approval waits here (%s)", callback.user_id,
                        callback.data[:80])
            self.on_verdict(ApprovalVerdict(callback_id=callback.callback_id, text=FORGED, accepted=False), env)
            return
        self.send(APPROVALS, answer_of(callback, INTERFACE_NAME, self.name), cause=env)

    @handles
    def on_verdict(self, verdict: ApprovalVerdict, env: Envelope) -> None:
        self.run_io(answer_callback(self._bot, verdict), cause=env)
