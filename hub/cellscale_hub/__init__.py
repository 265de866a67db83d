"""cellscale's control plane: a JupyterHub-managed service that owns every job.

Where things are (the arrows are the only imports allowed between rooms; import-linter
checks the ones marked *):

    app.py        the process: ControlPlane (traitlets config), wiring of everything below
    api/          HTTP: routes, admin API and page, log streaming (one watch per followed
                    log), OAuth, one error format
                    -> placement, store, drivers, waiting (* never the controller)
    placement.py  where a submit goes (tenant → queue → backend) and typed refusals
    controller.py the reconcile loop: admit, launch, observe, retry, preempt
    waiting.py    why each pending job waits: published by the controller, read by the API
    faults.py     fault classes → retry or give up (pure)
    lifecycle.py  which phase changes are legal; what an attempt's state means (pure)
    scheduling/   admission over GPUs, CPUs and memory, fair share, the never-fits
                    ceiling, GPU ids (* pure)
    tenancy.py    Kueue's nouns as a validated document (flavors, cohorts, queues, tenants)
    store/        SQLAlchemy tables, job queries, the tenancy's audited revisions, the
                    snapshot admission decides on (usage.py), per-queue totals kept on
                    commit (totals.py), a sweep's points (points.py), the stored spec
                    typed (specs.py); Alembic migrations
    drivers/      one module per scheduler + the Driver contract (base.py); the only room
                    that opens a job's directory (*)
    refs.py       a stored job and attempt → the AttemptRef a driver works on
    proc.py       the one subprocess helper (argv lists only)
    dev/          `cellscale dev slurm up`: a real Slurm cluster on this machine
"""
