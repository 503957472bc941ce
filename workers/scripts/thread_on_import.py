"""A module that starts a thread when it is imported.

Preloaded into the launcher (`SupervisorConfig(preload=("workers.scripts.thread_on_import",))`),
it leaves the launcher with a second thread, which mpvisor must refuse: the first management
call raises `ConfigError` naming this module. The thread only waits on an event nobody sets.
"""

from __future__ import annotations

import threading

_never = threading.Event()
threading.Thread(target=_never.wait, name="preload-thread", daemon=True).start()
