"""The demo's data (`mieb-ray demo`), made on the spot from the few real pictures in images/: a hub-layout mirror
of the catalog's sources (mirror.py), a BioVITA-shaped benchmark (biovita.py) and a tiny random CLIP saved with
save_pretrained (models.py). The tests and benchmarks build on them (tests/support/). Import the module you need:
models.py alone needs no datasets or webdataset (bench/gpu_encode.py)."""
