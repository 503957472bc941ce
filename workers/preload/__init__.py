"""Modules that break the launcher when it imports them as `preload` (never import them here).

| module | at import |
|---|---|
| `workers.preload.segfault` | dies by SIGSEGV |
| `workers.preload.exits` | writes a line to stderr, then `os._exit(3)` |
| `workers.preload.hangs` | blocks forever in a C call (`signal.sigwait`), no Python code runs |
| `workers.preload.raises` | raises `RuntimeError("preload refused: no config")` |
| `workers.preload.segfault_if` | dies by SIGSEGV if the file `$MPV_PRELOAD_CRASH_FILE` exists |
"""
