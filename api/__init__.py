"""stagewright's service: the REST API (``api.app.create_app``, routes in ``api.routes``,
use cases in ``api.services``), the dashboard and the SQL store (``api.store``, migrations
in ``migrations/``). Installed with the ``service`` extra; the command line (``cli``) starts
it with ``stagewright serve``. Thin: formulas and schedule logic live in ``planner``, and
nothing here imports ``cli``."""

__all__: list[str] = []
