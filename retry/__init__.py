"""Bounded retry: backoff policy, due-job worker and sweeper, rate limiter, circuit breaker,
dead-letter queue.

Public surface: `retry.policy` (pure backoff), `retry.queue` (the scheduling contract with the
delivery log), `retry.dlq.dead_letter`, `retry.ratelimit.RateLimiter`,
`retry.breaker.CircuitBreaker`, `retry.worker.Worker`, `retry.sweeper.sweep_stale` and the
operator API `retry.api.DeadLetterController`. `retry` never imports `sender` or `webhooks`.
"""
