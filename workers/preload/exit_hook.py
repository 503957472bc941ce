"""Imported by the launcher (`preload`): every process forked from it gets an `os._exit` that
first appends a line, its pid and the status, to the file a target named (`record_to`), then
ends. So coverage.py's `patch = ["fork", "_exit"]` saves a forked child's measurements as it ends."""

import os

_path = ""


def _wrap_exit() -> None:
    real = os._exit

    def _exit(status: int) -> None:
        if _path:
            with open(_path, "a") as file:
                file.write(f"{os.getpid()} {status}\n")
        real(status)

    os._exit = _exit  # type: ignore[assignment]


os.register_at_fork(after_in_child=_wrap_exit)


def record_to(path: str) -> int:
    """Name the file this process's `os._exit` writes to; return the pid."""
    global _path
    _path = path
    return os.getpid()


def record_and_fail(path: str) -> None:
    record_to(path)
    raise ValueError("failed on purpose")
