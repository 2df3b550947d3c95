"""How a failed run's reasons are read from torchrun's stderr (no ranks are started here).

The summary blocks are made with torch's own template, so a change in torchrun's wording
shows up here rather than as a vague error from a real failure.
"""

from __future__ import annotations

from string import Template

from torch.distributed.elastic.multiprocessing.errors import _FAILURE_FORMAT_TEMPLATE

from executor.launcher import failure_reasons


def _torchrun_block(idx: int, rank: int, exitcode: int, signal: str, message: str) -> str:
    return Template(_FAILURE_FORMAT_TEMPLATE).substitute(
        idx=idx,
        time="2026-11-25_06:00:00",
        hostname="node",
        rank=rank,
        local_rank=rank,
        exitcode=exitcode,
        pid=4242,
        signal_name=f" ({signal})" if signal else "",
        error_file="<N/A>",
        message=message,
    )


def test_a_killed_rank_is_named_from_torchrun_summary_alone():
    # What the flaky run printed: the killed rank says nothing, the others were stopped
    # before they reported the lost peer.
    stderr = "\n".join(
        [
            "W1125 some warning",
            "=" * 40,
            "executor.worker FAILED",
            "-" * 40,
            "Root Cause (first observed failure):",
            _torchrun_block(0, 1, -9, "SIGKILL", "Signal 9 (SIGKILL) received by PID 4242"),
            "=" * 40,
        ]
    )
    assert failure_reasons(stderr) == ["rank 1 exited with code -9 (SIGKILL)"]


def test_torchrun_failures_come_before_the_ranks_own_lines_without_repeats():
    stderr = "\n".join(
        [
            "rank 0: stopped: rank 1 is gone (connection closed)",
            "rank 0: stopped: rank 1 is gone (connection closed)",
            "Failures:",
            _torchrun_block(1, 0, 1, "", "<N/A>"),
            "Root Cause (first observed failure):",
            _torchrun_block(0, 1, -9, "SIGKILL", "Signal 9 (SIGKILL) received by PID 4242"),
        ]
    )
    assert failure_reasons(stderr) == [
        "rank 0 exited with code 1",
        "rank 1 exited with code -9 (SIGKILL)",
        "rank 0: stopped: rank 1 is gone (connection closed)",
    ]


def test_without_either_the_last_lines_of_stderr_are_the_reason():
    assert failure_reasons("a\nb\nc\nd\n") == ["b", "c", "d"]


def test_the_ranks_own_lines_are_cut_at_four_after_every_torchrun_failure():
    own = [f"rank {r}: stopped: reason {r}" for r in range(6)]
    blocks = [_torchrun_block(i, r, 1, "", "<N/A>") for i, r in enumerate(range(6))]
    reasons = failure_reasons("\n".join(own + blocks))
    assert reasons == [f"rank {r} exited with code 1" for r in range(6)] + own[:4]
