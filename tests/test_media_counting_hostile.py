"""Media counting against crafted and unusual files (found by hostile run DN): a PDF that made
zlib copy the rest of the file once for each of its streams, a WAV header's byte rate taken
as it said, and video or other binary files counted as their base64 text."""

from __future__ import annotations

import base64
import random
import struct
import types
import zlib
from typing import Any

import pytest

from agentctx.messages import OpaqueBlock, UserMessage
from agentctx.tokens import MessageCounter, media
from agentctx.tokens.media import (
    AUDIO_TOKENS_PER_SECOND,
    PDF_PAGE_TOKENS,
    audio_tokens,
    opaque_cost,
    pdf_tokens,
)

# ---------------------------------------------------------------------------------------
# PDF: the work of reading object streams


def _endless_object_streams(streams: int, filler: int) -> bytes:
    """A PDF of ``streams`` tiny object streams, none with an ``endstream``, then ``filler``
    bytes: each stream's data runs, as far as a reader knows, to the end of the file."""
    one = b"<< /Type /ObjStm /Filter /FlateDecode >> stream\n"
    one += zlib.compress(b"1 0 obj<</Type/Page>>") + b"\n"
    return b"%PDF-1.5\n" + one * streams + b"%" + b"A" * filler + b"\n%%EOF"


