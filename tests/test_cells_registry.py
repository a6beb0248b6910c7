"""The cells API: registry, knob validation, describe/state accounting, determinism, hooks."""

from __future__ import annotations

import pytest
import torch

import cells
from cells.registry import SPECS
from conftest import RANK1_ARMS

FACTORIAL_VOCAB = 91  # 64 keys + 26 values + mask


def test_registered_arms():
    expected = {*RANK1_ARMS, "mamba2_ref", "mamba2_ref_noconv", "attention", "mlstm", "linear_mamba"}
    assert set(cells.ARMS) == expected
    assert isinstance(cells.ARMS, tuple)


@pytest.mark.parametrize("arm", cells.ARMS)
def test_every_arm_takes_the_shared_knobs(arm):
    k = cells.knobs(arm)
    for name in ("conv", "impl", "heads", "bidirectional", "mlp"):
        assert name in k, f"{arm} lacks shared knob {name}"
    assert k["impl"] == "auto"


def test_knob_defaults_encode_the_arm_names():
    assert cells.knobs("armed_gdn")["conv"] == 4 and cells.knobs("gated_deltanet")["conv"] == 1
    assert cells.knobs("deltanet")["decay"] is False and cells.knobs("gated_deltanet")["decay"] is True
    assert cells.knobs("dg_diag")["rank1"] is False and cells.knobs("armed_dg_rank")["conv"] == 4
    assert cells.knobs("mamba2_ref")["conv"] == 4 and cells.knobs("mamba2_ref_noconv")["conv"] == 1
    assert cells.knobs("linear_mamba")["conv"] == 2
    assert cells.knobs("mlstm")["heads"] == 4


@pytest.mark.parametrize(
    "arm,knobs,message",
    [
        ("armd_gdn", {}, "unknown arm 'armd_gdn' (known: deltanet, gated_deltanet"),
        (
            "armed_gdn",
            {"convv": 4},
            "unknown knob 'convv' for arm 'armed_gdn' (known: bidirectional, conv, decay, heads",
        ),
        ("armed_gdn", {"conv": "four"}, "knob 'conv' for arm 'armed_gdn' expects int in [1, 64], got 'four'"),
        ("armed_gdn", {"conv": 0}, "knob 'conv' for arm 'armed_gdn' expects int in [1, 64], got 0"),
        ("armed_gdn", {"conv": True}, "knob 'conv' for arm 'armed_gdn' expects int"),
        ("armed_gdn", {"conv": 4.0}, "knob 'conv' for arm 'armed_gdn' expects int"),
        ("armed_gdn", {"bidirectional": "yes"}, "knob 'bidirectional' for arm 'armed_gdn' expects true or false"),
        ("armed_gdn", {"impl": "fast"}, "knob 'impl' for arm 'armed_gdn' expects one of 'auto', 'naive'"),
        (
            "armed_gdn_fwd",
            {"bidirectional": True},
            "knob 'bidirectional' for arm 'armed_gdn_fwd' expects the fixed value False",
        ),
        ("deltanet", {"decay": True}, "knob 'decay' for arm 'deltanet' expects the fixed value False"),
        ("dg_diag", {"rank1": True}, "expects the fixed value False"),
        ("mamba2_ref_noconv", {"conv": 4}, "expects the fixed value 1"),
        ("mlstm", {"read": "ns99"}, "knob 'read' for arm 'mlstm' expects one of 'raw'"),
        ("mlstm", {"read": "whiten"}, "got 'whiten'"),
        ("mlstm", {"read_blend": 1.5}, "expects number in [0, 1], got 1.5"),
        ("mlstm", {"write": "delta", "read": "ns5"}, "write 'delta' supports only read 'raw'"),
        ("mlstm", {"impl": "chunk"}, "impl 'chunk' applies to write 'delta' only"),
        ("gated_deltanet", {"heads": 3}, "d_model must be divisible by heads (3)"),
        ("attention", {"positions": "rotary", "head_dim": 5}, "rotary positions need an even head_dim"),
        ("linear_mamba", {"pattern": "gqa"}, "knob 'pattern' for arm 'linear_mamba' expects one of 'mha'"),
    ],
)
def test_validate_messages(arm, knobs, message):
    with pytest.raises(ValueError) as info:
        cells.validate(arm, knobs)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_validate_checks_sizes():
    with pytest.raises(ValueError, match="d_model for arm 'deltanet' expects int >= 1, got 0"):
        cells.validate("deltanet", {}, d_model=0)
    with pytest.raises(ValueError, match="n_layers"):
        cells.validate("deltanet", {}, n_layers="2")
    with pytest.raises(ValueError, match="divisible by heads"):
        cells.validate("deltanet", {"heads": 2}, d_model=33)
    cells.validate("deltanet", {"heads": 2}, d_model=34)


def test_validate_accepts_good_knobs_and_builds_nothing():
    before = torch.random.get_rng_state()
    for arm in cells.ARMS:
        cells.validate(arm, {})
    cells.validate("armed_gdn", {"conv": 2, "bidirectional": True, "impl": "naive", "heads": 2})
    cells.validate("mlstm", {"read": "ns3", "read_blend": 0, "rls_lambda": 2})
    cells.validate("attention", {"head_dim": 16, "heads": 2, "positions": "rotary", "bidirectional": True})
    # Building a model would draw initial weights from the global RNG.
    assert torch.equal(before, torch.random.get_rng_state())


