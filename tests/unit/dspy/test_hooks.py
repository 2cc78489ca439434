"""hooks.py holds every private DSPy/LiteLLM API the package uses; an upgrade that removes one is named."""

from __future__ import annotations

import dspy

from skynet_dspy._dspy import hooks


def test_every_private_api_the_hooks_use_is_there_in_the_installed_versions():
    found = hooks.problems()
    assert found == [], "\n".join(found)


def test_a_removed_dspy_execution_entry_point_is_named_with_the_versions(monkeypatch):
    from dspy.clients import execution

    monkeypatch.delattr(execution, "execute")
    found = hooks.problems()
    assert len(found) == 1
    assert found[0].startswith("wrap_dspy_execution:")
    assert f"dspy {dspy.__version__}" in found[0] and hooks.DSPY_CHECKED in found[0]
    assert "dspy.clients.execution.execute is gone" in found[0]


def test_a_changed_call_result_is_named(monkeypatch):
    import dataclasses

    from dspy.clients import call_result

    fields = [f for f in dataclasses.fields(call_result.CallResult) if f.name != "cache_hit"]
    changed = dataclasses.make_dataclass("CallResult", [(f.name, f.type, f) for f in fields])
    monkeypatch.setattr(call_result, "CallResult", changed)
    assert any(p.startswith("call_result_figures:") and "'cache_hit'" in p for p in hooks.problems())


def test_a_removed_litellm_entry_point_is_named(monkeypatch):
    import litellm

    monkeypatch.delattr(litellm, "acompletion")
    found = [p for p in hooks.problems() if p.startswith("wrap_litellm:")]
    assert found and "litellm.acompletion is gone" in found[0] and hooks.LITELLM_CHECKED in found[0]


def test_a_removed_module_call_is_named(monkeypatch):
    monkeypatch.delattr(dspy.Module, "acall")
    found = [p for p in hooks.problems() if p.startswith("wrap_module_calls:")]
    assert found == [f"wrap_module_calls: dspy {dspy.__version__} (hooks checked against {hooks.DSPY_CHECKED}): "
                     "dspy.Module.acall is gone"]


def test_inside_a_module_follows_dspys_caller_modules():
    seen = []

    class Outer(dspy.Module):
        def forward(self):
            seen.append(hooks.inside_a_module())
            return dspy.Prediction(answer="x")

    assert not hooks.inside_a_module()
    Outer()()
    assert seen == [True]


def test_wrapping_dspy_execution_is_idempotent(monkeypatch):
    from dspy.clients import execution

    originals = {name: getattr(execution, name) for name in ("execute", "aexecute")}
    for name, original in originals.items():
        monkeypatch.setattr(execution, name, original)  # each restored after the test

    def wrap(fn, asynchronous):
        def wrapped(*args, **kwargs):
            return fn(*args, **kwargs)

        wrapped.asynchronous = asynchronous
        return wrapped

    assert hooks.wrap_dspy_execution(wrap)
    once = {name: getattr(execution, name) for name in originals}
    assert hooks.wrap_dspy_execution(wrap)
    for name, original in originals.items():
        if getattr(original, "_skynet_wrapped", False):  # measurement already wrapped it in this process
            assert once[name] is original
        else:
            assert once[name] is not original and once[name].asynchronous == (name == "aexecute")
        assert getattr(execution, name) is once[name]  # not wrapped twice


def test_a_gepa_adapter_that_no_longer_reads_the_cache_key_is_named(monkeypatch):
    import inspect

    real = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: real(obj).replace("_gepa_transient_failure", "_renamed"))
    found = [p for p in hooks.problems() if p.startswith("keep_out_of_gepas_cache:")]
    assert found and hooks.GEPA_CHECKED in found[0] and "no longer reads '_gepa_transient_failure'" in found[0]


def test_a_litellm_response_without_hidden_params_is_named(monkeypatch):
    from litellm.types.utils import ModelResponse

    monkeypatch.setattr(ModelResponse, "_hidden_params", None, raising=False)
    original = ModelResponse.__init__

    def without(self, *args, **kwargs):
        original(self, *args, **kwargs)
        object.__setattr__(self, "_hidden_params", None)

    monkeypatch.setattr(ModelResponse, "__init__", without)
    assert any(p.startswith("response_cost:") and "_hidden_params" in p for p in hooks.problems())


def test_dspy_carries_its_context_into_the_threads_it_starts():
    """measure.py carries a run in dspy.context, relying on DSPy copying it into dspy.Parallel's threads."""
    seen = []

    class Look(dspy.Module):
        def forward(self, n):
            seen.append(dspy.settings.get("skynet_probe"))
            return dspy.Prediction(n=n)

    with dspy.context(skynet_probe="carried"):
        dspy.Parallel(num_threads=2, disable_progress_bar=True)([(Look(), {"n": 1}), (Look(), {"n": 2})])
    assert seen == ["carried", "carried"]
