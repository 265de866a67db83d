"""The control loop: the controller's cycle and the reconcilers it runs (admission, attempts,
sites), the sweep runner, staging ahead, and the site board they read."""
