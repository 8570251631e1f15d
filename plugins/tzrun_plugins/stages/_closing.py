"""What the stages that hold a resource (a progress bar, event writers, a profiler) share."""

from __future__ import annotations

import tzrun


class ClosedAtTheEnd:
    """A stage whose :meth:`close` runs when training ends, normally or with an error.

    Subclasses implement ``close``, which must be safe to call more than once.
    """

    def close(self) -> None:
        """Release what the stage holds."""
        raise NotImplementedError

    @tzrun.hookimpl
    def tzrun_after_train(self, run: tzrun.RunContext, step: int) -> None:
        self.close()

    @tzrun.hookimpl
    def tzrun_on_train_error(self, run: tzrun.RunContext, error: BaseException) -> None:
        self.close()
