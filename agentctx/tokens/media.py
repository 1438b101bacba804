"""What media inside provider items costs: images, PDFs, audio and video a provider reads as
media, other binary files, and documents given by reference, where an adapter keeps an item
whole (`OpaqueBlock`).

Counted as the text they are written in, base64 media would cost what no provider bills:
one screenshot 160k tokens, one PDF twice a 200k window. `opaque_cost` is how
`MessageCounter` counts an opaque block.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import math
import re
import zlib
from collections.abc import Mapping
from typing import Any

from agentctx.messages import ImageBlock
from agentctx.tokens.estimate import (
    UNKNOWN_IMAGE_TOKENS,
    URL_SAFE_TO_STANDARD,
    compact_json,
    image_tokens,
)

__all__ = [
    "AUDIO_TOKENS_PER_SECOND",
    "PDF_PAGE_TOKENS",
    "UNKNOWN_DOCUMENT_TOKENS",
    "VIDEO_TOKENS_PER_SECOND",
    "audio_tokens",
    "opaque_cost",
    "pdf_tokens",
    "video_tokens",
]


def _decode(data: str) -> bytes:
    """The bytes of base64 ``data``, standard or URL-safe (pydantic-ai's), padded or not;
    empty when it is no base64."""
    try:
        return base64.b64decode(data.translate(URL_SAFE_TO_STANDARD) + "=" * (-len(data) % 4))
    except (binascii.Error, ValueError):
        return b""


PDF_PAGE_TOKENS = 2500
"""Estimated tokens of one page of a PDF: Anthropic reads each page as its text and an image
of it (about 2,300-2,500 tokens a page of text or a table measured on Claude, 1,600 a scanned
one)."""
_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")
_PDF_STREAM_END = re.compile(rb"endstream")
_PDF_BYTES_A_PAGE = 50_000  # when the page objects are compressed out of sight
_PDF_INFLATED_AT_MOST = 16 << 20  # of object streams read: what a bomb could make no bigger
_PDF_DICTIONARY_AT_MOST = 2000  # bytes of an object stream's dictionary around /ObjStm
_PDF_OBJECT_STREAMS_AT_MOST = 10_000  # read of one file: real ones hold tens to hundreds
# Pages a file can hold for its size: a page's content stream and objects take more than
# this, so a compressed stream of page objects alone (a zip bomb) is not read as millions.
_PDF_BYTES_A_PAGE_AT_LEAST = 100
_PDF_READ_FIRST = 4096  # bytes of a stream first given to zlib, twice as many each time after
_PDF_READ_AT_MOST = 1 << 20  # given at a time


def pdf_tokens(data: str) -> int:
    """Estimated tokens of a base64 PDF: `PDF_PAGE_TOKENS` a page, its pages counted from its
    page objects, in the file and in its compressed object streams (an incremental update
    puts a page edited since outside them, counted twice), else one per 50 KB; at most one
    per `_PDF_BYTES_A_PAGE_AT_LEAST` of the file (a page's content takes that much)."""
    raw = _decode(data)
    pages = len(_PDF_PAGE.findall(raw)) + _pages_in_object_streams(raw)
    pages = min(pages, len(raw) // _PDF_BYTES_A_PAGE_AT_LEAST)
    return (pages or max(1, math.ceil(len(raw) / _PDF_BYTES_A_PAGE))) * PDF_PAGE_TOKENS


def _pages_in_object_streams(raw: bytes) -> int:
    """The page objects inside ``raw``'s object streams (PDF 1.5: where pdfTeX and most
    writers since put them), those compressed with FlateDecode, read up to
    `_PDF_INFLATED_AT_MOST` bytes in all, and at most as many compressed bytes as the file
    holds."""
    pages, room, unread, streams = 0, _PDF_INFLATED_AT_MOST, len(raw), 0
    ends: list[int] | None = None  # where each stream's data ends, found once: no file twice
    at = raw.find(b"/ObjStm")
    while at >= 0 and room > 0 and unread > 0 and streams < _PDF_OBJECT_STREAMS_AT_MOST:
        streams += 1
        near = _PDF_DICTIONARY_AT_MOST
        start = raw.rfind(b"<<", max(0, at - near), at)
        data = raw.find(b"stream", at, at + near)
        if start >= 0 and data >= 0 and b"/FlateDecode" in raw[start:data]:
            data += 6 + (raw[data + 6 : data + 8] == b"\r\n") + 1  # the line break after it
            if ends is None:
                ends = [m.start() for m in _PDF_STREAM_END.finditer(raw)]
            k = bisect.bisect_left(ends, data)
            end = ends[k] if k < len(ends) else len(raw)
            objects, read = _inflate(memoryview(raw)[data:end], room, unread)
            room, unread = room - len(objects), unread - read
            pages += len(_PDF_PAGE.findall(objects))
        at = raw.find(b"/ObjStm", at + 7)
    return pages


def _inflate(stream: memoryview, most: int, read_most: int) -> tuple[bytes, int]:
    """The zlib data at the start of ``stream`` inflated, up to ``most`` bytes of it and
    ``read_most`` bytes read of ``stream``; and how many bytes of ``stream`` it read. Empty
    when the data is no zlib."""
    # Fed a piece at a time, growing: zlib copies what it does not read of its input, and a
    # stream with no end before the end of the file (one of thousands, a crafted file) gave
    # it the whole rest of the file each time, 35 s of copying for 20 MB.
    inflater, read, piece = zlib.decompressobj(), 0, _PDF_READ_FIRST
    pieces: list[bytes] = []
    try:
        while read < min(len(stream), read_most) and most > 0 and not inflater.eof:
            fed = stream[read : min(read + piece, read_most)]
            pieces.append(inflater.decompress(fed, most))
            most -= len(pieces[-1])
            read += len(fed) - len(inflater.unused_data) - len(inflater.unconsumed_tail)
            piece = min(2 * piece, _PDF_READ_AT_MOST)
    except zlib.error:
        return b"", read
    return b"".join(pieces), read


UNKNOWN_DOCUMENT_TOKENS = 5 * PDF_PAGE_TOKENS
"""Estimated tokens of a document given by reference (a URL, a file id): its size is not
known here, so five pages' worth until usage reports calibrate the media slot."""


AUDIO_TOKENS_PER_SECOND = 10  # OpenAI bills audio input at about a token per 100 ms
_AUDIO_BYTES_PER_SECOND = {"mp3": 16_000, "wav": 32_000}  # 128 kbit/s; 16 kHz 16-bit mono
# What a WAV file's header can say it plays a second: from 8 kbit/s speech codecs (G.729)
# to 192 kHz 8 channels of 32 bits. A header outside is not believed.
_WAV_BYTES_PER_SECOND_AT_LEAST = 1000
_WAV_BYTES_PER_SECOND_AT_MOST = 192_000 * 8 * 4
# Chunks may come before "fmt " (LIST, JUNK, a broadcast WAV's bext of 602 bytes and more).
_WAV_HEAD_B64_CHARS = 8192
# Formats whose bytes a second are their samples a second times a sample's bytes, whatever
# the header's byte rate says: PCM, IEEE float, A-law, mu-law, and the extensible header.
_WAV_SAMPLED = frozenset((0x0001, 0x0003, 0x0006, 0x0007, 0xFFFE))


def audio_tokens(data: str, audio_format: str) -> int:
    """Estimated tokens of base64 audio: `AUDIO_TOKENS_PER_SECOND` of its length, read from a
    WAV header (its sample rate times the bytes of a sample on all channels, or for a
    compressed WAV its byte rate), else the format's usual rate; a header that says less
    than 1 KB or more than 6 MB a second is not believed."""
    size = len(data) * 3 // 4
    rate = _AUDIO_BYTES_PER_SECOND.get(audio_format.lower(), 16_000)
    if audio_format.lower() == "wav":
        rate = _wav_bytes_per_second(_decode(data[:_WAV_HEAD_B64_CHARS])) or rate
    return max(1, math.ceil(size / rate * AUDIO_TOKENS_PER_SECOND))


def _wav_bytes_per_second(head: bytes) -> int | None:
    """The bytes a second of the WAV file starting with ``head``, as its ``fmt`` chunk says;
    ``None`` when ``head`` holds no such chunk or it says what no audio plays."""
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    at = 12
    while head[at : at + 4] != b"fmt ":  # the chunks before it, skipped by their sizes
        if at + 8 > len(head):
            return None
        size = int.from_bytes(head[at + 4 : at + 8], "little")
        at += 8 + size + size % 2
    fmt = head[at + 8 : at + 24]
    if len(fmt) < 16:
        return None
    kind, channels = int.from_bytes(fmt[0:2], "little"), int.from_bytes(fmt[2:4], "little")
    sample_rate, byte_rate = int.from_bytes(fmt[4:8], "little"), int.from_bytes(fmt[8:12], "little")
    block, bits = int.from_bytes(fmt[12:14], "little"), int.from_bytes(fmt[14:16], "little")
    # A player of sampled audio reads the rate and the block, not the byte rate (a field
    # that can say anything: 1 byte a second made 10 MB 100 million tokens).
    if kind in _WAV_SAMPLED:
        rate = sample_rate * (block or channels * math.ceil(bits / 8))
    else:  # ADPCM, GSM, MP3 in WAV: their blocks hold many samples; the byte rate says
        rate = byte_rate
    at_least, at_most = _WAV_BYTES_PER_SECOND_AT_LEAST, _WAV_BYTES_PER_SECOND_AT_MOST
    return rate if at_least <= rate <= at_most else None


VIDEO_TOKENS_PER_SECOND = 263  # Gemini: 258 a frame at one frame a second, and its sound
# Bytes a second of a video: when its length is not read, a web video's 1 Mbit/s (most are
# more, so more seconds than it plays, a conservative count); a length read from its header
# is believed between 32 kbit/s and 100 Mbit/s, a header saying more or less is not.
_VIDEO_BYTES_PER_SECOND = 125_000
_VIDEO_BYTES_PER_SECOND_AT_LEAST = 4_000
_VIDEO_BYTES_PER_SECOND_AT_MOST = 12_500_000
_MP4_BOXES_AT_MOST = 64  # read of the file's top level and of its movie box: real ones hold few
_MP4_TYPE = re.compile(rb"[\x20-\x7e]{4}")  # a box's type: four printable characters


def video_tokens(data: str) -> int:
    """Estimated tokens of a base64 video: `VIDEO_TOKENS_PER_SECOND` of its length, read from
    an MP4 or QuickTime movie header (``mvhd``), else taken as 125 KB of the file a second
    (1 Mbit/s: a WebM, an AVI, an MP4 whose header is not read). A length the header says
    is kept between 4 KB and 12.5 MB of the file a second (32 kbit/s to 100 Mbit/s)."""
    size = len(data) * 3 // 4
    seconds = size / _VIDEO_BYTES_PER_SECOND
    stated = _mp4_seconds(data)
    if stated is not None:
        at_least, at_most = _VIDEO_BYTES_PER_SECOND_AT_LEAST, _VIDEO_BYTES_PER_SECOND_AT_MOST
        seconds = min(max(stated, size / at_most), size / at_least)
    return max(1, math.ceil(seconds * VIDEO_TOKENS_PER_SECOND))


def _bytes_at(data: str, start: int, length: int) -> bytes:
    """``length`` bytes of base64 ``data`` (with no line breaks) from byte ``start``, fewer at
    its end: only the characters that hold them are decoded."""
    held = _decode(data[start // 3 * 4 : (start + length + 2) // 3 * 4])
    return held[start % 3 : start % 3 + length]


def _mp4_seconds(data: str) -> float | None:
    """The length in seconds an MP4 or QuickTime file in base64 ``data`` says it plays (its
    movie header's duration over its time scale); ``None`` when it says none."""
    if "\n" in data or "\r" in data:  # where a byte's characters are is not known
        return None
    size = len(data) * 3 // 4
    box = _mp4_box(data, 0, size, b"moov")
    if box is None:
        return None
    header = _mp4_box(data, *box, b"mvhd")
    if header is None:
        return None
    head = _bytes_at(data, header[0], 32)
    if head[:1] == b"\x01":  # version 1: 64-bit times
        scale, duration = head[20:24], head[24:32]
    else:
        scale, duration = head[12:16], head[16:20]
    if len(duration) < 4 or duration == b"\xff" * len(duration):  # all ones: not known
        return None
    scale_, duration_ = int.from_bytes(scale, "big"), int.from_bytes(duration, "big")
    return duration_ / scale_ if scale_ and duration_ else None


def _mp4_box(data: str, start: int, end: int, kind: bytes) -> tuple[int, int] | None:
    """Where the content of the box of type ``kind`` between bytes ``start`` and ``end`` of
    base64 MP4 ``data`` starts and ends; ``None`` when there is none among its first
    `_MP4_BOXES_AT_MOST` boxes."""
    at = start
    for _ in range(_MP4_BOXES_AT_MOST):
        head = _bytes_at(data, at, 16)
        if len(head) < 8 or not _MP4_TYPE.fullmatch(head[4:8]):
            return None  # the end, or no box: not a file of boxes
        size, content = int.from_bytes(head[:4], "big"), at + 8
        if size == 1 and len(head) == 16:  # a 64-bit size follows the type
            size, content = int.from_bytes(head[8:16], "big"), at + 16
        elif size == 0:  # to the end
            size = end - at
        if size < content - at:
            return None
        if head[4:8] == kind:
            return content, min(at + size, end)
        at += size
        if at >= end:
            return None
    return None


_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+);base64,", re.IGNORECASE)
_BASE64_HEAD = re.compile(r"[A-Za-z0-9+/_=\r\n-]{16,}")  # base64, URL-safe, with line breaks
_AUDIO_FORMATS = frozenset(("wav", "mp3", "flac", "opus", "pcm16", "aac", "ogg", "m4a", "webm"))
_AUDIO_SUBTYPES = {"mpeg": "mp3", "x-wav": "wav", "wave": "wav", "vnd.wave": "wav"}
_MEDIA_WORDS = (
    "base64",
    "BASE64",
    "media_type",
    "mime_type",
    "file_id",
    "file_url",
    '"url"',
    '"image_url"',
    '"file"',
    '"format"',
    '"source_type"',
    "image_generation_call",
)
# A document or file by reference: what names it, beside what the model reads of it.
_REFERENCE_FIELDS = frozenset(("source", "file", "file_url", "file_id", "url", "image_url", "id"))
_MEDIA_URL_KEYS = frozenset(("image_url", "url", "file_data"))  # where a data: URL is media
_TOOL_USE = re.compile(r"tool_use$|_call$")  # a tool call's item: its input is what was written
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/x-yaml")


def _text_like(media_type: str) -> bool:
    """Whether a file of this type is read as the text it holds (CSV, JSON, code)."""
    kind = media_type.lower()
    return kind.startswith(_TEXT_TYPES) or kind.endswith(("+json", "+xml"))


def _text_of(data: str) -> str:
    """The text a base64 text file holds (``data`` itself when it is no base64)."""
    raw = _decode(data)
    return raw.decode("utf-8", "replace") if raw or not data else data


def _base64(data: object) -> str | None:
    """``data`` when it reads as base64 (its start does), else ``None``: a field named
    ``data`` can hold anything, an SVG's markup or a CSV."""
    return data if isinstance(data, str) and _BASE64_HEAD.fullmatch(data[:256]) else None


def _media_tokens(media_type: str, data: str) -> int | None:
    """Tokens of base64 media a provider reads as media (an image, a PDF, audio, video), and
    of a binary file of another type (a page each 50 KB, as a PDF whose pages are not read);
    ``None``: other data, counted as the text it is."""
    kind = media_type.lower()
    if kind.startswith("image/"):
        return image_tokens(ImageBlock(kind, data))
    if kind == "application/pdf":
        return pdf_tokens(data)
    if kind.startswith("audio/"):
        subtype = kind.removeprefix("audio/")
        return audio_tokens(data, _AUDIO_SUBTYPES.get(subtype, subtype))
    if kind.startswith("video/"):
        return video_tokens(data)
    if _binary(data):  # a Word file, a spreadsheet, a zip: read by a provider, if at all,
        # as the text or pages in it, never as its base64 (3 MB counted as 2.6M tokens)
        return max(1, math.ceil(len(data) * 3 // 4 / _PDF_BYTES_A_PAGE)) * PDF_PAGE_TOKENS
    return None


# In no text: tabs, breaks and ESC are, and so are BEL, backspace and SO/SI, which terminal
# output carries (a title sequence ends in BEL; a hostile run's ANSI build log, DO 8).
_CONTROL = re.compile(rb"[\x00-\x06\x10-\x1a\x1c-\x1f]")
_SNIFF_B64_CHARS = 1368  # a kilobyte: where a file's format shows


def _binary(data: str) -> bool:
    """Whether base64 ``data`` holds bytes no text holds (control bytes) in its first
    kilobyte: every compressed or binary format's header does, and random bytes all but
    always (a kilobyte lacks them one time in 10^49); text in UTF-8 or any 8-bit encoding
    does not."""
    head = _decode(data[:_SNIFF_B64_CHARS])
    return _CONTROL.search(head) is not None


def _by_reference(value: Mapping[str, Any]) -> int | None:
    """Tokens of an image or a document given by reference, not by its data (its size is not
    known here: `UNKNOWN_IMAGE_TOKENS`, `UNKNOWN_DOCUMENT_TOKENS`); ``None`` for anything
    else."""
    kind = value.get("type")
    if value.get("kind") == "uploaded-file":  # pydantic-ai's file by a provider's id
        media_type = value.get("media_type")
        is_image = isinstance(media_type, str) and media_type.startswith("image/")
        return UNKNOWN_IMAGE_TOKENS if is_image else UNKNOWN_DOCUMENT_TOKENS
    if kind in ("input_image", "computer_screenshot"):  # OpenAI's, by URL or id
        url = value.get("image_url")
        by_url = isinstance(url, str) and not url.startswith(("data:", "DATA:"))
        return UNKNOWN_IMAGE_TOKENS if by_url or value.get("file_id") else None
    if kind == "image":  # Anthropic's by its source; LangChain's by URL or id
        source, url = value.get("source"), value.get("url")
        by_source = isinstance(source, Mapping) and source.get("type") in ("url", "file")
        by_url = isinstance(url, str) and not url.startswith(("data:", "DATA:"))
        by_id = value.get("file_id") or (value.get("source_type") == "id" and value.get("id"))
        return UNKNOWN_IMAGE_TOKENS if by_source or by_url or by_id else None
    return UNKNOWN_DOCUMENT_TOKENS if _document_by_reference(value) else None


def _document_by_reference(value: Mapping[str, Any]) -> bool:
    """Whether ``value`` is a document or file given by reference: an Anthropic document's
    ``url`` or ``file`` source, a Responses ``input_file`` or a Chat ``file`` part by id or
    URL, LangChain's file block by id or URL, pydantic-ai's ``DocumentUrl``."""
    kind = value.get("type")
    if kind == "document":
        source = value.get("source")
        return isinstance(source, Mapping) and source.get("type") in ("url", "file")
    if kind == "file" and isinstance(file := value.get("file"), Mapping):
        value = file  # Chat's part
    elif kind == "file":  # LangChain's: by its own marks, not any JSON typed "file" (a listing)
        if not (value.get("source_type") in ("url", "id") or "mime_type" in value):
            return "file_id" in value
    elif kind != "input_file" and value.get("kind") != "document-url":
        return False
    has_data = any(k in value for k in ("file_data", "data", "base64"))
    return not has_data and any(value.get(k) for k in ("file_id", "file_url", "url", "id"))


def opaque_cost(payload: Mapping[str, Any]) -> tuple[str, int]:
    """An opaque payload as it is counted: its compact JSON with the media in it left out,
    and the media's tokens (`image_tokens`, `pdf_tokens`, `audio_tokens`, `video_tokens`,
    a PDF page for each 50 KB of another binary file, and the unknown sizes of media by
    reference). Media is what a provider reads as media: a base64 ``data:``
    URL where a URL names media (``image_url``, ``url``, ``file_data``), base64 ``data``
    beside its media or MIME type, Chat's audio, an image or a file by id or URL (a
    Responses computer-use screenshot or input file, an Anthropic document, a framework's
    binary part the adapter keeps whole). A text file's data is counted as its text; what
    a tool wrote (a data URL in its output) is the text it is."""
    text = compact_json(dict(payload))
    if not any(word in text for word in _MEDIA_WORDS):  # most payloads: a few searches in C
        return text, 0
    media = 0
    read_as_text = False  # a text file's data was read as its text

    def without_media(value: Any, key: object = None) -> Any:
        nonlocal media, read_as_text
        if isinstance(value, str):
            # Only where a provider reads a URL as the media it names: the same string in
            # a tool's output is text to the model.
            found = _DATA_URL.match(value) if key in _MEDIA_URL_KEYS else None
            if found is None:
                return value
            kind, data = found.group(1), value[found.end() :]
            if _text_like(kind):
                read_as_text = True
                return _text_of(data)
            tokens = _media_tokens(kind, data)
            if tokens is None:
                return value
            media += tokens
            return ""
        if isinstance(value, Mapping):
            kind = value.get("type")
            image = _base64(value.get("result")) if kind == "image_generation_call" else None
            if image is not None:  # the image it made, base64 in ``result``
                media += image_tokens(ImageBlock("image/png", image))  # its size is read
                return {k: v for k, v in value.items() if k != "result"}
            if kind == "text" or (isinstance(kind, str) and _TOOL_USE.search(kind)):
                # What the model wrote (a tool's input) and a text source are text, read
                # as written whatever keys they hold.
                return value
            referenced = _by_reference(value)
            if referenced is not None:  # its size is not known here
                media += referenced
                return {
                    k: without_media(v, k) for k, v in value.items() if k not in _REFERENCE_FIELDS
                }
            encoded = _base64(value.get("data")) or _base64(value.get("base64"))
            media_type = value.get("media_type") or value.get("mime_type")
            audio = value.get("format")
            rest = {k: v for k, v in value.items() if k not in ("data", "base64")}
            if encoded is not None and isinstance(media_type, str) and _text_like(media_type):
                read_as_text = True
                return {
                    **rest,
                    "text": _decode(encoded).decode("utf-8", "replace"),
                }  # read as the text it holds
            tokens = None
            if encoded is not None and isinstance(media_type, str):  # a source, a binary part
                tokens = _media_tokens(media_type, encoded)
            elif encoded is not None and isinstance(audio, str) and audio in _AUDIO_FORMATS:
                tokens = audio_tokens(encoded, audio)  # Chat's input_audio
            if tokens is not None:
                media += tokens
                return rest
            return {k: without_media(v, k) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [without_media(v, key) for v in value]
        return value

    try:
        stripped = without_media(payload)
    except RecursionError:  # nested past what a walk reaches: counted as the text it is
        return text, 0
    return (compact_json(stripped), media) if media or read_as_text else (text, 0)
