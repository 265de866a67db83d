"""cellscale's control plane: a JupyterHub-managed service that owns every job."""
