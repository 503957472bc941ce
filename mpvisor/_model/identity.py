"""Who is a task? Its `TaskId`: an int unique in this process, never reused.

A leaf: the handle (for `add`) and the controller (for `submit`, before admission) allocate ids
here, so neither needs the runtime to name a task. Ids increase in allocation order,
process-wide, across every supervisor of the process.
"""

from __future__ import annotations

import itertools
from typing import TypeAlias

TaskId: TypeAlias = int  # a task's identity: unique in this process, never reused
next_id = itertools.count(1).__next__  # TaskIds increase in allocation order, process-wide
