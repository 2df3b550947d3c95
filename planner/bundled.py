"""Where the data shipped with stagewright is: ``profiles/`` and ``migrations/``.

In a checkout (and in the editable install ``make`` makes) both are folders at the top of the
repository, beside the packages. A wheel carries them inside the package that reads them,
as ``<package>/_data/<name>`` (``planner/_data/profiles``, ``api/_data/migrations``; see
``[tool.setuptools]`` in pyproject.toml). :func:`bundled_dir` finds either, so every reader
asks it rather than building a path from its own ``__file__``.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["bundled_dir"]


def bundled_dir(package: str, name: str) -> Path:
    """The folder ``name`` that ships with the (imported) ``package``: the copy the wheel put
    inside it when there is one, else the checkout's top-level folder beside it.

    The result is a real folder on disk (Alembic and the dashboard's static files need a
    path); a package imported from a zip archive is refused."""
    root = files(package)
    if not isinstance(root, Path):
        raise RuntimeError(
            f"{package} is not installed as files on disk ({root}); stagewright reads its "
            f"bundled {name}/ folder from there"
        )
    root = root.resolve()
    packaged = root / "_data" / name
    return packaged if packaged.is_dir() else root.parent / name
