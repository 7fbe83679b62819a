"""Named tolerances for equivalence tests (METHOD §4 states fp32 ≤ 1e-5 abs/rel)."""

FP32_EXACT = {"rtol": 1e-5, "atol": 1e-5}
FP64_EXACT = {"rtol": 1e-10, "atol": 1e-10}
