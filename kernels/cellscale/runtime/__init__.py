"""The in-job runtime: what runs on the nodes.

`supervisor` starts one attempt on one node (the launcher, heartbeats, the exit record);
`rank` wraps each rank (log prefixes, the GPU it sees); `cell` executes the cell's code
with its inputs and returns rank 0's outputs. `environment` tells a cell where it runs.
"""

from cellscale.runtime.environment import JobEnvironment

__all__ = ["JobEnvironment"]
