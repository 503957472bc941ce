"""Importing this module kills the process by SIGSEGV if the file named by the environment
variable `MPV_PRELOAD_CRASH_FILE` exists (so a test can break only the launchers after the first)."""

import ctypes
import faulthandler
import os

if os.path.exists(os.environ.get("MPV_PRELOAD_CRASH_FILE", "/nonexistent")):
    faulthandler.disable()
    ctypes.string_at(0)
