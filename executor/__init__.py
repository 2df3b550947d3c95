"""stagewright's executor: runs the planner's schedule IR on torch.distributed.

Not implemented yet (issue 6); the package exists so that the distribution's layout is the
one in the architecture document."""

__all__: list[str] = []
