"""torchrun command lines and the per-node launch scripts that hold them.

A line runs as printed, given the files it names (the executor config, in the folder
``stagewright plan --emit`` writes) and, on several nodes, ``MASTER_ADDR`` (the first node's
address) and optionally ``MASTER_PORT`` (default 29500; a cluster's job environment often sets
it, and another job may hold 29500 on node 0) and ``RDZV_TIMEOUT`` (how many seconds a node
waits for the others, default torchrun's 900). One node needs no address at all:
``--standalone`` lets torchrun pick a free port on the machine, so two jobs on one machine do
not collide.
"""

from __future__ import annotations

from planner.specs import CandidateConfig, PlanRequest

__all__ = [
    "EXECUTOR_CONFIG_FILE",
    "MASTER_PORT",
    "RDZV_TIMEOUT",
    "RUN_INTERRUPTED_NOTE",
    "STOP_GRACE",
    "launch_script",
    "node_layout",
    "torchrun_commands",
    "torchrun_prefix",
]

EXECUTOR_CONFIG_FILE = "executor-config.json"
MASTER_PORT = 29500  # torchrun's default rendezvous port, unless MASTER_PORT says another
# Seconds a node waits for the others, unless RDZV_TIMEOUT says otherwise: torchrun's own
# default (LaunchConfig in torch.distributed.launcher.api). The lines below, given
# --master-addr and --master-port but no --rdzv-backend, rendezvous through torchrun's
# "static" backend, a TCPStore on node 0 whose only setting besides the node's rank is
# --rdzv-conf timeout=SECONDS (static_tcp_rendezvous.create_rdzv_handler): node 0 waits that
# long for the others to connect, the others that long to reach it.
RDZV_TIMEOUT = 900
# Seconds between the steps a several-node script takes to end torchrun after Ctrl-C or
# SIGTERM (see _meeting): SIGTERM, then SIGKILL. Long enough for a torchrun that stops its
# ranks to finish doing so and print its account (1-3 s here on 2 busy cores, ranks that end
# on the signal); short enough that someone who pressed Ctrl-C does not give up on it, and
# that both steps fit in the 30 s Slurm gives a job between SIGTERM and SIGKILL (KillWait's
# default), so that the script still says how it ended.
STOP_GRACE = 10
# What an executor run stopped by Ctrl-C or SIGTERM leaves, said after "interrupted (SIGINT)"
# by the emitted scripts and by stagewright run.
RUN_INTERRUPTED_NOTE = (
    "; the run did not finish: no run report was written (checkpoints completed in "
    "--checkpoint-dir are kept, and a run started again resumes from the newest)"
)


