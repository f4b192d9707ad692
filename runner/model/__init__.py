"""Model definitions the runner executes: the tiny attention + Mamba2 hybrid (random weights, pure torch) and
its Mamba state offload with the boundary rule."""
