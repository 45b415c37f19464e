"""Model families, one package each: stage model adapters, stage-to-stage input processors and
prompt processors.

Each family declares itself once, in its manifest module (`FAMILY = ModelFamily(...)`,
omni/family.py): `family.py` in its package, or `<name>_family.py` beside a one-module family
(causal_lm.py, two_stage.py); the manifest module is its one line in omni/registry.py's FAMILIES. omni reads the manifests
without importing the packages and imports each named class on first use.
docs/adding_a_model_family.md walks through adding one.
"""
