"""[data] fields: a built-in objective's inputs read under the data set's own names."""

from __future__ import annotations

import pytest
import torch

from vcdl.config import parse_config
from vcdl.errors import ConfigError, DataError
from vcdl.objectives import objective_for


def test_the_inputs_are_read_under_the_data_sets_names() -> None:
    cfg = parse_config(
        {"train": {"objective": "regression"}, "data": {"fields": {"x": "features", "y": "target"}}}
    )
    objective = objective_for(cfg.train, cfg.data.fields)
    assert objective.fields == ("features", "target") and objective.inputs == ("x", "y")
    objective.check(["features", "target", "id"])
    batch = objective.prepare({"features": torch.ones(4, 3), "target": torch.zeros(4)})
    assert set(batch) == {"x", "y"} and batch["x"].shape == (4, 3)
    # Unnamed inputs keep their own names.
    partial = objective_for(cfg.train, {"y": "target"})
    assert partial.fields == ("x", "target")


def test_without_a_mapping_the_refusal_says_what_to_write() -> None:
    objective = objective_for(parse_config({"train": {"objective": "regression"}}).train)
    with pytest.raises(DataError) as err:
        objective.check(["features", "target"])
    message = str(err.value)
    assert "needs the field(s) x, y; the data set has features, target" in message
    assert '[data] fields = { x = "<field>", y = "<field>" }' in message
    assert "\n" not in message


def test_a_mapping_onto_a_missing_field_or_of_an_unknown_input_is_refused() -> None:
    train = parse_config({"train": {"objective": "classification"}}).train
    with pytest.raises(DataError, match=r"needs the field\(s\) feats.*has features, target"):
        objective_for(train, {"x": "feats", "y": "target"}).check(["features", "target"])
    with pytest.raises(
        ConfigError, match=r"maps z, which objective 'classification' does not read"
    ):
        objective_for(train, {"z": "features"})
    lm = parse_config({"train": {"objective": "causal_lm"}}).train
    assert objective_for(lm, {"tokens": "ids"}).fields == ("ids",)


@pytest.mark.parametrize("bad", [{"x": ""}, {"x": "a b"}, {"": "x"}, {"x": "f" * 65}])
def test_a_field_name_that_is_not_one_is_refused_in_the_config(bad: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"data\.fields"):
        parse_config({"data": {"fields": bad}})
