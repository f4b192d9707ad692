"""Rotary position embedding (RoPE) of the attention inputs."""
