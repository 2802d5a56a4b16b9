"""diloco_async: delayed Nesterov (Liu et al. 2024), against a hand-computed sequence,
a float64 reference of the paper's two-buffer form, diloco at N = 1, and the rule's state."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vcdl.config import parse_config
from vcdl.errors import MergeError
from vcdl.merge.ops import delayed_nesterov, diloco
from vcdl.merge.rules import STEP_KEY, Applied, merge_rule, rule_of
from vcdl.types import StateDict


def applied(out: Applied | str) -> Applied:
    assert not isinstance(out, str), out
    return out


def reference(
    head: list[float],
    results: list[list[float]],
    bases: list[list[float]],
    lr: float,
    mu: float,
    n: int,
) -> list[list[float]]:
    """The paper's Algorithm 3 as written, two buffers (momentum m, gradient sum Δ), float64."""
    theta = torch.tensor(head, dtype=torch.float64)
    m = torch.zeros_like(theta)
    acc = torch.zeros_like(theta)
    out = []
    for t, (r, b) in enumerate(zip(results, bases, strict=True), start=1):
        g = torch.tensor(b, dtype=torch.float64) - torch.tensor(r, dtype=torch.float64)
        acc += g
        if t % n == 0:
            m = mu * m + acc / n
            theta = theta - lr * (g / n + mu * m)
            acc.zero_()
        else:
            theta = theta - lr * g / n
        out.append(theta.tolist())
    return out


def test_a_hand_computed_sequence() -> None:
    # lr 1, μ 0.5, N 2, base 0, results g = -2, -4, -6, -8 (pseudo-gradients 2, 4, 6, 8).
    # t1: pending 1;  θ = 0 - 1·(2/2) = -1
    # t2: pending 1 + 2 = 3 (= μ·0 + (2+4)/2);  θ = -1 - (2 + 0.5·3) = -4.5;  pending 1.5
    # t3: pending 1.5 + 3 = 4.5;  θ = -4.5 - 3 = -7.5
    # t4: pending 4.5 + 4 = 8.5 (= μ·3 + (6+8)/2);  θ = -7.5 - (4 + 0.5·8.5) = -15.75
    head: StateDict = {"w": torch.tensor([0.0])}
    pending: StateDict | None = None
    seen = []
    for step, r in enumerate([-2.0, -4.0, -6.0, -8.0]):
        head, pending = delayed_nesterov(
            head,
            {"w": torch.tensor([r])},
            pending,
            lr=1.0,
            momentum=0.5,
            delay=2,
            step=step,
            base={"w": torch.tensor([0.0])},
        )
        seen.append((head["w"].item(), pending["w"].item()))
    assert seen == [(-1.0, 1.0), (-4.5, 1.5), (-7.5, 4.5), (-15.75, 4.25)]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 5),
    mu=st.floats(0.0, 0.95),
    lr=st.floats(0.01, 2.0),
    steps=st.integers(1, 12),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_a_float64_reference_of_the_two_buffer_form(
    n: int, mu: float, lr: float, steps: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    head0 = torch.randn(6, generator=gen, dtype=torch.float64)
    results = [torch.randn(6, generator=gen, dtype=torch.float64) for _ in range(steps)]
    bases = [torch.randn(6, generator=gen, dtype=torch.float64) for _ in range(steps)]
    want = reference(
        head0.tolist(), [r.tolist() for r in results], [b.tolist() for b in bases], lr, mu, n
    )
    head: StateDict = {"w": head0.float()}
    pending: StateDict | None = None
    for step in range(steps):
        head, pending = delayed_nesterov(
            head,
            {"w": results[step].float()},
            pending,
            lr=lr,
            momentum=mu,
            delay=n,
            step=step,
            base={"w": bases[step].float()},
        )
        torch.testing.assert_close(
            head["w"].double(), torch.tensor(want[step], dtype=torch.float64), rtol=1e-4, atol=1e-4
        )


@settings(max_examples=40, deadline=None)
@given(mu=st.floats(0.0, 0.95), lr=st.floats(0.01, 2.0), seed=st.integers(0, 2**31 - 1))
def test_a_delay_of_one_is_diloco_nesterov(mu: float, lr: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    head_a: StateDict = {"w": torch.randn(5, generator=gen)}
    head_b = dict(head_a)
    buf_a: StateDict | None = None
    buf_b: StateDict | None = None
    for step in range(4):
        result = {"w": torch.randn(5, generator=gen)}
        base = {"w": torch.randn(5, generator=gen)}
        head_a, buf_a = delayed_nesterov(
            head_a, result, buf_a, lr=lr, momentum=mu, delay=1, step=step, base=base
        )
        head_b, buf_b = diloco(head_b, result, buf_b, lr=lr, momentum=mu, base=base)
        torch.testing.assert_close(head_a["w"], head_b["w"], rtol=1e-5, atol=1e-5)


def test_over_a_round_the_head_moves_as_nesterov_on_the_mean() -> None:
    # N results from one base, then diloco once on their mean at lr (the synchronous
    # DiLoCo round): the same head after the round.
    n, lr, mu = 4, 0.7, 0.9
    gen = torch.Generator().manual_seed(3)
    head: StateDict = {"w": torch.randn(8, generator=gen)}
    sync_head, sync_buf = dict(head), None
    pending: StateDict | None = None
    step = 0
    for _round in range(3):
        base = dict(head)
        results = [{"w": base["w"] - torch.randn(8, generator=gen)} for _ in range(n)]
        for r in results:
            head, pending = delayed_nesterov(
                head, r, pending, lr=lr, momentum=mu, delay=n, step=step, base=base
            )
            step += 1
        mean = {"w": torch.stack([r["w"] for r in results]).mean(0)}
        sync_head, sync_buf = diloco(
            sync_head, mean, sync_buf, lr=lr, momentum=mu, base={"w": sync_head["w"]}
        )
        # The synchronous round's pseudo-gradients are from its own head, which is the
        # asynchronous head at the round's start: the two agree round by round.
        torch.testing.assert_close(head["w"], sync_head["w"], rtol=1e-5, atol=1e-5)


def test_integers_and_narrow_floats() -> None:
    head = {"w": torch.ones(3, dtype=torch.bfloat16), "n": torch.tensor(5)}
    result = {"w": torch.zeros(3, dtype=torch.bfloat16), "n": torch.tensor(7)}
    new, pending = delayed_nesterov(
        head, result, None, lr=0.5, momentum=0.9, delay=2, step=0, base=head
    )
    assert new["w"].dtype == torch.bfloat16 and new["n"].item() == 7
    assert pending["w"].dtype == torch.float32 and set(pending) == {"w"}
    assert head["w"].tolist() == [1.0, 1.0, 1.0]  # inputs untouched


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"lr": -1.0}, "lr must be"),
        ({"momentum": 1.0}, "momentum must be"),
        ({"delay": 0}, "delay must be"),
        ({"step": -1}, "step must be"),
    ],
)
def test_bad_arguments_are_refused(kw: dict[str, float], match: str) -> None:
    args: dict[str, float] = {"lr": 0.5, "momentum": 0.9, "delay": 2, "step": 0} | kw
    w = {"w": torch.zeros(2)}
    with pytest.raises(MergeError, match=match):
        delayed_nesterov(w, w, None, base=w, **args)  # type: ignore[arg-type]


