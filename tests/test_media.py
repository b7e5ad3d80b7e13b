"""Photos, voice notes, files, stickers, places, contacts and polls: never met with silence.

Through python-telegram-bot against the fake Bot API (which pushes the media updates
and serves getFile and the files), the fake LLM (which records what the model was sent,
and transcribes at ``/v1/audio/transcriptions``), and the user's reply. The bot and the
fake share a ManualClock: an album's gathering window is a timer the tests fire.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiohttp import web
from conftest import wait_for

from autoresponse import Application
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.limits import MEDIA_CONCURRENT_DOWNLOADS
from autoresponse.actors.llm.media import MediaReader
from autoresponse.actors.prompts import build_chat_request
from autoresponse.messages import Attachment, OriginalContext, UserRequest
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.interfaces.telegram.media import file_url
from autoresponse.testing.fake_telegram import FakeTelegramServer

ALLOWED = 7
CHAT = 42


@pytest.fixture
def fake_telegram(manual_clock: ManualClock) -> Iterator[FakeTelegramServer]:
    with FakeTelegramServer(clock=manual_clock) as server:
        yield server


def start_bot(make_app: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer,
              *, telegram: dict[str, Any] | None = None, **llm: Any) -> Application:
    """The bot on the fake Bot API, with these LLM settings (vision, caps, transcription)."""
    return make_app(base_url=fake_llm.base_url, llm=llm, telegram={
        "token": "123456:TEST-TOKEN", "base_url": fake_telegram.base_url,
        "allowed_users": [ALLOWED], "poll_timeout": 1, **(telegram or {}),
    }, clock=fake_telegram.clock)


@pytest.fixture
def make_bot(fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer,
             make_app: Callable[..., Application]) -> Callable[..., Application]:
    def make(*, telegram: dict[str, Any] | None = None, **llm: Any) -> Application:
        return start_bot(make_app, fake_llm, fake_telegram, telegram=telegram, **llm)
    return make


def until(fake: FakeTelegramServer, condition: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Fire the bot's timers in turn until ``condition()`` holds; its value."""
    assert isinstance(fake.clock, ManualClock)
    assert fake.clock.advance_until(condition, timeout), "condition not met"
    return condition()


def settle(app: Application, fake: FakeTelegramServer) -> None:
    until(fake, lambda: app.runtime.inflight.count() == 0)
    assert app.runtime.wait_idle(timeout=15)


def replies(text: str, action: str = "message_telegram_bot") -> FakeResponse:
    """The model's answer: one message to the chat."""
    return FakeResponse(content=json.dumps({"actions": [{"type": action, "payload": {"text": text}}]}))


def user_content(fake_llm: FakeLLMServer, n: int = 0) -> Any:
    """The user's message the model was sent in its ``n``-th request (a string, or parts)."""
    return fake_llm.requests[n].messages[-1]["content"]


def jpeg(size: int, seed: int = 0) -> bytes:
    """Bytes that start as a JPEG does, ``size`` long."""
    return b"\xff\xd8\xff\xe0" + bytes((seed + n) % 251 for n in range(size - 4))


# ---------------------------------------------------------------- captions and documents


def test_a_captioned_text_file_is_the_request_and_its_text_is_inlined(
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot()
    fake_llm.script(replies("Two lines: a greeting and a farewell."))
    sent = fake_telegram.push_document(b"hello there\ngoodbye now\n", file_name="notes.txt",
                                       caption="summarize this", chat_id=CHAT, user_id=ALLOWED)
    [reply] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram)
    assert reply.params["text"] == "Two lines: a greeting and a farewell."
    assert reply.params["reply_parameters"]["message_id"] == sent["message_id"]
    content = user_content(fake_llm)
    assert content.startswith("summarize this\n")  # the caption is the request
    assert '[document "notes.txt" (24 B); its text follows]\nhello there\ngoodbye now\n' in content
    assert [c.params["path"] for c in fake_telegram.calls_to("file")] == ["documents/file_1"]


