"""Run the real `blackbox` command as a child process, as an operator would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


class BlackboxProcess:
    """`python -m blackbox ARGS` with a given environment, its output kept in a file."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        *args: str,
        program: Sequence[str] = (),
        cwd: Path | None = None,
    ) -> None:
        """`program` replaces `python -m blackbox` (an installed `blackbox` command); `cwd`
        is the working directory (`python -m` imports from there first)."""
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [*(program or (sys.executable, "-m", "blackbox")), *(args or ("run",))],
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )

    def kill(self) -> None:
        """SIGKILL: the process dies mid-work, as in a crash."""
        self.process.kill()
        self.process.wait()
        self._log.close()

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM, then the exit code (the test fails if it does not exit in time)."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        self._log.close()
        return code

    def wait(self, timeout: float = 30.0) -> int:
        code = self.process.wait(timeout)
        self._log.close()
        return code

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")
