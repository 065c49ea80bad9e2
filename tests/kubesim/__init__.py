"""kubesim: a simulated Kubernetes API server with simulated GPU nodes, for tests and the demo (a stand-in only)."""

from __future__ import annotations

from .cluster import CAPACITY_ANNOTATION, FAULTS, SimCluster, SimNode

__all__ = ["CAPACITY_ANNOTATION", "FAULTS", "SimCluster", "SimNode"]
