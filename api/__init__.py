"""stagewright's interfaces: the ``stagewright`` command line (and, as they land, the REST
service, the dashboard and the SQL store). Thin: formulas and schedule logic live in
``planner``."""

__all__: list[str] = []
