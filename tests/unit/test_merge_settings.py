"""vcdl.merge.settings: the merge section comes from the rule registry and the rules' settings.

A rule's name, its line of the form and the keys it owns are declared beside
the rule (vcdl/merge/builtin/); the config takes them from there, and what a
user writes and what a ledger recorded keep their shape.
"""

from __future__ import annotations

import json
import subprocess
import sys
import typing

import pytest

from vcdl.config import MergeSection, RunConfig, RunSection, parse_config
from vcdl.errors import ConfigError
from vcdl.merge.builtin.diloco import DilocoSettings
from vcdl.merge.builtin.diloco_async import DilocoAsyncSettings
from vcdl.merge.interface import RuleSettings
from vcdl.merge.rules import RULES
from vcdl.merge.settings import SharedMergeSettings


def test_the_rule_choices_are_the_registry_s_names_in_its_order() -> None:
    field = MergeSection.model_fields["rule"]
    assert typing.get_args(field.annotation) == tuple(RULES)
    schema = RunConfig.model_json_schema()["$defs"]["MergeSection"]["properties"]["rule"]
    assert schema["enum"] == list(RULES) and schema["default"] == "vc_asgd"
    assert schema["description"] == " ".join(r.summary for r in RULES.values())
    for name, rule in RULES.items():
        assert rule.summary.startswith(f"{name}: ")


def test_an_unknown_rule_is_refused_naming_the_choices() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"merge": {"rule": "sgd"}})
    assert str(err.value) == (
        "invalid config: merge.rule: Input should be 'vc_asgd', 'delta', 'average', 'easgd', "
        "'diloco' or 'diloco_async' (got 'sgd')"
    )


def test_every_rule_s_own_keys_are_keys_of_the_merge_section() -> None:
    for rule in RULES.values():
        own = rule.settings_model
        if own is None:
            continue
        assert issubclass(MergeSection, own), f"add {own.__name__} to MergeSection's bases"
        assert set(own.model_fields) <= set(MergeSection.model_fields)
    assert RULES["diloco"].settings_model is DilocoSettings
    assert RULES["diloco_async"].settings_model is DilocoAsyncSettings


def test_the_shared_keys_lead_and_each_rule_s_follow() -> None:
    shared = list(SharedMergeSettings.model_fields)
    assert list(MergeSection.model_fields)[: len(shared)] == shared
    assert list(MergeSection.model_fields)[len(shared) :] == [
        "outer_momentum",
        "nesterov",
        "momentum_delay",
        "mergers",  # added since: after the recorded keys
    ]


def test_the_merge_section_is_as_strict_as_every_other_section() -> None:
    assert RuleSettings.model_config == RunSection.model_config
    assert MergeSection.model_config == RunSection.model_config


def test_a_rule_s_keys_stay_flat_and_a_recorded_merge_section_loads_unchanged() -> None:
    cfg = parse_config({"merge": {"rule": "diloco", "outer_momentum": 0.5, "nesterov": False}})
    assert (cfg.merge.outer_momentum, cfg.merge.nesterov) == (0.5, False)
    # The merge section as ledgers recorded it before the rules owned their keys.
    recorded = (
        '{"rule":"diloco","alpha":0.5,"schedule":"constant","alpha_end":null,"alphas":null,'
        '"staleness":"plain","staleness_power":1.0,"staleness_grace":0,"max_staleness":null,'
        '"max_update_norm":null,"result_precision":"full","fold":1,"outer_momentum":0.5,'
        '"nesterov":false}'
    )
    # Keys added since load at their defaults, after the recorded ones.
    assert cfg.merge.model_dump_json() == recorded[:-1] + ',"momentum_delay":null,"mergers":1}'
    whole = RunConfig().model_dump() | {"merge": json.loads(recorded)}
    assert RunConfig.model_validate_json(json.dumps(whole)).merge == cfg.merge


def test_reading_a_config_imports_no_torch() -> None:
    """The config imports every rule's declaration; torch waits for the first merge."""
    code = (
        "import sys\n"
        "import vcdl.config, vcdl.merge, vcdl.merge.rules\n"
        "vcdl.config.parse_config({'merge': {'rule': 'diloco'}})\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_merge_package_s_names_load_on_first_use() -> None:
    import vcdl.merge

    for name in vcdl.merge.__all__:
        assert callable(getattr(vcdl.merge, name)) or isinstance(getattr(vcdl.merge, name), tuple)
    with pytest.raises(AttributeError):
        vcdl.merge.no_such_name  # noqa: B018
