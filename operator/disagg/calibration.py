"""Online calibration of the stage models from what the engines report (pure).

Every autoscaling decision with fresh metrics adds one sample per stage:

* decode: (mean running sequences per decode pod, mean inter-token latency in ms),
  i.e. step time against batch size;
* prefill: (mean prompt tokens, mean prefill time in ms), where the engine exports
  a prefill-time histogram (vLLM's `vllm:request_prefill_time_seconds`).

The spec's service model is the prior: a robust (Huber) line fit in which the prior
counts as `prior_weight` pseudo-samples, so a handful of noisy samples nudge the
model and a long history replaces it. Until `min_samples` samples exist the spec's
model is used as is. The status shows the fitted parameters and their sample count.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from disagg import model as m


@dataclass
class Calibrator:
    max_samples: int = 240
    min_samples: int = 5
    prior_weight: float = 5.0
    decode: deque = field(default_factory=lambda: deque(maxlen=240))
    prefill: deque = field(default_factory=lambda: deque(maxlen=240))

    def observe(self, values: dict[str, float], decode_batch: float | None) -> None:
        itl = values.get("itl_mean")
        if decode_batch and decode_batch > 0 and itl is not None and math.isfinite(itl) and itl > 0:
            self.decode.append((float(decode_batch), itl * 1000.0))
        pt, tokens = values.get("prefill_time_mean"), values.get("prompt_tokens_mean")
        if (
            pt is not None
            and tokens
            and math.isfinite(pt)
            and pt > 0
            and math.isfinite(tokens)
            and tokens > 0
        ):
            self.prefill.append((float(tokens), pt * 1000.0))

    def _fit(self, samples: deque, fit, prior):
        if len(samples) < self.min_samples:
            return None
        xs, ys = zip(*samples, strict=True)
        return fit(list(xs), list(ys), prior=prior, prior_weight=self.prior_weight)

    def models(self, base: m.StageModels) -> m.StageModels:
        """The spec's models with the fitted stages swapped in."""
        out = base
        d = self._fit(self.decode, m.fit_decode, base.decode)
        if d is not None:
            out = replace(out, decode=d.model)
        p = self._fit(self.prefill, m.fit_prefill, base.prefill)
        if p is not None:
            out = replace(out, prefill=p.model)
        return out

    def status(self, base: m.StageModels) -> dict[str, Any]:
        fitted = self.models(base)
        return {
            "decode": {
                "stepFixedMs": round(fitted.decode.step_fixed_ms, 3),
                "stepMsPerSequence": round(fitted.decode.step_ms_per_seq, 4),
                "samples": len(self.decode),
                "fitted": len(self.decode) >= self.min_samples,
            },
            "prefill": {
                "fixedMs": round(fitted.prefill.fixed_ms, 3),
                "msPerToken": round(fitted.prefill.ms_per_token, 5),
                "samples": len(self.prefill),
                "fitted": len(self.prefill) >= self.min_samples,
            },
        }
