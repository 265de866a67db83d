#!/bin/sh
# cellscale local backend: sweep cs-0123456789ab, attempt 1: 250 point(s) in 25 task(s) of 10, at most 4 at once, each with 1 GPU(s)
# one task pool per array; each task runs its points one after another:
#   PYTHON -m cellscale.runtime.sweep task /var/cellscale/jobs/cs-0123456789ab 1 INDEX
cd /var/cellscale/jobs/cs-0123456789ab
exec runuser -u alice -- PYTHON -m cellscale.runtime.sweep pool /var/cellscale/jobs/cs-0123456789ab 1
