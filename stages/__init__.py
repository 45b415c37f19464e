"""Model families, one package each: stage model adapters, stage-to-stage input processors and
prompt processors.

Each family declares itself once, in its package's `family.py` (`FAMILY = ModelFamily(...)`,
omni/family.py), and has one line in omni/registry.py's FAMILIES. omni reads the manifests
without importing the packages and imports each named class on first use.
docs/adding_a_model_family.md walks through adding one.
"""
