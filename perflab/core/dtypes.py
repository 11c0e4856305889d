"""The one table of the 16-bit float formats perflab names by short name.

``"bf16"`` / ``"fp16"`` mean the same dtype everywhere: autocast's dtype
(``RunConfig.amp``, :data:`perflab.train.step.AMP_DTYPES`), the gradient compression of a DDP
communication hook (``RunConfig.comm_hook``, :data:`perflab.distributed.link_hook.COMPRESSIONS`) and the
peak FLOP/s a run is compared with (:mod:`perflab.analysis.flops`).
"""
from __future__ import annotations

import torch

__all__ = ["LOW_PRECISION_DTYPES"]

#: Short name -> torch dtype of the 16-bit float formats (bfloat16: fp32's 8-bit
#: exponent, 7-bit mantissa; float16: 5-bit exponent, 10-bit mantissa; IEEE 754-2008).
LOW_PRECISION_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
