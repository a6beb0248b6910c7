"""How trials are grouped into seed packs (runner.tune_runner.make_units): ``pack_seeds: auto``
sizes packs from the cluster's slots, a number keeps its meaning, configs never mix."""

from __future__ import annotations


from orchestrator.params import resolve
from orchestrator.runner.tune_runner import AUTO_PACK_SIZE, make_units, pack_size


def _trials(n_seeds: int, lrs=(1e-3,)):
    out = []
    for lr in lrs:
        for seed in range(n_seeds):
            p = resolve({"arm": "gated_deltanet", "task": "mqar", "lr": lr, "seed": seed})
            out.append((len(out) + 1, f"k{len(out)}", p))
    return out


def _units(trials, pack_seeds, slots, max_cpu=2.0):
    return make_units(
        "s",
        trials,
        cpu=1.0,
        gpu=0.0,
        pack_seeds=pack_seeds,
        max_cpu=max_cpu,
        max_gpu=0.0,
        slots=slots,
    )


def test_auto_fills_the_cluster_slots():
    trials = _trials(10)
    units = _units(trials, "auto", slots=2)
    # ceil(10 / 2) = 5 members a pack: two packs keep both slots busy.
    assert sorted(len(u["members"]) for u in units) == [5, 5]
    assert pack_size("auto", 10, 2) == 5
    # A 16-slot cluster splits the same seeds finer; one slot takes them all (up to the cap).
    assert sorted(len(u["members"]) for u in _units(trials, "auto", slots=16)) == [1] * 10
    assert [len(u["members"]) for u in _units(_trials(40), "auto", slots=1)] == [AUTO_PACK_SIZE, 8]


def test_auto_without_cluster_facts_and_numbers_keep_their_meaning():
    trials = _trials(10)
    assert [len(u["members"]) for u in _units(trials, "auto", slots=0)] == [10]
    assert sorted(len(u["members"]) for u in _units(trials, 3, slots=2)) == [1, 3, 3, 3]
    assert all(len(u["members"]) == 1 for u in _units(trials, 1, slots=2))


def test_configs_that_differ_beyond_the_seed_never_share_a_pack():
    trials = _trials(4, lrs=(1e-3, 3e-3))
    units = _units(trials, "auto", slots=1)
    assert len(units) == 2
    for u in units:
        assert len({m["params"]["lr"] for m in u["members"]}) == 1


def test_units_travel_through_tunes_grid_by_reference():
    """Tune deep-copies its whole search space once per variant: units that copied like dicts
    made a sweep's grid O(N^2) in the driver (minutes at 5,000 trials). A Unit copies as
    itself, pickles with its contents, and names its trials in Tune's tags."""
    import copy
    import pickle

    from ray import tune
    from ray.tune.search.variant_generator import generate_variants

    from orchestrator.runner.unit import Unit

    units = [Unit(u) for u in _units([(i, f"k{i}", {"seed": i, "arm": "a"}) for i in range(50)], 1, 0)]
    variants = [spec["config"]["unit"] for _, spec in generate_variants({"config": {"unit": tune.grid_search(units)}})]
    assert len(variants) == 50 and all(v is u for v, u in zip(variants, units))
    back = pickle.loads(pickle.dumps(units[3]))
    assert dict(back) == dict(units[3]) and copy.deepcopy(back) is back
    assert repr(units[3]) == "trials_3" and units[3].get("threads") == 1
