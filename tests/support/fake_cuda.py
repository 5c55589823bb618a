"""Ray worker setup hooks that stand in for CUDA. `support.fake_cuda.pretend`
(tests/unit/encode/test_encoder_device.py): torch in that worker says CUDA is available (as on a GPU node whose Ray
leaves CUDA_VISIBLE_DEVICES set for actors given no GPU), though nothing can run there. `support.fake_cuda.gpus_on_cpu`
(tests/system/test_autoscaling.py): an encoder given a declared GPU runs on the CPU."""


def pretend() -> None:
    """torch in this worker says CUDA is available."""
    import torch

    torch.cuda.is_available = lambda: True


def gpus_on_cpu() -> None:
    """A Ray worker setup hook for tests/system/test_autoscaling.py (`support.fake_cuda.gpus_on_cpu`): the test
    cluster's GPU nodes declare GPUs that this machine does not have, so an encoder the pool gave one (device
    cuda, the pool's decision) loads and runs on the CPU instead; everything else about it is the GPU path (its
    pool, its resources, its node)."""
    from mieb_ray.encode import model

    init = model.Encoder.__init__

    def on_cpu(self, *args, **kwargs):
        if str(kwargs.get("device") or "").startswith("cuda"):  # stages.EncodeStage passes device= by name
            kwargs["device"] = "cpu"
        init(self, *args, **kwargs)

    model.Encoder.__init__ = on_cpu
