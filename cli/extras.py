"""The optional parts of stagewright and the message a person gets when one is missing.

``pip install stagewright`` installs the planner and this command line only. The commands
that need more import it inside ``needs_extra`` so that a missing dependency becomes one
line naming the extra that installs it, instead of a traceback.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from planner.errors import StagewrightError

__all__ = ["EXTRA_MODULES", "STORE_HINT", "Extra", "needs_extra", "require_installed"]

Extra = Literal["service", "executor"]

# Added to an unknown GPU when a command planned with the bundled profiles only: a profile
# added with `stagewright profiles` or fitted by `stagewright calibrate` lives in a store.
STORE_HINT = (
    "; these are the bundled profiles: for one in a store (added with `stagewright "
    "profiles`, or fitted by `stagewright calibrate`) give --database-url"
)

# The top-level modules each extra of pyproject.toml installs (and their own dependencies
# that the code imports directly); a missing module outside these is a bug, not a missing
# extra, and is not disguised as one.
EXTRA_MODULES: dict[Extra, frozenset[str]] = {
    "service": frozenset(
        {
            "fastapi",
            "fastapi_offline",
            "starlette",
            "uvicorn",
            "sqlalchemy",
            "alembic",
            "psycopg",
            "httpx",
        }
    ),
    "executor": frozenset({"torch"}),
}


@contextmanager
def needs_extra(extra: Extra, what: str) -> Iterator[None]:
    """Run the imports in the ``with`` block; if one fails because a module of ``extra`` is
    not installed, raise ``StagewrightError`` saying ``what`` needs it and how to install
    it (the CLI prints it as one line and exits with status 2). Keep only imports in the
    block: any other ``ImportError`` propagates unchanged."""
    try:
        yield
    except ImportError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in EXTRA_MODULES[extra]:
            raise
        raise StagewrightError(
            f"{what} needs {missing}: install it with pip install 'stagewright[{extra}]'"
        ) from exc


def require_installed(extra: Extra, what: str, module: str) -> None:
    """Fail as ``needs_extra`` does unless ``module`` (of ``extra``) is installed, without
    importing it: for commands that use it only in the processes they start (``stagewright
    run`` starts torchrun), which would otherwise fail later and less clearly."""
    with needs_extra(extra, what):
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
