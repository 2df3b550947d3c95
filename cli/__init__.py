"""The ``stagewright`` command line (``cli.main:main``).

It needs only the planner: ``pip install stagewright`` gives ``stagewright plan``,
``simulate`` and ``regress``. Commands that serve or use the SQL store import ``api`` and
need the ``service`` extra; ``run`` and ``profile`` import ``executor`` and need the
``executor`` extra (torch). Both are imported only when such a command runs, and a missing
extra is one line on stderr naming what to install (``cli.extras``)."""

__all__: list[str] = []
