import pytest

pytest.importorskip("ray.rllib")


@pytest.fixture(scope="module")
def ray_local():
    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield
    ray.shutdown()
