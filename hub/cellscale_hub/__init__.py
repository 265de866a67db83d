"""cellscale's control plane: a JupyterHub-managed service that owns every job.

Its rooms, in layers: a room imports only rooms below it, never one beside it (import-linter's
`layers` and `acyclic_siblings` contracts in pyproject.toml; docs/architecture.md).

    __main__.py   `python -m cellscale_hub`
    app.py        the process: ControlPlane (traitlets config), the wiring of everything below
    api/          HTTP: one router per resource (jobs, desk, bundles, points, cost, admin API
                    and page), log streaming (one watch per followed log), OAuth, CSRF, one
                    error format; never imports control/
    control/      the reconcile loop (controller.py) and its reconcilers: admit.py,
                    attempts.py (launch, observe, retry, preempt), sites.py; the sweep
                    runner, staging ahead, the site board
    cost/         the ledger (pure), metering, estimates and budgets, a cloud pool's bill
    routing.py    where a submit goes (tenant → queue → backend) and typed refusals
    metrics.py    Prometheus metrics
    refs.py       a stored job and attempt → the AttemptRef a driver works on
    bundles.py    the content-addressed bundle store, and its clean-up
    drivers/      a core Driver (base.py), opt-in capabilities (capabilities.py), one module
                    or folder per scheduler (local.py, slurm/, kubernetes/); the only room
                    that opens a job's directory (jobfiles.py)
    store/        SQLAlchemy tables, job queries, the stored spec typed, a sweep's points,
                    the tenancy's audited revisions, the snapshot admission decides on,
                    per-queue totals kept on commit; Alembic migrations
    waiting.py    why each pending job waits: published by the controller, read by the API
    scheduling/   admission (pure): one cycle over GPUs, CPUs and memory, fair share,
                    ordering, preemption, site offers, the never-fits ceiling, GPU ids
    tenancy.py    Kueue's nouns as a validated document (flavors, cohorts, queues, tenants)
    faults.py     fault classes → retry or give up (pure)
    lifecycle.py  which phase changes are legal; what an attempt's state means (pure)
    settings.py   the one frozen Settings the controller and the API run by
    auth.py       JupyterHub tokens → a Principal with scopes
    inotify.py    file watches (log followers)
    proc.py       the one subprocess helper (argv lists only)
    dev/          dev tools apart from the layers: a real Slurm cluster, the cloud
                    simulation, a kube-apiserver, an object store, Unix users
"""
