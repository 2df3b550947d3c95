"""torchrun command lines and the per-node launch scripts that hold them.

A line runs as printed, given the files it names (the executor config, in the folder
``stagewright plan --emit`` writes) and, on several nodes, ``MASTER_ADDR`` (the first node's
address) and optionally ``MASTER_PORT`` (default 29500; a cluster's job environment often sets
it, and another job may hold 29500 on node 0). One node needs no address at all:
``--standalone`` lets torchrun pick a free port on the machine, so two jobs on one machine do
not collide.
"""

from __future__ import annotations

from planner.specs import CandidateConfig, PlanRequest

__all__ = [
    "EXECUTOR_CONFIG_FILE",
    "MASTER_PORT",
    "launch_script",
    "node_layout",
    "torchrun_commands",
    "torchrun_prefix",
]

EXECUTOR_CONFIG_FILE = "executor-config.json"
MASTER_PORT = 29500  # torchrun's default rendezvous port, unless MASTER_PORT says another


def node_layout(request: PlanRequest, config: CandidateConfig) -> tuple[int, int]:
    """(nodes, processes per node) of the candidate's t x cp x p x d ranks."""
    world = config.world_size
    per_node = min(request.cluster.gpus_per_node, world)
    return max(1, world // per_node), per_node


def torchrun_prefix(request: PlanRequest, config: CandidateConfig, node: int) -> str:
    """``torchrun`` and its options for ``node``, before the program it runs."""
    nodes, per_node = node_layout(request, config)
    if nodes == 1:
        return f"torchrun --standalone --nproc-per-node={per_node}"
    return (
        f"torchrun --nnodes={nodes} --node-rank={node} --nproc-per-node={per_node} "
        f"--master-addr=$MASTER_ADDR --master-port=${{MASTER_PORT:-{MASTER_PORT}}}"
    )


def torchrun_commands(request: PlanRequest, config: CandidateConfig) -> list[str]:
    """One torchrun line per node running the executor on ``executor-config.json``."""
    nodes, _ = node_layout(request, config)
    target = f"-m executor.worker {EXECUTOR_CONFIG_FILE}"
    return [f"{torchrun_prefix(request, config, node)} {target}" for node in range(nodes)]


def launch_script(
    command: str, *, node: int, nodes: int, title: str, env: str = "", prelude: str = ""
) -> str:
    """A bash script that runs ``command`` (a torchrun line) from its own folder on node
    ``node`` of ``nodes``; extra arguments are passed on to the command. ``env`` holds
    ``export`` lines the runtime needs; ``prelude`` runs before the script leaves the folder
    it was started from (to read paths the operator gave relative to it)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# {title}",
        f"# Node {node} of {nodes}: run this on node {node}"
        + (", with MASTER_ADDR set to node 0's address." if nodes > 1 else "."),
        "set -euo pipefail",
        *([prelude.rstrip("\n")] if prelude else []),
        'cd "$(dirname "$0")"',
    ]
    if nodes > 1:
        lines.append(': "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"')
    # Without this bash says only "torchrun: command not found" (exit 127), which does not
    # say that the environment holding torch (and stagewright) is not the one on PATH.
    lines += [
        "if ! command -v torchrun >/dev/null; then",
        '  echo "$0: torchrun is not on PATH; activate the Python environment that has torch '
        '(its bin folder must be on PATH)" >&2',
        "  exit 127",
        "fi",
    ]
    lines += [
        "# gloo finds its network interface from the host name; when every node is this",
        "# machine (MASTER_ADDR on loopback), say so, since the host may have other interfaces.",
        'if [ -z "${GLOO_SOCKET_IFNAME:-}" ] && '
        '[[ "${MASTER_ADDR:-127.0.0.1}" =~ ^(127\\.|localhost$) ]]; then',
        "  export GLOO_SOCKET_IFNAME=lo",
        "fi",
    ]
    if env:
        lines.append(env.rstrip("\n"))
    if nodes > 1:
        # torchrun says nothing while it waits for the other nodes, and gives up only after
        # its rendezvous timeout (900 s): say what it waits for, and where.
        lines.append(
            f'echo "$0: node {node} of {nodes}: waiting until all {nodes} nodes have started '
            f"their script, meeting at $MASTER_ADDR:${{MASTER_PORT:-{MASTER_PORT}}} (torchrun "
            'gives up after 15 minutes)" >&2'
        )
    lines.append(f'{command} "$@"')
    return "\n".join(lines) + "\n"