def test_a_file_that_is_not_text_is_described_not_downloaded(
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot()
    fake_llm.script(replies("I cannot open PDFs, sorry."))
    fake_telegram.push_document(b"%PDF-1.7 ...", file_name="report.pdf", mime_type="application/pdf",
                                caption="what does it say?", chat_id=CHAT, user_id=ALLOWED)
    [reply] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram)
    assert reply.params["text"] == "I cannot open PDFs, sorry."
    assert user_content(fake_llm) == ('what does it say?\n[document "report.pdf" (12 B): '
                                      'you cannot read this kind of file, only text files]')
    assert fake_telegram.calls_to("getFile") == []


@pytest.mark.parametrize("name, data, read", [
    ("out.txt", "Name,Stadt\nJürgen,München\n".encode("utf-16"), True),  # PowerShell's "> out.txt"
    ("wide.txt", "Name,Stadt\nJürgen,München\n".encode("utf-32"), True),
    ("excel.csv", "Name;Stadt\nJürgen;München\n".encode("cp1252"), True),  # Excel's "CSV" on Windows
    ("marked.txt", "Name,Stadt\nJürgen,München\n".encode("utf-8-sig"), True),
    ("data.csv", b"PK\x03\x04\x14\x00\x00\x00\x08\x00", False),  # a zip named .csv: binary
    ("odd.txt", b"\x81\x8d\x8f\x90\x9d", False),  # neither UTF-8 nor Windows-1252
], ids=["utf-16", "utf-32", "cp1252", "utf-8 with a mark", "binary", "undecodable"])
def test_a_text_file_in_a_windows_encoding_is_read_and_binary_is_not(
    name: str, data: bytes, read: bool,
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot()
    fake_llm.script(replies("Jürgen lives in München."))
    fake_telegram.push_document(data, file_name=name, caption="where?", chat_id=CHAT, user_id=ALLOWED)
    [reply] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram)
    assert reply.params["text"] == "Jürgen lives in München."
    content = user_content(fake_llm)
    if read:
        assert "\nJürgen" in content and "München\n" in content and "\ufeff" not in content
        assert "its text follows" in content
    else:
        assert content == f'where?\n[document "{name}" ({len(data)} B): not read: it is not text]'


# ---------------------------------------------------------------- photos


