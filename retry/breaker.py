"""Circuit breaker per provider: stop calling a provider that is failing, probe it later.

States: `closed` (sends go through), `open` (sends are deferred: not failed, not counted as
attempts), `half_open` (the cool-down is over; exactly one probe send goes through).

* An account-level failure (sending paused, account suspended, throttled account) opens the
  circuit at once, with the longer account cool-down: such problems need a human.
* Otherwise the breaker opens when, over a sliding window of `window_seconds`, at least
  `min_volume` outcomes were recorded and the share of failures reached `failure_ratio`.
* After the cool-down the next `allow` is the probe (the state reads `half_open` from then
  on); every other caller is refused until the probe reports. Success closes the circuit
  (with a fresh window), failure re-opens it. A probe that never reports (its process died)
  is replaced by a new one after another cool-down.

The window is kept as counts per time slice (a tenth of the window), so it costs the same at
any volume. Two implementations with one interface: `RedisBreaker` (state shared by every
process, each operation one atomic Lua script) and `InProcessBreaker`. The clock is
injectable for tests; in production both use wall-clock seconds.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from retry.settings import RetrySettings
from retry.shared import SharedStateOutage, SharedStateUnavailable

log = logging.getLogger("retry.breaker")

Clock = Callable[[], float]
SLICES = 10
STATES = ("closed", "open", "half_open")


class CircuitBreaker(Protocol):
    """The interface the send path uses around each provider call."""

    async def allow(self, provider: str) -> bool:
        """May a call to `provider` go out now? (In half-open: True for the one probe.)"""
        ...

    async def record_success(self, provider: str) -> None:
        """A call to `provider` succeeded."""
        ...

    async def record_failure(self, provider: str, *, account_level: bool = False) -> None:
        """A call to `provider` failed (transient/provider fault, or account-level)."""
        ...

    async def state(self, provider: str) -> str:
        """ "closed", "open" or "half_open"."""
        ...


@dataclass(frozen=True)
class BreakerConfig:
    """Thresholds of every provider's breaker."""

    failure_ratio: float = 0.5
    min_volume: int = 20
    window_seconds: float = 60.0
    cooldown_seconds: float = 30.0
    account_cooldown_seconds: float = 300.0

    @classmethod
    def from_settings(cls, settings: RetrySettings) -> BreakerConfig:
        """The breaker knobs of the retry settings."""
        return cls(
            failure_ratio=settings.breaker_failure_ratio,
            min_volume=settings.breaker_min_volume,
            window_seconds=settings.breaker_window_seconds,
            cooldown_seconds=settings.breaker_cooldown_seconds,
            account_cooldown_seconds=settings.breaker_account_cooldown_seconds,
        )

    @property
    def slice_seconds(self) -> float:
        """Width of one counting slice of the sliding window."""
        return self.window_seconds / SLICES


@dataclass
class _Circuit:
    state: str = "closed"
    # open: calls are refused until then; half_open: the probe's slot is taken until then.
    until: float = 0.0
    # slice number -> [successes, failures]
    window: dict[int, list[int]] = field(default_factory=dict)


def _opened(provider: str, account_level: bool, cooldown: float) -> None:
    # The operator-facing signal: an open circuit pauses a whole channel.
    if account_level:
        log.error(
            "circuit for %s opened by an account-level error; sends deferred for %.0fs "
            "(check the provider account: sending paused or suspended?)",
            provider,
            cooldown,
        )
    else:
        log.warning(
            "circuit for %s opened by its failure ratio; sends deferred for %.0fs",
            provider,
            cooldown,
        )


class InProcessBreaker:
    """Breaker state in this process's memory (no Redis): same rules, not shared."""

    def __init__(self, config: BreakerConfig | None = None, *, clock: Clock | None = None) -> None:
        self._config = config or BreakerConfig()
        self._clock = clock or time.time
        self._circuits: dict[str, _Circuit] = {}

    def _circuit(self, provider: str) -> _Circuit:
        return self._circuits.setdefault(provider, _Circuit())

    async def allow(self, provider: str) -> bool:
        """True when closed, or for the single probe once the cool-down is over."""
        c = self._circuit(provider)
        now = self._clock()
        if c.state == "closed":
            return True
        if now >= c.until:
            c.state = "half_open"
            c.until = now + self._config.cooldown_seconds
            return True
        return False

    async def record_success(self, provider: str) -> None:
        """Count a success; in half-open it closes the circuit."""
        c = self._circuit(provider)
        if c.state == "half_open":
            c.state, c.until, c.window = "closed", 0.0, {}
            log.info("circuit for %s closed again", provider)
        elif c.state == "closed":
            self._count(c, 0)

    async def record_failure(self, provider: str, *, account_level: bool = False) -> None:
        """Count a failure; opens the circuit on account-level errors or a high ratio."""
        c = self._circuit(provider)
        now = self._clock()
        cfg = self._config
        if account_level:
            until = now + cfg.account_cooldown_seconds
            if c.state != "open" or until > c.until:
                was_open = c.state == "open"
                c.state, c.until, c.window = "open", until, {}
                if not was_open:
                    _opened(provider, True, cfg.account_cooldown_seconds)
            return
        if c.state == "half_open":
            c.state, c.until, c.window = "open", now + cfg.cooldown_seconds, {}
            _opened(provider, False, cfg.cooldown_seconds)
        elif c.state == "closed":
            self._count(c, 1)
            successes, failures = self._totals(c, now)
            total = successes + failures
            if total >= cfg.min_volume and failures >= cfg.failure_ratio * total:
                c.state, c.until, c.window = "open", now + cfg.cooldown_seconds, {}
                _opened(provider, False, cfg.cooldown_seconds)

    async def state(self, provider: str) -> str:
        """The state; an open circuit whose cool-down is over reads `half_open`."""
        c = self._circuit(provider)
        if c.state == "open" and self._clock() >= c.until:
            return "half_open"
        return c.state

    def _count(self, c: _Circuit, index: int) -> None:
        now = self._clock()
        slot = math.floor(now / self._config.slice_seconds)
        c.window.setdefault(slot, [0, 0])[index] += 1
        self._totals(c, now)

    def _totals(self, c: _Circuit, now: float) -> tuple[int, int]:
        current = math.floor(now / self._config.slice_seconds)
        successes = failures = 0
        for slot in list(c.window):
            if slot <= current - SLICES:
                del c.window[slot]
            else:
                successes += c.window[slot][0]
                failures += c.window[slot][1]
        return successes, failures


