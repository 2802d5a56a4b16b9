"""benchmarks/time_to_accuracy.py gives every contender the same global batch."""

from __future__ import annotations

from benchmarks.time_to_accuracy import Settings, contenders


def test_the_plain_contenders_step_on_what_vcdls_workers_step_on_together() -> None:
    s = Settings(variants=("merge.rule=vc_asgd", "train.batch_size=100"))
    plain, vcdls = contenders(s, 64, 2, "t", ["train.lr=0.01"])
    shipped = vcdls["vcdl"]
    assert shipped.cluster.workers == 2
    # examples/mnist1d.toml: 50 per worker; one process steps on 100, DDP splits 100.
    assert shipped.train.batch_size == 50
    assert plain.train.batch_size == shipped.global_batch_size == 100
    assert vcdls["vcdl merge.rule=vc_asgd"].train.batch_size == 50
    assert vcdls["vcdl merge.rule=vc_asgd"].merge.rule == "vc_asgd"
    # A variant that sets the batch itself keeps its own.
    assert vcdls["vcdl train.batch_size=100"].train.batch_size == 100
    # Every contender gets the part's overrides; the plain one differs in its batch only.
    assert {c.train.lr for c in [plain, *vcdls.values()]} == {0.01}
    assert plain.model_copy(update={"train": shipped.train}) == shipped