def test_the_rule_keeps_its_state_and_counts_merges() -> None:
    cfg = parse_config({"merge": {"rule": "diloco_async", "alpha": 0.5, "outer_momentum": 0.5}})
    rule = merge_rule(cfg.merge, workers=2)
    assert rule.keeps_state and rule.reads_base and rule.delay == 2
    head: StateDict = {"w": torch.tensor([0.0])}
    state: StateDict | None = None
    heads = []
    for step, g in enumerate([2.0, 4.0, 6.0, 8.0]):
        result = {"w": head["w"] - g}  # its pseudo-gradient from the head it started at: g
        out = applied(rule.apply(head, result, 0.5, base=head, state=state))
        head, state = out.weights, out.state
        assert state is not None and int(state[STEP_KEY]) == step + 1
        heads.append(head["w"].item())
    # lr = (1 - α)·N·(1 - μ) = 0.5 and the pseudo-gradients of the sequence above:
    # -0.5·1, then -0.5·(2 + 0.5·3), -0.5·3, -0.5·(4 + 0.5·8.5).
    assert heads == pytest.approx([-0.5, -2.25, -3.75, -7.875])


def test_the_delay_defaults_to_the_run_s_workers_and_can_be_set() -> None:
    cfg = parse_config({"merge": {"rule": "diloco_async"}, "cluster": {"workers": 3}})
    assert rule_of(cfg).delay == 3
    cfg = parse_config(
        {"merge": {"rule": "diloco_async", "momentum_delay": 5}, "cluster": {"workers": 3}}
    )
    assert rule_of(cfg).delay == 5


def test_a_state_of_another_model_restarts_the_momentum() -> None:
    rule = merge_rule(parse_config({"merge": {"rule": "diloco_async"}}).merge, workers=2)
    head = {"w": torch.zeros(2)}
    foreign = {"v": torch.ones(2), STEP_KEY: torch.tensor(7)}
    out = applied(rule.apply(head, {"w": torch.ones(2)}, 0.5, base=head, state=foreign))
    fresh = applied(rule.apply(head, {"w": torch.ones(2)}, 0.5, base=head, state=None))
    assert out.state is not None and fresh.state is not None
    torch.testing.assert_close(out.state["w"], fresh.state["w"])
