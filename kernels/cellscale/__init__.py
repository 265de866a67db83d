"""cellscale: run a notebook cell as a gang-scheduled cluster job.

%load_ext cellscale
%%cluster --gpus 2 --launcher torchrun --outputs loss
"""

__version__ = "0.1.0"


def load_ipython_extension(ipython) -> None:
    from cellscale.magics import ClusterMagics

    ipython.register_magics(ClusterMagics(ipython))


def unload_ipython_extension(ipython) -> None:
    pass
