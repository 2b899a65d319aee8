"""`disagg emulate`: an emulated GPU fleet behind the pods of DisaggDeployments.

The EMULATOR runs the simulator's stage logic (`disagg.sim`) on the wall clock:
each routable pod gets an emulated engine of its pool, a load generator sends
requests through prefill -> KV transfer -> decode, and every pod's engine
metrics (vLLM or SGLang names) are served for Prometheus.

* `disagg.emulator.fleet`: clock-free emulated deployments, pods and their metric state (pure).
* `disagg.emulator.metrics`: the Prometheus collector (prometheus_client, own registry).
* `disagg.emulator.load`: the load generator (Poisson / uniform / piecewise schedule / trace).
* `disagg.emulator.driver`: the asyncio wall-clock driver, pod watcher and metrics server.
"""

from disagg.emulator.fleet import DeploymentEmulator, EmulatedPod, Fleet, from_spec

__all__ = ["DeploymentEmulator", "EmulatedPod", "Fleet", "from_spec"]
