"""Importing this module starts a thread that lives on (as a BLAS library's pool would)."""

import threading

_pool = threading.Thread(target=threading.Event().wait, name="pool-worker", daemon=True)
_pool.start()