# KEYS[1] circuit hash {state, until} (one per provider, never expires);
# KEYS[2] window hash {"<slice>:s"|"<slice>:f": count}.
# ARGV[1] op: allow | success | failure | account | state; ARGV[2] now (negative = TIME);
# ARGV[3] cooldown; ARGV[4] account cooldown; ARGV[5] slice seconds; ARGV[6] slices;
# ARGV[7] min volume; ARGV[8] failure ratio.
# Returns {answer, event}: answer 1/0 for allow, the state for `state`; event "opened",
# "closed" or "" (for logging by the caller).
_BREAKER_LUA = """
local op = ARGV[1]
local now = tonumber(ARGV[2])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local cooldown = tonumber(ARGV[3])
local account_cooldown = tonumber(ARGV[4])
local slice = tonumber(ARGV[5])
local slices = tonumber(ARGV[6])
local min_volume = tonumber(ARGV[7])
local ratio = tonumber(ARGV[8])
local current = redis.call('HMGET', KEYS[1], 'state', 'until')
local state = current[1] or 'closed'
local until_ = tonumber(current[2]) or 0
local ttl = math.ceil(slice * slices * 1000) + 60000

local function save(new_state, new_until)
  redis.call('HSET', KEYS[1], 'state', new_state, 'until', string.format('%.6f', new_until))
end

local function totals()
  local cur = math.floor(now / slice)
  local flat = redis.call('HGETALL', KEYS[2])
  local s, f = 0, 0
  for i = 1, #flat, 2 do
    local name = flat[i]
    local sep = string.find(name, ':', 1, true)
    local n = tonumber(string.sub(name, 1, sep - 1))
    if n <= cur - slices then
      redis.call('HDEL', KEYS[2], name)
    elseif string.sub(name, sep + 1) == 's' then
      s = s + tonumber(flat[i + 1])
    else
      f = f + tonumber(flat[i + 1])
    end
  end
  return s, f
end

local function count(kind)
  local cur = math.floor(now / slice)
  redis.call('HINCRBY', KEYS[2], string.format('%d', cur) .. ':' .. kind, tonumber(ARGV[9]) or 1)
  redis.call('PEXPIRE', KEYS[2], ttl)
end

if op == 'state' then
  if state == 'open' and now >= until_ then
    return {'half_open', ''}
  end
  return {state, ''}
elseif op == 'allow' then
  if state == 'closed' then
    return {1, 'closed'}
  end
  if now >= until_ then
    save('half_open', now + cooldown)
    return {1, ''}
  end
  return {0, ''}
elseif op == 'success' then
  if state == 'half_open' then
    save('closed', 0)
    redis.call('DEL', KEYS[2])
    return {1, 'closed'}
  elseif state == 'closed' then
    count('s')
  end
  return {1, ''}
elseif op == 'account' then
  local new_until = now + account_cooldown
  if state ~= 'open' or new_until > until_ then
    save('open', new_until)
    redis.call('DEL', KEYS[2])
    if state ~= 'open' then
      return {1, 'opened'}
    end
  end
  return {1, ''}
elseif op == 'failure' then
  if state == 'half_open' then
    save('open', now + cooldown)
    redis.call('DEL', KEYS[2])
    return {1, 'opened'}
  elseif state == 'closed' then
    count('f')
    local s, f = totals()
    local total = s + f
    if total >= min_volume and f >= ratio * total then
      save('open', now + cooldown)
      redis.call('DEL', KEYS[2])
      return {1, 'opened'}
    end
  end
  return {1, ''}
end
return redis.error_reply('unknown breaker op ' .. op)
"""


