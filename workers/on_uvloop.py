"""Targets of a program that runs on uvloop, as many asyncio programs do.

Importing this module sets uvloop's event loop policy, as such a program's code does at its
top, so an `async def` target here runs on uvloop's loop in its attempt.

| target | does | ends |
|---|---|---|
| `loop_module()` | | returns the module of the loop it runs on (`"uvloop"`) |
| `failing()` | raises `ValueError` from its own frame, inside an `await` | a retryable failure, whose traceback starts at `failing` |
"""

from __future__ import annotations

import asyncio

import uvloop

asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


async def failing() -> None:
    await asyncio.sleep(0)
    raise ValueError("failed on purpose")
