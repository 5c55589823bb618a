"""A Ray worker setup hook for tests/unit/encode/test_encoder_device.py (`support.fake_cuda.pretend`): torch in that
worker says CUDA is available (as on a GPU node whose Ray leaves CUDA_VISIBLE_DEVICES set for actors given no GPU),
though nothing can run there."""


def pretend() -> None:
    import torch

    torch.cuda.is_available = lambda: True
