"""`orchestrator bench pack`: lone trials vs seed packs, including seed counts that do not
divide into packs of two or more per core (the GPU machine has 16 cores)."""

from __future__ import annotations

import pytest

from orchestrator.bench import pack
from orchestrator.cli import main


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fewer_than_two_seeds_per_core_make_fewer_larger_packs():
    # 2 seeds on 2 cores used to be split [0] + [1]: packs of one, refused by PackTrainer.
    r = pack.run(seeds=2, steps=2, cores=2)
    assert (r["seeds"], r["packs"]) == (2, 1)
    assert r["lone_wall_s"] > 0 and r["pack_wall_s"] > 0
    # The same two trials, lone and packed: equal accuracy up to the pack's rounding.
    assert r["max_final_acc_diff"] <= 2e-3


def test_one_seed_is_a_one_line_error(capsys):
    assert main(["bench", "pack", "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert "--seeds" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="at least 2 seeds"):
        pack.run(seeds=1, steps=2, cores=2)
