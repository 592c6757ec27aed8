"""Pilots (SPEC §1 "pilot"): a job over a stratified sample of a scope, whose report projects the
whole scope's cost, review effort and risks.

- `sample`: the strata and the draw, by the database (`create_job` writes a pilot's items from it);
- `measure`: what the pilot's own items, drafts and decisions show, per stratum and in all;
- `projection`: the arithmetic from those measurements to the whole scope, with its 90 % range;
- `report`: the report as the API and the screen show it, and whether enough is decided to project;
- `drill`: the acceptance drill a pilot may ask for, staged in its own run, and what each step showed;
- `drill_report`: the drill's steps and its checks, read from the ledger, as the report shows them.
"""
