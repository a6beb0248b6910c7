"""Study design: group-sequential seeds and power before the run.

- ``boundaries``: Lan–DeMets alpha-spending boundaries (O'Brien–Fleming and Pocock shapes) by
  recursive numerical integration, plus the classical Pocock / O'Brien–Fleming constants.
- ``sequential``: the spec's ``sequential:`` block (pydantic), its validation against the axes
  (one-line errors), and the per-look decision for one contrast or every stratum (Bonferroni).
- ``power``: exact Fisher power (enumeration; sequential by carried probability mass) and log-rank
  power by seeded simulation, checked against Schoenfeld's formula.
- ``stats``: vectorised Fisher tables and log-rank z for the simulations.
"""
