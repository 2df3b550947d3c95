"""stagewright's interfaces: the ``stagewright`` command line, the REST service
(``api.app.create_app``, routes in ``api.routes``) and the SQL store (``api.store``,
migrations in ``migrations/``). Thin: formulas and schedule logic live in ``planner``."""

__all__: list[str] = []