def test_build_rejects_bad_knobs_like_validate():
    with pytest.raises(ValueError, match="unknown knob 'convv'"):
        cells.build("armed_gdn", 10, convv=4)
    with pytest.raises(ValueError, match="vocab_size"):
        cells.build("armed_gdn", 0)


@pytest.mark.parametrize("arm", RANK1_ARMS)
def test_rank1_state_at_the_factorial_setting(arm):
    row = cells.describe(arm, FACTORIAL_VOCAB, d_model=32, n_layers=1)
    assert row["state_elements"] == 32 * 32 == 1024
    assert row["state_scaling"] == "fixed"


@pytest.mark.parametrize("arm", ["mamba2_ref", "mamba2_ref_noconv"])
def test_mamba2_state_at_the_factorial_setting(arm):
    row = cells.describe(arm, FACTORIAL_VOCAB, d_model=32, n_layers=1, d_state=16)
    assert row["state_elements"] == 64 * 16 == 1024


def test_param_counts_match_the_prototype_harness():
    # shared/MEASUREMENTS.md: the prototype GDN harness had 18,525 (unarmed) / 18,909 (armed).
    assert cells.describe("gated_deltanet", 91, d_model=32)["params"] == 18_525
    assert cells.describe("armed_gdn", 91, d_model=32)["params"] == 18_909


def test_mlstm_is_the_78k_model_at_vocab_80():
    row = cells.describe("mlstm", 80)
    assert row["d_model"] == 94
    assert abs(row["params"] - 78_000) / 78_000 < 0.01, row["params"]


def test_parameter_bookkeeping_of_the_knobs():
    d = 32
    base = cells.describe("gated_deltanet", 91, d_model=d)["params"]
    # The arming conv: width-4 depthwise on q, k, v, no bias.
    assert cells.describe("gated_deltanet", 91, d_model=d, conv=4)["params"] - base == 3 * d * 4
    # The diagonal ablation keeps every parameter.
    assert cells.describe("dg_rank", 91)["params"] == cells.describe("dg_diag", 91)["params"]
    # A bidirectional layer holds two mixers (and two states).
    fwd = cells.describe("armed_gdn", 91)
    bi = cells.describe("armed_gdn", 91, bidirectional=True)
    mixer = sum(p.numel() for p in cells.build("armed_gdn", 91).blocks[0].mixer.parameters())
    assert bi["params"] - fwd["params"] == mixer
    assert bi["state_elements"] == 2 * fwd["state_elements"]
    # The conv toggle of mamba2_ref keeps a width-1 conv with bias (channels: x, B, C).
    channels = 64 + 2 * 16
    assert (
        cells.describe("mamba2_ref", 91)["params"] - cells.describe("mamba2_ref_noconv", 91)["params"] == channels * 3
    )


def test_state_elements_of_other_arms():
    assert cells.describe("gated_deltanet", 91, heads=2)["state_elements"] == 2 * 16 * 16
    att = cells.describe("attention", 91, heads=2, head_dim=16)
    assert att["state_scaling"] == "per_token" and att["state_elements"] == 2 * 2 * 16
    ml = cells.describe("mlstm", 80)  # C + n + m per head, D = 192 / 4
    assert ml["state_elements"] == 4 * 48 * 48 + 4 * 48 + 4
    assert cells.describe("mlstm", 80, read="rls")["state_elements"] == ml["state_elements"] + 4 * 48 * 48


def test_describe_reports_resolved_knobs_and_keeps_the_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    row = cells.describe("armed_gdn", 91, conv=2)
    assert torch.equal(torch.rand(3), expected)
    assert set(row) >= {"arm", "params", "state_elements", "knobs"}
    assert row["knobs"]["conv"] == 2 and row["knobs"]["decay"] is True
    assert isinstance(row["params"], int) and isinstance(row["state_elements"], int)


@pytest.mark.parametrize("arm", cells.ARMS)
def test_init_is_deterministic_under_manual_seed(arm):
    torch.manual_seed(7)
    a = cells.build(arm, 11, d_model=16)
    torch.manual_seed(7)
    b = cells.build(arm, 11, d_model=16)
    torch.manual_seed(8)
    c = cells.build(arm, 11, d_model=16)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
    tokens = torch.randint(0, 11, (2, 9))
    assert torch.equal(a(tokens), b(tokens))


def test_hooks_exist_only_where_they_mean_something():
    assert hasattr(cells.build("mlstm", 11, d_model=16, read="ns2"), "set_read_blend")
    assert not hasattr(cells.build("mlstm", 11, d_model=16), "set_read_blend")
    assert not hasattr(cells.build("armed_gdn", 11), "set_read_blend")
    for arm in cells.ARMS:
        model = cells.build(arm, 11, d_model=16)
        groups = model.param_groups(1e-3, 0.1)
        ids = [id(p) for g in groups for p in g["params"]]
        assert sorted(ids) == sorted(id(p) for p in model.parameters())
        assert all(g["lr"] == 1e-3 and g["weight_decay"] == 0.1 for g in groups)


def test_knob_help_covers_every_knob():
    for arm in cells.ARMS:
        helps = cells.knob_help(arm)
        assert set(helps) == set(cells.knobs(arm)) and all(helps.values())
    assert cells.knob_help("deltanet")["decay"].endswith("[fixed]")
    assert SPECS["mlstm"].d_model == 94
