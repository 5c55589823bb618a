"""What the Ray cluster can offer, for the jobs' default pool sizes.

An autoscaling cluster starts with its head alone (no CPU, no GPU for work): sizing pools from the
resources present would give one CPU actor and, worse, encoders on CPUs (NeMo Curator's bug: GPU
requests computed on a CPU-only head). On the head of a cluster made by `ray up`, the autoscaler's
config says what it can grow to; the larger of that and what is up now is the capacity.
"""

from __future__ import annotations

import os

import yaml

BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"  # where `ray up` leaves the config on the head


def autoscaler_capacity(config: dict) -> dict[str, float]:
    """CPUs and GPUs of all worker node types at their max_workers, per a cluster launcher config."""
    total = {"CPU": 0.0, "GPU": 0.0}
    for name, node_type in config.get("available_node_types", {}).items():
        count = node_type.get("max_workers", 0) if name != config.get("head_node_type") else 1
        for resource in total:
            total[resource] += float(node_type.get("resources", {}).get(resource, 0)) * count
    return total


def capacity() -> dict[str, float]:
    import ray

    now = ray.cluster_resources()
    total = {"CPU": float(now.get("CPU", 0)), "GPU": float(now.get("GPU", 0))}
    path = os.path.expanduser(BOOTSTRAP_CONFIG)
    if os.path.exists(path):
        with open(path) as f:
            grown = autoscaler_capacity(yaml.safe_load(f) or {})
        total = {k: max(v, grown[k]) for k, v in total.items()}
    return total
