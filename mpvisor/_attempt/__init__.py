"""What runs inside an attempt's process?

Owns the child's side of an attempt: its main loop (`child`: the handshake, the import, the
call, the result), what a target sees (`context`: `mpvisor.context()`), how a target's module
is found ahead of the fork (`prepared`), and the start message the parent sends it (`start`).

May import: `_model`, `_platform`.
"""
