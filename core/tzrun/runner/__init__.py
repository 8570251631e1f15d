"""Building and running a training job: distributed setup, model and optimizers, the loop,
evaluation and checkpoints. Entered through :func:`tzrun.runner.loop.train`."""
