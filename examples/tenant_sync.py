"""Tenant sync with `replace`: only the newest sync of each tenant matters.

Every tenant has a slot of its own (`tenant-<name>`). A sync is submitted with
`ControllerSpec.replace`: if the tenant's slot is busy, the running sync is asked to stop (a
cooperative `Canceled`, then a kill of its tree after `grace`) and the new one runs next, once
the old one's process is gone, so two syncs of one tenant never run at once. Several requests
that arrive while the old sync is still stopping collapse into the newest one (the ones in
between are `REJECTED` with `superseded_by_replace`). Other tenants' slots are not affected.

    python examples/tenant_sync.py     # prints each sync's outcome; exits 0
"""

from __future__ import annotations

import asyncio
import sys
import time

import mpvisor
from mpvisor import (
    ControllerConfig,
    ControllerSpec,
    OutcomeKind,
    Supervisor,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)

PAGES = 10


def sync(tenant: str, revision: int) -> str:
    """Copy a tenant's pages (a stand-in: 10 pages of 50 ms); a stop request ends it between pages."""
    ctx = mpvisor.context()
    for page in range(1, PAGES + 1):
        ctx.check_cancelled()  # stop here if a newer sync replaced this one
        time.sleep(0.05)  # copy one page
        ctx.progress(page, PAGES)
    return f"{tenant} synced at revision {revision}"


def request(tenant: str, revision: int) -> ControllerSpec:
    spec = TaskSpec.once(TaskFn(f"sync-{tenant}-r{revision}", sync, (tenant, revision)))
    return ControllerSpec.replace(spec).with_slot(f"tenant-{tenant}")


async def main() -> int:
    supervisor = Supervisor.builder(SupervisorConfig(grace=5.0)).with_controller(ControllerConfig()).build()
    async with supervisor as handle:
        events = handle.events()
        waiters = {}
        for tenant, revision in [("acme", 1), ("globex", 1)]:
            _, waiters[tenant, revision] = await handle.submit_and_watch(request(tenant, revision))
        async for event in events:  # once acme's first sync is copying pages ...
            if event.task == "sync-acme-r1" and event.progress and event.progress[0] >= 2:
                break
        for revision in (2, 3, 4):  # ... three newer revisions of acme arrive at once
            _, waiters["acme", revision] = await handle.submit_and_watch(request("acme", revision))
        outcomes = {key: await waiter.wait() for key, waiter in waiters.items()}
    for (tenant, revision), outcome in sorted(outcomes.items()):
        detail = outcome.value or outcome.reason
        print(f"{tenant} r{revision}: {outcome.label} ({detail})")
    expected = {("acme", 1): OutcomeKind.CANCELED, ("acme", 2): OutcomeKind.REJECTED,
                ("acme", 3): OutcomeKind.REJECTED, ("acme", 4): OutcomeKind.COMPLETED,
                ("globex", 1): OutcomeKind.COMPLETED}
    return 0 if {key: outcome.kind for key, outcome in outcomes.items()} == expected else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
