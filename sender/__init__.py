"""The send side: `POST /v1/messages`, the dispatch procedure, the delivery log, provider adapters.

Public surface: `sender.api.MessagesController` (routes), `sender.service.SendService`,
`sender.dispatch.Dispatcher` (its `dispatch` is the retry worker's entry), `sender.status`
(status strings) and `sender.classify` (send-time outcome classification).
"""
