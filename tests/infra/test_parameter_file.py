"""`settings check --file main.bicepparam` writes each app setting as the template does
(functions.bicepparam.TEMPLATE_SETTINGS against infra/modules/functionapp.bicep, evaluated
by test_settings_contract's evaluator), and a parameter the file leaves out takes
main.bicep's default, which is the app's own."""

from __future__ import annotations

import json

import pytest

from functions.bicepparam import TEMPLATE_SETTINGS, _render
from functions.model.policy import PolicySettings
from functions.settings import Settings
from functions.terminate.settings import DrainSettings, UndrainSettings
from tests.infra import test_settings_contract as contract
from tests.infra.bicep import load, module_params
from tests.infra.test_functionapp import settings as template_settings

# Derived in main.bicep before the function app gets them (effectiveApprovers, ...): the
# file's own value is passed on when it is not empty.
DERIVED = {
    "approvers": "effectiveApprovers",
    "allowedSubscriptions": "effectiveAllowedSubscriptions",
}


def _sample(kind: str, empty: bool = False):
    return {
        "array": [] if empty else [{"name": "x", "action": "hold"}],
        "bool": True,
        "int": 42,
        "string": "" if empty else "sample-value",
    }[kind]


@pytest.mark.parametrize("param", sorted(TEMPLATE_SETTINGS))
def test_each_parameter_becomes_the_setting_the_template_writes(monkeypatch, param):
    main = load("main")
    mapped = TEMPLATE_SETTINGS[param]
    kind = main.params[param]["type"]
    vault = module_params(main, "keyVault")
    if param in vault:  # a secret: to Key Vault, and the setting a reference to it
        assert vault[param] == param
        node = json.dumps(template_settings()[mapped.setting])
        assert f"secretNames.{param}" in node, node
        return
    assert module_params(main, "functionApp")[param] == DERIVED.get(param, param)
    for empty in (False, True):
        value = _sample(kind, empty)
        if param == "allowedSubscriptions" and not empty:
            value = ["00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"]
        monkeypatch.setitem(contract.SAMPLE, param, value)
        written = contract.app_settings()
        if mapped.omitted_when_empty and empty and param in DERIVED:
            continue  # main.bicep derives it (not the file's to get wrong); the app's default
        if mapped.omitted_when_empty and empty:
            assert mapped.setting not in written
            assert not _render(value, mapped.render).strip("[]{} ")
            continue
        ours = _render(value, mapped.render)
        if mapped.render == "json":
            assert json.loads(ours) == json.loads(written[mapped.setting])
        else:
            assert ours == written[mapped.setting], (param, ours, written[mapped.setting])


def test_a_parameter_left_out_takes_the_apps_own_default():
    main = load("main")
    models = {"POLICY__": PolicySettings, "DRAIN__": DrainSettings, "UNDRAIN__": UndrainSettings}
    for param, mapped in TEMPLATE_SETTINGS.items():
        default = main.param_default(param)
        if main.decorator(param, "secure") or mapped.omitted_when_empty:
            continue  # secrets have no default; an empty one leaves the setting out
        prefix = next((p for p in models if mapped.setting.startswith(p)), "")
        model = models.get(prefix, Settings)
        field = mapped.setting.removeprefix(prefix).lower()
        app_default = model.model_fields[field].get_default(call_default_factory=True)
        rendered = _render(default, mapped.render)
        if isinstance(app_default, tuple):
            assert json.loads(rendered) == list(app_default), param
        else:
            assert rendered == _render(app_default, "text"), (param, rendered, app_default)


def test_every_setting_the_template_writes_from_a_parameter_is_mapped():
    """A new parameter the template turns into an app setting is checked from the file too
    (or the file's value of it would go unchecked)."""
    mapped = {m.setting for m in TEMPLATE_SETTINGS.values()}
    fn = load("functionapp")
    written = template_settings()
    from_params = {
        name
        for name, node in written.items()
        if any(p in json.dumps(node) for p in fn.params if p not in contract.SAMPLE)
    }
    # Settings from template-made values (names, sizes) and fixed timeouts are not the file's.
    not_the_files = {
        "DOCUMENTS_QUEUE",
        "HEARTBEATS_QUEUE",
        "RECONCILE_QUEUE",
        "NOTIFICATIONS_TOPIC",
        "STATE_TABLE_PREFIX",
        "EVENTGRID_QUEUE",
        "RETENTION_DAYS",
        "PAGERDUTY_EVENTS_URL",
        "DRAIN__STEP_TIMEOUT_SECONDS",
        "DRAIN__SAFETY_MARGIN_SECONDS",
    }
    missing = sorted(from_params - mapped - not_the_files)
    assert not missing, f"functions.bicepparam.TEMPLATE_SETTINGS lacks {missing}"
