"""A serving process freezes its heap once started, so that full garbage collections (80-120
ms each under load, measured) no longer walk every module and schema; an app built for a
test or an embedding does not touch the process's collector."""

from __future__ import annotations

import gc

from fastapi.testclient import TestClient

from api.app import create_app
from tests.integration.conftest import settings_for


def test_only_a_serving_app_freezes_the_heap(database_url):
    gc.unfreeze()
    with TestClient(create_app(settings_for(database_url))) as client:
        assert client.get("/healthz").status_code == 200
        assert gc.get_freeze_count() == 0
    try:
        with TestClient(create_app(settings_for(database_url), freeze_heap=True)) as client:
            assert client.get("/healthz").status_code == 200
            assert gc.get_freeze_count() > 10_000  # the modules and schemas loaded so far
    finally:
        gc.unfreeze()
