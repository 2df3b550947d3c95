"""stagewright's planner: pure Python (no torch, no web framework, no database).

It holds the schedule IR and its generators, the simulator that prices a schedule, and (as
they land) the cost model and the search. ``api`` and ``executor`` depend on it; it depends
on neither.
"""

__all__: list[str] = []
