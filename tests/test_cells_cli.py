"""``orchestrator cells`` and ``orchestrator bench cells`` through the real entry point."""

from __future__ import annotations

import json

import cells
from conftest import RANK1_ARMS
from orchestrator.cli import main


def _json(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)


def test_cells_json_lists_every_arm_at_the_factorial_setting(capsys):
    rows = _json(capsys, ["cells", "--json"])
    assert [r["arm"] for r in rows] == list(cells.ARMS)
    by_arm = {r["arm"]: r for r in rows}
    for arm in (*RANK1_ARMS, "mamba2_ref", "mamba2_ref_noconv"):
        assert by_arm[arm]["state_elements"] == 1024, arm
    assert by_arm["mamba2_ref"]["knobs"]["d_state"] == 16
    assert by_arm["armed_gdn"]["knobs"]["conv"] == 4
    assert all(r["vocab_size"] == 91 and r["d_model"] == 32 and r["n_layers"] == 1 for r in rows)
    assert by_arm["gated_deltanet"]["params"] == cells.describe("gated_deltanet", 91, d_model=32)["params"]


def test_cells_flags_reach_the_rows(capsys):
    rows = _json(
        capsys,
        [
            "cells",
            "--json",
            "--arms",
            "mamba2_ref,armed_gdn",
            "--mamba2-d-state",
            "8",
            "--d-model",
            "16",
            "--n-layers",
            "2",
            "--vocab-size",
            "80",
            "--knob",
            "heads=2",
        ],
    )
    by_arm = {r["arm"]: r for r in rows}
    assert set(by_arm) == {"mamba2_ref", "armed_gdn"}
    assert by_arm["mamba2_ref"]["state_elements"] == 32 * 8
    assert by_arm["armed_gdn"]["state_elements"] == 2 * 8 * 8
    assert by_arm["armed_gdn"]["n_layers"] == 2 and by_arm["armed_gdn"]["vocab_size"] == 80


def test_cells_table(capsys):
    assert main(["cells", "--arms", "mlstm", "--d-model", "94", "--vocab-size", "80"]) == 0
    out = capsys.readouterr().out
    assert "mlstm" in out and "77,716" in out


def test_cells_user_errors(capsys):
    assert main(["cells", "--arms", "armd_gdn"]) == 2
    assert "error: unknown arm 'armd_gdn'" in capsys.readouterr().err
    assert main(["cells", "--arms", "armed_gdn", "--knob", "conv=four"]) == 2
    assert "error: knob 'conv' for arm 'armed_gdn' expects int" in capsys.readouterr().err
    assert main(["cells", "--knob", "convv=4"]) == 2
    assert "convv" in capsys.readouterr().err
    assert main(["cells", "--knob", "conv"]) == 2
    assert "key=value" in capsys.readouterr().err


def test_bench_cells_json(capsys):
    argv = "bench cells --json --arms gated_deltanet --arms mlstm --seq-len 12 --d-model 16 --batch 2 --repeats 1"
    data = _json(capsys, argv.split())
    assert [r["arm"] for r in data["rows"]] == ["gated_deltanet", "mlstm"]
    for row in data["rows"]:
        assert set(row) == {
            "arm",
            "naive_tok_s",
            "default_tok_s",
            "speedup_vs_naive",
            "harness_tok_s",
            "ceiling_vs_naive",
        }
        assert row["naive_tok_s"] > 0 and row["default_tok_s"] > 0 and row["harness_tok_s"] > 0
        assert abs(row["speedup_vs_naive"] - row["default_tok_s"] / row["naive_tok_s"]) < 1e-9
        assert abs(row["ceiling_vs_naive"] - row["harness_tok_s"] / row["naive_tok_s"]) < 1e-9
    assert data["seq_len"] == 12 and data["device"] == "cpu"


def test_bench_harness_is_the_model_without_its_mixers():
    import torch

    from cells.registry import build
    from orchestrator.bench.cells import harness_of

    torch.manual_seed(0)
    model = build("gated_deltanet", 11, d_model=8, n_layers=2)
    harness = harness_of(model)
    tokens = torch.randint(0, 11, (2, 7))
    # By hand: every block reduces to x + norm1(x), then its MLP; the original keeps its mixers.
    x = model.embedding(tokens)
    for block in model.blocks:
        x = x + block.norm1(x)
        x = x + block.mlp(block.norm2(x))
    expected = model.readout(model.norm(x))
    torch.testing.assert_close(harness(tokens), expected, rtol=0, atol=0)
    assert all(type(b.mixer).__name__ == "DeltaMixer" for b in model.blocks)
    assert not torch.allclose(model(tokens), expected)


def test_bench_cells_table_and_errors(capsys):
    assert main(["bench", "cells", "--arms", "linear_mamba", "--seq-len", "8", "--batch", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "linear_mamba" in out and "ceiling" in out
    assert main(["bench", "cells", "--arms", "nope"]) == 2
    assert "unknown arm 'nope'" in capsys.readouterr().err
    assert main(["bench", "cells", "--arms", "linear_mamba", "--clock", "cpu", "--threads", "2"]) == 2
    assert "--clock cpu times one thread" in capsys.readouterr().err
    assert main(["bench", "cells", "--arms", "linear_mamba", "--clock", "sundial"]) == 2
    assert "clock 'sundial'" in capsys.readouterr().err


def test_bench_cells_cpu_clock(capsys):
    """One thread's CPU time: the row's figures are tokens per CPU second, positive, and the
    clock is reported with them."""
    import torch

    threads = torch.get_num_threads()
    try:
        args = ["bench", "cells", "--json", "--arms", "gated_deltanet", "--seq-len", "12", "--d-model", "16"]
        data = _json(capsys, args + ["--batch", "2", "--repeats", "1", "--clock", "cpu", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert data["clock"] == "cpu" and data["threads"] == 1
    (row,) = data["rows"]
    assert row["naive_tok_s"] > 0 and row["default_tok_s"] > 0


def test_cells_spec_counts_are_the_built_models(capsys):
    # Unmatched rows come from the spec's own (arm, d_model, n_layers, vocab): a count must be
    # the model each trial builds, not one with the vocabulary and width swapped.
    rows = _json(capsys, ["cells", "--spec", "sweeps/basin_map.yaml", "--json"])
    assert {r["vocab_size"] for r in rows} == {80, 88, 96}
    for r in rows:
        assert r["arm"] == "mlstm" and r["d_model"] == 94 and r["n_layers"] == 1
        model = cells.build("mlstm", r["vocab_size"], 94, 1, **r["knobs"])
        assert r["params"] == sum(p.numel() for p in model.parameters()), r
        assert r["params"] == cells.describe("mlstm", r["vocab_size"], d_model=94, n_layers=1, **r["knobs"])["params"]
    assert main(["cells", "--spec", "sweeps/basin_map.yaml"]) == 0
    table = capsys.readouterr().out
    v80 = next(r for r in rows if r["vocab_size"] == 80)
    assert f"{v80['params']:,}" in table
