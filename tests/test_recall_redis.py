"""`RedisRecallStore` against a real ``redis-server`` started on 127.0.0.1 for these tests
(``./scripts/test`` installs it when it is missing)."""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import threading
import time
from typing import TYPE_CHECKING

import anyio
import pytest
import redis

from agentctx.budget import Budget
from agentctx.errors import ConfigError, StoreError
from agentctx.events import StoreDegraded
from agentctx.manager import ContextManager
from agentctx.messages import Message, canonical_json
from agentctx.recall import LedgerStore, RecallStore, recall_id
from agentctx.recall.redis import RedisRecallStore
from agentctx.strategies import ToolOutputPipeline
from agentctx.testing import synthetic_session

from .test_recall import RID, aged_session, check_extend_ledger, check_round_trip, replay

if TYPE_CHECKING:
    from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (./scripts/test installs it)")
    port = free_port()
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        else:
            pytest.fail("redis-server did not start")
        yield url
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisRecallStore]:
    s = RedisRecallStore(redis_url, prefix=f"t{time.monotonic_ns()}")
    yield s
    s.close()


def test_round_trip_is_scoped_by_session(store: RedisRecallStore) -> None:
    assert isinstance(store, RecallStore) and isinstance(store, LedgerStore)
    text = "line one\nline two ✓ \ud800"  # a lone surrogate comes back exactly
    rid = store.put("a", text)
    assert rid == recall_id("a", text) and store.put("a", text) == rid
    assert store.get("a", rid) == text
    store.save_ledger("a\udcff", '[{"x": "\ud83d"}]')  # a half emoji, a fsdecoded byte
    assert store.load_ledger("a\udcff") == '[{"x": "\ud83d"}]'
    assert store.get("b", rid) is None
    # an id comes from the model: a crafted one cannot reach another session's key
    other = store.put("a:r:ctx-0000000000000000", "secret")
    assert store.get("a", f"ctx-0000000000000000:r:{other}") is None
    assert store.load_ledger("a") is None
    store.save_ledger("a", '{"v": 1}')
    assert store.load_ledger("a") == '{"v": 1}' and store.load_ledger("b") is None


async def test_another_worker_resumes_the_same_view(redis_url: str) -> None:
    history = aged_session()
    first = RedisRecallStore(redis_url, prefix="resume")
    view, ledger = await replay(first, history, "run-1")
    first.close()
    second = RedisRecallStore(redis_url, prefix="resume")  # another process, say
    assert check_round_trip(second, "run-1", history, ledger) > 5
    async with ContextManager(
        Budget(context_window=40_000, reserve_output=4_000),
        strategy=ToolOutputPipeline(mc=None, budget=None, l0=None, l1=None, l2=None),
        recall=second,
        session_id="run-1",
        on_over_budget="send",
    ) as again:
        resumed = await again.prepare(history)
    assert [canonical_json(m) for m in resumed] == [canonical_json(m) for m in view]
    for m in view:
        for rid in RID.findall(canonical_json(m)):
            assert second.get("run-1", rid) is not None
            assert second.get("run-2", rid) is None
    second.close()


def test_unreferenced_entries_expire_referenced_ones_do_not(redis_url: str) -> None:
    store = RedisRecallStore(redis_url, prefix="ttl", ttl_seconds=60)
    raw = redis.Redis.from_url(redis_url)
    store.update_pins("s", {recall_id("s", "kept")}, ())  # the ledger names it first
    kept, dropped = store.put("s", "kept"), store.put("s", "dropped")
    key = "ttl:s:r:{}".format
    assert raw.ttl(key(kept)) == -1 and 0 < raw.ttl(key(dropped)) <= 60  # nobody names it
    store.pin("s", {kept, dropped})  # referenced: kept for good
    assert raw.ttl(key(dropped)) == -1
    store.pin("s", {kept})  # no longer referenced: expires again
    assert raw.ttl(key(kept)) == -1 and 0 < raw.ttl(key(dropped)) <= 60
    store.release("s")  # the session ended here: all of it expires unless a worker resumes it
    assert 0 < raw.ttl(key(kept)) <= 60
    store.pin("s", {kept})  # resumed
    assert raw.ttl(key(kept)) == -1
    raw.close()
    store.close()
    with pytest.raises(ConfigError):
        RedisRecallStore(redis_url, ttl_seconds=0)


