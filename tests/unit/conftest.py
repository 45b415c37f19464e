import pytest

from omni import registry


@pytest.fixture
def join_processor():
    """A registered input processor, so multi-stage configs validate without real stages."""
    registry.register_input_processor("join")(lambda outputs: outputs)
    yield
    registry.INPUT_PROCESSORS.pop("join", None)
