"""Stage model adapters and stage-to-stage input processors, one module per model family.

Each module registers its adapters and processors into omni's registry (omni/registry.py) when
imported; the built-ins are also declared there by name, so `omni validate` knows them without
importing any model code.
"""
