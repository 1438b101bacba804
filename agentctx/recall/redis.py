"""`RedisRecallStore`: recall entries and ledgers in Redis, shared by many workers.

```python
from agentctx.recall.redis import RedisRecallStore   # pip install 'py-agentctx[redis]'

store = RedisRecallStore("redis://localhost:6379/0", ttl_seconds=7 * 86_400)
async with ContextManager(budget, recall=store, session_id="run-42") as ctx: ...
```

Any worker with the same ``session_id`` reads the same entries and resumes the same ledger.
Keys are ``{prefix}:{session}:r:{id}`` (content) and ``{prefix}:{session}:ledger``; a session
can only name its own. With ``ttl_seconds`` entries expire unless the session's view still
references them (`pin` removes their expiry; entries no longer referenced get it back), and
the ledger is refreshed on every save. Redis errors become `StoreError`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from agentctx.errors import ConfigError, MissingExtraError, StoreError
from agentctx.recall.store import recall_id

try:
    import redis
except ImportError as exc:
    raise MissingExtraError("redis", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

__all__ = ["RedisRecallStore"]

_RID = re.compile(r"ctx-[0-9a-f]{16}")


class RedisRecallStore:
    """A `RecallStore` and `LedgerStore` on a Redis server.

    Args:
        url: a ``redis://`` URL (ignored when ``client`` is given).
        client: a ``redis.Redis`` to use instead (the caller keeps ownership).
        prefix: the first part of every key.
        ttl_seconds: how long an entry no view references is kept (``None``: forever).
    """

    def __init__(
        self,
        url: str = "redis://localhost:6379/0",
        *,
        client: redis.Redis | None = None,
        prefix: str = "agentctx",
        ttl_seconds: int | None = None,
    ) -> None:
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ConfigError(f"ttl_seconds must be positive, got {ttl_seconds}")
        self.prefix = prefix
        self.ttl_seconds = ttl_seconds
        self._owned = client is None
        try:
            self._redis: redis.Redis = client or redis.Redis.from_url(url)
        except (ValueError, redis.RedisError) as exc:
            raise StoreError(f"cannot use Redis at {url}: {exc}") from exc
        self._pinned: dict[str, set[str]] = {}

    def put(self, session_id: str, content: str) -> str:
        """Store ``content`` for ``session_id`` and return its recall id."""
        rid = recall_id(session_id, content)
        # A new entry is about to be referenced by a placeholder: it is kept without expiry
        # until a `pin` says the view no longer names it.
        data = content.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        self._call(lambda r: r.set(self._key(session_id, rid), data, nx=True))
        self._pinned.setdefault(session_id, set()).add(rid)
        return rid

    def get(self, session_id: str, rid: str) -> str | None:
        """The content stored under ``rid`` for ``session_id``, or ``None``."""
        if not _RID.fullmatch(rid):
            return None  # an id comes from the model: never let it reach another key
        value = self._call(lambda r: r.get(self._key(session_id, rid)))
        return None if value is None else bytes(value).decode("utf-8")

    def pin(self, session_id: str, rids: Iterable[str]) -> None:
        """Mark exactly ``rids`` as still referenced by ``session_id``'s view."""
        pinned = set(rids)
        before = self._pinned.get(session_id, set())
        self._pinned[session_id] = pinned
        ttl = self.ttl_seconds
        if ttl is None:
            return

        def apply(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=False)
            for rid in pinned - before:
                pipe.persist(self._key(session_id, rid))
            for rid in before - pinned:
                pipe.expire(self._key(session_id, rid), ttl)
            pipe.execute()

        self._call(apply)

    def load_ledger(self, session_id: str) -> str | None:
        """The saved ledger JSON of ``session_id``, or ``None``."""
        value = self._call(lambda r: r.get(self._ledger_key(session_id)))
        return None if value is None else bytes(value).decode("utf-8")

    def save_ledger(self, session_id: str, ledger_json: str) -> None:
        """Save the ledger JSON of ``session_id`` (refreshing its expiry)."""
        self._call(lambda r: r.set(self._ledger_key(session_id), ledger_json, ex=self.ttl_seconds))

    def close(self) -> None:
        """Close the connection pool if this store made it."""
        if self._owned:
            self._redis.close()

    def _key(self, session_id: str, rid: str) -> str:
        return f"{self.prefix}:{session_id}:r:{rid}"

    def _ledger_key(self, session_id: str) -> str:
        return f"{self.prefix}:{session_id}:ledger"

    def _call(self, action: Callable[[redis.Redis], Any]) -> Any:
        try:
            return action(self._redis)
        except redis.RedisError as exc:
            raise StoreError(f"recall store (Redis): {exc}") from exc
