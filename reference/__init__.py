"""Pure-PyTorch references: the definitions every kernel in touchstone is checked against.

Only torch is imported here (no triton, no runner). Each function states the spec it follows and its
edge-case policy (NaN, Inf, -0, subnormals, saturation, rounding) in its docstring.
"""
