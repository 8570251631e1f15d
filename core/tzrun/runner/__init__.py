"""Building and running a training job: a :class:`~tzrun.runner.session.Session` assembles a
run's parts, a :class:`~tzrun.runner.trainer.Trainer` runs the loop, evaluation and
checkpoints. Entered through :func:`tzrun.runner.trainer.train`."""