def _counting_zlib(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Has `media` count the bytes it gives zlib to inflate; the list holds their sum."""
    fed = [0]

    class Counting:
        def __init__(self) -> None:
            self._inflater = zlib.decompressobj()

        def decompress(self, data: Any, max_length: int = 0) -> bytes:
            fed[0] += memoryview(data).nbytes
            return self._inflater.decompress(data, max_length)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inflater, name)

    fake = types.SimpleNamespace(decompressobj=Counting, error=zlib.error)
    monkeypatch.setattr(media, "zlib", fake)
    return fed


def test_a_pdf_of_object_streams_with_no_end_is_read_in_work_bounded_by_its_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each stream was given the whole rest of the file, which zlib copied: 10,000 streams
    in 21.8 MB blocked the event loop 35 s. Its pages are still the same."""
    streams = 2000
    pdf = _endless_object_streams(streams, 1 << 20)
    fed = _counting_zlib(monkeypatch)
    assert pdf_tokens(base64.b64encode(pdf).decode()) == streams * PDF_PAGE_TOKENS
    # A few kilobytes a stream at first, and no more than twice what zlib read after: the
    # old reading gave zlib 2 GB here.
    assert fed[0] <= 3 * len(pdf) + streams * 4096


def test_a_pdf_of_overlapping_streams_reads_no_more_than_its_size_in_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Streams whose data holds the next stream (stored zlib blocks, each with an object
    stream inside): each one's data is the rest of the file, all of it zlib to read."""
    inner = b""
    for _ in range(300):
        inner = b"<< /Type /ObjStm /Filter /FlateDecode >>\nstream\n" + zlib.compress(
            b"<</Type /Page>>" + inner, 0
        )
    pdf = b"%PDF-1.5\n" + inner + b"\n%%EOF"
    fed = _counting_zlib(monkeypatch)
    assert pdf_tokens(base64.b64encode(pdf).decode()) > 0
    assert fed[0] <= 3 * len(pdf) + 300 * 4096


@pytest.mark.parametrize("endstream", [True, False])
@pytest.mark.parametrize("pages", [1, 50, 3000])
def test_the_pages_of_a_large_object_stream_are_all_counted(pages: int, endstream: bool) -> None:
    """A stream read a piece at a time has its page objects counted across the pieces, with
    or without an ``endstream`` after it (a file cut short)."""
    rng = random.Random(pages)
    objects = b"".join(
        b"%d 0 obj<</Type /Page /Id (%s)>>endobj\n" % (n, rng.randbytes(30).hex().encode())
        for n in range(pages)
    )
    pdf = b"%PDF-1.5\n<< /Type /ObjStm /Filter /FlateDecode >>\nstream\n" + zlib.compress(objects)
    pdf += b"\nendstream\nendobj\n%%EOF" if endstream else b""
    pdf += rng.randbytes(100 * pages)  # their contents, in the file
    assert pdf_tokens(base64.b64encode(pdf).decode()) == pages * PDF_PAGE_TOKENS


# ---------------------------------------------------------------------------------------
# WAV: what its header says


def _wav(
    pcm: bytes,
    *,
    kind: int = 1,
    channels: int = 1,
    sample_rate: int = 16_000,
    byte_rate: int = 32_000,
    block: int = 2,
    bits: int = 16,
    before: bytes = b"",
) -> str:
    """Base64 of a WAV file of ``pcm``, its ``fmt`` chunk as given, ``before`` it the chunks
    some writers put first."""
    fmt = struct.pack("<HHIIHH", kind, channels, sample_rate, byte_rate, block, bits)
    chunks = before + b"fmt " + struct.pack("<I", 16) + fmt
    chunks += b"data" + struct.pack("<I", len(pcm)) + pcm
    return base64.b64encode(
        b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks
    ).decode()


_PCM = random.Random(0).randbytes(320_000)  # 10 s of 16 kHz 16-bit mono
_TEN_SECONDS = 10 * AUDIO_TOKENS_PER_SECOND


@pytest.mark.parametrize("byte_rate", [1, 0, 0xFFFFFFFF, 32_000])
def test_a_wav_is_counted_by_its_sample_rate_not_the_byte_rate_its_header_says(
    byte_rate: int,
) -> None:
    """10 MB of 16 kHz PCM whose header said 1 byte a second was 104,858,040 tokens, and
    4 GB a second 1 token: a player reads the sample rate and the block, so is this."""
    data = _wav(_PCM, byte_rate=byte_rate)
    assert _TEN_SECONDS <= audio_tokens(data, "wav") <= _TEN_SECONDS + 2
    part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    assert _TEN_SECONDS <= opaque_cost(part)[1] <= _TEN_SECONDS + 2


@pytest.mark.parametrize(
    "fields",
    [
        {"sample_rate": 0xFFFFFFFF, "block": 0xFFFF},  # 280 TB a second
        {"sample_rate": 1, "block": 1},  # a byte a second
        {"kind": 2, "byte_rate": 1},  # ADPCM: its byte rate is all it says
        {"kind": 2, "byte_rate": 0xFFFFFFFF},
    ],
)
def test_a_wav_header_that_says_what_no_audio_plays_gives_the_usual_rate(
    fields: dict[str, Any],
) -> None:
    """Never 1 token nor 100 million: a rate outside 1 KB to 6 MB a second is not believed,
    and the file is counted at 16 kHz 16-bit mono."""
    data = _wav(_PCM, **fields)
    assert _TEN_SECONDS <= audio_tokens(data, "wav") <= _TEN_SECONDS + 2


def test_a_wav_with_a_chunk_before_its_format_is_read_by_its_format() -> None:
    """A LIST chunk before ``fmt `` put other bytes where the byte rate is read: 48 kHz
    stereo (192 KB a second) is read as that, not as what the LIST chunk holds."""
    info = b"INFOISFT" + struct.pack("<I", 14) + b"Lavf60.3.100\x00\x00"
    before = b"LIST" + struct.pack("<I", len(info)) + info
    pcm = random.Random(1).randbytes(192_000 * 5)
    data = _wav(pcm, channels=2, sample_rate=48_000, byte_rate=192_000, block=4, before=before)
    assert (
        5 * AUDIO_TOKENS_PER_SECOND <= audio_tokens(data, "wav") <= 5 * AUDIO_TOKENS_PER_SECOND + 2
    )


# ---------------------------------------------------------------------------------------
# Video and other binary files


def _box(kind: bytes, content: bytes) -> bytes:
    return struct.pack(">I", 8 + len(content)) + kind + content


def _mp4(seconds: float, size: int, *, moov_first: bool = True, version: int = 0) -> bytes:
    """An MP4 of about ``size`` bytes whose movie header says it plays ``seconds``."""
    scale = 1000
    if version == 0:
        times = struct.pack(">IIII", 0, 0, scale, round(seconds * scale))
    else:
        times = struct.pack(">QQIQ", 0, 0, scale, round(seconds * scale))
    mvhd = _box(b"mvhd", bytes([version, 0, 0, 0]) + times + bytes(80))
    moov = _box(b"moov", mvhd + _box(b"trak", bytes(200)))
    ftyp = _box(b"ftyp", b"isom\x00\x00\x02\x00isomiso2avc1mp41")
    mdat = _box(b"mdat", random.Random(size).randbytes(size))
    return ftyp + (moov + mdat if moov_first else mdat + moov)


_VIDEO_RATE = 263  # Gemini's tokens a second of video, as `media.VIDEO_TOKENS_PER_SECOND`
_MB3 = 3 << 20
_UNREAD_MP4 = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + random.Random(3).randbytes(_MB3)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    "payload",
    [
        {"kind": "binary", "data": "{video}", "media_type": "video/mp4"},  # pydantic-ai's
        {"type": "video", "base64": "{video}", "mime_type": "video/mp4"},  # LangChain's
        {"type": "file", "file": {"file_data": "data:video/mp4;base64,{video}"}},
    ],
    ids=["pydantic-ai", "langchain", "data url"],
)
def test_a_video_is_counted_by_its_length_not_as_its_base64(payload: dict[str, Any]) -> None:
    """A 3 MB MP4 was 2.6 million tokens of base64 text, BudgetExceededError in a 1M window;
    with no length read, it is taken as 1 Mbit/s: about 25 s, 6.6k tokens."""
    filled = _fill(payload, _b64(_UNREAD_MP4))
    seconds = len(_UNREAD_MP4) / 125_000
    expected = seconds * _VIDEO_RATE
    assert expected <= opaque_cost(filled)[1] <= expected + 2
    counted = MessageCounter(lazy=False).count(UserMessage((OpaqueBlock("x", filled),)))
    assert expected <= counted < expected + 100


