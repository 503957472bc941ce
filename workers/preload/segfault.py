"""Importing this module kills the importing process by SIGSEGV (a launcher `preload` fault)."""

import ctypes
import faulthandler

faulthandler.disable()  # die quietly, as a broken C extension would
ctypes.string_at(0)
