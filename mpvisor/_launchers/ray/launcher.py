"""What does a user configure to run attempts on Ray: `RayLauncher`?

The settings (a frozen record, checked when made) and the `LauncherFactory` that builds a
`client.RayClient` for each supervisor that serves with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from mpvisor._launchers.ray.client import RayClient
from mpvisor._model import checks as _validate
from mpvisor._model.errors import ConfigError
from mpvisor._model.records import record

if TYPE_CHECKING:
    from mpvisor._launchers.seam import Launcher, LaunchSettings


DEFAULT_LOST_FENCE = 5.0  # seconds after Ray declared an agent dead before its attempt is reported lost


@record(frozen=True, init=False)
class RayLauncher:
    """Attempts placed on a Ray cluster: pass it as `SupervisorConfig(launcher=RayLauncher())`.

    `address`: the cluster to connect to, as `ray.init(address=...)` takes it: `None` connects like
    `ray.init()` does (a cluster configured by `RAY_ADDRESS` or `ray start`, else a local one that
    the supervisor starts and, at shutdown, stops); `auto` (a configured cluster, never a new
    one); `HOST:PORT` (a head node's GCS); `ray://HOST:PORT` (through the cluster's client server:
    Ray's client, `ray[client]`, which the `ray` extra brings); `local` (always a new local one).
    Another form is a `ConfigError` at once (`checks.ray_address`, the rule of `--ray` too).
    If Ray is already initialized in this process, that connection is used and left alone.
    A cluster not reached within `start_timeout` is a `ConfigError`; what Ray says while it
    connects stays off the terminal (`output.RayOutput`).
    `runtime_env`: Ray's runtime_env for every agent (code and packages for other nodes): the
    job's when the supervisor makes the connection (Ray uploads local code only there), else each agent's.
    `lost_fence`: seconds, after Ray declared an attempt's agent or node dead, before the attempt
    is reported lost (its slot's next owner or its retry waits for it); default 5.

    Each attempt reserves its task's `Resources` (`TaskSpec.with_resources`); without them, one
    CPU. Ray's own retries are off: mpvisor's restart policy decides.
    """

    address: str | None
    runtime_env: Mapping[str, Any] | None
    lost_fence: float

    def __init__(
        self,
        address: str | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        lost_fence: float = DEFAULT_LOST_FENCE,
    ) -> None:
        if address is not None:
            _validate.ray_address("address", address)
        if runtime_env is not None and not isinstance(runtime_env, Mapping):
            raise ConfigError(f"runtime_env must be a mapping (Ray's runtime_env) or None, got {runtime_env!r}")
        env_vars = (runtime_env or {}).get("env_vars", {})
        if not isinstance(env_vars, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
            raise ConfigError(f"runtime_env['env_vars'] must map strings to strings, got {env_vars!r}")
        fence = _validate.duration("lost_fence", lost_fence)
        object.__setattr__(self, "address", address)
        object.__setattr__(self, "runtime_env", dict(runtime_env) if runtime_env is not None else None)
        object.__setattr__(self, "lost_fence", fence)

    def __hash__(self) -> int:
        return hash((self.address, repr(self.runtime_env), self.lost_fence))

    def __call__(
        self, loop: asyncio.AbstractEventLoop, launch: LaunchSettings, on_death: Callable[[str], None]
    ) -> Launcher:
        """Build the runtime's launcher (a `LauncherFactory`)."""
        return RayClient(loop, self, launch, on_death)
