"""What the tests share, in one place: servers and clusters they start (s3server, raycluster, autoscaling, fakehub),
data they make (mirror, biovita, models, pictures, planted, embedding_fixtures, contamination, topk), references they
compare with (mteb_reference, open_clip_data, equivalence, numerics) and the stand-ins a GPU run swaps (gpu,
fake_cuda, torchvision_standin).

conftest.py puts tests/ on PYTHONPATH, so that the processes the tests start import these modules by the same
names: Ray's workers the fake hub (`support.fakehub:from_env`), the worker setup hooks `support.fake_cuda.pretend`
and `gpus_on_cpu`.
The benchmarks import them after bench/harness.py's use_test_fixtures(). This package imports nothing itself."""
