"""What the tests that start their own Ray head share: free ports for every port it opens, and
stopping it by the process group it was started in (never `ray stop`, which stops every cluster on
the machine)."""

from __future__ import annotations

import os
import signal
import socket
import time

#: The ports a Ray head opens besides its GCS port (each given a free one, so two tests' clusters and a
#: user's never collide).
HEAD_PORTS = ("ray-client-server-port", "dashboard-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
              "runtime-env-agent-port", "metrics-export-port")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def head_port_flags() -> list[str]:
    """`ray start --head` flags giving each of its other ports a free one."""
    return [f"--{name}={free_port()}" for name in HEAD_PORTS]


def stop_process_group(leader: int, pause: float) -> None:
    """SIGTERM, then SIGKILL, to the process group `leader` opened (`start_new_session=True`)."""
    for number in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(leader, number)
        except ProcessLookupError:
            return
        time.sleep(pause)