def test_many_workers_share_one_server(redis_url: str) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            s = RedisRecallStore(redis_url, prefix="workers")
            for i in range(50):
                rid = s.put(f"session-{n}", f"output {i} of worker {n}")
                assert s.get(f"session-{n}", rid) == f"output {i} of worker {n}"
                assert s.get(f"session-{(n + 1) % 4}", rid) is None
            s.close()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_server_that_is_gone_is_a_store_error() -> None:
    store = RedisRecallStore(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(StoreError, match="Redis"):
        store.put("s", "text")
    with pytest.raises(StoreError):
        store.get("s", "ctx-0000000000000000")
    store.close()
    with pytest.raises(StoreError):
        RedisRecallStore("not a url")


async def test_entries_a_server_restarted_empty_lost_are_said_to_be_lost(redis_url: str) -> None:
    """Found by a hostile run (R, finding 1): the server lost what the session had written
    (restarted without persistence, or evicting), and a recall of an id the view shows told
    the model it "was not found in this session", as for a mistyped id; no event said so."""
    prefix = f"t{time.monotonic_ns()}"
    events: list[object] = []
    client = redis.Redis.from_url(redis_url)
    store = RedisRecallStore(redis_url, prefix=prefix)
    try:
        async with ContextManager(
            Budget(context_window=40_000, reserve_output=4_000),
            recall=store,
            session_id="restarted",
            on_over_budget="send",
        ) as ctx:
            ctx.subscribe(events.append)
            view: list[Message] = []
            for group in synthetic_session(3, 60, mean_output_lines=30):
                view = await ctx.prepare([*view, *group])
            ids = sorted({r for m in view for r in RID.findall(canonical_json(m))})
            assert ids
            for _ in range(250):  # the writer writes off the event loop
                if all(store.get("restarted", rid) is not None for rid in ids):
                    break
                await anyio.sleep(0.02)
            else:
                raise AssertionError("the entries were not written")
            for key in client.scan_iter(f"{prefix}*"):
                client.delete(key)
            client.close()
            answers = [await ctx.handle_recall({"id": rid}) for rid in [*ids, ids[-1]]]
            unknown = await ctx.handle_recall({"id": "ctx-0123456789abcdef"})
    finally:
        store.close()
    assert all("the recall store no longer holds it" in a for a in answers)
    assert "not found" in unknown  # an id the session never named: mistyped
    missing = [e for e in events if isinstance(e, StoreDegraded) and e.reason == "missing"]
    assert [e.lost for e in missing] == [(rid,) for rid in ids]  # once each


def test_the_redis_store_saves_a_ledger_a_decision_at_a_time(store: RedisRecallStore) -> None:
    check_extend_ledger(store)


def test_a_ledger_of_any_length_is_saved_whole_in_one_go(store: RedisRecallStore) -> None:
    """A worker that resumes a session saves its whole ledger from decision 0 on its first
    save. Past about 8,000 decisions the script failed (Lua's unpack takes no more) after it
    had deleted the saved ledger: the session's decisions were gone, and never saved again
    (found by a hostile run)."""
    parts = [json.dumps({"n": n}) for n in range(20_000)]
    assert store.extend_ledger("big", parts[:10], 0)
    assert store.extend_ledger("big", parts, 0)
    assert json.loads(store.load_ledger("big") or "") == [{"n": n} for n in range(20_000)]
    assert store.extend_ledger("big", parts[5:9_000], 5)
    assert len(json.loads(store.load_ledger("big") or "")) == 9_000


@pytest.mark.parametrize("save", ["whole", "a decision at a time"])
def test_a_live_sessions_ledger_keeps_no_expiry_until_the_session_ends(
    redis_url: str, save: str
) -> None:
    """Found by a hostile run (BT store 1): the ledger's expiry was refreshed only when a
    decision was saved, so a session going longer than ``ttl_seconds`` without one lost it
    while the entries it names stayed pinned, and the next worker silently started over."""
    store = RedisRecallStore(redis_url, prefix=f"live{time.monotonic_ns()}", ttl_seconds=60)
    raw = redis.Redis.from_url(redis_url)
    ledger, parts = f"{store.prefix}:s:ledger", f"{store.prefix}:s:ledger:parts"

    def saved() -> None:
        if save == "whole":
            store.save_ledger("s", '[{"a": 1}]')
        else:
            assert store.extend_ledger("s", ['{"a": 1}'], 0)

    saved()
    key = ledger if save == "whole" else parts
    assert raw.ttl(key) == -1  # live: no expiry, however long until the next decision
    store.release("s")  # the session ended here
    assert 0 < raw.ttl(key) <= 60
    saved()  # a worker resumes it
    assert raw.ttl(key) == -1
    store.release("s")
    resumed = RedisRecallStore(redis_url, prefix=store.prefix, ttl_seconds=60)
    assert resumed.load_ledger("s") == '[{"a": 1}]'  # resumed, no decision yet: live too
    assert raw.ttl(key) == -1
    resumed.release("s")
    assert 0 < raw.ttl(key) <= 60
    raw.close()
    resumed.close()
    store.close()


async def test_a_session_quiet_for_longer_than_the_ttl_resumes_as_it_was(redis_url: str) -> None:
    """The same, end to end: a worker whose calls take no decision for longer than
    ``ttl_seconds`` hands over a session the next worker resumes byte for byte."""
    prefix = f"quiet{time.monotonic_ns()}"
    history = aged_session()

    def worker(store: RedisRecallStore) -> ContextManager:
        return ContextManager(
            Budget(context_window=40_000, reserve_output=4_000),
            recall=store,
            session_id="run-q",
            on_over_budget="send",
        )

    first = RedisRecallStore(redis_url, prefix=prefix, ttl_seconds=1)
    async with worker(first) as ctx:
        for n in range(20, len(history) + 1, 20):  # decisions at several points on the way
            view = await ctx.prepare(history[:n])
        view = await ctx.prepare(history)
        assert ctx.ledger.decisions
        version = ctx.ledger.version
        await anyio.sleep(2.2)  # past the ttl, no decision
        assert await ctx.prepare(history) == view and ctx.ledger.version == version
        second = RedisRecallStore(redis_url, prefix=prefix, ttl_seconds=1)
        async with worker(second) as resumed:  # a hand-over while the first still runs
            assert await resumed.prepare(history) == view
    first.close()
    second.close()


@pytest.mark.parametrize("ttl", [604_800.0, 0.5, 59.2])
def test_an_expiry_in_fractional_seconds_is_whole_seconds(redis_url: str, ttl: float) -> None:
    """`timedelta(days=7).total_seconds()` is a float: taken, not refused by the server on
    every write (found by a hostile run: every ledger save failed, and nothing expired)."""
    store = RedisRecallStore(redis_url, prefix=f"f{time.monotonic_ns()}", ttl_seconds=ttl)
    raw = redis.Redis.from_url(redis_url)
    rid = store.put("s", "text")
    assert store.extend_ledger("s", ['{"a": 1}'], 0)
    store.release("s")  # the ledger expires once the session ended
    whole = math.ceil(ttl)
    assert 0 < raw.ttl(f"{store.prefix}:s:r:{rid}") <= whole
    assert 0 < raw.ttl(f"{store.prefix}:s:ledger:parts") <= whole
    raw.close()
    store.close()


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("ttl_seconds", 0),
        ("ttl_seconds", -1),
        ("ttl_seconds", True),
        ("ttl_seconds", "7d"),
        ("ttl_seconds", math.nan),
        ("ttl_seconds", math.inf),
        ("ttl_seconds", 1e300),  # past what Redis keeps: every write failed
        ("ttl_seconds", 2**63),
        ("timeout", 0),
        ("timeout", "1"),
        ("timeout", 1e12),  # past what a socket takes: every call raised OverflowError
    ],
)
def test_a_setting_that_cannot_work_is_refused_when_the_store_is_made(
    redis_url: str, setting: str, value: object
) -> None:
    with pytest.raises(ConfigError, match=setting):
        RedisRecallStore(redis_url, **{setting: value})  # type: ignore[arg-type]


