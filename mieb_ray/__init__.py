"""mieb-ray: the mieb-train CLIP training set, CLIP embeddings and BioVITA retrieval as Ray jobs."""

__version__ = "0.1.0"
