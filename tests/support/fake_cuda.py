"""Ray worker setup hooks that stand in for CUDA. `support.fake_cuda.pretend`
(tests/unit/encode/test_encoder_device.py): torch in that worker says CUDA is available (as on a GPU node whose Ray
leaves CUDA_VISIBLE_DEVICES set for actors given no GPU), though nothing can run there. `support.fake_cuda.gpus_on_cpu`
(tests/system/test_autoscaling.py): an encoder given a declared GPU runs on the CPU;
`support.fake_cuda.paced_gpus_on_cpu` too, no faster than a batch per PACE_S."""

import time

PACE_S = 0.3


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


def paced_gpus_on_cpu() -> None:
    """gpus_on_cpu, and each image batch takes at least PACE_S: the tiny model on this machine embeds the test's
    mirror in 4 s on one encoder, less than the autoscaler may take to bring up the second GPU node (up to 8 s seen),
    so a test that kills a node once both encoders run needs the job to last (93 batches: about 28 s on one)."""
    gpus_on_cpu()
    from mieb_ray.encode import model

    features = model.Encoder.image_features

    def paced(self, pixel_values):
        t0 = time.monotonic()
        out = features(self, pixel_values)
        time.sleep(max(0.0, PACE_S - (time.monotonic() - t0)))
        return out

    model.Encoder.image_features = paced