def test_with_vision_a_photo_goes_to_the_model_as_an_image_of_the_largest_size_under_the_cap(
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot(vision=True, max_image_bytes=10_000)
    fake_llm.script(replies("A red bicycle."))
    small, medium, large = jpeg(600, 1), jpeg(8_000, 2), jpeg(40_000, 3)
    fake_telegram.push_photo([(90, 68, small), (800, 600, medium), (1280, 960, large)],
                             caption="what is this?", chat_id=CHAT, user_id=ALLOWED)
    [reply] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram)
    assert reply.params["text"] == "A red bicycle."
    text, image = user_content(fake_llm)
    assert text == {"type": "text", "text": "what is this?\n[photo (800x600, 7.8 KB): shown below]"}
    assert image["type"] == "image_url"
    url = image["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == medium  # 1280px is over the cap; 800px is the largest under it


def test_without_vision_the_model_is_told_a_photo_came(
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot()
    fake_llm.script(replies("I cannot see pictures here, but tell me about it."))
    fake_telegram.push_photo([(1280, 960, jpeg(30_000))], chat_id=CHAT, user_id=ALLOWED)  # no caption
    [reply] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram)
    assert reply.params["text"] == "I cannot see pictures here, but tell me about it."
    assert user_content(fake_llm) == "[photo (1280x960, 29.3 KB): you cannot see images here; say so if it matters]"
    assert fake_telegram.calls_to("getFile") == []  # nothing downloaded for nothing


HEIC = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x01" * 2000


@pytest.mark.parametrize("sent, label", [
    ("heic", '[document "IMG_0042.HEIC" (2.0 KB)'),  # an iPhone photo sent as a file
    ("html", "[photo (800x600, 40 B)"),  # the file URL answered a proxy's error page
], ids=["heic", "html"])
def test_with_vision_what_the_model_cannot_decode_is_described_never_sent_as_an_image(
    sent: str, label: str,
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot(vision=True)
    fake_llm.script(replies("I cannot see that picture; could you send it as a JPEG?"))
    if sent == "heic":
        fake_telegram.push_document(HEIC, file_name="IMG_0042.HEIC", mime_type="image/heic",
                                    caption="what is in this picture?", chat_id=CHAT, user_id=ALLOWED)
    else:
        fake_telegram.push_photo([(800, 600, b"<html><body>Access denied</body></html>\n")],
                                 caption="what is in this picture?", chat_id=CHAT, user_id=ALLOWED)
    [reply] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram)
    # The model answers (a server would refuse the whole turn over an image it cannot decode).
    assert reply.params["text"] == "I cannot see that picture; could you send it as a JPEG?"
    assert user_content(fake_llm) == f"what is in this picture?\n{label}: not read: not an image the model can see]"


# ---------------------------------------------------------------- voice


def test_a_voice_note_is_transcribed_when_a_transcription_url_is_set(
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot(transcribe_url=f"{fake_llm.base_url}/audio/transcriptions")
    fake_llm.transcript = "run uptime please"
    fake_llm.script(replies("On it."))
    voice = b"OggS" + bytes(range(200))
    fake_telegram.push_voice(voice, duration=3, chat_id=CHAT, user_id=ALLOWED)
    [reply] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram)
    assert reply.params["text"] == "On it."
    [upload] = fake_llm.transcriptions
    assert (upload.data, upload.model, upload.content_type) == (voice, "whisper-1", "audio/ogg")
    assert user_content(fake_llm) == "[voice note (3 s, 204 B), transcribed: run uptime please]"


class LateFiles(FakeTelegramServer):
    """The fake Bot API, serving each file ``file_delay`` seconds late."""

    file_delay = 0.0

    async def _file(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.file_delay)
        return await super()._file(request)


class LateTranscriptions(FakeLLMServer):
    """The fake LLM, answering each transcription ``transcribe_delay`` seconds late (the
    upload is recorded first)."""

    transcribe_delay = 0.0

    async def _transcribe(self, request: web.Request) -> web.Response:
        answer = await super()._transcribe(request)
        await asyncio.sleep(self.transcribe_delay)
        return answer


@pytest.fixture
def late_llm() -> Iterator[LateTranscriptions]:
    with LateTranscriptions() as server:
        yield server


@pytest.fixture
def late_telegram(manual_clock: ManualClock) -> Iterator[LateFiles]:
    with LateFiles(clock=manual_clock) as server:
        yield server


def test_a_voice_notes_download_and_transcription_share_one_media_timeout(
    late_llm: LateTranscriptions, late_telegram: LateFiles, make_app: Callable[..., Application]
) -> None:
    """Each takes well under the timeout, both together more: the transcription is cut at the
    message's deadline, and the turn goes on with a note (it had a timeout of its own)."""
    bot = start_bot(make_app, late_llm, late_telegram, media_timeout=1.0,
                    transcribe_url=f"{late_llm.base_url}/audio/transcriptions")
    late_telegram.file_delay, late_llm.transcribe_delay = 0.6, 0.7
    late_llm.script(replies("I could not hear that in time; please say it again."))
    late_telegram.push_voice(b"OggS" + bytes(200), duration=3, chat_id=CHAT, user_id=ALLOWED)
    [reply] = until(late_telegram, lambda: late_telegram.sent(CHAT))
    settle(bot, late_telegram)
    assert reply.params["text"] == "I could not hear that in time; please say it again."
    assert len(late_llm.transcriptions) == 1  # downloaded in time, and sent to be transcribed
    assert user_content(late_llm) == "[voice note (3 s, 204 B): not read: not transcribed in time]"


def test_without_transcription_the_model_is_told_a_voice_note_came(
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot()
    fake_llm.script(replies("I cannot listen to voice notes; please type it."))
    fake_telegram.push_voice(b"OggS" + bytes(100), duration=5, chat_id=CHAT, user_id=ALLOWED)
    [reply] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram)
    assert reply.params["text"] == "I cannot listen to voice notes; please type it."
    assert user_content(fake_llm) == "[voice note (5 s, 104 B): you cannot hear it: no transcription is configured]"
    assert fake_llm.transcriptions == [] and fake_telegram.calls_to("getFile") == []


# ---------------------------------------------------------------- stickers, places, contacts, polls


def test_stickers_places_contacts_and_polls_reach_the_model_in_words(
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot()
    fake_telegram.push_sticker("👍", chat_id=1, user_id=ALLOWED)
    fake_telegram.push_location(52.520008, 13.404954, chat_id=2, user_id=ALLOWED)
    fake_telegram.push_contact("+49 30 1234567", "Grace", chat_id=3, user_id=ALLOWED)
    fake_telegram.push_poll("Lunch?", ["pizza", "soup"], chat_id=4, user_id=ALLOWED)
    until(fake_telegram, lambda: all(fake_telegram.sent(chat) for chat in (1, 2, 3, 4)))
    settle(bot, fake_telegram)
    asked = sorted(r.messages[-1]["content"] for r in fake_llm.requests)
    assert asked == ['[contact Grace, +49 30 1234567]',
                     '[location 52.52001, 13.40495]',
                     '[poll "Lunch?" (options: pizza; soup)]',
                     '[sticker 👍]']
    assert all(len(fake_telegram.sent(chat)) == 1 for chat in (1, 2, 3, 4))  # each got its answer


def test_a_video_alone_gets_a_short_notice_and_the_model_is_not_asked(
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot()
    sent = fake_telegram.push_video(b"\x00\x00\x00\x18ftypmp42", duration=12, chat_id=CHAT, user_id=ALLOWED)
    [notice] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram)
    assert notice.params["text"] == ("Sorry, I cannot take a video yet. Send me text, a photo, a voice note "
                                     "or a text file, and I will answer.")
    assert notice.params["reply_parameters"]["message_id"] == sent["message_id"]
    assert fake_llm.requests == []


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("answer", ["absolute", "traversal", "a Bot API path that is a file here too"])
def test_a_file_is_only_ever_downloaded_from_the_bot_apis_file_url_never_read_from_this_machine(
    answer: str, make_bot: Callable[..., Application], fake_llm: FakeLLMServer,
    fake_telegram: FakeTelegramServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    bot = make_bot()
    fake_llm.script(replies("Here is a summary."))
    sent = fake_telegram.push_document(b"harmless user text\n", file_name="notes.txt", caption="summarize",
                                       chat_id=CHAT, user_id=ALLOWED)
    file_id = sent["document"]["file_id"]
    path, data = fake_telegram.files[file_id]
    if answer == "absolute":  # a hostile or compromised Bot API answers getFile with a path here
        fake_telegram.files[file_id] = (str(secret), data)
    elif answer == "traversal":
        fake_telegram.files[file_id] = (os.path.relpath(secret), data)  # "../../tmp/.../secret.txt"
    else:  # Telegram's own path, which happens to name a file in the working directory
        monkeypatch.chdir(tmp_path)
        (tmp_path / path).parent.mkdir(parents=True)
        secret.rename(tmp_path / path)
    [reply] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram)
    assert reply.params["text"] == "Here is a summary."
    content = user_content(fake_llm)
    assert "root:" not in content
    if answer == "a Bot API path that is a file here too":
        assert "harmless user text" in content
        assert [c.params["path"] for c in fake_telegram.calls_to("file")] == [path]
    else:
        assert content == 'summarize\n[document "notes.txt" (19 B): not read: its download failed]'
        assert fake_telegram.calls_to("file") == []


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "photos/%2e%2e/%2e%2e/x", "%2Fetc/passwd",
                                  "file:///etc/passwd", "photos/a\\..\\b"])
