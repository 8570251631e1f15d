"""tzrun-contrib-optimizers: optimizers and an LR schedule for tzrec-run, installed as a plugin.

Components (name them in the TOML; see the README for every option):

* dense optimizers ``lion`` (Chen et al. 2023) and ``adabelief`` (Zhuang et al. 2020);
* LR schedule ``inverse_sqrt`` (linear warmup, then ``lr * sqrt(timescale / steps)``);
* sparse optimizer ``ema_rowwise_adagrad`` (FBGEMM's ``EMAINPLACE_ROWWISE_ADAGRAD``).

The package is found through its ``tzrun`` entry point (:mod:`tzrun_contrib_optimizers.hooks`);
importing it registers nothing.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
