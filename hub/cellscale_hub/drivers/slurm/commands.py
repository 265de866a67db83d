"""Running Slurm's commands for the driver: argv lists through `proc`, with the driver's
`SLURM_CONF` and timeout, and a controller that does not answer raised as BackendUnreachable."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from cellscale_hub import proc
from cellscale_hub.drivers.owners import as_user
from cellscale_hub.drivers.slurm.parse import command_error, json_answer
from cellscale_hub.drivers.slurm.script import SAFE_NAME
from cellscale_hub.drivers.types import BackendUnreachable


class SlurmCommands:
    """The Slurm CLI, as the driver runs it (a mixin of `SlurmDriver`: its traits `slurm_conf`,
    `command_timeout`, `cluster`, `submit_as`)."""

    def _env(self) -> dict[str, str]:
        return proc.job_environment({"SLURM_CONF": self.slurm_conf} if self.slurm_conf else None)

    def _run(self, argv: list[str]) -> str:
        try:
            result = proc.run(argv, timeout=self.command_timeout, env=self._env())
        except subprocess.TimeoutExpired:
            raise BackendUnreachable(
                f"{shlex.join(argv)} did not answer within {self.command_timeout} s: Slurm does not answer"
            ) from None
        if result.returncode:
            raise command_error(argv, result.returncode, result.stderr)
        return result.stdout

    def _json(self, argv: list[str]) -> dict:
        """A `--json` query; Slurm 22.05's squeue and sinfo exit 0 with an empty list and an
        `errors` entry when the controller does not answer: that is unreachable, not empty."""
        return json_answer(argv, self._run(argv))

    def cluster_name(self) -> str:
        """This backend's ClusterName: the trait, else slurm.conf's, else `scontrol show config`."""
        if self._cluster_name is None:
            name = self.cluster or (conf_cluster_name(Path(self.slurm_conf)) if self.slurm_conf else None)
            if not name:
                config = self._run(["scontrol", "show", "config"])
                match = re.search(r"^ClusterName\s*=\s*(\S+)", config, re.MULTILINE)
                if not match:
                    raise RuntimeError("`scontrol show config` names no ClusterName")
                name = match.group(1)
            if not SAFE_NAME.match(name.lower()):
                raise RuntimeError(f"Slurm cluster name {name!r} is not a plain name")
            self._cluster_name = name.lower()
        return self._cluster_name

    def _as_user(self, user: str) -> list[str]:
        return as_user(self.submit_as, user)


def conf_cluster_name(conf: Path) -> str | None:
    try:
        text = conf.read_text()
    except OSError:
        return None
    match = re.search(r"^\s*ClusterName\s*=\s*(\S+)", text, re.MULTILINE | re.IGNORECASE)
    return match.group(1) if match else None
