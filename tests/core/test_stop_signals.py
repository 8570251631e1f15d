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


def test_a_hang_up_stops_like_sigterm():
    """A closed terminal or ssh session (SIGHUP) checkpoints and stops, on one rank or under a
    torchrun started by hand, instead of killing the process."""
    inherited = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # pytest itself may run under nohup
    try:
        signals = StopSignals(world_size=1)
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            assert signals.received == "SIGHUP" and signals.should_stop()
        finally:
            signals.restore()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, inherited)


def test_a_hang_up_stays_ignored_under_nohup():
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        signals = StopSignals(world_size=1)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        signals.restore()
    finally:
        signal.signal(signal.SIGHUP, before)
