"""Background searches: the job runner (``api.jobs.runner``), where a search runs
(``api.jobs.search``: a search process with limits, or inline for tests) and the search
process itself (``api.jobs.worker``, which imports nothing of the web stack: it starts in
a fraction of a second)."""

__all__: list[str] = []
