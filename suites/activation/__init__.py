"""SiLU-and-mul: the kernel against its references."""
