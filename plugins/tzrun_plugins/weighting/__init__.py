"""First-party loss weightings (``[train.loss_weighting]``): ``sum`` and ``pareto``."""
