"""stagewright's executor: runs the planner's schedule IR on torch.distributed.

``stagewright run CONFIG.json`` starts :mod:`executor.launcher`, which validates a plan's
executor config and runs :mod:`executor.worker` under torchrun (gloo on CPU, NCCL on GPU);
each rank interprets its own list of the schedule's actions (:mod:`executor.interpreter`),
the very list the planner priced, with point-to-point communication, BPipe's activation
transfers and PipeDream-2BW's weight versions in modules of their own, and reports measured
step times and saved-activation bytes next to the prediction. ``--verify`` compares losses
and gradients with a single-process reference (:mod:`executor.reference`,
:mod:`executor.verify`). :mod:`executor.profiler` measures the layer times that
``stagewright profile`` stores.

The package exports nothing itself: callers import the module they need.
"""

__all__: list[str] = []
