"""Triton kernels, each public op registered as a `touchstone::<op>` torch.library custom op.

Importing this package imports no kernel module: `@triton.jit` reads TRITON_INTERPRET when a kernel is
defined, so the test tier decides the interpreter before the first `import kernels.<op>`.
"""
