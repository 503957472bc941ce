"""Attempts on a Ray cluster: `SupervisorConfig(launcher=RayLauncher(...))`.

Needs Ray: install the `ray` extra (`pip install '.[ray]'` in a checkout) or `pip install 'ray[client]'`.
Each attempt runs under an agent (a Ray actor of its own, placed with the task's
`TaskSpec.with_resources(...)`), which forks it from a local mpvisor launcher on that node: the same process semantics as on this machine
(own session, SIGTERM -> grace -> SIGKILL of the whole tree, `exited` only once the tree is
reaped). If the agent or its node dies, the attempt ends as a retryable failure whose reason
starts `launcher died` or `node lost`, after a fence of `lost_fence` seconds. Importing this
module does not import Ray; serving a supervisor with a `RayLauncher` does.
"""

from __future__ import annotations

from mpvisor._launchers.ray import RayLauncher

RayLauncher.__module__ = __name__

__all__ = ["RayLauncher"]
