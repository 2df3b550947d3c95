"""The launch artefacts of a plan as files: what ``stagewright plan --emit DIR`` writes and
``GET /v1/plans/{id}/launch.tar.gz`` packs.

Per ranked candidate, a folder ``candidate-N`` (N = its rank in the plan) with:
- ``executor-config.json`` and, where stagewright's executor can run the candidate,
  ``run-node<i>.sh``, one per node, holding the plan's torchrun line for that node (run it on
  that node, with ``MASTER_ADDR`` set when there are several); where it cannot, no script that
  would only fail: the folder's line in ``README.md`` gives the reason;
- where Megatron-LM can run the candidate as planned: ``megatron-args.txt`` (one argument per
  line) and ``megatron-node<i>.sh`` (``MEGATRON_LM`` names a Megatron-LM checkout; synthetic
  data and a null tokenizer unless ``DATA_ARGS`` says otherwise);
- where torch.distributed.pipelining can: ``torch-pipelining.csv``, which
  ``python -m executor.torch_pipelining`` runs on torch's runtime with stagewright's model
  (the README says how, for a candidate of one pipeline in fp32);
- ``candidate.json``: the candidate as the plan holds it (prediction, runtimes, notes).
And at the top, ``plan.json`` (the whole plan) and ``README.md`` (what is where).
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass

from planner.launch.artefacts import materialize_launch, megatron_of
from planner.launch.torch_csv import torch_runner_problem
from planner.launch.torchrun import (
    EXECUTOR_CONFIG_FILE,
    RUN_INTERRUPTED_NOTE,
    launch_script,
    node_layout,
    torchrun_prefix,
)
from planner.specs import Candidate, Plan, PlanRequest

__all__ = ["LaunchFile", "launch_archive", "launch_files"]


@dataclass(frozen=True)
class LaunchFile:
    path: str  # relative, with "/" separators
    content: str
    executable: bool = False


def _title(candidate: Candidate, index: int) -> str:
    c = candidate.config
    # cp when it is not 1: without it a context-parallel candidate reads as t x p x d GPUs.
    cp = f" cp={c.cp}" if c.cp != 1 else ""
    return (
        f"stagewright candidate {index}: {c.schedule}, t={c.t}{cp} p={c.p} d={c.d}, micro-batch "
        f"{c.micro_batch_size} x {c.num_microbatches}, recompute {c.recompute}"
    )


# Before the script moves to its own folder: MEGATRON_LM may be relative to where it was
# started, and a checkout without pretrain_gpt.py is said in one line rather than by a
# traceback from every rank.
_MEGATRON_CHECKOUT = """\
: "${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (holding pretrain_gpt.py)}"
if [ ! -f "$MEGATRON_LM/pretrain_gpt.py" ]; then
  echo "$0: MEGATRON_LM=$MEGATRON_LM holds no pretrain_gpt.py;" \\
    "set MEGATRON_LM to a Megatron-LM checkout" >&2
  exit 2
