"""Quantization formats built from the element codecs: FP8 groups and blocks, MXFP4, NVFP4 (global scales, fused
w1/w3), and the 128x4 swizzled block-scale layout."""
