"""When Slurm's own scheduler would start a job: `sbatch --test-only`, run as a member of the
job's account so that its associations apply, with the answers Slurm 22.05 gets absurdly
wrong left out. Staging ahead asks the same question (`staging`)."""

from __future__ import annotations

import subprocess
import time

from cellscale.spec import JobSpec
from cellscale_hub import proc
from cellscale_hub.drivers.capabilities import EstimatesStart
from cellscale_hub.drivers.slurm.parse import command_error, key_values, parse_estimate, slurm_minutes
from cellscale_hub.drivers.slurm.script import SAFE_NAME, SAFE_NODE
from cellscale_hub.drivers.types import BackendUnreachable


class SlurmEstimates(EstimatesStart):
    """A mixin of `SlurmDriver`: start estimates, reused `estimate_seconds` per job shape and account."""

    def start_estimate(self, spec: JobSpec, account: str) -> float | None:
        """When Slurm's scheduler would start the job if submitted now (`sbatch --test-only`,
        run as a member of the account so its associations apply); None when Slurm cannot say
        or says something absurd: 22.05 sometimes answers now + 3.5 days while nodes are still
        COMPLETING, so an estimate beyond half the partition's MaxTime while enough idle nodes
        (powered-down cloud nodes included) exist for the gang counts as unknown. Reused
        `estimate_seconds` per (shape, account), so a scheduling cycle may ask per pending head."""
        spec = self.shape(spec)
        res = spec.resources
        key = (account, res.nodes, res.gpus_per_node, res.cpus_per_node, res.memory_mb_per_node, res.timeout_min)
        now = time.monotonic()
        cached = self._estimates.get(key)
        if cached and now - cached[0] < self.estimate_seconds:
            return cached[1]
        estimate = self._estimate(spec, account)
        self._estimates[key] = (now, estimate)
        return estimate

    def _estimate(self, spec: JobSpec, account: str) -> float | None:
        answer = self._test_only(spec, account)
        at = parse_estimate(answer) if answer else None
        if at is None:
            return None
        res = spec.resources
        if at - time.time() >= self._max_time_s() / 2 - 60 and self._idle_nodes() >= res.nodes:
            self.log.info("Slurm's start estimate %s for a %d-node gang ignored: nodes are idle", at, res.nodes)
            return None
        return at

    def _test_only(
        self, spec: JobSpec, account: str, excluded: tuple[str, ...] = (), nodelist: tuple[str, ...] = ()
    ) -> str | None:
        """What `sbatch --test-only` says of the job (run as a member of the account, so its
        associations apply); None when it refuses."""
        account = self.account_of(account)
        if not SAFE_NAME.match(account):
            return None
        user = self._account_user(account)
        if user is None:
            return None
        res = spec.resources
        avoid = sorted(node for node in excluded if SAFE_NODE.match(node))
        argv = [
            *self._as_user(user),
            "sbatch",
            "--test-only",
            f"--account={account}",
            f"--partition={self.partition}",
            f"--nodes={res.nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={res.cpus_per_node}",
            *([f"--mem={res.memory_mb_per_node}M"] if res.memory_mb_per_node else []),
            *([f"--gres=gpu:{res.gpus_per_node}"] if res.gpus_per_node else []),
            f"--time={res.timeout_min}",
            *([f"--switches={res.switches}"] if res.switches else []),
            *([f"--exclude={','.join(avoid)}"] if avoid else []),
            *([f"--nodelist={','.join(nodelist)}"] if nodelist else []),
            "--output=/dev/null",
            "--chdir=/",
            "--wrap=true",
        ]
        try:
            result = proc.run(argv, timeout=self.command_timeout, env=self._env())
        except subprocess.TimeoutExpired:
            raise BackendUnreachable(f"sbatch --test-only did not answer within {self.command_timeout} s") from None
        if result.returncode:
            error = command_error(argv, result.returncode, result.stderr)
            if isinstance(error, BackendUnreachable):
                raise error
            self.log.debug("sbatch --test-only refused: %s", error)
            return None
        return result.stderr + result.stdout

    def _account_user(self, account: str) -> str | None:
        """A researcher of the account in this cluster (sbatch --test-only must run as one)."""
        if account not in self._account_users:
            rows = self._run(
                [
                    "sacctmgr",
                    "-n",
                    "-P",
                    "show",
                    "assoc",
                    "where",
                    f"cluster={self.cluster_name()}",
                    f"account={account}",
                    "format=user",
                ]
            )
            users = sorted({u for u in rows.split() if SAFE_NAME.match(u)})
            self._account_users[account] = users[0] if users else None
        return self._account_users[account]

    def _max_time_s(self) -> float:
        fields = key_values(self._run(["scontrol", "-o", "show", "partition", self.partition]))
        return slurm_minutes(fields.get("MaxTime", "")) * 60.0

    def _idle_nodes(self) -> int:
        """Nodes of the partition that take a job now or once powered up."""
        return sum(
            1
            for n in self._nodes()
            if self.partition in n.get("partitions", [])
            and str(n.get("state", "")).lower() == "idle"
            and not {"DRAIN", "DOWN", "FAIL"} & {str(f).upper() for f in n.get("state_flags", [])}
        )
