"""An interactive bash with job control on a real pseudo-terminal (Python's own `pty`), for the
tests that check how `mpvisor run` behaves as a terminal's foreground job: `Shell.run(line)`
types a line and waits for what it printed up to the next prompt; `Shell.press(ch)` types a
control character (Ctrl-C `\\x03`, Ctrl-Z `\\x1a`); `Shell.until(text)` waits for text, with a
deadline, never a sleep."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import time

import psutil  # type: ignore[import-untyped]

from tests._support import kill_all

PROMPT = "MPV-PROMPT> "
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


class Shell:
    """`bash --norc --noprofile -i` on a pty, its prompt `PROMPT`, in a directory `cwd`."""

    def __init__(self, cwd: str, env: dict[str, str]) -> None:
        env = {**env, "PS1": PROMPT, "TERM": "dumb", "HISTFILE": "/dev/null"}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: bash, its controlling terminal the pty's other end
            try:
                os.chdir(cwd)
                os.execvpe("bash", ["bash", "--norc", "--noprofile", "-i"], env)
            finally:
                os._exit(127)
        self.seen = ""
        self.raw = b""  # every byte the terminal showed, as it came (line ends and escapes kept)
        self.until(PROMPT)

    def _read(self, deadline: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # the shell has gone (EIO)
            return False
        self.raw += data
        self.seen += _ANSI.sub("", data.decode(errors="replace"))
        return bool(data)

    def until(self, text: str, timeout: float = 30.0) -> str:
        """Everything read up to and including `text` (consumed); AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            if not self._read(deadline) and time.monotonic() >= deadline:
                raise AssertionError(f"no {text!r} within {timeout} s; the terminal showed: {self.seen!r}")
        head, _, self.seen = self.seen.partition(text)
        return head + text

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def run(self, line: str, timeout: float = 30.0) -> str:
        """Type `line`; what the terminal showed until the next prompt (the echoed line left out)."""
        self.type(line + "\n")
        self.until(line + "\n", timeout)
        return self.until(PROMPT, timeout)[: -len(PROMPT)]

    def press(self, char: str) -> None:
        os.write(self.fd, char.encode())

    def close(self) -> None:
        """Kill the shell, then whatever is still in its session: a job a test left running (a
        failed test's background `mpvisor run`, say) would outlive the killed shell, as a bare
        command would, and meet every later run's look for its processes."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.fd)
        left = []
        for pid in psutil.pids():
            try:
                if os.getsid(pid) == self.pid:  # the shell led its session: its id stays its pid's
                    left.append(psutil.Process(pid))
            except (ProcessLookupError, psutil.Error):
                pass
        kill_all(left, timeout=10)
