"""The Slurm backend (`driver.SlurmDriver`), named by the entry point
`cellscale_hub.drivers.slurm:SlurmDriver`."""

from cellscale_hub.drivers.slurm.driver import SlurmDriver

__all__ = ["SlurmDriver"]
