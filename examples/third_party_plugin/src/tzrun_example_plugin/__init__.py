"""An example tzrec-run plugin: ``sign_sgd`` and ``label_mean``."""

__version__ = "0.1.0"
