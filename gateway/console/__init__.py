"""The operator console: server-rendered HTML pages under `/console` (see `routes`).

Sign in with an API key, then look up an address, follow a message, work the dead-letter
queue, search, export and import suppressions, and watch the rates. No build chain, no CDN:
templates, the stylesheet and the charts (SVG drawn by the server) live in this package.
"""