def node_layout(request: PlanRequest, config: CandidateConfig) -> tuple[int, int]:
    """(nodes, processes per node) of the candidate's t x cp x p x d ranks."""
    world = config.world_size
    per_node = min(request.cluster.gpus_per_node, world)
    return max(1, world // per_node), per_node


def torchrun_prefix(request: PlanRequest, config: CandidateConfig, node: int) -> str:
    """``torchrun`` and its options for ``node``, before the program it runs."""
    return _prefix(*node_layout(request, config), node)


def _prefix(nodes: int, per_node: int, node: int) -> str:
    """:func:`torchrun_prefix` given the candidate's :func:`node_layout`."""
    if nodes == 1:
        return f"torchrun --standalone --nproc-per-node={per_node}"
    return (
        f"torchrun --nnodes={nodes} --node-rank={node} --nproc-per-node={per_node} "
        f"--master-addr=$MASTER_ADDR --master-port=${{MASTER_PORT:-{MASTER_PORT}}} "
        f"--rdzv-conf=timeout=${{RDZV_TIMEOUT:-{RDZV_TIMEOUT}}}"
    )


def torchrun_commands(request: PlanRequest, config: CandidateConfig) -> list[str]:
    """One torchrun line per node running the executor on ``executor-config.json``."""
    # The layout once, not once a node: a plan makes these for each of its candidates, and a
    # 16,384-GPU one has 2,048 nodes.
    nodes, per_node = node_layout(request, config)
    target = f"-m executor.worker {EXECUTOR_CONFIG_FILE}"
    return [f"{_prefix(nodes, per_node, node)} {target}" for node in range(nodes)]


def launch_script(
    command: str,
    *,
    node: int,
    nodes: int,
    title: str,
    env: str = "",
    prelude: str = "",
    ranks_end_with_torchrun: bool = False,
    interrupted_note: str = "",
) -> str:
    """A bash script that runs ``command`` (a torchrun line) from its own folder on node
    ``node`` of ``nodes``; extra arguments are passed on to the command. ``env`` holds
    ``export`` lines the runtime needs; ``prelude`` runs before the script leaves the folder
    it was started from (to read paths the operator gave relative to it).
    ``ranks_end_with_torchrun`` says that the program's ranks end when torchrun does, however
    it ends (executor.lifeline), so that the script may kill torchrun once it runs them.
    On Ctrl-C or SIGTERM the script ends torchrun and says so in one line, followed by
    ``interrupted_note`` (what the interrupted program leaves behind), with exit status
    128 + the signal's number; torchrun's own account of its shutdown is not passed on."""
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
        lines.append(_CHECK_RDZV_TIMEOUT)
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
    lines.append(_supervised(command, node, nodes, ranks_end_with_torchrun, interrupted_note))
    return "\n".join(lines) + "\n"


# torchrun reads the value with int(); whole seconds, and at most 7 digits (115 days) so that
# a slip of the keyboard is not taken for a wait of centuries.
_CHECK_RDZV_TIMEOUT = f"""\
RDZV_TIMEOUT="${{RDZV_TIMEOUT:-{RDZV_TIMEOUT}}}"
if ! [[ "$RDZV_TIMEOUT" =~ ^[1-9][0-9]{{0,6}}$ ]]; then
  echo "$0: RDZV_TIMEOUT=$RDZV_TIMEOUT is not a number of seconds; set RDZV_TIMEOUT to how" \\
    "long this node waits for the others, in whole seconds from 1 to 9999999" \\
    "(e.g. RDZV_TIMEOUT=1800), or unset it for torchrun's {RDZV_TIMEOUT}" >&2
  exit 2
fi"""


def _supervised(
    command: str, node: int, nodes: int, ranks_end_with_torchrun: bool, note: str
) -> str:
    """Run ``command``; on several nodes, first say what the node waits for and how long,
    and when torchrun ends because the nodes did not all meet in time, say that in the
    script's words; on Ctrl-C or SIGTERM, end torchrun and say so (followed by ``note``)."""
    several = nodes > 1
    where = f"$MASTER_ADDR:${{MASTER_PORT:-{MASTER_PORT}}}"
    here = f"$0: node {node} of {nodes}:" if several else "$0:"
    waiting_line = (
        f"""echo "{here} waiting until all {nodes} nodes have started their script, \
meeting at {where} (torchrun gives up after $RDZV_TIMEOUT s; RDZV_TIMEOUT=SECONDS sets that)" >&2
"""
        if several
        else ""
    )
    timed_out_hint = (
        f"""  if [ -n "$timed_out" ]; then
    echo "{here} the {nodes} nodes did not all meet at {where} within" \\
      "RDZV_TIMEOUT=$RDZV_TIMEOUT s; start every node's script within that time, each" \\
      "with MASTER_ADDR set to node 0's address (reachable from every node) and the same" \\
      "MASTER_PORT, or set RDZV_TIMEOUT to wait longer" >&2
  fi
"""
        if several
        else ""
    )
    grace = STOP_GRACE * 10  # the script counts in tenths of a second
    # What torchrun was doing when the signal came and it did not handle it yet (below).
    waiting_for = f" while waiting for the other nodes at {where}" if several else ""
    stopped_early = (
        '  said+="; torchrun stopped. Scripts already started on the other nodes wait up to '
        'their"\n  said+=" RDZV_TIMEOUT for this one: stop them too, or start this one again"'
        if several
        else '  said+=" while torchrun was starting; torchrun stopped"'
    )
    # torchrun says nothing while it waits for the other nodes, and a wait that runs out ends
    # in a traceback whose last line says it in torch's words: "Timed out after N seconds
    # waiting for clients. 1/2 clients joined." on node 0, "The client socket has timed out
    # after Nms while trying to connect to (ADDR, PORT)." on the others. Its stderr passes
    # through the function line by line, and the script's own line follows when one of those
    # was in it. The function ignores Ctrl-C and SIGTERM so that it ends only when torchrun
    # and its ranks have. What torchrun prints once it stops on a signal (the log line
    # "Received SIGNAL death signal, shutting down workers", then the stopping of its ranks
    # and a SignalException traceback) is not passed on: the script's own line says it.
    #
    # Ctrl-C does not stop a torchrun that waits for the other nodes: the wait is one blocking
    # call into C++ (the static rendezvous's TCPStore), and Python raises KeyboardInterrupt
    # only when it returns, after RDZV_TIMEOUT. So the script ends torchrun itself. It runs
    # the pipeline in the background and waits for it with `wait`, which a trapped signal
    # interrupts (bash runs no trap while a foreground command runs). Without job control
    # a background pipeline stays in the script's process group, the terminal's foreground
    # group: Ctrl-C and Ctrl-Z still reach torchrun. Bash starts a background command with
    # SIGINT and SIGQUIT ignored; `trap -` gives torchrun back the dispositions it had.
    #
    # What the script does depends on whether torchrun handles SIGTERM itself, which it does
    # from when it starts its ranks (torch.distributed.elastic's PContext.start installs the
    # handler) until it ends; Linux shows it in /proc/PID/status (SigCgt). Whether it still
    # has ranks is no guide: on the same Ctrl-C, torchrun may have stopped them already. A
    # torchrun gone by the time the script looks (bash has reaped it) ended on the signal
    # itself, at once, which one with the handler does not: it takes a second or two to stop
    # its ranks and end (0.9-2.4 s measured, even with ranks gone within milliseconds).
    # Until then SIGTERM ends torchrun at once: the script sends it at once, and SIGKILL if
    # torchrun has not ended STOP_GRACE s later (no rank exists to be orphaned). After,
    # torchrun stops its ranks on SIGINT and SIGTERM: it signals them, waits up to 30 s and
    # kills those left. It had the signal too, in the usual case (a terminal's Ctrl-C, a
    # scheduler signalling the job's processes), and a second one during that shutdown cuts
    # it short, so the script only waits. When the ranks end with torchrun
    # (executor.lifeline), a torchrun still running STOP_GRACE s later (the signal went to the
    # script alone, or the ranks are slow to stop) gets SIGTERM, and SIGKILL STOP_GRACE s
    # after that. Other ranks (Megatron-LM's) would outlive a torchrun cut short: torchrun is
    # left to end them. Where the script cannot tell (not Linux), SIGTERM at once, no SIGKILL.
    term_after_ranks, kill_after_ranks = (grace, 2 * grace) if ranks_end_with_torchrun else (-1, -1)
    return f"""\
{waiting_line}pass_on_what_torchrun_says() {{
  trap '' INT TERM
  local line timed_out="" stopping=""
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in
      *" death signal, shutting down workers"*) stopping=1 ;;
    esac
    [ -n "$stopping" ] || printf '%s\\n' "$line" >&2
    case "$line" in
      *"waiting for clients"*|*"client socket has timed out"*) timed_out=1 ;;
    esac
  done
{timed_out_hint}}}
interrupted="" signals=0
trap 'interrupted=${{interrupted:-INT}} signals=$((signals + 1))' INT
trap 'interrupted=${{interrupted:-TERM}} signals=$((signals + 1))' TERM
exec 3>&1
( trap - INT QUIT; exec {command} "$@" ) 2>&1 >&3 3>&- | pass_on_what_torchrun_says 3>&- &
pipeline=$!
torchrun=$(jobs -p) || true  # the pipeline's first process
status=0
wait "$pipeline" || status=$?
[ -n "$interrupted" ] || exit "$status"
[ -n "$torchrun" ] || torchrun=$(jobs -p) || true
handles_term=""  # whether torchrun handles SIGTERM itself: empty where the script cannot tell
if [[ $OSTYPE == linux* ]]; then
  handles_term=no caught=0
  {{ while read -r key value; do
      if [ "$key" = SigCgt: ]; then caught=$value; fi
    done <"/proc/$torchrun/status"; }} 2>/dev/null || true
  if (((0x$caught >> 14) & 1)); then handles_term=yes; fi  # bit 14: signal 15, SIGTERM
fi
case "$handles_term" in  # when to send SIGTERM and SIGKILL, in tenths of a second (-1: never)
  no) term_at=0 kill_at={grace} ;;
  yes) term_at={term_after_ranks} kill_at={kill_after_ranks} ;;
  *) term_at=0 kill_at=-1 ;;
esac
killed=""
for ((tenths = 0; ; tenths++)); do
  kill -0 "$torchrun" 2>/dev/null || break
  if ((tenths == term_at)); then kill -TERM "$torchrun" 2>/dev/null || true; fi
  if ((tenths == kill_at)); then
    if kill -KILL "$torchrun" 2>/dev/null; then killed=1; fi
    break
  fi
  sleep 0.1
done
while :; do  # until torchrun's output has all been passed on (a signal cuts a wait short)
  seen=$signals
  wait "$pipeline" || true
  [ "$signals" != "$seen" ] || break
done
said="{here} interrupted (SIG$interrupted)"
if [ "$handles_term" = no ]; then said+="{waiting_for}"; fi
if [ -n "$killed" ]; then
  said+="; torchrun did not end within {STOP_GRACE} s of SIGTERM and was killed with SIGKILL"
elif [ "$handles_term" = no ]; then
{stopped_early}
elif [ "$handles_term" = yes ]; then
  said+="; torchrun stopped its ranks and ended"
else
  said+="; torchrun has ended"
fi
echo "$said{note}" >&2
exit $((128 + $(kill -l "$interrupted")))"""