fi
MEGATRON_LM="$(cd "$MEGATRON_LM" && pwd)"
"""


def _candidate_files(request: PlanRequest, candidate: Candidate, index: int) -> list[LaunchFile]:
    folder = f"candidate-{index}"
    title = _title(candidate, index)
    nodes, _ = node_layout(request, candidate.config)
    launch = materialize_launch(request, candidate)
    files = [
        LaunchFile(
            f"{folder}/{EXECUTOR_CONFIG_FILE}", json.dumps(launch.executor_config, indent=1)
        ),
        LaunchFile(f"{folder}/candidate.json", candidate.model_dump_json(indent=2)),
    ]
    for node, line in enumerate(launch.torchrun if "stagewright" in candidate.runtimes else []):
        files.append(
            LaunchFile(
                f"{folder}/run-node{node}.sh",
                # executor.worker's ranks end with torchrun (executor.lifeline).
                launch_script(
                    line,
                    node=node,
                    nodes=nodes,
                    title=title,
                    ranks_end_with_torchrun=True,
                    interrupted_note=RUN_INTERRUPTED_NOTE,
                ),
                executable=True,
            )
        )
    if launch.megatron_args is not None:
        megatron = megatron_of(request, candidate)
        files.append(LaunchFile(f"{folder}/megatron-args.txt", "\n".join(megatron.args) + "\n"))
        env = "".join(f"export {k}={v}\n" for k, v in megatron.env.items())
        env += (
            "# Synthetic data and a null tokenizer unless DATA_ARGS says otherwise (its paths\n"
            "# absolute, or relative to this folder: the script runs from here), e.g.\n"
            '# DATA_ARGS="--data-path PREFIX --tokenizer-type GPT2BPETokenizer --vocab-file '
            'VOCAB --merge-file MERGES"\n'
            'DATA_ARGS="${DATA_ARGS:---mock-data --tokenizer-type NullTokenizer}"\n'
            'TRAIN_ARGS="${TRAIN_ARGS:---train-iters 100 --lr 1.0e-4}"\n'
        )
        for node in range(nodes):
            command = (
                f"{torchrun_prefix(request, candidate.config, node)} "
                '"$MEGATRON_LM/pretrain_gpt.py" $(cat megatron-args.txt) $DATA_ARGS $TRAIN_ARGS'
            )
            files.append(
                LaunchFile(
                    f"{folder}/megatron-node{node}.sh",
                    launch_script(
                        command,
                        node=node,
                        nodes=nodes,
                        title=title,
                        env=env,
                        prelude=_MEGATRON_CHECKOUT,
                    ),
                    executable=True,
                )
            )
    if launch.torch_pipelining_csv is not None:
        files.append(LaunchFile(f"{folder}/torch-pipelining.csv", launch.torch_pipelining_csv))
    return files


def _torch_line(request: PlanRequest, candidate: Candidate) -> str:
    """What to do with a candidate's torch-pipelining.csv."""
    c = candidate.config
    if torch_runner_problem(c.t, c.d, c.cp, request.training.precision) is not None:
        return (
            "  torch-pipelining.csv: the schedule for torch.distributed.pipelining's "
            "_PipelineScheduleRuntime (_load_csv), row i on pipeline rank i of your stages"
        )
    return (
        "  torch-pipelining.csv: the schedule for torch.distributed.pipelining; on "
        "stagewright's model, checked against one process: `torchrun --standalone "
        f"--nproc-per-node={c.p} -m executor.torch_pipelining executor-config.json "
        "torch-pipelining.csv --verify` (in the folder)"
    )


def _readme(plan: Plan, with_csv: set[int]) -> str:
    lines = [
        f"# Launch artefacts of plan {plan.id}",
        "",
        f"{plan.request.model.name} on {plan.request.cluster.num_nodes} x "
        f"{plan.request.cluster.gpus_per_node} {plan.request.cluster.gpu}. Candidates in "
        "ranked order (1 is the best); each folder holds what runs it:",
        "",
    ]
    for index, candidate in enumerate(plan.candidates, start=1):
        p = candidate.predicted
        lines.append(
            f"- candidate-{index}: {_title(candidate, index).split(': ', 1)[1]}; predicted "
            f"{p.iteration_time_s:.4g} s per step, peak {p.peak_memory_gib:.1f} GiB; runs on "
            f"{', '.join(candidate.runtimes) or 'no runtime'}"
            + (" (stale weights: PipeDream-2BW)" if candidate.semantics == "stale" else "")
        )
        if "stagewright" not in candidate.runtimes:
            reason = candidate.runtime_limits.get("stagewright", "")
            lines.append(f"  (no run-node scripts: stagewright's executor cannot run it: {reason})")
        if index in with_csv:
            lines.append(_torch_line(plan.request, candidate))
    lines += [
        "",
        "Run `bash candidate-N/run-node<i>.sh` on node i (with MASTER_ADDR set to node 0's "
        "address when there are several nodes); stagewright and torch must be installed. "
        "Extra arguments go to the executor (e.g. `--steps 100 --verify`). The script runs from "
        "its own folder, so the report lands in `candidate-N/stagewright-run/run-report.json`, "
        "beside the config, wherever the script is started from (a relative `--out DIR` is "
        "taken from there too); the executor prints its path when it finishes.",
        "",
    ]
    return "\n".join(lines)


def launch_files(plan: Plan) -> list[LaunchFile]:
    """Every file of the plan's launch artefacts."""
    per_candidate = [
        _candidate_files(plan.request, candidate, index)
        for index, candidate in enumerate(plan.candidates, start=1)
    ]
    with_csv = {
        index
        for index, files in enumerate(per_candidate, start=1)
        if any(f.path.endswith("/torch-pipelining.csv") for f in files)
    }
    out = [
        LaunchFile("plan.json", plan.model_dump_json(indent=2)),
        LaunchFile("README.md", _readme(plan, with_csv)),
    ]
    for files in per_candidate:
        out += files
    return out


def launch_archive(plan: Plan, root: str) -> bytes:
    """The files as a gzipped tar archive under the folder ``root``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for item in launch_files(plan):
            data = item.content.encode("utf-8")
            info = tarfile.TarInfo(f"{root}/{item.path}")
            info.size = len(data)
            info.mode = 0o755 if item.executable else 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
