"""disagg-operator: a Kubernetes operator and autoscaler for disaggregated LLM serving."""

__version__ = "0.1.0"