def test_a_ledger_is_read_from_a_server_over_its_memory_limit(redis_url: str) -> None:
    """A server over its ``maxmemory`` refuses transactions, which the ledger was read in: a
    resuming worker found no ledger and started over (a cache break), then saved over the
    one it could not read (found by a hostile run). Reads still work there."""
    store = RedisRecallStore(redis_url, prefix=f"oom{time.monotonic_ns()}")
    raw = redis.Redis.from_url(redis_url)
    store.save_ledger("s", '[{"saved": true}]')
    store.extend_ledger("t", ['{"part": 1}'], 0)
    used = int(raw.info("memory")["used_memory"])
    raw.config_set("maxmemory", used // 2)
    raw.config_set("maxmemory-policy", "noeviction")
    try:
        with pytest.raises(redis.OutOfMemoryError):
            raw.set("more", "x")  # over the limit
        assert json.loads(store.load_ledger("s") or "") == [{"saved": True}]
        assert json.loads(store.load_ledger("t") or "") == [{"part": 1}]
    finally:
        raw.config_set("maxmemory", 0)
        raw.close()
        store.close()


def test_redis_keeps_the_session_state_as_it_keeps_the_ledger(redis_url: str) -> None:
    """`SessionStateStore` (the calibration and last call a resumed worker takes over): no
    expiry while a worker holds the session, the expiry once it ends."""
    store = RedisRecallStore(redis_url, prefix=f"state{time.monotonic_ns()}", ttl_seconds=60)
    raw = redis.Redis.from_url(redis_url)
    key = f"{store.prefix}:s:state"
    store.save_state("s", '{"version": 1}')
    assert raw.ttl(key) == -1 and store.load_state("s") == '{"version": 1}'
    store.release("s")
    assert 0 < raw.ttl(key) <= 60
    other = RedisRecallStore(redis_url, prefix=store.prefix, ttl_seconds=60)
    assert other.load_state("s") == '{"version": 1}'  # resumed: live again
    assert raw.ttl(key) == -1
    other.release("s")
    assert 0 < raw.ttl(key) <= 60
    raw.close()
    other.close()
    store.close()


# -- found by a hostile run (CD 2) ---------------------------------------------------------


def test_no_two_sessions_share_a_key_whatever_their_prefixes(redis_url: str) -> None:
    """Prefix ``tenant`` with session ``acme:42`` and prefix ``tenant:acme`` with session
    ``42`` made the same keys: one read the other's entries, ledger and state."""
    base = f"t{time.monotonic_ns()}"
    a = RedisRecallStore(redis_url, prefix=f"{base}:tenant")
    b = RedisRecallStore(redis_url, prefix=f"{base}:tenant:acme")
    (rid,) = a.put_many("acme:42", ["A's private text"])
    a.save_ledger("acme:42", "[]")
    a.save_state("acme:42", '{"version": 1}')
    assert b.get("42", rid) is None
    assert b.load_ledger("42") is None and b.load_state("42") is None
    assert a.get("acme:42", rid) == "A's private text"
    a.close()
    b.close()


@pytest.mark.parametrize("session", ["a", "*", "a[b]", "a\\b", "100%", "a:r"])
def test_forget_deletes_one_sessions_keys_and_no_others(redis_url: str, session: str) -> None:
    """The docs said to delete a dead session with ``{prefix}:{session}:*``: for session
    ``a`` that matched the keys of sessions ``a:b``, ``a:r``, ...; for ``*``, every one's."""
    store = RedisRecallStore(redis_url, prefix=f"t{time.monotonic_ns()}")
    others = ["a:b", "a:r", "a:ledger", "ab", "b", "a*", "%2A"]
    kept = {s: store.put_many(s, [f"text of {s}"])[0] for s in others if s != session}
    for s in [session, *kept]:
        store.save_ledger(s, json.dumps([s]))
        store.save_state(s, json.dumps({"s": s}))
    (rid,) = store.put_many(session, ["gone"])
    store.forget(session)
    assert store.get(session, rid) is None
    assert store.load_ledger(session) is None and store.load_state(session) is None
    for s, other in kept.items():
        assert store.get(s, other) == f"text of {s}"
        assert store.load_ledger(s) == json.dumps([s]) and store.load_state(s) is not None
    store.close()


def test_a_client_that_decodes_responses_is_refused_and_bad_utf8_is_a_data_error(
    redis_url: str,
) -> None:
    """Found by a hostile run (CS 5): with ``client=redis.Redis(decode_responses=True)``,
    forget() raised AttributeError and deleted nothing, and a value that is no UTF-8 text
    raised UnicodeDecodeError. Now such a client is refused when the store is made (a
    ConfigError that says why), and a value the client cannot decode is a StoreDataError."""
    from agentctx.errors import StoreDataError

    decoding = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ConfigError, match="decode_responses"):
            RedisRecallStore(client=decoding)
    finally:
        decoding.close()
    client = redis.Redis.from_url(redis_url)
    try:
        store = RedisRecallStore(client=client, prefix="cs5")
        rid = store.put("s", "text")
        client.set(f"cs5:s:r:{rid}", b"\xff\xfe not utf-8")
        # The pool turned to decoding after the store was made (the check sees the client
        # as given): the decode error is still the store's data error.
        client.connection_pool.connection_kwargs["decode_responses"] = True
        client.connection_pool.disconnect()
        with pytest.raises(StoreDataError, match="not UTF-8"):
            store.get("s", rid)
    finally:
        client.close()


def test_other_content_at_a_recall_id_in_redis_is_a_store_data_error(redis_url: str) -> None:
    """Found by a hostile run (CS 10): wrong data already at a recall id (SET NX keeps what
    is there) was handed to the model as the original. Now a read checks the content
    against its id (a content hash) and raises StoreDataError when they differ."""
    from agentctx.errors import StoreDataError

    client = redis.Redis.from_url(redis_url)
    store = RedisRecallStore(client=client, prefix="cs10")
    try:
        rid = recall_id("s", "the original")
        client.set(f"cs10:s:r:{rid}", b"forged")
        assert store.put("s", "the original") == rid
        with pytest.raises(StoreDataError, match=rid):
            store.get("s", rid)
        assert store.get("s", store.put("s", "another")) == "another"
    finally:
        client.close()
