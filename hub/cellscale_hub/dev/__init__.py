"""Development helpers: real clusters on one machine for cellscale's tests and demos."""
