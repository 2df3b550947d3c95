"""The published JSON Schemas of the documents the planner and the executor exchange.

``python -m planner.launch.schema [DIR]`` writes ``executor-config.schema.json`` and
``run-report.schema.json`` into DIR (default ``docs``); a test checks that the published files
are the ones these models give.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from planner.launch.config import EXECUTOR_CONFIG_FORMAT, ExecutorConfig
from planner.launch.report import RUN_REPORT_FORMAT, RunReport

__all__ = ["SCHEMAS", "schema_text"]

SCHEMAS: dict[str, tuple[type[Any], str]] = {
    "executor-config.schema.json": (ExecutorConfig, EXECUTOR_CONFIG_FORMAT),
    "run-report.schema.json": (RunReport, RUN_REPORT_FORMAT),
}


def schema_text(name: str) -> str:
    """The JSON Schema file ``name`` as it should be published."""
    model, version = SCHEMAS[name]
    schema = model.model_json_schema()
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "x-format": version,
        **schema,
    }
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else Path("docs")
    folder.mkdir(parents=True, exist_ok=True)
    for name in SCHEMAS:
        (folder / name).write_text(schema_text(name), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
