# Installed by the cellscale distribution into <prefix>/etc/ipython: every kernel of this
# environment pre-loads the %%cluster magic (loading it starts nothing).
c = get_config()  # noqa: F821
c.InteractiveShellApp.extensions.append("cellscale")