def _fill(payload: dict[str, Any], data: str) -> dict[str, Any]:
    """``payload`` with ``{video}`` in its strings replaced by ``data``."""

    def fill(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        return value.replace("{video}", data) if isinstance(value, str) else value

    filled: dict[str, Any] = fill(payload)
    return filled


@pytest.mark.parametrize("moov_first", [True, False])
@pytest.mark.parametrize("version", [0, 1])
def test_an_mp4_is_counted_by_the_length_its_movie_header_says(
    moov_first: bool, version: int
) -> None:
    """Its movie header read wherever it is (before or after the media), 32- or 64-bit."""
    from agentctx.tokens.media import video_tokens

    data = _b64(_mp4(20, 1 << 20, moov_first=moov_first, version=version))
    assert video_tokens(data) == 20 * _VIDEO_RATE


@pytest.mark.parametrize(
    ("seconds", "low", "high"),
    [
        (1e6, 262 * _VIDEO_RATE, 263 * _VIDEO_RATE),  # at 4 KB/s
        (1e-3, 22, 24),  # at 12.5 MB/s: 0.084 s
        (0, 8 * _VIDEO_RATE, 9 * _VIDEO_RATE),  # not said: 1 Mbit/s
    ],
)
def test_an_mp4_header_saying_what_its_size_cannot_play_is_kept_to_plausible_rates(
    seconds: float, low: int, high: int
) -> None:
    """A movie header can say anything: 11 days would be 263 million tokens; 1 MB is counted
    as between 4 KB and 12.5 MB a second of it."""
    from agentctx.tokens.media import video_tokens

    assert low <= video_tokens(_b64(_mp4(seconds, 1 << 20))) <= high


def test_a_video_that_is_no_mp4_or_has_line_breaks_is_taken_at_1_mbit_a_second() -> None:
    from agentctx.tokens.media import video_tokens

    webm = b"\x1aE\xdf\xa3" + random.Random(4).randbytes(1_250_000 - 4)  # 10 s at 1 Mbit/s
    assert 10 * _VIDEO_RATE <= video_tokens(_b64(webm)) <= 10 * _VIDEO_RATE + 1
    wrapped = base64.encodebytes(_mp4(20, 1_250_000 - 400)).decode()  # MIME base64: lines
    assert 10 * _VIDEO_RATE <= video_tokens(wrapped) <= 11 * _VIDEO_RATE


@pytest.mark.parametrize(
    "media_type",
    [
        "application/zip",
        "application/octet-stream",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "font/woff2",
    ],
)
def test_a_binary_file_of_another_type_is_counted_as_pages_not_as_its_base64(
    media_type: str,
) -> None:
    """3 MB of a zip (a Word file) was 2.6 million tokens of base64: a provider reads it, if
    at all, by the text or pages in it, counted as a PDF whose pages are not read."""
    raw = b"PK\x03\x04\x14\x00\x06\x00" + random.Random(5).randbytes(_MB3)
    payload = {"kind": "binary", "data": _b64(raw), "media_type": media_type}
    pages = -(-len(raw) // 50_000)
    assert opaque_cost(payload)[1] == pages * PDF_PAGE_TOKENS


@pytest.mark.parametrize(
    "media_type", ["application/javascript", "application/octet-stream", "application/rtf"]
)
def test_text_of_a_type_not_named_as_text_is_still_counted_as_text(media_type: str) -> None:
    """Only bytes that no text holds make a file binary: a script or a Latin-1 CSV of an
    unknown type is counted as the text it is, as before."""
    raw = ("const a = 'café';\n" * 3000).encode("latin-1")
    payload = {"kind": "binary", "data": _b64(raw), "media_type": media_type}
    text, tokens = opaque_cost(payload)
    assert tokens == 0
    assert _b64(raw) in text


def test_the_video_rate_is_geminis() -> None:
    from agentctx.tokens.media import VIDEO_TOKENS_PER_SECOND

    assert VIDEO_TOKENS_PER_SECOND == _VIDEO_RATE


def test_terminal_output_with_a_bell_or_a_backspace_is_text() -> None:
    """Found by a re-run (DO 8): an ANSI build log sent as octet-stream was priced as PDF
    pages (60,000 tokens for some 290,000 of text), for the BEL ending its title sequence;
    backspaces and SO/SI are terminal output too."""
    line = "\x1b]0;make: building\x07\x1b[32mok\x1b[0m step 3\x08\x08 done \x0e\x0f\n"
    raw = (line * 2000).encode()
    payload = {"kind": "binary", "data": _b64(raw), "media_type": "application/octet-stream"}
    text, tokens = opaque_cost(payload)
    assert tokens == 0
    assert _b64(raw) in text


def test_a_wav_whose_format_follows_a_broadcast_chunk_is_read_by_its_format() -> None:
    """Found by a re-run (DO 9): a `fmt ` chunk past the first 384 bytes (a broadcast
    WAV's bext chunk, 602 bytes) was not found, and 44.1 kHz stereo was counted at the
    32 KB/s of the fallback, five times over."""
    pcm = random.Random(1).randbytes(44_100 * 4 * 3)  # 3 s of 44.1 kHz 16-bit stereo
    bext = b"bext" + struct.pack("<I", 602) + bytes(602)
    data = _wav(pcm, channels=2, sample_rate=44_100, byte_rate=176_400, block=4, before=bext)
    assert (
        3 * AUDIO_TOKENS_PER_SECOND <= audio_tokens(data, "wav") <= 3 * AUDIO_TOKENS_PER_SECOND + 2
    )