def test_a_file_path_that_would_leave_the_bot_apis_file_url_is_refused(path: str) -> None:
    with pytest.raises(LookupError):
        file_url("https://api.telegram.org/file/bot1:T", path)
    assert file_url("https://api.telegram.org/file/bot1:T", "photos/a%20b.jpg").endswith("/photos/a%20b.jpg")


@pytest.mark.parametrize("where", ["inside", "outside", "linked outside"])
def test_a_local_bot_api_servers_files_are_read_from_its_directory_and_nowhere_else(
    where: str, make_bot: Callable[..., Application], fake_llm: FakeLLMServer,
    fake_telegram: FakeTelegramServer, tmp_path: Any
) -> None:
    """``--local`` hands out paths on its machine: read under ``telegram.local_files`` only,
    once every link is followed."""
    served = tmp_path / "bot-api"
    (served / "documents").mkdir(parents=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    bot = make_bot(telegram={"local_files": str(served)})
    fake_llm.script(replies("Here is a summary."))
    sent = fake_telegram.push_document(b"harmless user text\n", file_name="notes.txt", caption="summarize",
                                       chat_id=CHAT, user_id=ALLOWED)
    file_id = sent["document"]["file_id"]
    _, data = fake_telegram.files[file_id]
    local = served / "documents" / "file_1.txt"
    if where == "inside":
        local.write_bytes(data)
    elif where == "outside":
        local = secret
    else:
        local.symlink_to(secret)
    fake_telegram.files[file_id] = (str(local), data)
    until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram)
    content = user_content(fake_llm)
    assert "root:" not in content and fake_telegram.calls_to("file") == []
    assert ("harmless user text" in content) == (where == "inside")


