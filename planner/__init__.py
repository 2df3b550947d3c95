"""stagewright's planner: pure Python (no torch, no web framework, no database).

A plan request enters at :func:`planner.plan.plan` and travels one way: the grid enumerates
and prunes the search space (:mod:`planner.search.grid`), the cost model estimates and
prices candidates (:mod:`planner.costmodel`, with the simulator :mod:`planner.simulate`
timing the schedules of :mod:`planner.schedules`), ``method`` cpsat refines the best of them
(:mod:`planner.search.refinement`), and :mod:`planner.assemble` turns the ranked ones into
the plan's entries with their launch artefacts (:mod:`planner.launch`). The request and plan
shapes are :mod:`planner.specs`; profiles come through :mod:`planner.profiles`; measured runs
and the fit of a profile's free parameters to them are :mod:`planner.measurements` and
:mod:`planner.calibrate`. ``api`` and ``executor`` depend on this package; it depends on
neither.
"""

__all__: list[str] = []
