"""`MessageCounter`: memoized, calibrated token counts of messages and prompts."""

from __future__ import annotations

import math
import sys
import threading
import types
import weakref
from collections import abc
from numbers import Real
from operator import mul
from typing import TYPE_CHECKING, Any

from agentctx._check import preview
from agentctx.errors import ConfigError, UnsupportedMessageError
from agentctx.messages import (
    MOST_TOKENS,
    AssistantMessage,
    ImageBlock,
    Message,
    OpaqueBlock,
    RedactedThinkingBlock,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    fingerprint,
    written_arguments,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

from agentctx.tokens.calibrate import Calibration
from agentctx.tokens.classify import CLASS_ORDER, ContentClass
from agentctx.tokens.estimate import (
    Estimator,
    FeatureCounter,
    TokenCounter,
    default_estimator,
    image_tokens,
)
from agentctx.tokens.estimate import compact_json as _compact_json
from agentctx.tokens.media import opaque_cost

__all__ = ["MessageCounter"]


# ---------------------------------------------------------------------------------------
# Message counter with calibration


# Claiming a message for a counter's estimate is one check and one write: sessions in other
# threads may count the same message object (a briefing from a shared summary cache).
_CLAIMS = threading.Lock()


class _Entry:
    """Memo entry: the uncalibrated per-slot vector and its count under one calibration.

    ``exact`` is false while ``base`` is the quick first estimate (see `MessageCounter.refine`);
    ``owner`` is the counter's key, so a message carrying the entry of another counter is
    counted again.
    """

    __slots__ = ("base", "count", "exact", "generation", "owner")

    def __init__(
        self, owner: object, base: tuple[float, ...], generation: int, exact: bool = True
    ) -> None:
        self.owner = owner
        self.base = base
        self.count = 0
        self.generation = generation
        self.exact = exact


class _Estimates(dict[object, _Entry]):
    """The estimates of a message that several counters counted (sessions sharing message
    objects: managers replaying one history, a briefing from a shared summary cache), by
    counter key. Its ``owner`` is no counter's, so the inline checks of `_Entry` fall
    through to `MessageCounter._entry`."""

    __slots__ = ()
    owner = None
    exact = False


_SHARED_ESTIMATES = 16  # per message; a counter beyond them keeps its estimate in its memo


def _quick_len(text: str) -> int:
    """Characters of ASCII text (``isascii`` is O(1) in CPython), UTF-8 bytes of the rest."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _quick_arguments_len(arguments: Mapping[str, Any]) -> int:
    """The characters of ``arguments`` as compact JSON (`_quick_len`), escapes included: a
    control character is six (``\u0001``) and costs tokens as such, so counting it as one
    would put a write of binary-looking content under the budget on a first estimate."""
    try:
        return _quick_len(_compact_json(arguments))
    except (TypeError, ValueError):  # a key JSON cannot hold: never sent so
        return _quick_len(str(arguments))
    except RecursionError as e:
        raise _too_deep(e) from e


def _too_deep(error: RecursionError) -> UnsupportedMessageError:
    """A tool call whose arguments nest past what the JSON encoder (and ``str``) can write:
    the error `prepare` refuses such a call with, not a bare `RecursionError`."""
    return UnsupportedMessageError(
        None, f"tool call arguments nested too deep or inside themselves ({error})"
    )


def _counted(value: object, counter: object, text: str) -> float:
    """``value``, what ``counter`` said ``text`` costs, when it is a count: a counter of
    one's own that says -3 would have every budget met, one that says NaN would fail deep in
    the sums."""
    if type(value) is int and 0 <= value <= MOST_TOKENS:
        return value
    if isinstance(value, Real) and not isinstance(value, bool):  # numpy's too
        try:
            number = float(value)
        except OverflowError:  # an int past a float's range
            number = math.inf
        if 0 <= number <= MOST_TOKENS:
            return number
    raise ConfigError(
        f"{type(counter).__name__} counted {preview(value)} for a text of {len(text)} "
        f"characters: a token count is a number from 0 to {MOST_TOKENS:,}"
    )


def _features(counter: FeatureCounter, text: str, kind: ContentClass | None) -> tuple[float, ...]:
    """``counter.features(text, kind)`` of a feature counter of one's own, checked as
    `_counted` checks a count: one per slot."""
    units = counter.features(text, kind)
    if not isinstance(units, tuple) or len(units) != len(counter.weights):
        raise ConfigError(
            f"{type(counter).__name__}.features gave {preview(units)} for a text of "
            f"{len(text)} characters: a tuple of {len(counter.weights)} numbers, one per slot"
        )
    return tuple(_counted(n, counter, text) for n in units)


class MessageCounter:
    """Counts message tokens (memoized on each message) and calibrates from reported usage.

    ```python
    counter = MessageCounter()              # or MessageCounter(ExactCounter())
    counter.count(message)                  # counted once: then an attribute read
    counter.observe(sent, usage.prompt_tokens)
    counter.estimate_prompt(view)           # overhead + calibrated message tokens
    ```

    A message costs ``message_overhead`` tokens plus its blocks: text and thinking text, each
    tool call's name, id and compact JSON arguments, tool result ids and text, `image_tokens`
    per image, compact JSON of opaque blocks (the media in them as `agentctx.tokens.media`
    prices it: images, PDFs, audio, video, other binary files), ``len(data) // 6`` for
    redacted thinking
    (encrypted base64; thinking signatures are not counted). The text goes to the wrapped
    counter's slots (per content class for an `Estimator`, one slot otherwise), framing and
    ids to a ``fixed`` slot, images to an ``image`` slot. The default counter is
    `default_estimator`: the estimate, with texts of up to `EXACT_BELOW` characters counted
    exactly when tiktoken (the ``tokenizer`` extra) is installed.

    `observe` fits the hidden ``overhead`` (system prompt and tool schemas) and one multiplier
    per slot, made of a scale shared by all text and framing slots (another tokenizer) and a
    small per-slot deviation, to the last ``max_observations`` reports: least squares on
    relative error, older reports weighted ``decay ** age``, a ridge prior of strength
    ``prior`` on the deviations and ``prior / 10`` on the shared scale and the overhead.
    ``generation`` increments on every accepted report, so callers can cache totals and
    recompute when it changes. Memo entries beyond ``max_entries`` are evicted oldest first.
    Not thread-safe; use one counter per session.
    """

    def __init__(
        self,
        counter: TokenCounter | None = None,
        *,
        message_overhead: int = 4,
        max_entries: int = 100_000,
        max_observations: int = 16,
        decay: float = 0.9,
        prior: float = 1e-3,
        lazy: bool = True,
    ) -> None:
        for name, value, least in (
            ("max_entries", max_entries, 1),
            ("max_observations", max_observations, 1),
            ("message_overhead", message_overhead, 0),
        ):
            if type(value) is not int or not least <= value <= sys.maxsize:
                raise ConfigError(
                    f"MessageCounter.{name} must be a whole number from {least} to "
                    f"sys.maxsize; got {preview(value)}"
                )
        if isinstance(counter, abc.Sequence) or (
            counter is not None and not isinstance(counter, TokenCounter)
        ):
            # A tokenizer's name is not a counter, nor is a list: a str, bytes, list or tuple
            # has a ``count`` method of its own.
            raise ConfigError(
                f"MessageCounter counter is a TokenCounter (an object with count(text) -> int, "
                f"e.g. ExactCounter('cl100k_base')) or None; got {preview(counter)}"
            )
        for name, rate in (("decay", decay), ("prior", prior)):
            if not (type(rate) in (int, float) and 0 <= rate <= sys.float_info.max):
                raise ConfigError(
                    f"MessageCounter.{name} must be a finite number >= 0; got {preview(rate)}"
                )
        if not 0 < decay <= 1:
            raise ConfigError(f"MessageCounter.decay must be in (0, 1]; got {preview(decay)}")
        self._counter: TokenCounter = counter if counter is not None else default_estimator()
        self._features = self._counter if isinstance(self._counter, FeatureCounter) else None
        # The estimator's output needs no check; a feature counter of one's own has its
        # weights checked here and each text's features as they come (`_features`).
        self._trusted = type(self._counter) is Estimator
        if self._features is not None and not self._trusted:
            weights = self._features.weights
            slots = len(self._features.slots)
            if (
                not isinstance(weights, tuple)
                or len(weights) != slots
                or not all(
                    isinstance(w, Real) and not isinstance(w, bool) and 0 <= w <= MOST_TOKENS
                    for w in weights
                )
            ):
                raise ConfigError(
                    f"{type(self._counter).__name__}.weights must be a tuple of numbers from 0 "
                    f"to {MOST_TOKENS:,}, one for each of its {slots} slots; got "
                    f"{preview(weights)}"
                )
        text_slots = self._features.slots if self._features is not None else ("text",)
        self._slots = (*text_slots, "fixed", "image")
        self._fixed = len(text_slots)
        self._quick_slots = (
            (CLASS_ORDER.index(ContentClass.PROSE), CLASS_ORDER.index(ContentClass.JSON))
            if self._features is not None
            else (0, 0)
        )
        self._message_overhead = message_overhead
        self._max_entries = max_entries
        # Estimates live on the messages counted (`_tk`), found without serializing them;
        # the memo shares them between equal messages that are other objects, for those
        # whose fingerprint is known anyway.
        self._memo: dict[str, _Entry] = {}
        self._key = object()
        self._calibration = Calibration(
            len(self._slots),
            len(self._slots) - 1,
            max_observations=max_observations,
            decay=decay,
            prior=prior,
        )
        self._set_multipliers()
        self._overhead = 0
        self._generation = 0
        # Calibrations so far: what an entry's count is valid for (a refined entry is made
        # stale on its own, so refining one message leaves the others' counts valid).
        self._epoch = 0
        self._anchor: tuple[tuple[Message, ...], int] | None = None
        self._lazy = lazy
        self._on_refined: list[
            Callable[[], Callable[[object, tuple[float, ...]], None] | None]
        ] = []

    # -- reading ---------------------------------------------------------------------------

    @property
    def counter(self) -> TokenCounter:
        """The wrapped text counter."""
        return self._counter

    @property
    def slots(self) -> tuple[str, ...]:
        """Calibration slot names: the text counter's, then ``fixed`` and ``image``."""
        return self._slots

    @property
    def multipliers(self) -> tuple[float, ...]:
        """Calibrated multiplier per slot (all 1.0 before the first observation)."""
        return tuple(self._mult)

    @property
    def quick_spread(self) -> float:
        """How many times a quick estimate's calibrated tokens a full one can reach from the
        calibration alone: a quick estimate is priced as prose (or JSON), a full one as the
        text's own class, which the calibration may weigh more (1.0 uncalibrated)."""
        return self._spread

    @property
    def base_spread(self) -> float:
        """How many times its calibrated tokens a message's `count_unshrunk` can be: 1.0
        unless the calibration prices some class of text below its base estimate."""
        return self._base_spread

    def count_unshrunk(self, messages: Iterable[Message]) -> int:
        """Tokens of ``messages`` with no class of text priced below its base estimate (the
        per-message and media slots calibrated as they are): what a new message may cost
        where the calibration prices its class lower than it turns out to be."""
        text = self._fixed
        mult = [max(1.0, m) if i < text else m for i, m in enumerate(self._mult)]
        return round(sum(sum(map(mul, mult, self.vector(m))) for m in messages))

    def _set_multipliers(self) -> None:
        mult = self._mult = self._calibration.multipliers
        prose, json_slot = self._quick_slots
        quick = max(min(mult[prose], mult[json_slot]), 1e-9)
        self._spread = max(1.0, max(mult[: self._fixed]) / quick)
        self._base_spread = max(1.0, 1 / max(min(mult[: self._fixed]), 1e-9))

    @property
    def overhead(self) -> int:
        """Fitted tokens the provider adds to every request (system prompt, tools); >= 0."""
        return self._overhead

    @property
    def generation(self) -> int:
        """Increments whenever calibration changes the numbers."""
        return self._generation

    @property
    def observations(self) -> int:
        """How many observations the current fit uses."""
        return len(self._calibration)

    def calibration_state(self) -> dict[str, Any] | None:
        """The calibration as JSON-ready data (`restore_calibration` takes it back), with
        the slots it is for; ``None`` before the first observation."""
        if not len(self._calibration):
            return None
        return {
            "counter": self._identity(),
            "slots": list(self._slots),
            **self._calibration.state(),
        }

    def _identity(self) -> str:
        """What tells the text counter's calibration apart from another's (an exact counter
        of another encoding has the same slots)."""
        counter = self._counter
        kind = type(counter)
        encoding = getattr(counter, "encoding", "")  # a name; an object's repr changes
        named = encoding if type(encoding) is str and len(encoding) <= 100 else ""
        return f"{kind.__module__}.{kind.__qualname__}:{named}"

    def restore_calibration(self, state: object) -> bool:
        """Take back what `calibration_state` gave, of a counter with the same slots (a
        worker resuming a session another one calibrated); only into a counter that has
        observed nothing yet. ``False``, with nothing changed, otherwise."""
        if len(self._calibration) or not isinstance(state, dict):
            return False
        if (
            state.get("counter") != self._identity()
            or state.get("slots") != list(self._slots)
            or not self._calibration.restore(state)
        ):
            return False
        self._set_multipliers()
        self._overhead = max(0, round(self._calibration.overhead))
        self._generation += 1
        self._epoch += 1
        return True

    # -- counting --------------------------------------------------------------------------

    def count(self, message: Message) -> int:
        """Calibrated tokens of one message. Raises `UnsupportedMessageError` for a tool call
        whose arguments JSON cannot write (nested too deep, or inside themselves), as
        `ContextManager.prepare` does."""
        entry: _Entry | None = message._tk
        if entry is None or entry.owner is not self._key:
            entry = self._entry(message)
        if entry.generation == self._epoch:
            return entry.count
        return self._refresh(entry).count

    def count_many(self, messages: Iterable[Message]) -> int:
        """Calibrated tokens of several messages (no request overhead)."""
        key, epoch = self._key, self._epoch
        total = 0
        for m in messages:
            entry = m._tk
            # The common cases inline (a memoized count, or one of an earlier calibration),
            # as in `count`.
            if entry is not None and entry.owner is key:
                total += (entry if entry.generation == epoch else self._refresh(entry)).count
            else:
                total += self.count(m)
        return total

    def count_text(self, text: str, kind: ContentClass | None = None) -> int:
        """Calibrated tokens of a bare text, with no message framing."""
        vec = [0.0] * len(self._slots)
        self._add_text(vec, text, kind)
        total = self.total(vec)
        return max(1, total) if text else 0

    def estimate_prompt(self, messages: Sequence[Message]) -> int:
        """Predicted prompt tokens of a request sending ``messages``: overhead + messages."""
        return self.overhead + self.count_many(messages)

    def context_tokens(
        self,
        messages: Sequence[Message],
        last_sent_len: int | None = None,
        last_prompt_tokens: int | None = None,
    ) -> int:
        """Prompt size of ``messages``, anchored on the last reported usage when possible.

        With both arguments: ``last_prompt_tokens + count_many(messages[last_sent_len:])``.
        Without them: the same with the last `observe` call as the anchor, if its messages
        are still the unchanged prefix of ``messages``; otherwise `estimate_prompt`.
        """
        if (last_sent_len is None) != (last_prompt_tokens is None):
            raise ConfigError("pass both last_sent_len and last_prompt_tokens, or neither")
        if last_sent_len is not None and last_prompt_tokens is not None:
            return last_prompt_tokens + self.count_many(messages[last_sent_len:])
        if self._anchor is not None:
            sent, reported = self._anchor
            n = len(sent)
            if len(messages) >= n and all(
                messages[i] is sent[i] or fingerprint(messages[i]) == fingerprint(sent[i])
                for i in range(n - 1, -1, -1)
            ):
                return reported + self.count_many(messages[n:])
        return self.estimate_prompt(messages)

    # -- calibration -----------------------------------------------------------------------

    def observe(
        self,
        messages: Sequence[Message],
        prompt_tokens: int,
        *,
        vector: Sequence[float] | None = None,
        most_overhead: float | None = None,
    ) -> bool:
        """Record that sending exactly ``messages`` cost ``prompt_tokens``, and refit; whether
        the report was taken.

        ``prompt_tokens`` is the provider's full prompt count for that request (uncached +
        cache reads + cache writes, i.e. `Usage.prompt_tokens`). Non-positive counts, as
        aborted turns report, are ignored, and so are counts that are no finite number or
        past any context window (a billion tokens). ``vector``: the sum of the messages' `vector`s
        when the caller keeps it up to date (and `refine`d them first), so a long request
        costs O(1) here instead of a pass over every message. ``most_overhead``: the largest
        request overhead this report's fit may give (see `Calibration.add`).
        """
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int | float):
            raise ConfigError(f"observe() needs a token count, got {prompt_tokens!r}")
        if not 0 < prompt_tokens <= MOST_TOKENS:  # NaN fails this too
            return False
        prompt_tokens = round(prompt_tokens)
        if vector is None:
            x = [0.0] * len(self._slots)
            for message in messages:
                entry = self._entry(message)
                if not entry.exact:
                    self._make_exact(message, entry)
                for i, v in enumerate(entry.base):
                    x[i] += v
            vector = x
        self._anchor = (tuple(messages), prompt_tokens)
        self._calibration.add(tuple(vector), prompt_tokens, most_overhead=most_overhead)
        self._set_multipliers()
        self._overhead = max(0, round(self._calibration.overhead))
        self._generation += 1
        self._epoch += 1
        return True

    # -- internals -------------------------------------------------------------------------

    def _entry(self, message: Message, *, full: bool = False) -> _Entry:
        """The estimate of ``message``: its own, an equal message's, or a new one.

        Estimates live on the message (a counter that is not the first to count it keeps
        its own beside the others'), found without serializing it. A lazy counter never
        serializes a message for its estimate (its quick and full estimates cost less than
        a fingerprint); the memo shares estimates between equal messages that are other
        objects, for a counter that is not lazy and for messages whose fingerprint is known
        anyway. ``full``: a new estimate is the full one, not a quick one first."""
        key = self._key
        held = message._tk
        if held is not None:
            if held.owner is key:
                return held  # type: ignore[no-any-return]
            if type(held) is _Estimates and (mine := held.get(key)) is not None:
                return mine
        fp = message._fp
        if not fp and not self._lazy:
            fp = fingerprint(message)
        found = self._memo.get(fp) if fp else None
        if found is None:
            if self._lazy and not full:
                found = _Entry(key, self._quick_base(message), -1, exact=False)
            else:
                found = _Entry(key, self._base(message), -1)
            if fp:
                self._remember(fp, found)
        with _CLAIMS:
            held = message._tk
            kept = True
            if held is None:
                object.__setattr__(message, "_tk", found)
            elif type(held) is not _Estimates:
                object.__setattr__(message, "_tk", _Estimates({held.owner: held, key: found}))
            elif len(held) < _SHARED_ESTIMATES:
                held[key] = found
            else:
                kept = False
        if not kept and not fp:
            # No session's estimate gives way (its view's sums are made of it): this one
            # lives in this counter's memo, found by fingerprint from now on.
            self._remember(fingerprint(message), found)
        return found

    def _remember(self, fp: str, entry: _Entry) -> None:
        memo = self._memo
        if fp not in memo and len(memo) >= self._max_entries:
            del memo[next(iter(memo))]  # FIFO: oldest first, O(1)
        memo[fp] = entry

    def _refresh(self, entry: _Entry) -> _Entry:
        entry.count = self.total(entry.base)
        entry.generation = self._epoch
        return entry

    def refine(self, messages: Iterable[Message]) -> int:
        """Replace quick first estimates of ``messages`` with full ones; returns how many.

        With ``lazy=True`` (the default) a message seen for the first time gets a quick
        estimate (characters over a conservative ratio), so `ContextManager.prepare` stays
        cheap on the hot path; the full content-aware estimate follows when it matters: in
        `observe` (after the model call, for what was sent) and before a strategy decides.
        """
        changed = 0
        key = self._key
        for message in messages:
            entry: _Entry | None = message._tk
            if entry is not None and entry.owner is key and entry.exact:
                continue  # the common case, checked inline: a view is refined whole
            entry = self._entry(message)
            if not entry.exact:
                self._make_exact(message, entry)
                changed += 1
        if changed:
            self._generation += 1
        return changed

    def is_full(self, message: Message) -> bool:
        """Whether this counter already holds the full estimate of ``message`` (`refine`
        would leave it as it is)."""
        entry: _Entry | None = message._tk
        if entry is not None and entry.owner is self._key:
            return entry.exact
        return self._entry(message).exact

    def count_full(self, message: Message) -> int:
        """Calibrated tokens of one message from the full estimate (refined if quick)."""
        entry: _Entry | None = message._tk
        if entry is None or entry.owner is not self._key:
            entry = self._entry(message, full=True)  # a first-seen message: no quick one first
        if not entry.exact:
            self._make_exact(message, entry)
            self._generation += 1
        return self.count(message)

    def _make_exact(self, message: Message, entry: _Entry) -> None:
        fp = message._fp
        known = self._memo.get(fp) if fp else None
        if known is not None and known.exact:
            base = known.base
        else:
            base = self._base(message)
            if fp:
                self._remember(fp, entry)
        if self._on_refined:
            delta = tuple(b - a for a, b in zip(entry.base, base, strict=True))
        # Only this entry's count changes: the others' stay valid (no new calibration epoch).
        entry.base, entry.exact, entry.generation = base, True, -1
        for held in self._on_refined:
            listener = held()
            if listener is not None:
                listener(entry, delta)

    def on_refined(self, listener: Callable[[object, tuple[float, ...]], None]) -> None:
        """Call ``listener(key, delta)`` whenever `refine` or `observe` replaces a vector:
        ``key`` is the `estimate_key` of the messages it belongs to, ``delta`` what the new
        vector adds, so a cached sum of vectors can be kept up to date. A bound method is
        held weakly: it stops being called once its object is gone."""
        self._on_refined = [held for held in self._on_refined if held() is not None]
        if isinstance(listener, types.MethodType):  # a builtin's bound method has no weak form
            self._on_refined.append(weakref.WeakMethod(listener))
        else:
            self._on_refined.append(lambda: listener)

    def vector(self, message: Message) -> tuple[float, ...]:
        """The uncalibrated per-slot vector of a message (memoized, quick first if lazy).

        Sum vectors and pass the sum to `total` to count many messages in O(slots) after a
        calibration change; `on_refined` tells when `refine` or `observe` replaces one, so a
        cached sum can be kept up to date.
        """
        return self._entry(message).base

    def estimate_key(self, message: Message) -> object:
        """What identifies the estimate ``message`` shares with others in `on_refined`."""
        return self._entry(message)

    def keyed_vectors(
        self, messages: Iterable[Message]
    ) -> tuple[list[object], list[tuple[float, ...]]]:
        """The `estimate_key` and the `vector` of each message, in one lookup each."""
        key = self._key
        entries: list[_Entry] = []
        # Messages no counter has estimated (a call's new ones) get their quick estimate
        # here and are claimed under one lock, as `_entry` would one by one.
        fresh: list[tuple[int, Message, _Entry]] = []
        quick = self._lazy
        for m in messages:
            entry = m._tk
            if entry is not None and entry.owner is key:
                entries.append(entry)
            elif entry is None and quick and not m._fp:
                entry = _Entry(key, self._quick_base(m), -1, False)
                fresh.append((len(entries), m, entry))
                entries.append(entry)
            else:
                entries.append(self._entry(m))
        if fresh:
            taken = []  # claimed by another thread's counter in between: ask `_entry`
            with _CLAIMS:
                for i, m, entry in fresh:
                    if m._tk is None:
                        object.__setattr__(m, "_tk", entry)
                    else:
                        taken.append((i, m))
            for i, m in taken:
                entries[i] = self._entry(m)
        return entries, [entry.base for entry in entries]  # type: ignore[return-value]

    def total(self, vector: Sequence[float]) -> int:
        """Calibrated tokens of a summed per-slot vector (see `vector`)."""
        total: float = sum(map(mul, self._mult, vector))
        return round(total)

    def _quick_base(self, message: Message) -> tuple[float, ...]:
        """A cheap first estimate, high on most text: characters / 3 (JSON arguments / 3.5),
        counting UTF-8 bytes for text that is not ASCII (CJK runs about a token a character).
        The densest text (single letters between spaces) runs up to 2.5x above it, which the
        manager allows for near the budget."""
        vec = [0.0] * len(self._slots)
        prose, json_slot = self._quick_slots
        fixed = float(self._message_overhead)
        if isinstance(message, SummaryMessage):
            vec[prose] += _quick_len(message.text) / 3.0
            blocks: tuple[Any, ...] = ()
        else:
            blocks = message.content
            if isinstance(message, ToolResultMessage):
                fixed += len(message.tool_call_id) / 2
        for block in blocks:
            if isinstance(block, TextBlock):
                vec[prose] += _quick_len(block.text) / 3.0
            elif isinstance(block, ThinkingBlock):
                vec[prose] += _quick_len(block.thinking) / 3.0
            elif isinstance(block, ToolCall):
                fixed += (len(block.name) + len(block.id)) / 2
                size = _quick_arguments_len(block.arguments)
                raw = block.extra.get("arguments")  # the string the model wrote (see `_base`)
                written = size if type(raw) is not str else max(size, _quick_len(raw))
                vec[json_slot] += written / 3.5
            elif isinstance(block, ImageBlock):
                vec[self._fixed + 1] += image_tokens(block)
            elif isinstance(block, OpaqueBlock):
                text, images = opaque_cost(block.payload)
                vec[json_slot] += _quick_len(text) / 3.5
                vec[self._fixed + 1] += images
            elif isinstance(block, RedactedThinkingBlock):
                fixed += len(block.data) // 6
        vec[self._fixed] += fixed
        return tuple(vec)

    def _add_text(self, vec: list[float], text: str, kind: ContentClass | None = None) -> None:
        if not text:
            return
        features = self._features
        if features is None:
            vec[0] += _counted(self._counter.count(text), self._counter, text)
            return
        f = features.features(text, kind) if self._trusted else _features(features, text, kind)
        for i, (w, units) in enumerate(zip(features.weights, f, strict=True)):
            vec[i] += w * units

    def _identifier_tokens(self, text: str) -> float:
        """Tokens of a tool name or call id, which need no content classification."""
        features = self._features
        if features is None:
            return _counted(self._counter.count(text), self._counter, text)
        kind = ContentClass.PROSE
        f = features.features(text, kind) if self._trusted else _features(features, text, kind)
        return sum(w * units for w, units in zip(features.weights, f, strict=True))

    def _base(self, message: Message) -> tuple[float, ...]:
        vec = [0.0] * len(self._slots)
        fixed = float(self._message_overhead)
        count = self._identifier_tokens
        if isinstance(message, SummaryMessage):
            self._add_text(vec, message.text)
            blocks: tuple[Any, ...] = ()
        elif isinstance(message, ToolResultMessage):
            fixed += count(message.tool_call_id)
            blocks = message.content
        elif isinstance(message, (UserMessage, AssistantMessage)):
            blocks = message.content
        else:  # pragma: no cover - the Message union is closed
            blocks = ()
        for block in blocks:
            if isinstance(block, TextBlock):
                self._add_text(vec, block.text)
            elif isinstance(block, ThinkingBlock):
                self._add_text(vec, block.thinking)
            elif isinstance(block, ToolCall):
                fixed += count(block.name) + count(block.id)
                written = written_arguments(block.arguments, block.extra.get("arguments"))
                if written is None:
                    try:
                        written = _compact_json(dict(block.arguments))
                    except RecursionError as e:
                        raise _too_deep(e) from e
                self._add_text(vec, written, ContentClass.JSON)
            elif isinstance(block, ImageBlock):
                vec[self._fixed + 1] += image_tokens(block)
            elif isinstance(block, OpaqueBlock):
                text, images = opaque_cost(block.payload)
                self._add_text(vec, text, ContentClass.JSON)
                vec[self._fixed + 1] += images
            elif isinstance(block, RedactedThinkingBlock):
                fixed += len(block.data) // 6
        vec[self._fixed] += fixed
        return tuple(vec)