class RedisBreaker:
    """Breaker state in Redis, shared by every process; each operation is one script call.

    The hot path is spared most of those calls: a `closed` answer to `allow` is reused for
    `LOCAL_SECONDS` (so a circuit opened by another process is seen within that time; one
    opened by this process at once), and successes while closed are counted locally and
    added in one call every `LOCAL_SECONDS` or `SUCCESS_BATCH` calls, and always before a
    failure is counted (the failure ratio sees them).
    """

    LOCAL_SECONDS = 1.0
    SUCCESS_BATCH = 100

    def __init__(
        self,
        redis: Redis,
        config: BreakerConfig | None = None,
        *,
        prefix: str = "gw:",
        clock: Clock | None = None,
        outage: SharedStateOutage | None = None,
    ) -> None:
        self._config = config or BreakerConfig()
        self._outage = outage or SharedStateOutage()
        self._prefix = prefix
        self._clock = clock
        self._script = redis.register_script(_BREAKER_LUA)
        # provider -> local time until which `allow` may answer True without asking Redis
        self._closed_until: dict[str, float] = {}
        # provider -> (successes not yet added, local time of the first of them)
        self._pending: dict[str, tuple[int, float]] = {}

    def _local_now(self) -> float:
        return self._clock() if self._clock is not None else time.monotonic()

    async def _run(self, op: str, provider: str, n: int = 1) -> tuple[str, str]:
        cfg = self._config
        now = self._clock() if self._clock is not None else -1.0
        key = f"{self._prefix}br:{provider}"
        try:
            answer, event = await self._script(
                keys=[key, key + ":w"],
                args=[
                    op,
                    repr(now),
                    repr(cfg.cooldown_seconds),
                    repr(cfg.account_cooldown_seconds),
                    repr(cfg.slice_seconds),
                    SLICES,
                    cfg.min_volume,
                    repr(cfg.failure_ratio),
                    n,
                ],
            )
        except (RedisError, OSError) as exc:
            # Raises SharedStateUnavailable: the send path defers (see retry.shared).
            raise self._outage.failed(exc) from exc
        self._outage.succeeded()
        return _text(answer), _text(event)

    async def allow(self, provider: str) -> bool:
        """True when closed, or for the single probe once the cool-down is over."""
        now = self._local_now()
        if self._closed_until.get(provider, float("-inf")) > now:
            return True
        answer, state = await self._run("allow", provider)
        if state == "closed":
            self._closed_until[provider] = now + self.LOCAL_SECONDS
        return answer == "1"

    async def record_success(self, provider: str) -> None:
        """Count a success; in half-open it closes the circuit."""
        now = self._local_now()
        if self._closed_until.get(provider, float("-inf")) > now:
            count, since = self._pending.get(provider, (0, now))
            count += 1
            if count < self.SUCCESS_BATCH and now - since < self.LOCAL_SECONDS:
                self._pending[provider] = (count, since)
                return
            self._pending.pop(provider, None)
            await self._run("success", provider, count)
            return
        await self._flush(provider)
        _, event = await self._run("success", provider)
        if event == "closed":
            log.info("circuit for %s closed again", provider)

    async def _flush(self, provider: str) -> None:
        count, _ = self._pending.pop(provider, (0, 0.0))
        if count:
            await self._run("success", provider, count)

    async def record_failure(self, provider: str, *, account_level: bool = False) -> None:
        """Count a failure; opens the circuit on account-level errors or a high ratio."""
        self._closed_until.pop(provider, None)
        await self._flush(provider)
        _, event = await self._run("account" if account_level else "failure", provider)
        if event == "opened":
            cooldown = (
                self._config.account_cooldown_seconds
                if account_level
                else self._config.cooldown_seconds
            )
            _opened(provider, account_level, cooldown)

    async def state(self, provider: str) -> str:
        """The state; an open circuit whose cool-down is over reads `half_open`."""
        answer, _ = await self._run("state", provider)
        return answer


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def build_breaker(
    settings: RetrySettings,
    *,
    redis: Redis | None,
    prefix: str,
    clock: Clock | None = None,
    outage: SharedStateOutage | None = None,
) -> CircuitBreaker:
    """The shared Redis breaker when Redis is configured, else the in-process one. A Redis
    breaker raises `retry.shared.SharedStateUnavailable` when Redis does not answer."""
    config = BreakerConfig.from_settings(settings)
    if redis is not None:
        return RedisBreaker(redis, config, prefix=prefix, clock=clock, outage=outage)
    return InProcessBreaker(config, clock=clock)


def breaker_readiness(
    breaker: CircuitBreaker, providers: Iterable[str]
) -> Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]:
    """A `/readyz` check showing each provider's circuit; never critical (an open circuit
    defers sends, the process still serves)."""
    names = tuple(dict.fromkeys(providers))

    async def check() -> tuple[bool, dict[str, Any]]:
        details: dict[str, Any] = {"critical": False}
        for name in names:
            try:
                details[name] = await breaker.state(name)
            except SharedStateUnavailable:
                details[name] = "unknown (shared state unavailable)"
        return True, details

    return check


__all__ = [
    "STATES",
    "BreakerConfig",
    "CircuitBreaker",
    "InProcessBreaker",
    "RedisBreaker",
    "breaker_readiness",
    "build_breaker",
]
