"""Bounded retry: backoff policy, due-job worker and sweeper, rate limiter, circuit breaker,
dead-letter queue.

Public surface: `retry.policy` (pure backoff and the one retry decision, `decide`),
`retry.queue` (the `DeliveryQueue` protocol the delivery log implements), `retry.dlq`
(`file_entry` and the operator's side), `retry.ratelimit.RateLimiter`,
`retry.breaker.CircuitBreaker`, `retry.worker.Worker`, `retry.sweeper.sweep_stale` and the
operator API `retry.api.DeadLetterController`. `retry` never imports `sender` or `webhooks`.
"""
