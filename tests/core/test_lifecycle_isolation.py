"""Per-plugin isolation of lifecycle hooks (``tzrun.kernel.plugins.call_lifecycle``) holds when a
plugin wraps the hook (``@hookimpl(wrapper=True)`` or ``hookwrapper=True``)."""

from __future__ import annotations

import pytest

import tzrun
from tzrun.kernel.plugins import call_lifecycle


class Wrapper:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    @tzrun.hookimpl(wrapper=True)
    def tzrun_before_train(self, run):
        self.calls.append("wrapper before")
        result = yield
        self.calls.append("wrapper after")
        return result


class OldStyleWrapper(Wrapper):
    @tzrun.hookimpl(hookwrapper=True)
    def tzrun_before_train(self, run):
        self.calls.append("wrapper before")
        yield
        self.calls.append("wrapper after")


class Good:
    def __init__(self, calls: list[str], tag: str) -> None:
        self.calls, self.tag = calls, tag

    @tzrun.hookimpl
    def tzrun_before_train(self, run):
        self.calls.append(self.tag)


class Failing:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    @tzrun.hookimpl
    def tzrun_before_train(self, run):
        self.calls.append("failing")
        raise RuntimeError("boom")


@pytest.mark.parametrize("wrapper_class", [Wrapper, OldStyleWrapper])
def test_a_failing_plugin_is_disabled_and_the_others_run_inside_a_wrapper(tzrun_pm, wrapper_class):
    calls: list[str] = []
    wrapper, failing = wrapper_class(calls), Failing(calls)
    tzrun_pm.register(Good(calls, "first"), name="first")
    tzrun_pm.register(failing, name="failing")
    tzrun_pm.register(Good(calls, "last"), name="last")
    tzrun_pm.register(wrapper, name="wrapper")
    with pytest.warns(RuntimeWarning, match=r"plugin 'failing' raised in tzrun_before_train: RuntimeError: boom; "
                                            r"it is disabled for the rest of this run and training goes on"):
        call_lifecycle(tzrun_pm, "tzrun_before_train", run=None)
    # pluggy's order (the last registered first), all inside the wrapper
    assert calls == ["wrapper before", "last", "failing", "first", "wrapper after"]
    assert not tzrun_pm.is_registered(failing) and tzrun_pm.is_registered(wrapper)
    calls.clear()
    call_lifecycle(tzrun_pm, "tzrun_before_train", run=None)
    assert calls == ["wrapper before", "last", "first", "wrapper after"]


def test_a_wrapper_that_raises_is_disabled_and_every_other_plugin_runs_once(tzrun_pm):
    calls: list[str] = []

    class Broken:
        @tzrun.hookimpl(wrapper=True)
        def tzrun_before_train(self, run):
            calls.append("broken before")
            raise ValueError("bad wrapper")
            yield  # pragma: no cover

    broken = Broken()
    tzrun_pm.register(Good(calls, "first"), name="first")
    tzrun_pm.register(Wrapper(calls), name="wrapper")
    tzrun_pm.register(broken, name="broken")
    with pytest.warns(RuntimeWarning, match=r"plugin 'broken' raised in tzrun_before_train: ValueError: bad wrapper"):
        call_lifecycle(tzrun_pm, "tzrun_before_train", run=None)
    assert not tzrun_pm.is_registered(broken)
    assert calls.count("first") == 1 and "broken before" in calls
    calls.clear()
    call_lifecycle(tzrun_pm, "tzrun_before_train", run=None)
    assert calls == ["wrapper before", "first", "wrapper after"]


def test_under_strict_a_failure_inside_a_wrapper_propagates(tzrun_pm):
    calls: list[str] = []
    tzrun_pm.strict = True
    tzrun_pm.register(Failing(calls), name="failing")
    tzrun_pm.register(Wrapper(calls), name="wrapper")
    with pytest.raises(RuntimeError, match="boom"):
        call_lifecycle(tzrun_pm, "tzrun_before_train", run=None)
