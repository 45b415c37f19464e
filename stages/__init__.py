"""Stage model adapters and stage-to-stage input processors, one module per model family.

Only the registry is imported here: adapters pull in torch and transformers, and `import stages`
must stay cheap for config validation. Adapter modules register themselves when imported.
"""

from stages.registry import (
    ADAPTERS,
    INPUT_PROCESSORS,
    get_adapter,
    get_input_processor,
    known_adapters,
    known_input_processors,
    register_adapter,
    register_input_processor,
)

__all__ = [
    "ADAPTERS",
    "INPUT_PROCESSORS",
    "get_adapter",
    "get_input_processor",
    "known_adapters",
    "known_input_processors",
    "register_adapter",
    "register_input_processor",
]
