"""Importing this module never finishes: it waits in a C call for a signal nobody sends."""

import signal

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGWINCH})
signal.sigwait({signal.SIGWINCH})
