"""`RedisRecallStore`: recall entries and ledgers in Redis, shared by many workers.

```python
from agentctx.recall.redis import RedisRecallStore   # pip install 'py-agentctx[redis]'

store = RedisRecallStore("redis://localhost:6379/0", ttl_seconds=7 * 86_400)
async with ContextManager(budget, recall=store, session_id="run-42") as ctx: ...
```

Any worker with the same ``session_id`` reads the same entries and resumes the same ledger.
Keys are ``{prefix}:{session}:r:{id}`` (content) and ``{prefix}:{session}:ledger`` (or
``...:ledger:parts``, a list of its decisions, as `extend_ledger` saves them), with ``%``,
``:``, ``*``, ``?``, ``[``, ``]`` and ``\\`` of the session id percent-encoded (``%3A``, ...),
so no two sessions share a key whatever their prefixes; a session can only name its own;
`forget` deletes a session's keys. With ``ttl_seconds`` entries expire unless the session's
ledger still references them (`update_pins` removes their expiry; entries no longer
referenced, and all of a session's entries once it ends, get it back); its ledger keeps no
expiry while a worker holds the session (saved or resumed it), and gets it when the session
ends here (`release`). Redis errors become `StoreError`.

The manager never calls it on the event loop: its writer runs each call in a worker thread
under a deadline (a thread, not ``redis.asyncio``, so one store can serve managers on several
event loops, as the blocking client wrappers run). A client this store makes gives up after
``timeout`` seconds (connect and each reply) and does not retry by itself: the writer keeps
what was not written and retries it with backoff, so a frozen or restarting server delays
writes, never the agent. Values are UTF-8 bytes encoded with ``surrogatepass``: a lone
surrogate comes back exactly as stored.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from agentctx._check import number
from agentctx.errors import ConfigError, MissingExtraError, StoreDataError, StoreError
from agentctx.recall.store import recall_id, vouched

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as exc:
    raise MissingExtraError("redis", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

__all__ = ["RedisRecallStore"]

_RID = re.compile(r"ctx-[0-9a-f]{16}")
# What a session id may not hold as it is in a key: ``:`` would let it pass for a session of
# another prefix ("a" + "b:c" and "a:b" + "c"), ``*?[]\`` would make a key pattern of it
# match other sessions' keys; these and ``%`` are written percent-encoded.
_KEY_ESCAPES = str.maketrans({c: f"%{ord(c):02X}" for c in "%:*?[]\\"})
_GLOB_ESCAPES = str.maketrans({c: "\\" + c for c in "*?[]\\"})
_FINEST = 1e-3  # below a millisecond, a timeout or an expiry is a mistake
_LONGEST = 100 * 365 * 86_400  # an expiry Redis keeps (past 2**63 ms it refuses it): a century
_LONGEST_WAIT = 86_400.0  # a socket timeout the platform takes: a day


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _decode(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:  # written by something else: a store error, not a crash
        raise StoreDataError(f"recall store holds a value that is not UTF-8 text: {e}") from e


# KEYS: the parts list, the whole ledger's key. ARGV: start, then the parts. One script, so
# no other client's write falls between the check and the write. A script that fails is not
# rolled back: the whole ledger is deleted only once its parts are written, and they are
# pushed a thousand at a time (Lua's unpack takes about 8,000 values at most). The list keeps
# no expiry while saved (one a `release` gave it is taken off).
_EXTEND = """
local start = tonumber(ARGV[1])
if redis.call('LLEN', KEYS[1]) < start then return 0 end
if start > 0 then redis.call('LTRIM', KEYS[1], 0, start - 1) else redis.call('DEL', KEYS[1]) end
for i = 2, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('DEL', KEYS[2])
redis.call('PERSIST', KEYS[1])
return 1
"""


class RedisRecallStore:
    """A `RecallStore` and `LedgerStore` on a Redis server.

    Args:
        url: a ``redis://`` URL (ignored when ``client`` is given).
        client: a ``redis.Redis`` to use instead (the caller keeps ownership, and its
            timeouts and retries apply). Not one made with ``decode_responses=True``: the
            store reads keys and values as bytes (a `ConfigError` says so).
        prefix: the first part of every key.
        ttl_seconds: how long an entry no ledger references is kept (``None``: forever);
            Redis keeps whole seconds, so a fraction counts as a second more
            (``timedelta(days=7).total_seconds()`` is fine).
        timeout: seconds to connect and to wait for each reply, for a client made from
            ``url``.
    """

    def __init__(
        self,
        url: str = "redis://localhost:6379/0",
        *,
        client: redis.Redis | None = None,
        prefix: str = "agentctx",
        ttl_seconds: float | None = None,
        timeout: float = 1.0,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.timeout = timeout
        number(self, "ttl_seconds", minimum=_FINEST, maximum=_LONGEST, optional=True)
        number(self, "timeout", minimum=_FINEST, maximum=_LONGEST_WAIT)
        self._ttl = None if ttl_seconds is None else math.ceil(ttl_seconds)  # whole seconds
        self.prefix = prefix
        if client is not None and client.get_connection_kwargs().get("decode_responses"):
            # Keys are matched and values decoded as bytes here (surrogates kept, bad UTF-8 a
            # StoreDataError); a client that decodes first breaks forget() and raises on them.
            raise ConfigError(
                "RedisRecallStore needs a client that returns bytes: make it without "
                "decode_responses=True"
            )
        self._owned = client is None
        try:
            self._redis: redis.Redis = client or redis.Redis.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0),
            )
        except (ValueError, redis.RedisError) as exc:
            raise StoreError(f"cannot use Redis at {url}: {exc}") from exc
        self._pinned: dict[str, set[str]] = {}
        self._live: set[str] = set()  # sessions whose ledger this store saved, until release

    def put(self, session_id: str, content: str) -> str:
        """Store ``content`` for ``session_id`` and return its recall id."""
        return self.put_many(session_id, [content])[0]

    def put_many(self, session_id: str, contents: Sequence[str]) -> list[str]:
        """Store each of ``contents`` in one round trip; return their recall ids.

        With ``ttl_seconds``, an entry the session does not reference (`update_pins`) expires
        like an unreferenced one; the manager pins what its ledger references first."""
        rids = [recall_id(session_id, c) for c in contents]
        pins = self._pinned.get(session_id, set())
        ttl = self._ttl

        def apply(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=False)
            for rid, content in zip(rids, contents, strict=True):
                ex = None if rid in pins else ttl
                pipe.set(self._key(session_id, rid), _encode(content), nx=True, ex=ex)
            pipe.execute()

        self._call(apply)
        return rids

    def get(self, session_id: str, rid: str) -> str | None:
        """The content stored under ``rid`` for ``session_id``, or ``None``."""
        if not _RID.fullmatch(rid):
            return None  # an id comes from the model: never let it reach another key
        content = _decode(self._call(lambda r: r.get(self._key(session_id, rid))))
        return None if content is None else vouched(session_id, rid, content)

    def pin(self, session_id: str, rids: Iterable[str]) -> None:
        """Mark exactly ``rids`` as still referenced by ``session_id``."""
        new = set(rids)
        old = self._pinned.get(session_id, set())
        self.update_pins(session_id, new - old, old - new)

    def update_pins(self, session_id: str, added: Iterable[str], removed: Iterable[str]) -> None:
        """``added`` are referenced by ``session_id`` from now on (no expiry), ``removed`` no
        longer (they expire after ``ttl_seconds``)."""
        pins = self._pinned.setdefault(session_id, set())
        added, removed = set(added) - pins, set(removed) & pins
        if self._ttl is not None and (added or removed):
            self._expire(session_id, persist=added, expire=removed)
        pins |= added
        pins -= removed

    def release(self, session_id: str) -> None:
        """``session_id`` ended here: its entries and its ledger expire after
        ``ttl_seconds`` unless a worker that resumes it references (saves) them again."""
        pins = self._pinned.get(session_id, set())
        ttl = self._ttl
        if ttl is not None and (pins or session_id in self._live):
            self._expire(session_id, persist=(), expire=pins, ledger=session_id in self._live)
        self._pinned.pop(session_id, None)
        self._live.discard(session_id)

    def load_ledger(self, session_id: str) -> str | None:
        """The saved ledger JSON of ``session_id``, or ``None``. With ``ttl_seconds``, a ledger
        found keeps no expiry from now until `release`: the session is live here."""

        def read(r: redis.Redis) -> tuple[list[bytes], bytes | None]:
            try:
                return self._read_ledger(r, session_id, transaction=True)
            except redis.OutOfMemoryError:
                # A server over its maxmemory refuses transactions, not reads: read the two
                # forms one after the other (a save between them, by another worker on the
                # session, is the rare case the transaction was for).
                return self._read_ledger(r, session_id, transaction=False)

        parts, whole = self._call(read)
        if (parts or whole is not None) and self._ttl is not None:
            # Resumed: live here until `release`, as if this worker had saved it.
            self._call(lambda r: self._persist_ledger(r, session_id))
            self._live.add(session_id)
        if parts:
            return "[" + ", ".join(_decode(p) or "" for p in parts) + "]"
        return _decode(whole)

    def _persist_ledger(self, r: redis.Redis, session_id: str) -> None:
        pipe = r.pipeline(transaction=False)
        pipe.persist(self._ledger_key(session_id))
        pipe.persist(self._parts_key(session_id))
        pipe.execute()

    def load_state(self, session_id: str) -> str | None:
        """The saved state JSON of ``session_id`` (`SessionStateStore`), or ``None``; kept
        as its ledger is (no expiry while a worker holds the session)."""
        key = self._state_key(session_id)
        saved = _decode(self._call(lambda r: r.get(key)))
        if saved is not None and self._ttl is not None:
            self._call(lambda r: r.persist(key))
            self._live.add(session_id)
        return saved

    def save_state(self, session_id: str, state_json: str) -> None:
        """Save the state JSON of ``session_id`` (`SessionStateStore`), with no expiry until
        `release`."""
        data = _encode(state_json)
        self._call(lambda r: r.set(self._state_key(session_id), data))
        self._live.add(session_id)

    def _read_ledger(
        self, r: redis.Redis, session_id: str, *, transaction: bool
    ) -> tuple[list[bytes], bytes | None]:
        pipe = r.pipeline(transaction=transaction)
        pipe.lrange(self._parts_key(session_id), 0, -1)
        pipe.get(self._ledger_key(session_id))
        parts, whole = pipe.execute()
        return parts, whole

    def save_ledger(self, session_id: str, ledger_json: str) -> None:
        """Save the ledger JSON of ``session_id``, with no expiry until `release`: a live
        session that goes long without a decision keeps it, as it keeps the entries it
        references."""
        data = _encode(ledger_json)

        def write(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=True)
            pipe.delete(self._parts_key(session_id))
            pipe.set(self._ledger_key(session_id), data)
            pipe.execute()

        self._call(write)
        self._live.add(session_id)

    def extend_ledger(self, session_id: str, parts: Sequence[str], start: int) -> bool:
        """Save the ledger of ``session_id`` as its first ``start`` decisions as saved, then
        ``parts`` (one decision's JSON each), atomically, with no expiry until `release`: a
        save costs what the ledger added, not the whole ledger (`AppendingLedgerStore`).
        ``False``, with nothing written, when fewer than ``start`` are there (the server
        restarted empty, the key expired or was evicted)."""
        words: list[bytes | int] = [self._parts_key(session_id), self._ledger_key(session_id)]
        words += [start, *(_encode(part) for part in parts)]
        saved = bool(self._call(lambda r: r.eval(_EXTEND, 2, *words)))
        if saved:
            self._live.add(session_id)
        return saved

    def forget(self, session_id: str) -> None:
        """Delete everything this store keeps of ``session_id`` (its entries, ledger and
        state), to end it for good or as its data must go. Not while a worker runs the
        session: what it writes next is kept again."""
        fixed = [self._ledger_key(session_id), self._parts_key(session_id)]
        fixed.append(self._state_key(session_id))
        head = f"{self._session(session_id)}:r:"
        pattern = _encode(head.translate(_GLOB_ESCAPES) + "*")
        skip = len(_encode(head))

        def apply(r: redis.Redis) -> None:
            found = r.scan_iter(match=pattern, count=1000)
            keys = [k for k in found if _RID.fullmatch(k[skip:].decode("ascii", "replace"))]
            keys += fixed
            for i in range(0, len(keys), 1000):
                r.delete(*keys[i : i + 1000])

        self._call(apply)
        self._pinned.pop(session_id, None)
        self._live.discard(session_id)

    def close(self) -> None:
        """Close the connection pool if this store made it."""
        if self._owned:
            self._redis.close()

    def _expire(
        self,
        session_id: str,
        *,
        persist: Iterable[str],
        expire: Iterable[str],
        ledger: bool = False,
    ) -> None:
        ttl = self._ttl
        assert ttl is not None

        def apply(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=False)
            for rid in persist:
                pipe.persist(self._key(session_id, rid))
            for rid in expire:
                pipe.expire(self._key(session_id, rid), ttl)
            if ledger:
                pipe.expire(self._ledger_key(session_id), ttl)
                pipe.expire(self._parts_key(session_id), ttl)
                pipe.expire(self._state_key(session_id), ttl)
            pipe.execute()

        self._call(apply)

    def _session(self, session_id: str) -> str:
        return f"{self.prefix}:{session_id.translate(_KEY_ESCAPES)}"

    def _key(self, session_id: str, rid: str) -> bytes:
        return _encode(f"{self._session(session_id)}:r:{rid}")

    def _ledger_key(self, session_id: str) -> bytes:
        return _encode(f"{self._session(session_id)}:ledger")

    def _parts_key(self, session_id: str) -> bytes:
        return _encode(f"{self._session(session_id)}:ledger:parts")

    def _state_key(self, session_id: str) -> bytes:
        return _encode(f"{self._session(session_id)}:state")

    def _call(self, action: Callable[[redis.Redis], Any]) -> Any:
        try:
            return action(self._redis)
        except redis.ResponseError as exc:
            # A key of another type (WRONGTYPE) stays so: no retry reads it.
            # (A pipeline's error names its command first.)
            error = StoreDataError if "WRONGTYPE" in str(exc) else StoreError
            raise error(f"recall store (Redis): {exc}") from exc
        except redis.RedisError as exc:
            raise StoreError(f"recall store (Redis): {exc}") from exc
        except UnicodeDecodeError as exc:  # a client that decodes what it reads (the checks
            # made here are of the client as given; its pool may be changed since)
            raise StoreDataError(
                f"recall store holds a value that is not UTF-8 text: {exc}"
            ) from exc
