#!/bin/sh
# cellscale local backend: job cs-0123456789ab, attempt 1, GPUs 0,1
# the supervisor then starts, once for each of its 2 processes: PYTHON -m cellscale.runtime.rank /var/cellscale/jobs/cs-0123456789ab 1
cd /var/cellscale/jobs/cs-0123456789ab
exec runuser -u alice -- PYTHON -m cellscale.runtime.supervisor /var/cellscale/jobs/cs-0123456789ab 1