def test_telegram_downloads_are_bounded_by_the_configured_media_timeout_not_a_shorter_one(
    make_bot: Callable[..., Application]
) -> None:
    bot = make_bot(media_timeout=120.0)
    files = bot.mounts["telegram"].downloaders["telegram"].__self__  # type: ignore[attr-defined]
    assert files.timeout is None  # no 30 s cap of its own under the LLM hop's 120 s deadline


def test_an_albums_photos_are_downloaded_together_within_one_timeout() -> None:
    """Ten photos whose downloads hang cost the turn one media timeout, not ten."""
    import autoresponse.interfaces.console  # noqa: F401  (its action, allowed below)

    in_flight, peak, started = 0, 0, []

    async def download(file_id: str, max_bytes: int) -> bytes:
        nonlocal in_flight, peak
        if file_id == "p0":
            return jpeg(2_000)  # the first arrives; the other nine hang
        started.append(file_id)
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await asyncio.Event().wait()
        finally:
            in_flight -= 1
        raise AssertionError("unreachable")

    reader = MediaReader(vision=True, timeout=0.2, downloaders={"telegram": download})
    context = OriginalContext(chat_id=1, message_id=1, interface_name="telegram")
    prompt = build_chat_request("our trip", context, allowed_actions=("message_console",), turns=[],
                                now=time.time())
    prompt = prompt.model_copy(update={"attachments": tuple(
        Attachment(kind="photo", file_id=f"p{n}", size=2_000, width=800, height=600) for n in range(10))})
    read, notices, left = asyncio.run(asyncio.wait_for(reader.read(prompt), 30))
    assert read.attachments[0].image is not None  # what arrived is shown
    assert [a.note for a in read.attachments[1:]] == ["not read: its download failed"] * 9
    assert (notices, left) == ([], True)
    assert peak == MEDIA_CONCURRENT_DOWNLOADS > 1  # together, a few at a time
    # The message's one deadline passed while the rest waited their turn: they never started.
    assert len(started) == MEDIA_CONCURRENT_DOWNLOADS


