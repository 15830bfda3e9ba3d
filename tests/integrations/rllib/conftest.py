import pytest

pytest.importorskip("ray.rllib")


@pytest.fixture(scope="module")
def ray_local(ray_shared):
    """The session's shared local Ray (``tests/integrations/conftest.py``), one torch thread here."""
    import torch

    torch.set_num_threads(1)
    yield
