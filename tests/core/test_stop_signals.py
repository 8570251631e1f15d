"""Ctrl-C asks a run to stop at the next step, like SIGTERM; a second Ctrl-C while it stops
interrupts at once, as Python does by default."""

from __future__ import annotations

import os
import signal

import pytest

from tzrun.runner.signals import StopSignals


def test_a_first_ctrl_c_only_asks_to_stop_and_a_second_interrupts():
    before = signal.getsignal(signal.SIGINT)
    signals = StopSignals(world_size=1)
    try:
        assert not signals.should_stop()
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.received == "SIGINT" and signals.should_stop()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signals.restore()
    assert signal.getsignal(signal.SIGINT) is before
