"""How are slots shared with other processes?

The lease store seam (`store`: `LeaseStore`, what a store gives and is asked) and one file per
store beside it: `local` (the per-user slot server's client; the server itself is `server`),
`memory` (in one process) and `postgres` (a PostgreSQL database, across hosts). `driver` drives a store for one owner (the controller and
`mpvisor run --slot` both use it).

May import: `_model`, `_tasks`, `_platform`.
"""