def test_an_album_of_ten_photos_is_one_turn(
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot(vision=True)
    fake_llm.script(replies("Ten photos of a beach."))
    members = [c.name for c in bot.runtime.cells if c.name.startswith("conversations.")]
    probes = [bot.runtime.probe(name) for name in members]
    try:
        album = fake_telegram.push_album([jpeg(2_000, n) for n in range(10)], caption="our trip",
                                         chat_id=CHAT, user_id=ALLOWED)
        # All ten reach the chat's conversation before its gathering window is let close.
        wait_for(lambda: sum(len(p.bodies(UserRequest)) for p in probes) == 10)
        [reply] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
        settle(bot, fake_telegram)
    finally:
        for probe in probes:
            probe.close()
    assert reply.params["text"] == "Ten photos of a beach."
    assert reply.params["reply_parameters"]["message_id"] == album[-1]["message_id"]
    [asked] = fake_llm.requests  # one turn, not ten
    parts = asked.messages[-1]["content"]
    assert parts[0]["text"].startswith("our trip\n[photo (800x600, 2.0 KB): shown below]")
    images = [base64.b64decode(p["image_url"]["url"].split(",", 1)[1]) for p in parts[1:]]
    assert images == [jpeg(2_000, n) for n in range(10)]  # every photo, in order
    assert len(fake_telegram.sent(CHAT)) == 1


def test_in_a_group_an_album_whose_caption_mentions_the_bot_is_answered_whole(
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot()
    group = -300
    fake_llm.script(replies("Three photos."))
    members = [c.name for c in bot.runtime.cells if c.name.startswith("conversations.")]
    probes = [bot.runtime.probe(name) for name in members]
    try:
        fake_telegram.push_album([jpeg(500, n) for n in range(3)], caption="chatter, not for the bot",
                                 chat_id=group, user_id=ALLOWED, chat_type="group")
        album = fake_telegram.push_album([jpeg(500, n) for n in range(3)], caption="@synth_bot what are these?",
                                         chat_id=group, user_id=ALLOWED, chat_type="group")
        # Only the second album (all three of it, the uncaptioned ones too) is for the bot.
        wait_for(lambda: sum(len(p.bodies(UserRequest)) for p in probes) == 3)
        [reply] = until(fake_telegram, lambda: fake_telegram.sent(group))
        settle(bot, fake_telegram)
    finally:
        for probe in probes:
            probe.close()
    assert reply.params["text"] == "Three photos."
    assert reply.params["reply_parameters"]["message_id"] == album[-1]["message_id"]
    [asked] = fake_llm.requests
    assert asked.messages[-1]["content"].splitlines() == ["what are these?"] + [
        "[photo (800x600, 500 B): you cannot see images here; say so if it matters]"] * 3


def test_a_file_above_the_cap_gets_a_notice_and_is_never_downloaded(
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot(max_file_bytes=1_000)
    fake_telegram.push_document(b"x" * 5_000, file_name="huge.log", chat_id=1, user_id=ALLOWED)
    fake_llm.script(replies("The file was too big, but here is what I know."))
    fake_telegram.push_document(b"y" * 5_000, file_name="big.txt", caption="what is in it?",
                                chat_id=2, user_id=ALLOWED)
    until(fake_telegram, lambda: fake_telegram.sent(1) and len(fake_telegram.sent(2)) == 2)
    settle(bot, fake_telegram)
    # Alone, the file gets the notice, and the model is not asked about nothing.
    [alone] = fake_telegram.sent(1)
    assert alone.params["text"] == 'Sorry, "huge.log" is too large for me to read (4.9 KB; I read files up to 1000 B).'
    # With a caption, the notice, then the model's answer: it was told the file was not read.
    notice, answer = fake_telegram.sent(2)
    assert notice.params["text"] == 'Sorry, "big.txt" is too large for me to read (4.9 KB; I read files up to 1000 B).'
    assert answer.params["text"] == "The file was too big, but here is what I know."
    [asked] = fake_llm.requests
    assert asked.messages[-1]["content"] == ('what is in it?\n[document "big.txt" (4.9 KB): '
                                            'not read: larger than 1000 B; the user was told]')
    assert fake_telegram.calls_to("getFile") == [] and fake_telegram.calls_to("file") == []


def test_file_ids_are_journaled_never_the_bytes(
    make_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    bot = make_bot(vision=True)
    photo = jpeg(3_000, 9)
    message = fake_telegram.push_photo([(640, 480, photo)], caption="look", chat_id=CHAT, user_id=ALLOWED)
    until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram)
    assert "image_url" in json.dumps(user_content(fake_llm))  # the model did see it
    with sqlite3.connect(bot.settings.journal_path) as db:
        stored = "\n".join(row[0] for row in db.execute("SELECT payload FROM items"))
        stored += "\n".join(row[0] for row in db.execute("SELECT hops FROM traces"))
    assert message["photo"][0]["file_id"] in stored
    encoded = base64.b64encode(photo).decode()
    assert encoded[:40] not in stored and "base64" not in stored


# ---------------------------------------------------------------- the Telethon userbot


class MediaStandIn:
    """The userbot tests' stand-in (Telethon's TL types in, what was sent out), which also
    serves each message's media by (message id, photo size) through ``download_media``."""

    def __init__(self, clock: ManualClock) -> None:
        from test_telethon import ME, StandInUserbot, user

        self.inner = StandInUserbot(user(ME, "me_myself"), clock=clock)
        self.clock = clock
        self.media: dict[tuple[int, str | None], bytes] = {}
        self.downloads: list[tuple[int, int, str | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def download_media(self, chat_id: int, message_id: int, *, thumb: str | None = None) -> bytes:
        self.downloads.append((chat_id, message_id, thumb))
        return self.media[(message_id, thumb)]


@pytest.fixture
def make_userbot(tmp_path: Any) -> Iterator[Callable[..., Application]]:
    import io

    from autoresponse import Settings
    from autoresponse.interfaces.console import Console
    from autoresponse.interfaces.telethon import USERBOT

    apps: list[Application] = []

    def make(llm: FakeLLMServer, userbot: MediaStandIn, **llm_settings: Any) -> Application:
        from test_telethon import ADA, telethon_settings

        settings = Settings.load(
            llm={"base_url": llm.base_url, "read_timeout": 5, "max_attempts": 2, **llm_settings},
            telethon=telethon_settings(allowed_users=[ADA]), terminal={"enabled": False},
            admin={"enabled": False}, events={"enabled": False}, data_dir=tmp_path / "data")
        app = Application(settings, console=Console(io.StringIO()), provided={USERBOT: userbot},
                          clock=userbot.clock).start()
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.stop()


def userbot_message(message_id: int, caption: str, media: Any) -> Any:
    import datetime as dt

    from telethon.tl import types
    from test_telethon import ADA

    return types.Message(id=message_id, peer_id=types.PeerUser(ADA), date=dt.datetime.now(dt.UTC),
                         message=caption, out=False, from_id=types.PeerUser(ADA), media=media)


def test_the_userbot_sends_a_photo_to_the_model_and_transcribes_a_voice_note(
    make_userbot: Callable[..., Application], fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    import datetime as dt

    from telethon.tl import types
    from test_telethon import ADA, user

    standin = MediaStandIn(manual_clock)
    make_userbot(fake_llm, standin, vision=True, max_image_bytes=30_000,
                 transcribe_url=f"{fake_llm.base_url}/audio/transcriptions")
    fake_llm.transcript = "what time is it"
    photo = types.Photo(id=1, access_hash=2, file_reference=b"", date=dt.datetime.now(dt.UTC), dc_id=2, sizes=[
        types.PhotoSize("m", 320, 240, 4_000), types.PhotoSize("x", 800, 600, 20_000),
        types.PhotoSize("y", 1280, 960, 90_000)])
    standin.media[(11, "x")] = jpeg(20_000, 5)
    voice = types.Document(id=3, access_hash=4, file_reference=b"", date=dt.datetime.now(dt.UTC),
                           mime_type="audio/ogg", size=300, dc_id=2,
                           attributes=[types.DocumentAttributeAudio(duration=4, voice=True)])
    standin.media[(12, None)] = b"OggS" + bytes(296)
    fake_llm.script(replies("A cat on a sofa.", "message_telethon"), replies("It is noon.", "message_telethon"))
    standin.receive(userbot_message(11, "who is this?", types.MessageMediaPhoto(photo=photo)), user(ADA, "ada"))
    assert manual_clock.advance_until(lambda: standin.delivered())
    standin.receive(userbot_message(12, "", types.MessageMediaDocument(document=voice, voice=True)),
                    user(ADA, "ada"))
    assert manual_clock.advance_until(lambda: len(standin.delivered()) == 2)
    assert [(s.text, s.reply_to) for s in standin.delivered()] == [("A cat on a sofa.", 11), ("It is noon.", 12)]
    assert standin.delivered()[0].chat == ADA
    text, image = user_content(fake_llm, 0)
    assert text["text"] == "who is this?\n[photo (800x600, 19.5 KB): shown below]"
    assert base64.b64decode(image["image_url"]["url"].split(",", 1)[1]) == jpeg(20_000, 5)
    assert user_content(fake_llm, 1) == "[voice note (4 s, 300 B), transcribed: what time is it]"
    assert standin.downloads == [(ADA, 11, "x"), (ADA, 12, None)]  # the size under the cap, and the voice
    assert [t.data for t in fake_llm.transcriptions] == [b"OggS" + bytes(296)]


# ---------------------------------------------------------------- Reddit and X: images by URL


def test_reddit_and_x_images_are_described_to_the_model_by_url(
    fake_llm: FakeLLMServer, manual_clock: ManualClock, make_app: Callable[..., Application], tmp_path: Any
) -> None:
    from test_reddit import reddit_settings
    from test_x import ADA, KEYS, ME, x_settings

    from autoresponse.testing.fake_reddit import FakeRedditServer
    from autoresponse.testing.fake_x import FakeXServer
    from test_reddit import CLIENT_ID, CLIENT_SECRET, PASSWORD

    with FakeRedditServer(username="synth_bot", client_id=CLIENT_ID, client_secret=CLIENT_SECRET,
                          password=PASSWORD, clock=manual_clock) as reddit, \
            FakeXServer(user_id=ME, username="synth", oauth1=KEYS, clock=manual_clock) as x:
        app = make_app(base_url=fake_llm.base_url, reddit=reddit_settings(reddit), x=x_settings(x, tmp_path),
                       clock=manual_clock)
        fake_llm.script(replies("A sunset over the sea.", "message_reddit"),
                        replies("Two kittens.", "message_x"))
        reddit.push_comment("u/synth_bot what is in https://i.redd.it/abc123.jpg ?", author="ada")
        assert manual_clock.advance_until(lambda: reddit.replies(), 20)
        post = x.push_mention("@synth what is this?", author_id=ADA, username="ada",
                              media=[{"type": "photo", "url": "https://pbs.twimg.com/media/kittens.jpg",
                                      "alt_text": "two kittens"}])
        assert manual_clock.advance_until(lambda: x.posts(), 20)
        assert manual_clock.advance_until(lambda: app.runtime.inflight.count() == 0)
        app.stop()
    [answer] = reddit.replies()
    assert answer.text == "A sunset over the sea."
    assert fake_llm.requests[0].messages[-1]["content"] == (
        "what is in https://i.redd.it/abc123.jpg ?\n[image https://i.redd.it/abc123.jpg]")
    [posted] = x.posts()
    assert (posted.text, posted.in_reply_to) == ("Two kittens.", post)
    assert fake_llm.requests[1].messages[-1]["content"] == (
        'what is this?\n[image https://pbs.twimg.com/media/kittens.jpg (described as "two kittens")]')
